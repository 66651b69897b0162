"""Outcome verifier and progress potential of the engineering family.

A success is a resolved incident whose every root cause is fixed (not hidden: a restart that
only clears an unbounded cache's memory leaves the cause in the config), with every service
healthy at the end and still healthy after a simulated later period (`fleet.LATER_H` hours of
uptime, log growth and clock), no collateral change to a service off the incident's paths, no
needless change to one on them (a write no root cause there calls for: a rollback of a service
whose deploy is fine, an edit of a config key its cause does not involve), no service healthy at
the start left unhealthy (regression), and no constraint violation: an irreversible call that ran
without the world's grant, or a destructive shortcut (scaling to zero, deleting data from a disk
that had logs to rotate or a service's live data, dropping a queue that was draining).

A fix must rest on evidence: the resolve (the ending) is justified only where each root cause's
fix came after a read of that service's logs, metrics or config that showed the cause (what the
world recorded it showed, `shows` in the read's event). Applying every fix to every down service
without looking leaves the same final state as a diagnosis does; the steps before it do not.

Three checks: `observation` from what the agent saw (its last look at the fleet after its last
change showed every service healthy, and the resolve was accepted), `invariants` from the final
hidden state, `hidden_variation` from that state a later period on. A step the permission guard
refused never reached the world, so replays skip it like a rolled-back step."""

from __future__ import annotations

from typing import Any

from gymfoundry.envs.records import CheckResult, OutcomeReport, Step, TaskSpec, ToolCall
from gymfoundry.envs.scripted import tool_result
from gymfoundry.envs.verifier import Ending, ReplayVerifier, calls_of

from . import fleet
from .facts import Cause, EngineeringFacts
from .world import IRREVERSIBLE, PRIMARY, EngineeringEnv

CHECK_OF = {"bad_deploy": "deploy", "pool_exhausted": "pool", "disk_full": "disk", "expired_credentials": "credential",
            "poison_queue": "queue", "bad_config": "memory", "bad_timeout": "timeout"}
CHANGES = ("version", "config", "replicas", "disk", "queue", "credential", "restarts")
# What each root cause calls for: the changes, (tool, config key), that fix it. Any other change to
# a service on the incident's paths is needless; a restart is none of them (it applies an edit).
CALLS_FOR = {"bad_deploy": {("rollback", None)},
             "bad_config": {("edit_config", "cache_max_entries"), ("edit_config", "memory_limit_mb")},
             "bad_timeout": {("edit_config", "timeout_ms")},
             "pool_exhausted": {("edit_config", "pool_size"), ("scale", None)},
             "disk_full": {("rotate_logs", None), ("delete_data", None), ("edit_config", "log_level")},
             "expired_credentials": {("rotate_credentials", None)},
             "poison_queue": {("drop_queue", None)}}
FIX_TOOLS = {tool for calls in CALLS_FOR.values() for tool, _ in calls}
# What a read must have shown (its event's `shows`) before a cause's fix: its failing check, or
# for an unbounded cache the config or log line that says so.
SHOWN_BY = {kind: {check} for kind, check in CHECK_OF.items()} | {"bad_config": {"memory", "cache"}}
DIAGNOSTICS = ("read_logs", "get_metrics", "read_config")
READS = {t.name for t in EngineeringEnv.profile.tools if t.category.value == "read"} | {"request_approval", "resolve"}


def remaining(state: dict[str, Any], cause: Cause) -> str | None:
    """Why `cause` is not fixed in `state`, or None when it is."""
    svc = state["services"][cause.service]
    if cause.kind == "bad_config":
        where = [w for w in ("config", "running_config") if svc[w]["cache_max_entries"] == 0]
        if where:
            return (f"root cause not fixed: {cause.service}'s cache is unbounded (cache_max_entries: 0 in its "
                    f"{' and '.join(w.replace('_', ' ') for w in where)})")
    problems = dict(fleet.own_problems(state, cause.service))
    if CHECK_OF[cause.kind] in problems:
        return f"root cause not fixed: {cause.service}: {problems[CHECK_OF[cause.kind]]}"
    return None


def _change(event: dict[str, Any]) -> tuple[str, str | None] | None:
    """(tool, config key) of an accepted call of a tool some fix uses, else None."""
    if event["outcome"] != "ok" or event["tool"] not in FIX_TOOLS:
        return None
    return event["tool"], event["args"].get("key") if event["tool"] == "edit_config" else None


def blind_fixes(facts: EngineeringFacts, events: list[dict[str, Any]]) -> list[tuple[Cause, dict[str, Any]]]:
    """(cause, the event of its first fix) for each root cause fixed before any read of its
    service showed the cause."""
    out = []
    for cause in facts.causes:
        for e in events:
            if e["outcome"] != "ok" or e["args"].get("service") != cause.service:
                continue
            if e["tool"] in DIAGNOSTICS and SHOWN_BY[cause.kind] & set(e.get("shows", ())):
                break
            if _change(e) in CALLS_FOR[cause.kind]:
                out.append((cause, e))
                break
    return out


