"""The family conformance checker: `check_family(name)` (CLI `gymfoundry check-family NAME`), what
Gymnasium's `check_env` is for one env, for a whole family — its generator, references, verifier,
scripted policy, tools and runtime. Every registered family passes it in `make test`.

Each check is named and reports pass or fail with a message that says what to fix; a family may
declare a check not applicable with a reason (`not_applicable = {check name: reason}` on its
verifier or env class), and a check whose input the family does not provide yet says so
(`missing`, not a failure). The checks:

- generation: `generate_task(seed, level)` is deterministic (in this interpreter and in a fresh
  one with another hash seed), covers levels 1-5, and gives valid tasks of this family and env id
- reference: every reference trajectory succeeds at every level, through the real env and the
  outcome verifier, with the verifier's precondition holding before any action
- potential: the verifier's `potentials(task, steps)` is defined (finite) at every step of every
  reference, never falls, and ends higher than it starts
- scripted_rollouts: the family's scripted policy (its `Family`) gives a mix of outcomes,
  no env bug, and never shows a hidden value (envs.leaks) in any observation
- malformed_actions: invalid JSON, an unknown tool, wrong argument types and an oversized argument
  give error observations of the agent-input kinds (envs.errors), the state unchanged
- tools_agree: the profile, the tool handlers, the tasks' allowed tools, the goal's tool hint and
  the env's function schemas name the same tools with the same arguments
- gymnasium: `gymnasium.utils.env_checker.check_env` passes on `gymnasium.make(env_id)`
- verifier_checks: the outcome report carries the three checks (observation, invariants,
  hidden_variation), each passing on every reference
- crafted_disagreement: on the rollout the family crafts (`crafted_disagreement(task)` on its
  verifier or env class: the calls, or None for a task that admits none), the checks disagree
- fuzz: hostile arguments for every tool (within and outside the schema) and hostile action texts
  never crash env code (`env_bug`), never fault, and refused input leaves the state as it was

The fuzz generator below is the one tests/envs/test_fuzz.py runs too."""

from __future__ import annotations

import inspect
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymfoundry.envs.base import AgentEnv
from gymfoundry.envs.errors import AGENT_INPUT, RESERVED, ErrorKind, rolled_back
from gymfoundry.envs.family import Family, family
from gymfoundry.envs.leaks import find_leaks
from gymfoundry.envs.records import LEVELS, OutcomeReport, Step, TaskSpec, ToolCall, check_task
from gymfoundry.envs.timestep import EpisodeEnd
from gymfoundry.envs.wrappers import standard_stack

__all__ = ["CHECKS", "Check", "CheckReport", "check_family", "fuzz_action_texts", "fuzz_tools"]

THREE_CHECKS = ("observation", "invariants", "hidden_variation")
MAX_LISTED = 5  # problems quoted in a message; the rest are counted


@dataclass
class Check:
    """One named check: `status` is pass, fail, n/a (the family declared it not applicable) or
    missing (the family does not provide what it needs yet; not a failure)."""

    name: str
    status: str
    message: str
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status == "fail"


@dataclass
class CheckReport:
    family: str
    env_id: str
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.failed]

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def render(self) -> str:
        verdict = "passes" if self.ok else f"FAILS {len(self.failures)} check(s)"
        lines = [f"family {self.family} ({self.env_id}) {verdict} in {self.seconds:.1f}s"]
        for c in self.checks:
            lines.append(f"  {c.status.upper():<7} {c.name:<21} {c.seconds:5.1f}s  {c.message}")
        return "\n".join(lines)

    __str__ = render


class _Fail(Exception):
    """Raised inside a check: the message says what is wrong and what to fix."""


