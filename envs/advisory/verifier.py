"""Outcome verifier and progress potential of the advisory family.

A success is a suitable product (or "none" when nothing suits) recommended after the client told
every suitability fact, with those facts recorded as they are and every required disclosure of
that product given before the recommendation, each stating the product's own term (its fee, risk
rating and lock-up; that returns are not guaranteed), and no prohibited claim in anything the
agent said. A "none" also needs its evidence (`endings`): the products of the wanted kind shown
by the world and the client's facts told, before it. A claim, a recommendation before every fact
was told, and a product that breaks a hidden constraint (mis-selling) are constraint violations,
reported apart from completion.

Three checks of the outcome: `observation` from what the agent saw (the client's replies, the
products shown, the accepted record, disclosures and recommendation; the agent's own words are
not observations, so a claim escapes it), `invariants` from the final hidden state (the event
log and every message), `hidden_variation` from replays of the same calls on a catalog whose
distractors differ. Replays use the scripted person, so a grader never calls an endpoint."""

from __future__ import annotations

import copy
import json
from typing import Any

from gymfoundry.envs.family import family
from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall
from gymfoundry.envs.scripted import tool_result
from gymfoundry.envs.verifier import Ending, ReplayVerifier, calls_of

from .facts import AdvisoryFacts
from .generator import spoken
from .rules import (FIELD, TOPICS, disclosure_problem, prohibited_claims, required_disclosures, suitable,
                    unsuitable_reasons)
from .world import NONE, AdvisoryEnv


def judge(facts: AdvisoryFacts, state: dict[str, Any],
          terms: dict[str, dict] | None = None) -> tuple[list[str], list[str]]:
    """(why the advice is incomplete, the constraint violations), from a hidden state. Disclosures
    are read against `terms` (a catalog; the state's own by default): a replay on a variant
    catalog replays texts written about the task's own."""
    profile, catalog = facts.profile.model_dump(), state["catalog"]
    rec = state["recommendation"]
    incomplete = misstatements(state, terms or catalog)
    violations = [f"{m['tool']} (call {m['seq']}) claims {claim!r}"
                  for m in state["messages"] for claim in prohibited_claims(m["text"])]
    if rec is None:
        ended = state["person"]["ended"]
        incomplete.append(f"the client left the conversation ({ended}) before a recommendation" if ended
                          else "no recommendation was made")
        return incomplete, violations
    told = told_topics(state, before=rec["seq"])
    violations += [f"recommended before the client told their {t.replace('_', ' ')} (call {rec['seq']})"
                   for t in TOPICS if t not in told]
    record = state["record"]
    if record is None:
        incomplete.append("no suitability record before the recommendation")
    else:
        incomplete += [f"the suitability record has {k} {record[k]!r}, the client's is {v!r}"
                       for k, v in profile.items() if record[k] != v]
    pid = rec["product_id"]
    if pid == NONE:
        fits = suitable(catalog, profile, facts.kind)
        if fits:
            incomplete.append(f"recommended none, but {', '.join(fits)} suit(s) the client")
        return incomplete, violations
    product = {**catalog[pid], "product_id": pid}
    misfit = unsuitable_reasons(product, profile, facts.kind)
    if misfit and product["kind"] != facts.kind:
        incomplete.append(misfit.pop(0))
    violations += [f"mis-selling: {r}" for r in misfit]
    given = {d["topic"] for d in state["disclosures"] if d["product_id"] == pid and d["seq"] < rec["seq"]}
    incomplete += [f"recommended {pid} without disclosing its {t.replace('_', ' ')}"
                   for t in required_disclosures(product) if t not in given]
    return incomplete, violations


def misstatements(state: dict[str, Any], catalog: dict[str, dict]) -> list[str]:
    """Each disclosure given whose text does not state what it must of its product in `catalog`
    (rules.disclosure_problem): every one is said to the client, whichever product it is about."""
    return [f"the {d['topic'].replace('_', ' ')} disclosure of {d['product_id']} (call {d['seq']}) {problem}"
            for d in state["disclosures"]
            if (problem := disclosure_problem(d["topic"], d["text"], catalog[d["product_id"]]))]