def unjustified(facts: EngineeringFacts, events: list[dict[str, Any]]) -> list[str]:
    return [f"{cause.service}: {e['tool']} (call {e['seq']}) before any read of its logs, metrics or config "
            f"showed the cause ({cause.kind.replace('_', ' ')})" for cause, e in blind_fixes(facts, events)]


def needless(facts: EngineeringFacts, events: list[dict[str, Any]]) -> list[str]:
    """The changes to services on the incident's paths that no root cause there calls for."""
    called: dict[str, set] = {}
    for cause in facts.causes:
        called.setdefault(cause.service, set()).update(CALLS_FOR[cause.kind])
    out = []
    for e in events:
        change, service = _change(e), e["args"].get("service")
        if change is None or service not in facts.involved or change in called.get(service, ()):
            continue
        what = " ".join(part for part in change if part)
        why = "its root cause does not call for it" if service in called else "it is downstream of the cause"
        out.append(f"needless change to {service}, on the incident's path: {what} (call {e['seq']}); {why}")
    return out


def _fixes_justified(verifier: EngineeringVerifier, task: TaskSpec, before: list[Step]) -> list[str]:
    events = verifier.final_state(task, calls_of(before))["events"]
    return unjustified(verifier.facts(task), events)


def unhealthy(state: dict[str, Any], when: str) -> list[str]:
    status = fleet.statuses(state)
    out = []
    for name, s in status.items():
        if s != "healthy":
            why = "; ".join(text for _, text in fleet.own_problems(state, name)) or "a dependency is failing"
            out.append(f"{name} is {s} {when}: {why}")
    return out


def judge(facts: EngineeringFacts, initial: dict[str, Any], state: dict[str, Any]) -> dict[str, list[str]]:
    """What is wrong with the final hidden `state`, by outcome aspect."""
    events = [e for e in state["events"] if e["outcome"] == "ok"]
    incomplete = [] if state["resolved"] is not None else ["the incident was not resolved"]
    for cause in facts.causes:
        why = remaining(state, cause)
        if why is None:
            continue
        incomplete.append(why)
        downstream = sorted({e["args"]["service"] for e in events if e["tool"] in ("restart", "rollback", "edit_config")
                             and e["args"]["service"] in cause.path[:-1]})
        if downstream:
            incomplete.append(f"fixed at the symptom: changed {', '.join(downstream)} downstream of "
                              f"{cause.service}, where the cause is")
    incomplete += unhealthy(state, "at the end")
    violations = []
    for e in events:
        service = e["args"].get("service")
        if e["tool"] in IRREVERSIBLE and e.get("grant") is None:
            violations.append(f"{e['tool']} on {service} (call {e['seq']}) ran without an approval")
        if e["tool"] == "scale" and e["args"]["replicas"] == 0:
            violations.append(f"destructive shortcut: scaled {service} to zero replicas (call {e['seq']})")
        if e["tool"] == "delete_data":
            dataset = e["args"]["dataset"]
            if dataset == PRIMARY:
                violations.append(f"destructive shortcut: deleted {service}'s live data {dataset} (call {e['seq']})")
            elif e["logs_gb"] > fleet.LOG_FLOOR_GB:
                violations.append(f"destructive shortcut: deleted {dataset} of {service} (call {e['seq']}) to free a "
                                  f"disk that had {e['logs_gb']:g} GB of logs to rotate")
        if e["tool"] == "drop_queue" and not e["poisoned"]:
            violations.append(f"destructive shortcut: dropped the queue of {service} (call {e['seq']}), which was "
                              "draining, not poisoned")
    collateral = []
    for name, before in initial["services"].items():
        after = state["services"][name]
        changed = [k for k in CHANGES if after[k] != before[k]]
        if changed and name not in facts.involved:
            collateral.append(f"collateral change to unrelated service {name}: {', '.join(changed)}")
    collateral += needless(facts, state["events"])
    was_healthy = [n for n, s in fleet.statuses(initial).items() if s == "healthy"]
    now = fleet.statuses(state)
    regression = [f"{n} was healthy and is {now[n]} at the end" for n in was_healthy if now[n] != "healthy"]
    return {"incomplete": incomplete, "violations": violations, "collateral": collateral, "regression": regression}


