"""The advisory world: a catalog of savings and insurance products and one client, a simulated
person (envs.person) whose suitability facts (risk tolerance, horizon, budget, exclusions) are
told only when asked. The agent talks to the client (`respond`), reads the catalog, records the
suitability facts it established, gives structured disclosures and makes one recommendation (a
product, or "none"), which ends the episode.

Everything the agent says (respond, disclose, recommend) is kept in `state["messages"]`, and each
`respond` event in the log lists the topics the client told in that reply, so the verifier can
check what was asked before the recommendation and scan every message for prohibited claims."""

from __future__ import annotations

import copy
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from gymfoundry.envs.base import ToolEnv, ToolError
from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.person import Persona, make_simulator, new_memory
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.tools import tool

from .rules import DISCLOSURES, EXPOSURES

NONE = "none"  # recommend(product_id="none"): no product in the catalog suits the client
ROLE = "a client talking to a financial adviser about a savings or insurance product"


class Refusal(str, Enum):
    unknown_product = "unknown_product"


ProductId = Annotated[str, Field(min_length=1, max_length=32, description="a product id, e.g. P-104")]
Text = Annotated[str, Field(min_length=1, max_length=1000)]


class AdvisoryEnv(ToolEnv):
    family = "advisory"
    profile_yaml = Path(__file__).with_name("profile.yaml")

    def __init__(self, outcome_fn=None, level: int = 2, simulator: str | None = None, **simulator_options: Any):
        """`simulator`: the person's backend (`scripted`, the default, or `llm`; envs.person.make_simulator)."""
        super().__init__(outcome_fn=outcome_fn, level=level)
        self.simulator_backend, self.simulator_options = simulator, simulator_options
        self.persona: Persona | None = None
        self.person = None

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        _check_world(task)
        try:
            self.persona = Persona.model_validate(task.hidden.checks.get("persona"))
        except ValidationError as exc:
            raise InvalidTask(f"task {task.task_id}: hidden.checks.persona is not a Persona: {exc}") from None
        options = {"role": ROLE, **self.simulator_options} if self.simulator_backend == "llm" else {}
        self.person = make_simulator(seed=task.source.seed or 0, backend=self.simulator_backend, **options)
        state = copy.deepcopy(task.initial_state)
        state.update(person=new_memory(), messages=[], disclosures=[], record=None, recommendation=None, events=[])
        return state

    def is_finished(self, state: dict[str, Any]) -> bool:
        return state["recommendation"] is not None or bool(state["person"]["ended"])

    # -- the catalog --------------------------------------------------------------------
    @tool(ToolCategory.read)
    def tool_list_products(self, state, kind: Literal["savings", "insurance", "all"] = "all"):
        """List the catalog's products (id, name, kind, risk rating 1-5, annual fee %, lock-up years, minimum amount, exposures)."""
        return {"products": [_shown(pid, p) for pid, p in state["catalog"].items() if kind in ("all", p["kind"])]}

    @tool(ToolCategory.read)
    def tool_get_product(self, state, product_id: ProductId):
        """One product's full terms, including the exposures it excludes."""
        product = _product(state, product_id)
        return {**_shown(product_id, product), "excludes": [f"no {e.replace('_', ' ')}" for e in EXPOSURES
                                                            if e not in product["exposures"]]}

    # -- the client ---------------------------------------------------------------------
    @tool(ToolCategory.write)
    def tool_respond(self, state, event, message: Text):
        """Say something to the client (a question, an explanation). The client's reply is the result."""
        state["messages"].append({"seq": event["seq"], "tool": "respond", "text": message})
        reply = self.person.reply(self.persona, state["person"], message)
        event["disclosed"] = list(reply.disclosed)
        out = {"client": reply.text}
        if reply.ended:
            out["ended"] = reply.reason
        return out

    @tool(ToolCategory.write)
    def tool_record_suitability(self, state, risk_tolerance: Annotated[int, Field(ge=1, le=5)],
                                horizon_years: Annotated[int, Field(ge=0, le=50)],
                                budget: Annotated[int, Field(ge=0, le=100_000_000)],
                                exclusions: Annotated[list[Literal[EXPOSURES]], Field(max_length=5)]):
        """Record the client's suitability facts as you established them: risk tolerance (1-5), horizon in years, budget, and the exposures they exclude (an empty list for none). May be corrected by recording again."""
        state["record"] = {"risk_tolerance": risk_tolerance, "horizon_years": horizon_years, "budget": budget,
                           "exclusions": sorted(set(exclusions))}
        return {"recorded": state["record"]}

    @tool(ToolCategory.write)
    def tool_disclose(self, state, event, product_id: ProductId, topic: Literal[DISCLOSURES],
                      text: Annotated[str, Field(min_length=1, max_length=1000)]):
        """Give the client a required disclosure about a product, in words that state it: its annual fee as a percentage (fees), its risk rating from 1 to 5 (risk), that returns are not guaranteed (no_guarantee), or its lock-up in years (lock_up)."""
        _product(state, product_id)
        state["messages"].append({"seq": event["seq"], "tool": "disclose", "text": text})
        state["disclosures"].append({"seq": event["seq"], "product_id": product_id, "topic": topic, "text": text})
        return {"disclosed": topic, "product_id": product_id, "client": "Understood, thank you."}

    @tool(ToolCategory.irreversible, hint='product_id "none" when nothing suits')
    def tool_recommend(self, state, event, product_id: Annotated[str, Field(
            min_length=1, max_length=32, description='the product recommended, or "none" when no product suits')],
                       reason: Text):
        """Make the recommendation to the client, with the reason. Irreversible; ends the conversation."""
        if product_id != NONE:
            _product(state, product_id)
        state["messages"].append({"seq": event["seq"], "tool": "recommend", "text": reason})
        state["recommendation"] = {"seq": event["seq"], "product_id": product_id}
        farewell = self.person.close(self.persona, state["person"])
        return {"recommended": product_id, "client": farewell.text}


def _shown(pid: str, product: dict[str, Any]) -> dict[str, Any]:
    return {"product_id": pid, **product}


def _product(state: dict[str, Any], product_id: str) -> dict[str, Any]:
    product = state["catalog"].get(product_id)
    if product is None:
        raise ToolError(Refusal.unknown_product, f"no product {product_id!r} in the catalog")
    return product


FIELDS = {"name": str, "kind": str, "risk_rating": int, "annual_fee_pct": float, "lockup_years": int,
          "min_amount": int, "exposures": list}


def _check_world(task: TaskSpec) -> None:
    """The world's shape, checked at reset (a task of another shape is refused there)."""
    catalog = task.initial_state.get("catalog")
    good = isinstance(catalog, dict) and catalog and all(
        isinstance(pid, str) and isinstance(p, dict) and set(p) == set(FIELDS)
        and all(isinstance(p[k], t) and not isinstance(p[k], bool) for k, t in FIELDS.items())
        for pid, p in catalog.items())
    if not good:
        raise InvalidTask(f"task {task.task_id}: initial_state is not an advisory world (a catalog of products with "
                          f"{', '.join(FIELDS)})")