class _Skip(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _listed(problems: list[str]) -> str:
    more = f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return "; ".join(problems[:MAX_LISTED]) + more


# -- the family under check ----------------------------------------------------------------------
class _Family:
    """What the checks share: the family's handle, the generated tasks and the reference
    episodes (each computed once, on first use)."""

    def __init__(self, fam: Family, seeds: int, mistake_rate: float | None):
        self.handle, self.env_id, self.name = fam, fam.env_id, fam.name
        self.seeds, self.mistake_rate = seeds, mistake_rate
        self.env_class = fam.env
        self._tasks: dict[tuple[int, int], TaskSpec] | None = None
        self._references: dict[tuple[int, int], _Episode] | None = None

    def verifier(self) -> Any:
        if self.handle.verifier is None:
            raise _Fail(f"{self.env_id} declares no outcome verifier: pass verifier=<class> to Family(...)")
        try:
            return self.handle.outcome_verifier
        except Exception as exc:
            raise _Fail(f"the verifier {self.handle.verifier} cannot be built: {type(exc).__name__}: {exc}") from exc

    def declared(self, attr: str) -> Any:
        """A family declaration, looked up on its `Family` spec, its verifier, then its env class."""
        owners: list[Any] = [self.handle]
        try:
            owners.append(self.handle.outcome_verifier)
        except Exception:  # the checks that need the verifier say why it cannot be built
            pass
        owners.append(self.env_class)
        return next((getattr(o, attr) for o in owners if getattr(o, attr, None) is not None), None)

    def not_applicable(self, check: str) -> None:
        reason = (self.declared("not_applicable") or {}).get(check)
        if reason:
            raise _Skip("n/a", f"declared not applicable by {self.name}: {reason}")

    def generate(self, seed: int, level: int) -> TaskSpec:
        return self.env_class.generate_task(seed, level)

    @property
    def tasks(self) -> dict[tuple[int, int], TaskSpec]:
        if self._tasks is None:
            self._tasks = {(s, lv): self.generate(s, lv) for lv in LEVELS for s in range(self.seeds)}
        return self._tasks

    @property
    def references(self) -> dict[tuple[int, int], _Episode]:
        if self._references is None:
            self._references = {key: play(self.handle, task, task.hidden.reference)
                                for key, task in self.tasks.items()}
        return self._references


@dataclass
class _Episode:
    steps: list[Step]
    terminated: bool
    outcome: OutcomeReport | None
    problem: str | None  # why the calls did not play out (an error, an early end), else None


def play(fam: Family, task: TaskSpec, calls: Iterable[ToolCall]) -> _Episode:
    """Play `calls` through the family's env (with its outcome verifier) and read the outcome."""
    env = fam.make()
    calls, problem, ts = list(calls), None, None
    try:
        env.reset(task=task)
        for i, call in enumerate(calls):
            ts = env.step(call)
            error = ts.error
            if error and problem is None:
                problem = f"step {i} ({call.name}) failed: {error['kind']}: {error['message'][:200]}"
            if ts.done and i < len(calls) - 1:
                problem = problem or f"the episode ended at step {i} of {len(calls)}"
                break
        steps = list(getattr(env, "steps", []))
        end = ts.end if ts is not None else EpisodeEnd()
        if end.verifier_error is not None:
            problem = problem or f"the outcome verifier raised {end.verifier_error}"
        outcome = OutcomeReport.model_validate(end.outcome) if end.outcome is not None else None
        if outcome is None and problem is None and steps:  # not ended by the calls: ask the verifier
            outcome = fam.outcome_verifier.verify(task, steps, env.state())
        return _Episode(steps, bool(ts and ts.terminated), outcome, problem)
    finally:
        env.close()


# -- the checks ----------------------------------------------------------------------------------
def check_generation(fam: _Family) -> str:
    problems = []
    for (seed, level), task in fam.tasks.items():
        again = fam.generate(seed, level)
        if again.model_dump(mode="json") != task.model_dump(mode="json"):
            diff = sorted(k for k, v in task.model_dump(mode="json").items() if again.model_dump(mode="json")[k] != v)
            problems.append(f"generate_task({seed}, {level}) differs between two calls (fields {', '.join(diff)}): "
                            "seed every random choice from (seed, level, version), e.g. "
                            "random.Random(content_hash([...]))")
        problems += _task_problems(fam, task, seed, level)
    for level in LEVELS:
        ids = {fam.tasks[(s, level)].task_id for s in range(fam.seeds)}
        if fam.seeds > 1 and len(ids) == 1:
            problems.append(f"level {level}: every seed gives the same task; the seed must vary it")
    if problems:
        raise _Fail(_listed(problems))
    fresh = _fresh_interpreter_ids(fam)
    return (f"{len(fam.tasks)} tasks (seeds 0..{fam.seeds - 1} x levels 1-5) deterministic and valid; {fresh}")


def _task_problems(fam: _Family, task: TaskSpec, seed: int, level: int) -> list[str]:
    where = f"generate_task({seed}, {level})"
    try:
        check_task(task)
    except Exception as exc:
        return [f"{where} is not a valid task: {exc}"]
    problems = []
    if task.difficulty.level != level:
        problems.append(f"{where} says difficulty level {task.difficulty.level}: set Difficulty(level={level})")
    if task.family != fam.env_class.family:
        problems.append(f"{where} is for family {task.family!r}, the env class is {fam.env_class.family!r}")
    if task.env_id != fam.env_id:
        problems.append(f"{where} names env {task.env_id!r}, not {fam.env_id!r}")
    if not task.hidden.reference:
        problems.append(f"{where} has no reference trajectory: the generator must write one")
    return problems


FRESH = """import json, sys
from gymfoundry.envs import UnknownEnv, family
env_id, seeds, levels = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
try:
    gen = family(env_id).env.generate_task
except UnknownEnv:
    print("null")
else:
    print(json.dumps({f"{s},{lv}": gen(s, lv).task_id for lv in levels for s in range(seeds)}))
"""


def _fresh_interpreter_ids(fam: _Family) -> str:
    """Task ids from a fresh interpreter with another hash seed: set or dict-of-hash iteration
    in a generator shows here, never within one process."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONHASHSEED": str(1 + (hash("gymfoundry") & 0xFFFF)),
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", FRESH, fam.env_id, str(fam.seeds), json.dumps(LEVELS)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=root)
    if out.returncode != 0:
        raise _Fail(f"generating in a fresh interpreter failed: {out.stderr.strip()[-400:]}")
    ids = json.loads(out.stdout.strip().splitlines()[-1])
    if ids is None:
        return "not found by discovery in a fresh interpreter, so ids across interpreters not compared"
    differ = [key for key, task in fam.tasks.items() if ids[f"{key[0]},{key[1]}"] != task.task_id]
    if differ:
        raise _Fail(f"generate_task{differ[0]} gives another task in a fresh interpreter (PYTHONHASHSEED differs): "
                    "the generator depends on hash order (iterating a set, hash()); sort before choosing")
    return "the same ids in a fresh interpreter with another hash seed"


def check_reference(fam: _Family) -> str:
    verifier = fam.verifier()
    problems = []
    for (seed, level), task in fam.tasks.items():
        why = _reference_problem(verifier, task, fam.references[(seed, level)])
        if why:
            problems.append(f"level {level} seed {seed}: {why}")
    if problems:
        raise _Fail(f"{len(problems)} of {len(fam.tasks)} references fail: {_listed(problems)} "
                    "(fix the generator's reference or the verifier: every task must be provably solvable)")
    return f"{len(fam.tasks)} references succeed through the env and {type(verifier).__name__}"


def _reference_problem(verifier: Any, task: TaskSpec, episode: _Episode) -> str | None:
    outside = sorted({c.name for c in task.hidden.reference} - set(task.allowed_tools))
    if outside:
        return f"the reference uses tools the task does not allow: {outside}"
    if len(task.hidden.reference) > task.budget.max_steps:
        return f"the reference needs {len(task.hidden.reference)} steps, the budget allows {task.budget.max_steps}"
    reason = verifier.precondition(task) if hasattr(verifier, "precondition") else None
    if reason:
        return f"the verifier's precondition fails: {reason}"
    if episode.problem:
        return episode.problem
    if not episode.terminated:
        return "the reference does not end the episode (its last call must finish it)"
    if episode.outcome is None or not episode.outcome.success:
        reasons = "; ".join(episode.outcome.reasons[:3]) if episode.outcome else "no outcome"
        return f"the verifier says failure: {reasons or 'no reason given'}"
    return None


def check_potential(fam: _Family) -> str:
    verifier = fam.verifier()
    potentials = getattr(verifier, "potentials", None)
    if not callable(potentials):
        raise _Fail(f"{type(verifier).__name__} has no potentials(task, steps) -> [phi_0, ..., phi_n]: without it "
                    "every step's progress reward is 0 (the heaviest rule weight); implement the potential over "
                    "the hidden state")
    problems = []
    for (seed, level), task in fam.tasks.items():
        steps = fam.references[(seed, level)].steps
        why = _potential_problem(potentials(task, steps), steps)
        if why:
            problems.append(f"level {level} seed {seed}: {why}")
    if problems:
        raise _Fail(f"along the reference, {_listed(problems)}")
    return f"rises along all {len(fam.tasks)} references, defined at every step"


def _potential_problem(phi: Any, steps: list[Step]) -> str | None:
    if not isinstance(phi, (list, tuple)) or len(phi) != len(steps) + 1:
        size = len(phi) if isinstance(phi, (list, tuple)) else type(phi).__name__
        return f"potentials returned {size} values for {len(steps)} steps (want one before and one after each step)"
    bad = [i for i, v in enumerate(phi) if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)]
    if bad:
        return f"phi is not a finite number at step {bad[0]} ({phi[bad[0]]!r}): define it on every state"
    falls = [i for i in range(1, len(phi)) if phi[i] < phi[i - 1]]
    if falls:
        i = falls[0]
        return (f"phi falls at step {i - 1} ({steps[i - 1].tool_call.name if steps[i - 1].tool_call else '?'}: "
                f"{phi[i - 1]} -> {phi[i]}): a reference step must never lose progress")
    if phi[-1] <= phi[0]:
        return f"phi ends at {phi[-1]}, not above where it starts ({phi[0]}): progress must show"
    return None


def check_scripted(fam: _Family) -> str:
    if fam.handle.scripted_policy is None:
        raise _Fail(f"{fam.env_id} declares no scripted policy: pass scripted_policy=<class> to Family(...)")
    policy_class = fam.handle.scripted_policy
    outcomes: Counter = Counter()
    problems = []
    for (seed, level), task in fam.tasks.items():
        policy = policy_class() if fam.mistake_rate is None else policy_class(mistake_rate=fam.mistake_rate)
        outcome, why = _scripted_episode(fam.handle, task, policy, seed)
        outcomes[outcome] += 1
        if why:
            problems.append(f"level {level} seed {seed}: {why}")
    mix = ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))
    if problems:
        raise _Fail(_listed(problems))
    if outcomes["success"] == 0 or outcomes["success"] == sum(outcomes.values()):
        raise _Fail(f"no mix of outcomes over {len(fam.tasks)} episodes ({mix}): the scripted policy must succeed "
                    "on some tasks and fail on others (a mistake rate that makes some of its steps wrong)")
    return f"{len(fam.tasks)} episodes: {mix}; no hidden value shown, no env bug"


def _scripted_episode(fam: Family, task: TaskSpec, policy: Any, seed: int) -> tuple[str, str | None]:
    """(outcome: success / failure / truncated, what is wrong or None)."""
    env = standard_stack(fam.make())
    try:
        policy.reset(seed)
        ts = env.reset(task=task)
        first = ts.observation
        while not ts.done:
            ts = env.step(policy.act(ts.observation))
        steps = list(getattr(env, "steps", []))
    finally:
        env.close()
    leaks = find_leaks(task, [first] + [s.observation for s in steps] + [s.result or "" for s in steps])
    if leaks:
        return "failure", f"an observation shows hidden values {leaks}: never render hidden fields or secrets"
    bugs = [s for s in steps if rolled_back(s.error)]
    if bugs:
        return "failure", f"step {bugs[0].index} was an {bugs[0].error}: {bugs[0].result[:300]}"
    end = ts.end
    if end.verifier_error is not None:
        return "failure", f"the outcome verifier raised {end.verifier_error}"
    if end.truncated:
        return "truncated", None
    return ("success" if (end.outcome or {}).get("success") else "failure"), None


def check_malformed(fam: _Family) -> str:
    task = fam.tasks[(0, 1)]
    env = standard_stack(fam.handle.make(verified=False))
    try:
        env.reset(task=task)
        cases = _malformed_cases(env.unwrapped, task)
        problems = [why for label, action, kinds in cases if (why := _malformed_problem(env, label, action, kinds))]
    finally:
        env.close()
    if problems:
        raise _Fail(_listed(problems) + " (bad input must be refused before any tool runs, as an error "
                                         "observation of an agent-input kind from envs.errors)")
    return f"{len(cases)} malformed actions refused with agent-input errors, the state unchanged"


WRONG_TYPE = {"string": 12345, "integer": "one", "number": "one", "boolean": "yes", "array": "x", "object": 1}


def _malformed_cases(env: Any, task: TaskSpec) -> list[tuple[str, Any, set[str]]]:
    tools = [t for t in env.profile.tools if t.name in task.allowed_tools]
    first = tools[0].name
    cases: list[tuple[str, Any, set[str]]] = [
        ("invalid JSON", '{"name": "' + first + '", "arguments": {', {ErrorKind.invalid_json.value}),
        ("an unknown tool", json.dumps({"name": "no_such_tool", "arguments": {}}), {ErrorKind.unknown_tool.value}),
        ("arguments that are not an object", json.dumps({"name": first, "arguments": 5}),
         {ErrorKind.invalid_arguments.value, ErrorKind.invalid_tool_call.value})]
    for tool in tools:
        for arg, schema in tool.parameters.get("properties", {}).items():
            if schema.get("type") in WRONG_TYPE:
                cases.append((f"{tool.name}({arg}=<wrong type>)", json.dumps(
                    {"name": tool.name, "arguments": {arg: WRONG_TYPE[schema["type"]]}}),
                    {ErrorKind.invalid_arguments.value}))
    text_arg = next(((t.name, a) for t in tools for a, s in t.parameters.get("properties", {}).items()
                     if s.get("type") == "string"), None)
    if text_arg:
        big = "x" * (task.budget.max_action_chars + 1)
        cases.append((f"{text_arg[0]}({text_arg[1]}=<{len(big)} chars>)", json.dumps(
            {"name": text_arg[0], "arguments": {text_arg[1]: big}}),
            {ErrorKind.action_too_large.value, ErrorKind.invalid_arguments.value}))
    return cases


def _malformed_problem(env: AgentEnv, label: str, action: Any, kinds: set[str]) -> str | None:
    before = env.state()
    ts = env.step(action)
    error = ts.error or {}
    kind = error.get("kind")
    try:
        observation = json.loads(ts.observation)
    except json.JSONDecodeError:
        observation = None
    if kind not in kinds or kind not in AGENT_INPUT:
        return f"{label} gave error kind {kind!r}, want one of {sorted(kinds)}: {ts.observation[:200]}"
    if not isinstance(observation, dict) or observation.get("ok") is not False:
        return f"{label} gave no error observation ({ts.observation[:200]})"
    if env.state() != before:
        return f"{label} changed the state: a refused input must do nothing"
    if ts.done:
        return f"{label} ended the episode: bad input is an error observation and the episode continues"
    return None


def check_tools(fam: _Family) -> str:
    env = fam.handle.make(verified=False)
    problems = []
    try:
        profile = env.profile
        declared = {t.name: t for t in profile.tools}
        handlers = {n.removeprefix("tool_") for n in dir(type(env)) if n.startswith("tool_")
                    and callable(getattr(type(env), n))}
        problems += [f"profile tool {n!r} has no handler tool_{n}: the env cannot run it"
                     for n in sorted(set(declared) - handlers)]
        problems += [f"handler tool_{n} is not in the profile: declare it, or the agent can never call it"
                     for n in sorted(handlers - set(declared))]
        problems += [p for n in sorted(set(declared) & handlers) for p in _signature_problems(env, declared[n])]
        allowed = {t for task in fam.tasks.values() for t in task.allowed_tools}
        problems += [f"tasks allow {n!r}, which the profile does not declare" for n in sorted(allowed - set(declared))]
        task = fam.tasks[(0, 1)]
        first = env.reset(task=task).observation
        problems += [f"the goal's tool hint never names allowed tool {n!r}: render the hint from the declarations"
                     for n in task.allowed_tools if n not in first]
        if env.available_tools != profile.function_schemas(task.allowed_tools):
            problems.append("available_tools differs from the profile's function schemas of the allowed tools")
    finally:
        env.close()
    if problems:
        raise _Fail(_listed(problems))
    return f"{len(declared)} tools agree across profile, handlers, tasks, hint and schemas"


def _signature_problems(env: Any, tool: Any) -> list[str]:
    """The handler's arguments against the schema. The leading parameters the runtime or a
    decorator passes (the state, an event record) are the required ones before the first that
    the schema names."""
    props = set(tool.parameters.get("properties", {}))
    required = set(tool.parameters.get("required", []))
    params = list(inspect.signature(getattr(env, f"tool_{tool.name}")).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    while params and params[0].name not in props and params[0].default is params[0].empty:
        params.pop(0)
    names = {p.name for p in params}
    needed = {p.name for p in params if p.default is p.empty}
    out = [f"{tool.name}: the profile declares argument {a!r}, tool_{tool.name} does not take it"
           for a in sorted(props - names)]
    out += [f"{tool.name}: tool_{tool.name} needs {a!r}, which the profile does not require"
            for a in sorted(needed - required)]
    return out


def check_gymnasium(fam: _Family) -> str:
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make(fam.env_id)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check_env(env.unwrapped, skip_render_check=True)
            except Exception as exc:
                raise _Fail(f"gymnasium's check_env fails: {type(exc).__name__}: {exc}") from exc
    finally:
        env.close()
    said = sorted({str(w.message)[:160] for w in caught})
    return "gymnasium check_env passes" + (f" (it warned: {_listed(said)})" if said else "")


def check_verifier_checks(fam: _Family) -> str:
    fam.not_applicable("verifier_checks")
    fam.verifier()
    problems, absent = [], Counter()
    for (seed, level), episode in fam.references.items():
        checks = episode.outcome.checks if episode.outcome else {}
        missing = tuple(c for c in THREE_CHECKS if c not in checks)
        if missing:
            absent[(missing, tuple(sorted(checks)))] += 1
        failing = [c for c in THREE_CHECKS if c in checks and not checks[c].passed]
        if failing:
            problems.append(f"level {level} seed {seed}: the reference fails the {failing} check(s): "
                            f"{_listed([r for c in failing for r in checks[c].reasons])}")
    problems = [f"on {n} of {len(fam.references)} references the outcome report has checks {list(has)}, without "
                f"{list(missing)}: report each as a CheckResult in OutcomeReport.checks, or declare "
                "not_applicable = {'verifier_checks': why} on the verifier"
                for (missing, has), n in sorted(absent.items())] + problems
    if problems:
        raise _Fail(_listed(problems))
    return f"{', '.join(THREE_CHECKS)} reported and passing on every reference"


def check_crafted(fam: _Family) -> str:
    fam.not_applicable("crafted_disagreement")
    craft = fam.declared("crafted_disagreement")
    if craft is None:
        raise _Skip("missing", f"{fam.name} provides no crafted rollout: define crafted_disagreement(task) -> "
                               "[ToolCall] | None on its verifier, calls on which its checks disagree (e.g. an "
                               "extra write the agent's observations cannot show), so the checker can show "
                               "the verifier catches it")
    for (seed, level), task in fam.tasks.items():
        calls = craft(task)
        if calls is None:
            continue
        episode = play(fam.handle, task, calls)
        outcome = episode.outcome
        if outcome is None:
            raise _Fail(f"the crafted rollout (level {level} seed {seed}) got no outcome report: {episode.problem}")
        verdicts = {name: c.passed for name, c in outcome.checks.items()}
        if not outcome.disagreement:
            raise _Fail(f"on the crafted rollout (level {level} seed {seed}) the verifier's checks agree "
                        f"({verdicts}): the checks must tell it apart, or the rollout is not the case it claims")
        if outcome.success:
            raise _Fail(f"the crafted rollout (level {level} seed {seed}) is a success although its checks "
                        f"disagree ({verdicts}): a success must pass every check")
        return f"checks disagree on the crafted rollout (level {level} seed {seed}): {verdicts}"
    raise _Fail("crafted_disagreement(task) returned None for every generated task: craft one for some task")


def check_fuzz(fam: _Family) -> str:
    rng = random.Random(f"fuzz:{fam.env_id}")
    task = fam.tasks[(min(3, fam.seeds - 1), 2)]
    env = fam.handle.make(verified=False)
    try:
        tools = fuzz_tools(env, task, rng)
    finally:
        env.close()
    stack = standard_stack(fam.handle.make(verified=False))
    try:
        texts = fuzz_action_texts(stack, task)
    finally:
        stack.close()
    problems = tools.problems + texts.problems
    if problems:
        raise _Fail(f"{len(problems)} of {tools.steps + texts.steps} hostile steps: {_listed(problems)}")
    return f"{tools.steps} hostile tool calls and {texts.steps} hostile action texts, no env bug"


CHECKS: dict[str, Callable[[_Family], str]] = {
    "generation": check_generation, "reference": check_reference, "potential": check_potential,
    "scripted_rollouts": check_scripted, "malformed_actions": check_malformed, "tools_agree": check_tools,
    "gymnasium": check_gymnasium, "verifier_checks": check_verifier_checks,
    "crafted_disagreement": check_crafted, "fuzz": check_fuzz}


def check_family(name: str | Family, *, seeds: int = 3, checks: Iterable[str] | None = None,
                 mistake_rate: float | None = None) -> CheckReport:
    """Run the conformance checks (all, or those named in `checks`) on a family: its handle, or
    a registered family's name or env id. `seeds` tasks per level (seeds 0..seeds-1) are generated,
    replayed and rolled out; `mistake_rate` overrides the scripted policy's default. Never raises
    for what a check finds: see `report.ok` and each check's message."""
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, not {seeds}")
    names = list(CHECKS) if checks is None else list(checks)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    started = time.perf_counter()
    fam = _Family(name if isinstance(name, Family) else family(name), seeds, mistake_rate)
    report = CheckReport(family=fam.name, env_id=fam.env_id)
    for check in names:
        report.checks.append(_run(check, CHECKS[check], fam))
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _run(name: str, fn: Callable[[_Family], str], fam: _Family) -> Check:
    started = time.perf_counter()
    try:
        status, message = "pass", fn(fam)
    except _Fail as exc:
        status, message = "fail", str(exc)
    except _Skip as exc:
        status, message = exc.status, exc.message
    except Exception as exc:  # the family's code raised where the check expected an answer
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        status, message = "fail", (f"the family's code raised {type(exc).__name__}: {exc} "
                                   f"(at {Path(frame.filename).name}:{frame.lineno}) while checking {name}")
    return Check(name, status, message, round(time.perf_counter() - started, 3))


# -- the fuzz generator (tests/envs/test_fuzz.py runs it too) -------------------------------------
DEEP_LIST: list = []
for _ in range(40):
    DEEP_LIST = [DEEP_LIST]
DEEP_DICT: dict = {}
for _ in range(40):
    DEEP_DICT = {"a": DEEP_DICT}
STRINGS = ["", " ", ".", "..", "../..", "a/../../b", "/", "/etc/passwd", "/workspace", "/workspace/../etc",
           "~", "$HOME", "*", "-rf", "\x00", "a\x00b", "\ud800", "x\udfffy", "é🙂\u202e", "\n\r\t", "x" * 600,
           "x" * 30000, "tests/", "./tests", "tests/../..", "NaN"]
NUMBERS = [0, -1, 1, 3.0, 1.5, 2**63, -(2**63) - 1, 10**400, float("nan"), float("inf"), float("-inf"), 1e-300,
           True, False]
OTHERS = [None, [], [""], ["\x00"], ["\ud800"], ["x"] * 300, {}, {"a": 1}, DEEP_LIST, DEEP_DICT]
HOSTILE = STRINGS + NUMBERS + OTHERS
RAW = ["", " ", "{", "}", "{}", "null", "[]", '"text"', "{{}}", '{"name": null}', '{"name": 5}', '{"name": ""}',
       '{"name": "nope"}', "<tool_call>", "<tool_call></tool_call>", "<tool_call>{}</tool_call>" * 2,
       '{"name": "x", "arguments": NaN}', '{"name": "x", "arguments": {"a": Infinity}}',
       '{"name": "x", "arguments": {"a": -Infinity}}', '{"name": "x", "arguments": "{\\"a\\": NaN}"}',
       '{"name": "x", "arguments": "[1"}', '{"name": "x", "arguments": "[]"}', '{"name": "x", "arguments": 7}',
       '{"name": "x", "arguments": {"a": ' + "9" * 5000 + "}}",
       '{"name": "x", "arguments": ' + "[" * 3000 + "]" * 3000 + "}",
       '{"name": "x", "arguments": ' + '{"a":' * 1500 + "1" + "}" * 1500 + "}", '{"function": "x"}',
       '{"function": {"name": ["x"]}}', '{"name": "x", "id": {"a": NaN}}', "\ud800" + '{"name": "x"}',
       '{"name": "\\ud800"}', '{"name": "x", "arguments": {"\\udc00": 1}}', "\x00" * 50, "{" * 9000]
EXECUTE_SAMPLE = 14  # hostile values per argument of a tool that starts a process (each is a sandbox run)
MAX_WORLD_NAMES = 24


@dataclass
class FuzzResult:
    steps: int = 0
    problems: list[str] = field(default_factory=list)


def valid_value(schema: dict) -> Any:
    if "enum" in schema:
        return schema["enum"][0]
    return {"string": "x", "integer": 1, "number": 1.0, "array": ["true"], "boolean": False}.get(schema.get("type"), "x")


def world_names(task: TaskSpec, state: dict[str, Any], rng: random.Random) -> list[str]:
    """Names the world itself uses (ids, keys, paths and their directories): hostile values that
    reach a tool's lookups instead of stopping at the first check."""
    names: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and 0 < len(value) <= 100 and "\n" not in value:
            names.add(value)
            if "/" in value:
                names.add(value.rsplit("/", 1)[0])

    walk(task.initial_state)
    walk({k: v for k, v in state.items() if k != "events"})
    ordered = sorted(names)
    return ordered if len(ordered) <= MAX_WORLD_NAMES else sorted(rng.sample(ordered, MAX_WORLD_NAMES))


def argument_cases(tool: Any, rng: random.Random, names: list[str], reference: list[ToolCall]) -> list[Any]:
    """Hostile variants of the tool's arguments in the reference solution (so each variant gets as
    deep into the tool as one bad argument allows), or of schema-valid placeholders."""
    props = tool.parameters.get("properties", {})
    seen = next((c.arguments for c in reference if c.name == tool.name), {})
    base = {name: seen.get(name, valid_value(schema)) for name, schema in props.items()}
    cases: list[Any] = [{}, {**base, "state": 1}, {**base, "self": 1}, [], "x", 5, ["a"]]
    cases += [{k: v for k, v in base.items() if k != name} for name in props]
    values = HOSTILE + names
    if tool.category.value == "execute":
        values = rng.sample(values, EXECUTE_SAMPLE)
    cases += [{**base, name: value} for name in props for value in values]
    return cases


def step_problem(env: AgentEnv, ts: Any, before: dict[str, Any]) -> str | None:
    """What is wrong with one hostile step, or None: an env bug or fault, an error of a runtime
    kind the tool may not use, an observation that does not say the error, a refused input that
    changed the state, or a step record that does not store and reload exactly."""
    error = ts.error
    if ts.info.get("env_bug") or ts.info.get("env_fault") or (error and rolled_back(error.get("kind"))):
        return f"{(error or {}).get('kind', 'env_bug')}: {ts.observation[:300]}"
    try:
        observation = json.loads(ts.observation)
    except json.JSONDecodeError:
        return f"the observation is not the runtime's JSON: {ts.observation[:200]}"
    if error is None:
        return None if observation.get("ok") is True else f"no error recorded for {ts.observation[:200]}"
    kind = error["kind"]
    if not (kind in AGENT_INPUT or kind not in RESERVED):
        return f"error kind {kind!r} is the runtime's, not the agent's input nor a tool refusal: {ts.observation[:200]}"
    if observation.get("ok") is not False or (observation.get("error") or {}).get("type") != kind:
        return f"the observation does not say the error {kind!r}: {ts.observation[:200]}"
    # Only the runtime gives the reserved agent-input kinds, before any tool runs, so nothing may
    # have changed; a tool may refuse with invalid_arguments or a kind of its own and keep the
    # attempt in its event log.
    if kind in AGENT_INPUT and kind in RESERVED and env.state() != before:
        return f"a refused input ({kind}) changed the state: {ts.observation[:200]}"
    steps = getattr(env, "steps", None)
    if steps:
        step = steps[-1]
        if Step.model_validate_json(step.model_dump_json()) != step:
            return f"step {step.index} does not store and reload exactly"
    return None


def _describe(tool: str, arguments: Any) -> str:
    text = json.dumps(arguments, default=repr, ensure_ascii=True) if not isinstance(arguments, (list, dict)) or \
        len(repr(arguments)) < 2000 else repr(arguments)
    return f"{tool}({text[:120]})"


def fuzz_tools(env: AgentEnv, task: TaskSpec, rng: random.Random) -> FuzzResult:
    """Every tool of the profile called with hostile arguments, from the world as the reference
    leaves it before its episode-ending call; episode-ending tools last, the world restarted
    whenever one ends it."""
    out = FuzzResult()
    reference = task.hidden.reference
    terminal = {t.name for t in env.profile.tools if t.category.value == "irreversible"}
    prefix = [c for c in reference if c.name not in terminal]

    def start() -> None:
        env.reset(task)
        for call in prefix:
            error = env.step(call).error
            if error:
                raise RuntimeError(f"the reference call {call.name} fails: {error['message']}")

    start()
    names = world_names(task, env.state(), rng)
    tools = sorted(env.profile.tools, key=lambda t: t.name in terminal)  # stable: episode-ending ones last
    for tool in tools:
        for arguments in argument_cases(tool, rng, names, reference):
            before = env.state()
            ts = env.step({"name": tool.name, "arguments": arguments})
            out.steps += 1
            why = step_problem(env, ts, before)
            if why:
                out.problems.append(f"{_describe(tool.name, arguments)} -> {why}")
            if ts.done:
                start()
    return out


def fuzz_action_texts(stack: AgentEnv, task: TaskSpec) -> FuzzResult:
    """Hostile raw action texts through the runtime's standard stack: each must be refused as
    agent input (and a step limit that ends the episode restarts it)."""
    out = FuzzResult()
    stack.reset(task)
    tool = stack.unwrapped.profile.tools[0].name
    for text in RAW + [t.replace('"x"', f'"{tool}"') for t in RAW]:
        before = stack.state()
        ts = stack.step(text)
        out.steps += 1
        kind = (ts.error or {}).get("kind")
        why = step_problem(stack, ts, before) or (None if kind in AGENT_INPUT else f"error kind {kind!r}")
        if why is None and getattr(stack, "steps", None) and stack.steps[-1].error != kind:
            why = f"the step records error {stack.steps[-1].error!r}, the observation {kind!r}"
        if why:
            out.problems.append(f"action text {text[:60]!r} -> {why}")
        if ts.done:
            stack.reset(task)
    return out
