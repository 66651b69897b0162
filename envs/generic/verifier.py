"""Outcome verifier and progress potential of a YAML domain (one class per domain, made on
first use as `envs.generic.verifier:<Name>Verifier`).

It judges states, never text: the agent's calls are replayed on a fresh env of the domain from
the task's initial state, and the task's outcome rules (state predicates in its hidden facts) are
evaluated on the final state. Three checks of the outcome: `observation` (every state-changing
call of the reference was accepted, as the agent saw it, and the episode was ended by an
accepted call), `invariants` (every outcome rule holds on the final hidden state, and the state
is as the reference leaves it: nothing else changed), `hidden_variation` (the same calls replayed
on each hidden variant of the world, the declared ones and the world listed in reverse order,
meet the same rules and match the reference replayed there). The potential is the share of
outcome rules that hold, and after the ending the state's verdict (1 or 0)."""

from __future__ import annotations

import threading
from typing import Any

from gymfoundry.envs.family import family
from gymfoundry.envs.generic.domain import DOMAINS
from gymfoundry.envs.generic.expr import evaluate, truth
from gymfoundry.envs.generic.facts import GenericFacts
from gymfoundry.envs.generic.rules import failed_rules, held, state_diff, variant_worlds
from gymfoundry.envs.generic.world import class_name
from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall, ToolCategory
from gymfoundry.envs.scripted import tool_result
from gymfoundry.envs.verifier import ReplayVerifier, calls_of

_CLASSES: dict[str, type] = {}
GOLD_KEPT = 512
_GOLD: dict[str, tuple] = {}  # task id -> its gold replays (see DomainVerifier._gold)
_GOLD_LOCK = threading.Lock()


class DomainVerifier(ReplayVerifier):
    # Bump when a verdict or the potential changes; `gymfoundry reverify` re-judges stored rollouts.
    # 2: after the ending, Phi follows the state's verdict.
    version = "2"

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        facts, calls = self.facts(task), calls_of(steps)
        final = self.final_state(task, calls) if final_state is None else final_state
        failing = failed_rules(facts, task.initial_state, final)
        gold, variants = self._gold(task)
        changed = state_diff(final, gold, self.domain.compare)
        checks = {"observation": self._observation(task, steps),
                  "invariants": CheckResult(passed=not failing and not changed, reasons=failing + changed),
                  "hidden_variation": self._variation(facts, variants, calls)}
        verdicts = {"completed": not failing, "no_side_effects": not changed, "no_regression": True,
                    "no_constraint_violation": True}
        success = all(verdicts[rule] for rule in family(self.family).profile.outcome_rules)
        reasons = failing + changed
        for name in ("invariants", "hidden_variation"):
            if success and not checks[name].passed:  # a success holds in the hidden state and on every variant
                success = False
                reasons += [f"{name}: {r}" for r in checks[name].reasons]
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=not failing, regression=False, constraint_violation=False,
                             side_effects=changed, reasons=reasons, checks=checks)

    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Phi in [0, 1]: the share of the task's outcome rules that hold on the state; once the
        episode has ended, what the state's verdict says: 1.0 where every rule holds and nothing
        else changed (as `invariants` judges), else 0.0, so a wrong ending earns no progress."""
        facts = self.facts(task)
        share = held(facts, task.initial_state, state) / len(facts.outcome)
        if not truth(self.domain.finish_when, {"state": state}):
            return round(share, 6)
        return 1.0 if share == 1 and not state_diff(state, self._gold(task)[0], self.domain.compare) else 0.0

    def precondition(self, task: TaskSpec) -> str | None:
        """A task whose rules all hold before any action is no exercise."""
        facts = self.facts(task)
        if not failed_rules(facts, task.initial_state, self.initial_state(task)):
            return "every outcome rule already holds on the initial state"
        return None

    def _observation(self, task: TaskSpec, steps: list[Step]) -> CheckResult:
        tools = self.domain.tools
        wanted = [c for c in task.hidden.reference if tools[c.name].category != ToolCategory.read]
        accepted = [s.tool_call for s in steps if s.tool_call is not None and s.error is None
                    and tool_result(s.result or "") is not None]
        i = 0
        for call in accepted:
            if i < len(wanted) and call.name == wanted[i].name and call.arguments == wanted[i].arguments:
                i += 1
        reasons = [f"saw no accepted {c.name}({c.arguments})" for c in wanted[i:]]
        last = steps[-1] if steps else None
        if last is None or last.error is not None or last.tool_call is None or \
                tools[last.tool_call.name].category != ToolCategory.irreversible:
            reasons.append("the episode was not ended by an accepted final call")
        return CheckResult(passed=not reasons, reasons=reasons)

    def _variation(self, facts: GenericFacts, variants: list[tuple], calls: list[ToolCall | None]) -> CheckResult:
        reasons = []
        for name, variant, gold in variants:
            final = self.final_state(variant, calls)
            reasons += [f"{name}: {r}" for r in failed_rules(facts, variant.initial_state, final)
                        + state_diff(final, gold, self.domain.compare)]
        return CheckResult(passed=not reasons, reasons=reasons)

    def _gold(self, task: TaskSpec) -> tuple[dict[str, Any], list[tuple[str, TaskSpec, dict[str, Any]]]]:
        """The reference's final state, and each hidden variant's task with the reference's final
        state there: replays of the task's own content (its id is its content hash), kept for the
        tasks judged last."""
        hit = _GOLD.get(task.task_id)
        if hit is None:
            variants = []
            for name, world in variant_worlds(self.facts(task), task.initial_state):
                variant = TaskSpec.model_validate({**task.model_dump(), "initial_state": world, "task_id": ""})
                variants.append((name, variant, self.final_state(variant, variant.hidden.reference)))
            hit = (self.final_state(task, task.hidden.reference), variants)
            with _GOLD_LOCK:  # rollouts are judged on many threads
                _GOLD[task.task_id] = hit
                while len(_GOLD) > GOLD_KEPT:
                    _GOLD.pop(next(iter(_GOLD)))
        return hit


def domain_verifier(domain: Any) -> type[DomainVerifier]:
    """A new verifier class `<Name>Verifier` for a domain being loaded (found by name afterwards)."""
    name = class_name(domain.name, "Verifier")
    namespace: dict[str, Any] = {"domain": domain, "family": domain.name, "verifier_id": f"{domain.name}-outcome",
                                 "__module__": __name__}
    if any(t.crafted for t in domain.tasks.values()):
        namespace["crafted_disagreement"] = _crafted
    cls = type(name, (DomainVerifier,), namespace)
    cls.__qualname__ = name
    _CLASSES[name] = cls
    return cls


def verifier_class(name: str) -> type[DomainVerifier]:
    """The verifier class named `<Name>Verifier` of a loaded domain."""
    if name not in _CLASSES:
        match = [d for d, _ in DOMAINS.values() if class_name(d.name, "Verifier") == name]
        if not match:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r} (no loaded domain has that verifier)")
        domain_verifier(match[0])
    return _CLASSES[name]


def _crafted(self: DomainVerifier, task: TaskSpec) -> list[ToolCall] | None:
    """The reference with the template's `crafted` calls before its last one (None if it has none)."""
    facts = self.facts(task)
    template = self.domain.tasks[facts.template]
    if not template.crafted:
        return None
    extra = [ToolCall(name=s.tool, arguments=evaluate(s.args, facts.params)) for s in template.crafted
             if s.when is None or evaluate(s.when, facts.params) is True]
    *calls, last = task.hidden.reference
    return [*calls, *extra, last]


def __getattr__(name: str) -> type:
    return verifier_class(name)