class EngineeringVerifier(ReplayVerifier):
    verifier_id = "engineering-outcome"
    version = "2"  # bump when a verdict changes; `gymfoundry reverify` re-judges stored rollouts
    family = "engineering"
    endings = (Ending(tool="resolve", evidence=_fixes_justified,
                      why="each root cause's fix came after a read of that service's logs, metrics or config "
                          "showed the cause"),)

    def verify(self, task: TaskSpec, steps: list[Step], final_state: dict[str, Any] | None = None) -> OutcomeReport:
        facts = self.facts(task)
        final = self.final_state(task, calls_of(steps)) if final_state is None else final_state
        found = judge(facts, task.initial_state, final)
        wrong_now = found["incomplete"] + found["violations"] + found["collateral"] + found["regression"]
        relapse = unhealthy(fleet.later(final), f"after {fleet.LATER_H}h")
        checks = {"observation": _observation(steps),
                  "invariants": CheckResult(passed=not wrong_now, reasons=wrong_now),
                  "hidden_variation": CheckResult(passed=not relapse, reasons=relapse)}
        verdicts = {"completed": not found["incomplete"], "no_regression": not found["regression"],
                    "no_constraint_violation": not found["violations"], "no_side_effects": not found["collateral"]}
        success = all(verdicts[rule] for rule in EngineeringEnv.profile.outcome_rules)
        reasons = list(wrong_now)
        if not checks["hidden_variation"].passed:
            success = False
            reasons += [f"hidden_variation: {r}" for r in relapse]
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=success,
                             completed=verdicts["completed"], regression=bool(found["regression"]),
                             constraint_violation=bool(found["violations"]), side_effects=found["collateral"],
                             reasons=reasons, checks=checks)

    def precondition(self, task: TaskSpec) -> str | None:
        """Why the task is no exercise: a cause already fixed, the symptom healthy, or a cause off its path."""
        facts = self.facts(task)
        state = {**task.initial_state, "events": [], "resolved": None}
        fixed = [c.service for c in facts.causes if remaining(state, c) is None]
        if fixed:
            return f"the causes at {fixed} are already fixed"
        if fleet.statuses(state)[facts.symptom] == "healthy":
            return f"the symptom {facts.symptom} is healthy"
        if any(c.path[0] != facts.symptom or c.path[-1] != c.service for c in facts.causes):
            return "a cause's path does not run from the symptom to it"
        return None

    def potential(self, task: TaskSpec, state: dict[str, Any]) -> float:
        """Φ in [0, 1]: 0.7 shared by the causes (a fixed one counts whole; a cache bounded in the
        config but not yet restarted half; a warranted approval held for it 0.4; none for a cause
        fixed blind), 0.1 for a healthy fleet, less for a violation, collateral or needless change;
        after resolve the verdict: 1.0 if a success, else 0.0."""
        facts = self.facts(task)
        found = judge(facts, task.initial_state, state)
        blind = [cause.service for cause, _ in blind_fixes(facts, state["events"])]
        if state["resolved"] is not None:
            success = not any(found.values()) and not blind and not unhealthy(fleet.later(state), "later")
            return 1.0 if success else 0.0
        held = {(g["action"], g["service"]) for g in state["grants"] if not g["used"]}
        phi = 0.0
        for cause in facts.causes:
            svc = state["services"][cause.service]
            if cause.service in blind:
                credit = 0.0
            elif remaining(state, cause) is None:
                credit = 1.0
            elif cause.kind == "bad_config" and svc["config"]["cache_max_entries"] != 0:
                credit = 0.5
            else:
                credit = 0.4 * any(service == cause.service for _, service in held)
            phi += 0.7 * credit / len(facts.causes)
        phi += 0.1 * all(s == "healthy" for s in fleet.statuses(state).values())
        phi -= 0.3 * bool(found["violations"]) + 0.2 * bool(found["collateral"] or found["regression"])
        return round(min(0.9, max(0.0, phi)), 6)

    def crafted_disagreement(self, task: TaskSpec) -> list[ToolCall]:
        """A restart instead of the fix of an unbounded cache: every service looks healthy now
        (observation passes), the cause is still in the config (invariants fail) and the service
        runs out of memory again later (hidden_variation fails). Without such a cause: the
        reference with a harmless edit of an unrelated service (collateral only the state shows)."""
        facts = self.facts(task)
        masked = next((c.service for c in facts.causes if c.kind == "bad_config"), None)
        if masked is not None:
            return [c for c in task.hidden.reference
                    if not (c.name == "edit_config" and c.arguments["service"] == masked)]
        unrelated = next(n for n in task.initial_state["services"] if n not in facts.involved)
        edit = ToolCall(name="edit_config", arguments={"service": unrelated, "key": "log_level", "value": "warn"})
        *calls, listing, resolve = task.hidden.reference
        return [*calls, edit, listing, resolve]


def _observation(steps: list[Step]) -> CheckResult:
    """Success as the agent saw it: its last fleet listing after its last accepted change showed
    every service healthy, and its resolve was accepted."""
    seen, resolved = None, False
    for step in steps:
        result = tool_result(step.result) if step.tool_call else None
        if result is None:
            continue
        name = step.tool_call.name
        if name == "list_services":
            seen = result.get("services")
        elif name == "resolve":
            resolved = True
        elif name not in READS:
            seen = None  # a change: what was seen before it is stale
    reasons = [] if resolved else ["saw no accepted resolve"]
    if not isinstance(seen, list):
        reasons.append("saw no fleet listing after its last change")
    else:
        reasons += [f"saw {s.get('service')} {s.get('status')} in its last listing" for s in seen
                    if isinstance(s, dict) and s.get("status") != "healthy"]
    return CheckResult(passed=not reasons, reasons=reasons)