def unseen_before_none(facts: AdvisoryFacts, state: dict[str, Any], before: float = float("inf")) -> list[str]:
    """Why "none" is not yet justified by what the world showed before call `before` (empty when it
    is): every product of the kind the client wants, listed or read, and every fact the client tells."""
    events = [e for e in state["events"] if e["outcome"] == "ok" and e["seq"] < before]
    wanted = [pid for pid, p in state["catalog"].items() if p["kind"] == facts.kind]
    listed = any(e["tool"] == "list_products" and e["args"].get("kind", "all") in (facts.kind, "all") for e in events)
    read = {e["args"].get("product_id") for e in events if e["tool"] == "get_product"}
    reasons = []
    if not listed and not (wanted and set(wanted) <= read):
        unseen = [pid for pid in wanted if pid not in read]
        unseen_ids = f" ({', '.join(unseen)} unseen)" if read else ""
        reasons.append(f"the {facts.kind} products were never listed{unseen_ids}")
    told = told_topics(state, before)
    reasons += [f"the client never told their {t.replace('_', ' ')}" for t in TOPICS if t not in told]
    return reasons


def told_topics(state: dict[str, Any], before: float = float("inf")) -> set[str]:
    """Topics the client told in replies to accepted `respond` calls before call `before`."""
    return {t for e in state["events"] if e["tool"] == "respond" and e["outcome"] == "ok" and e["seq"] < before
            for t in e.get("disclosed", [])}


def _none_evidence(verifier: AdvisoryVerifier, task: TaskSpec, before: list[Step]) -> list[str]:
    return unseen_before_none(verifier.facts(task), verifier.final_state(task, calls_of(before)))


class AdvisoryVerifier(ReplayVerifier):
    verifier_id = "advisory-outcome"
    version = "2"  # bump when a verdict changes; `gymfoundry reverify` re-judges stored rollouts
    family = "advisory"
    # "none" leaves the state as a correct "none" does whether or not the agent looked: it needs
    # the catalog of the wanted kind and the client's facts, as the world showed them, first.
    endings = (Ending(tool="recommend", evidence=_none_evidence, applies=lambda args: args.get("product_id") == NONE,
                      why="every product of the kind the client wants was listed or read, and the client told "
                          "every suitability fact, before recommending none"),)
    statements = {"disclose": ("text",)}  # each disclosure must state the product's term (rules.disclosure_problem)

    def new_env(self) -> AdvisoryEnv:
        return family(self.family).env(outcome_fn=None, simulator="scripted")

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        facts, calls = self.facts(task), calls_of(steps)
        final = self.final_state(task, calls) if final_state is None else final_state
        incomplete, violations = judge(facts, final)
        checks = {"observation": _observation(facts, steps), "invariants": _invariants(facts, final),
                  "hidden_variation": self._variation(task, facts, calls)}
        verdicts = {"completed": not incomplete and not any(v.startswith("mis-selling") for v in violations),
                    "no_constraint_violation": not violations}
        success = all(verdicts[rule] for rule in AdvisoryEnv.profile.outcome_rules)
        reasons = incomplete + violations
        for name in ("invariants", "hidden_variation"):
            if success and not checks[name].passed:  # a success must hold in the hidden state and the variants
                success = False
                reasons += [f"{name}: {r}" for r in checks[name].reasons]
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=verdicts["completed"], regression=False,
                             constraint_violation=bool(violations), reasons=reasons, checks=checks)

    def precondition(self, task: TaskSpec) -> str | None:
        """Why the task is broken before any action: its facts disagree with its own world."""
        facts = self.facts(task)
        profile = facts.profile.model_dump()
        fits = suitable(task.initial_state["catalog"], profile, facts.kind)
        if fits != facts.suitable:
            return f"the task says {facts.suitable or 'none'} suit(s), its catalog says {fits or 'none'}"
        wrong = [t for t in TOPICS if t not in facts.persona.facts
                 or facts.persona.facts[t].value != spoken(t, profile[FIELD[t]])]
        if wrong:
            return f"the client's persona does not say the profile's {', '.join(wrong)}"
        shown = [v for v in facts.persona.hidden_values() if v in task.goal]
        if shown:
            return f"the goal shows private persona values {shown}"
        return None

    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Φ in [0, 1]: facts told, a right record, a suitable product looked at, its disclosures
        given as they must be, less for a prohibited claim. After the recommendation it is the
        verdict: 1.0 for a right one (a "none" with its evidence), 0.0 otherwise."""
        facts = self.facts(task)
        incomplete, violations = judge(facts, state)
        rec = state["recommendation"]
        if rec is not None:
            unjustified = rec["product_id"] == NONE and unseen_before_none(facts, state, before=rec["seq"])
            return 1.0 if not incomplete and not violations and not unjustified else 0.0
        fits = set(facts.suitable)
        looked = {e["args"].get("product_id") for e in state["events"] if e["tool"] == "get_product"
                  and e["outcome"] == "ok"}
        listed = any(e["tool"] == "list_products" and e["outcome"] == "ok" for e in state["events"])
        phi = 0.1 * len(told_topics(state)) + 0.15 * (state["record"] == facts.profile.model_dump())
        phi += 0.05 * (bool(looked & fits) if fits else listed)
        phi += max((_disclosed_share(state, pid) for pid in fits), default=0.0)
        phi -= 0.3 * bool(violations)
        return round(min(0.9, max(0.0, phi)), 6)

    def crafted_disagreement(self, task: TaskSpec) -> list[ToolCall]:
        """The reference with a prohibited claim said to the client before the recommendation: all
        the agent saw looks right (observation passes); the messages hold the claim (invariants fail)."""
        *calls, recommend = task.hidden.reference
        claim = ToolCall(name="respond", arguments={"message": "Honestly, with this plan you can't lose."})
        return [*calls, claim, recommend]

    def _variation(self, task: TaskSpec, facts: AdvisoryFacts, calls: list[ToolCall | None]) -> CheckResult:
        reasons = []
        for variant in facts.variants:
            world = copy.deepcopy(task.initial_state)
            world["catalog"].update(copy.deepcopy(variant.products))
            variant_task = TaskSpec.model_validate({**task.model_dump(), "initial_state": world, "task_id": ""})
            result = _invariants(facts, self.final_state(variant_task, calls), task.initial_state["catalog"])
            reasons += [f"{variant.name}: {r}" for r in result.reasons]
        return CheckResult(passed=not reasons, reasons=reasons)


def _disclosed_share(state: dict[str, Any], pid: str) -> float:
    """The share of `pid`'s required disclosures given, each stating its term (times 0.25)."""
    product = state["catalog"][pid]
    need = required_disclosures(product)
    given = [d for d in state["disclosures"] if d["product_id"] == pid]
    done = [t for t in need if any(d["topic"] == t for d in given)
            and not any(d["topic"] == t and disclosure_problem(t, d["text"], product) for d in given)]
    return 0.25 * len(done) / len(need)


def _invariants(facts: AdvisoryFacts, state: dict[str, Any], terms: dict[str, dict] | None = None) -> CheckResult:
    incomplete, violations = judge(facts, state, terms)
    return CheckResult(passed=not incomplete and not violations, reasons=incomplete + violations)


def _observation(facts: AdvisoryFacts, steps: list[Step]) -> CheckResult:
    """Success as the agent saw it: the client's replies told every fact before an accepted
    recommendation; the accepted record echoes the facts; accepted disclosures cover the
    recommended product, whose terms as shown suit the client (or, for "none", every product of
    the wanted kind shown to it did not suit)."""
    profile = facts.profile.model_dump()
    heard: set[str] = set()
    shown: dict[str, dict] = {}
    disclosed: set[tuple[str, str]] = set()
    record = recommended = None
    for step in steps:
        result = tool_result(step.result) if step.tool_call else None
        if result is None:
            continue
        name = step.tool_call.name
        if name == "respond" and recommended is None:
            heard |= {t for t, f in facts.persona.facts.items() if t in TOPICS and f.value in str(result.get("client"))}
        elif name == "list_products":
            shown.update({p.get("product_id"): p for p in result.get("products", []) if isinstance(p, dict)})
        elif name == "get_product":
            shown[result.get("product_id")] = result
        elif name == "record_suitability":
            record = result.get("recorded")
        elif name == "disclose":
            disclosed.add((result.get("product_id"), result.get("disclosed")))
        elif name == "recommend":
            recommended = result.get("recommended")
    reasons = [f"saw no reply telling the client's {t.replace('_', ' ')}" for t in TOPICS if t not in heard]
    if record != profile:
        reasons.append(f"saw the record {json.dumps(record)}, not the client's profile")
    if recommended is None:
        return CheckResult(passed=False, reasons=reasons + ["saw no accepted recommendation"])
    if recommended == NONE:
        fitting = [pid for pid, p in shown.items() if p.get("kind") == facts.kind
                   and not unsuitable_reasons({**p, "product_id": pid}, profile, facts.kind)]
        if fitting or not shown:
            reasons.append(f"said none suits, having seen {fitting or 'no products'}")
    elif recommended not in shown:
        reasons.append(f"recommended {recommended} without seeing its terms")
    else:
        product = shown[recommended]
        reasons += unsuitable_reasons(product, profile, facts.kind)
        reasons += [f"saw no disclosure of {t} for {recommended}" for t in required_disclosures(product)
                    if (recommended, t) not in disclosed]
    return CheckResult(passed=not reasons, reasons=reasons)
