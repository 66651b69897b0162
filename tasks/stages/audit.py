"""The gameability audit: family-agnostic adversaries played through the real runtime and
verifier against the oracle (the task's reference), per level.

What is the laziest policy that passes a verdict? The audit plays the usual answers, built only
from the family's declared tools, their argument schemas and categories, and what the goal and
the world's replies show:

- `blind_ending`: a call that ends the episode made at turn 1, before any read (every non-read
  tool tried with the reference's arguments, each enum value and values from the goal; only the
  calls that did end the episode count);
- `do_nothing`: no call at all until the step limit;
- `stall`: a policy slower than the episode clock (its own time is its outcome: it must end as
  a counted model outcome, never as a fault that leaves the statistics);
- `spray`: bounded random walks of schema-valid calls built from what was seen, each ending one
  of the ways the family allows;
- `reference_perturbed`: the reference with one argument of its ending or of one of its writes
  changed (a number moved, an id's number changed, another enum value);
- `reference_no_reads`: the reference without its reads, where it ends by an ending the verifier
  declares evidence for (`envs.verifier.Ending`);
- `collateral`: the reference plus one extra write before its ending that changed the world
  (the reference's own writes aimed at another target it saw, then random writes; a write that
  was refused, changed only `ephemeral_state`, only said free text to a person or is a statement
  the verdict checks, is no collateral): it must fail or be reported as a side effect or
  regression;
- `negated`: where the verifier checks what the agent says (`statements`), the reference with
  one of those texts negated.

An adversary passes a level when its success rate is at most its chance floor (0 unless the
verifier declares one with its reason in `audit_floors`), its mean PRM return (the rule layer's,
summed over the episode's steps) stays below the oracle's, and none of its episodes left the
statistics (a fault or timeout). The oracle must succeed on every task. A family passes when
every row does. `audit_family` returns the rows; `land_audit` stores them in `family_audits`;
`require_audited` is what dataset assembly asks before it uses a family's rollouts.

Limits: the adversaries are generic. They find endings that need no evidence, verdicts blind to
an argument, writes nobody checks, negations nobody reads and time that leaves the statistics;
they do not search for a family's specific loophole (a word the claim scan misses, say): a
family's own hostile tests do that."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gymfoundry.envs.family import family as family_spec, replaced
from gymfoundry.envs.records import MODEL_OUTCOMES, Budget, FamilyAudit, Rollout, TaskSpec, ToolCall, ToolCategory, content_hash
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.stages.score import score_steps
from gymfoundry.envs.verifier import calls_of
from gymfoundry.verifiers.judge import JudgeSettings
from gymfoundry.verifiers.rules import rules_version
from gymfoundry.warehouse.tables import TABLES

ADVERSARIES = ("blind_ending", "do_nothing", "stall", "spray", "reference_perturbed", "reference_no_reads",
               "collateral", "negated")
ORACLE = "oracle"
COUNTED = frozenset(t.value for t in MODEL_OUTCOMES)
DONE_TEXT = "I have nothing more to do."
STALL_CLOCK_S = 0.2   # the stall adversary's episode clock; it sleeps past it
SPRAY_STEPS = 6        # most random calls before a spray ends the episode
PER_TASK = 3           # most variants of one adversary per task
SCAN = 12              # seeds looked at per level for tasks that end in different ways


# -- what the adversaries know: the tools, and words seen ----------------------------------------
@dataclass
class Pool:
    """Values seen so far (the goal, the world's replies): what an agent could put in arguments."""

    strings: list[str] = field(default_factory=list)
    numbers: list[float] = field(default_factory=list)
    text: str = ""

    def see(self, text: str) -> None:
        if not isinstance(text, str):
            return
        self.text = self.text or text[:300]
        try:
            _walk(json.loads(text), self)
        except (ValueError, TypeError, RecursionError):
            pass
        for found in re.findall(r"\"([^\"\n]{1,80})\"|'([^'\n]{1,80})'", text):
            self._string(found[0] or found[1])
        for found in re.findall(r"\b[A-Z][A-Z0-9]{0,5}-?\d{1,7}\b", text):
            self._string(found)
        for found in re.findall(r"(?<![\w.])-?\d{1,15}(?:\.\d{1,15})?(?![\w.])", text)[:200]:
            self._number(float(found))

    def _string(self, value: str) -> None:
        if 0 < len(value) <= 80 and value not in self.strings:
            self.strings.append(value)

    def _number(self, value: float) -> None:
        if math.isfinite(value) and value not in self.numbers:
            self.numbers.append(value)


def _walk(value: Any, pool: Pool, depth: int = 0) -> None:
    if depth > 20:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            pool._string(str(k))
            _walk(v, pool, depth + 1)
    elif isinstance(value, list):
        for v in value[:200]:
            _walk(v, pool, depth + 1)
    elif isinstance(value, bool):
        return
    elif isinstance(value, (int, float)) and abs(value) < 1e15:
        pool._number(float(value))
    elif isinstance(value, str):
        pool._string(value)


def make_value(schema: dict[str, Any], rng: random.Random, pool: Pool) -> Any:
    """A value the schema accepts, drawn from what was seen where one fits."""
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    low, high = schema.get("minimum"), schema.get("maximum")
    if kind in ("integer", "number"):
        fits = [n for n in pool.numbers if (low is None or n >= low) and (high is None or n <= high)
                and (kind == "number" or n == int(n))]
        if fits and rng.random() < 0.8:
            value = rng.choice(fits)
        else:
            value = rng.uniform(low if low is not None else 0, high if high is not None else 10)
        return int(value) if kind == "integer" else round(value, 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        items = schema.get("items", {"type": "string"})
        return [make_value(items, rng, pool) for _ in range(rng.randint(0, 2))][:schema.get("maxItems", 2)]
    if kind == "object":
        return {}
    most, least = schema.get("maxLength", 10_000), schema.get("minLength", 0)
    fits = [s for s in pool.strings if least <= len(s) <= most and _matches(schema.get("pattern"), s)]
    if most >= 200 and rng.random() < 0.5:  # free text: say something of the goal's
        return (pool.text or "Done.")[:most]
    return rng.choice(fits) if fits else "x" * max(1, least)


def _matches(pattern: str | None, text: str) -> bool:
    """Whether `text` fits the schema's pattern (a pattern Python cannot read fits nothing)."""
    if pattern is None:
        return True
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False


def make_call(tool: Any, rng: random.Random, pool: Pool) -> ToolCall:
    params = tool.spec.parameters
    required = set(params.get("required", []))
    arguments = {name: make_value(schema, rng, pool) for name, schema in params.get("properties", {}).items()
                 if name in required or rng.random() < 0.5}
    return ToolCall(name=tool.name, arguments=arguments)


def as_text(call: ToolCall) -> str:
    return json.dumps({"name": call.name, "arguments": call.arguments})


# -- the adversary policies ----------------------------------------------------------------------
class Calls:
    """Plays fixed calls, then says it is done without a call (turn after turn, to the limit)."""

    policy_id = "audit"

    def __init__(self, adversary: str, calls: list[ToolCall], stall_s: float = 0.0):
        self.version, self.calls, self.stall_s = adversary, calls, stall_s
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        self.turn = 0

    def act(self, observation: str) -> str:
        if self.stall_s:
            time.sleep(self.stall_s)
        self.turn += 1
        return as_text(self.calls[self.turn - 1]) if self.turn <= len(self.calls) else DONE_TEXT


class Spray:
    """A bounded random walk of schema-valid calls from what it has seen, then one ending."""

    policy_id = "audit"
    version = "spray"

    def __init__(self, tools: list[Any], ending: ToolCall, pool: Pool, seed: int):
        self.tools, self.ending, self.pool, self.seed = tools, ending, pool, seed
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        self.rng = random.Random(self.seed)
        self.length, self.turn = self.rng.randint(0, SPRAY_STEPS), 0

    def act(self, observation: str) -> str:
        self.pool.see(observation)
        self.turn += 1
        if self.turn <= self.length:
            return as_text(make_call(self.rng.choice(self.tools), self.rng, self.pool))
        if self.turn == self.length + 1:
            return as_text(self.ending)
        return DONE_TEXT


# -- the audit -----------------------------------------------------------------------------------
@dataclass
class Episode:
    adversary: str
    level: int
    task: TaskSpec
    rollout: Rollout
    counts: bool = True  # False: not this adversary's case after all (no ending reached, nothing changed)
    hit: bool | None = None  # the adversary got what it wanted (default: a verified success)


@dataclass
class AuditReport:
    family: str
    rows: list[FamilyAudit]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[FamilyAudit]:
        return [r for r in self.rows if not r.passed]

    def render(self) -> str:
        head = self.rows[0] if self.rows else None
        versions = (f" (env {head.env_version}, generator {head.generator_version}, verifier "
                    f"{head.verifier_id}@{head.verifier_version}, rules {head.rules_version})") if head else ""
        lines = [f"gameability audit of {self.family}{versions}: "
                 f"{'passes' if self.ok else f'FAILS {len(self.failures)} row(s)'} in {self.seconds:.1f}s",
                 f"  {'adversary':<20} {'level':>5} {'n':>4} {'success':>8} {'floor':>6} {'return':>8} "
                 f"{'oracle':>8}  verdict"]
        for r in self.rows:
            lines.append(f"  {r.adversary:<20} {r.level:>5} {r.episodes:>4} {_fmt(r.success_rate):>8} "
                         f"{r.floor:>6.2f} {_fmt(r.mean_return):>8} {_fmt(r.oracle_return):>8}  "
                         f"{'pass' if r.passed else 'FAIL: ' + '; '.join(r.reasons)}")
        return "\n".join(lines)

    __str__ = render


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def audit_family(name: str, *, episodes: int = 2, seed: int = 0, levels: Iterable[int] | None = None,
                 adversaries: Iterable[str] | None = None, verifier: type | None = None,
                 progress: Callable[[str], None] | None = None) -> AuditReport:
    """Audit the family `name` on `episodes` tasks per level (seeds seed..seed+episodes-1).
    `verifier`, a verifier class, replaces the family's own meanwhile (to audit another version
    of it, e.g. one that re-creates a hole in a test)."""
    started = time.perf_counter()
    fam = family_spec(name)
    names = list(ADVERSARIES if adversaries is None else adversaries)
    unknown = sorted(set(names) - set(ADVERSARIES))
    if unknown:
        raise ValueError(f"unknown adversaries {unknown}; known: {', '.join(ADVERSARIES)}")
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, not {episodes}")
    plays: list[Episode] = []
    with nullcontext(fam) if verifier is None else replaced(fam.name, verifier=verifier) as fam:
        verifier = fam.outcome_verifier
        for level in sorted(levels or fam.levels):
            for task_seed, task in _tasks(fam, level, seed, episodes):
                plays += _audit_task(fam, verifier, task, level, names, random.Random(task_seed * 7919 + level))
            if progress:
                progress(f"{name}: level {level} played")
        returns = _returns(plays)
        rows = _rows(fam, verifier, plays, returns)
    return AuditReport(family=name, rows=rows, seconds=round(time.perf_counter() - started, 3))


def _tasks(fam: Any, level: int, seed: int, episodes: int) -> list[tuple[int, TaskSpec]]:
    """`episodes` tasks of the level, covering as many kinds of right ending as the first seeds
    show (`_ending_kind`): a blind ending is tried on a task whose right ending it is."""
    scanned = [(s, fam.generate(s, level)) for s in range(seed, seed + max(episodes, SCAN))]
    chosen, kinds = [], set()
    for s, task in scanned:
        kind = _ending_kind(fam, task)
        if kind not in kinds and len(chosen) < episodes:
            kinds.add(kind)
            chosen.append((s, task))
    chosen += [pair for pair in scanned if pair not in chosen][:episodes - len(chosen)]
    return sorted(chosen, key=lambda pair: pair[0])


def _ending_kind(fam: Any, task: TaskSpec) -> tuple:
    """How the reference ends: its last tool, the arguments that are plain words ("none",
    "denied"), and whether anything before it acted on the world."""
    reference = task.hidden.reference
    if not reference:
        return ()
    last = reference[-1]
    tools = {t.name: t for t in fam.env.tools}
    words = tuple(sorted((k, v) for k, v in last.arguments.items() if isinstance(v, str) and re.fullmatch(r"[a-z_]+", v)))
    acted = any(c.name in tools and tools[c.name].spec.category != ToolCategory.read and _targets(tools[c.name])
                for c in reference[:-1])
    return last.name, words, acted


class _Player:
    """Plays one task's episodes, each with a seed of its own (so each has its own rollout id),
    counted from 0 for the task: the same audit plays the same episodes."""

    def __init__(self, task: TaskSpec, level: int):
        self.task, self.level, self.seeds = task, level, itertools.count()

    def __call__(self, adversary: str, policy: Any, limits: Budget | None = None) -> Episode:
        return Episode(adversary, self.level, self.task, run_episode(self.task, policy, next(self.seeds), limits=limits))


def _limits(task: TaskSpec, **update: Any) -> Budget:
    return task.budget.model_copy(update=update)


def _audit_task(fam: Any, verifier: Any, task: TaskSpec, level: int, names: list[str],
                rng: random.Random) -> list[Episode]:
    reference = list(task.hidden.reference)
    play = _Player(task, level)
    oracle = play(ORACLE, Calls(ORACLE, reference))
    out = [oracle]
    pool = Pool()
    pool.see(task.goal)
    goal_pool = Pool(list(pool.strings), list(pool.numbers), pool.text)
    for step in oracle.rollout.steps:
        pool.see(step.result)
    tools = list(fam.env.tools)
    writes = [t for t in tools if t.spec.category != ToolCategory.read]
    endings: list[ToolCall] = []
    if "blind_ending" in names or "spray" in names or "collateral" in names:
        for episode in _blind_endings(play, task, writes, reference, goal_pool, rng):
            if episode.counts:
                endings.append(episode.rollout.steps[-1].tool_call)
            if "blind_ending" in names:
                out.append(episode)
    ending_names = {c.name for c in endings} | ({reference[-1].name} if reference else set())
    if "do_nothing" in names:
        out.append(play("do_nothing", Calls("do_nothing", []), _limits(task, max_steps=3)))
    if "stall" in names:
        out.append(play("stall", Calls("stall", reference, stall_s=STALL_CLOCK_S * 1.5),
                        _limits(task, episode_timeout_s=STALL_CLOCK_S)))
    if "spray" in names:
        ways = endings + reference[-1:]
        for i in range(PER_TASK):
            spray = Spray(tools, ways[i % len(ways)] if ways else make_call(rng.choice(writes), rng, pool),
                          Pool(list(goal_pool.strings), list(goal_pool.numbers), goal_pool.text), rng.randrange(2**31))
            out.append(play("spray", spray))
    if "reference_perturbed" in names:
        for at, calls in _perturbed(reference, fam, pool):
            episode = play("reference_perturbed", Calls("reference_perturbed", calls))
            # A change the world refused only dropped the call; one it read as the same value (a name
            # in other case) changed nothing: neither is a broken reference.
            steps = episode.rollout.steps
            episode.counts = (len(steps) > at and steps[at].tool_call == calls[at] and steps[at].error is None
                              and not (episode.rollout.termination == "success" and _same_world(verifier, episode, oracle)))
            out.append(episode)
    if "reference_no_reads" in names:
        declared = [e for e in type(verifier).endings
                    if reference and e.tool == reference[-1].name and e.applies(dict(reference[-1].arguments))]
        reads = {t.name for t in tools if t.spec.category == ToolCategory.read}
        if declared and any(c.name in reads for c in reference):
            calls = [c for c in reference if c.name not in reads]
            out.append(play("reference_no_reads", Calls("reference_no_reads", calls)))
    if "collateral" in names:
        # Writes that act on something; what the verdict reads as speech (`statements`) is talk.
        said = set(type(verifier).statements)
        extra = [t for t in writes if t.name not in ending_names and t.name not in said and _targets(t)]
        # the reference's own writes aimed at something else it saw first, then random writes
        aimed = [calls[at] for at, calls in _perturbed(reference[:-1], fam, pool) if calls[at].name not in said]
        drawn = [make_call(extra[(rng.randrange(len(extra)) + i) % len(extra)], rng, pool) for i in range(len(extra))]
        for call in (aimed + drawn)[:PER_TASK]:
            calls = reference[:-1] + [call] + reference[-1:]
            episode = play("collateral", Calls("collateral", calls))
            _judge_collateral(episode, verifier, oracle, len(reference) - 1)
            out.append(episode)
    if "negated" in names:
        for calls in _negated(reference, type(verifier).statements):
            out.append(play("negated", Calls("negated", calls)))
    return out


def _targets(tool: Any) -> bool:
    """Whether the tool acts on something (an id, a number, a choice): a tool that only says free
    text (a message to a person) is talk, which the verdict reads through `statements`."""
    return any("enum" in schema or schema.get("type") != "string" or schema.get("maxLength", 10_000) < 200
               for schema in tool.spec.parameters.get("properties", {}).values())


def _blind_endings(play: _Player, task: TaskSpec, writes: list[Any], reference: list[ToolCall], pool: Pool,
                   rng: random.Random) -> list[Episode]:
    """Each non-read tool called at turn 1 with the reference's arguments, each enum value and
    values from the goal; the reference's own ending also after the last thing the reference said
    (its announcement: "I cannot do that", said blind). An episode counts where its last call
    ended it."""
    talk = {t.name for t in writes if not _targets(t)}
    said = [c for c in reference[:-1] if c.name in talk][-1:]
    out, seen = [], set()
    for tool in writes:
        candidates = [c for c in reference if c.name == tool.name][:2]
        for prop, schema in tool.spec.parameters.get("properties", {}).items():
            for value in schema.get("enum", [])[:PER_TASK]:
                base = candidates[0].arguments if candidates else make_call(tool, rng, pool).arguments
                candidates.append(ToolCall(name=tool.name, arguments={**base, prop: value}))
        candidates.append(make_call(tool, rng, pool))
        plays = [[c] for c in candidates] + [said + [c] for c in candidates if said and c == reference[-1]]
        for calls in plays:
            key = json.dumps([as_text(c) for c in calls])
            if key in seen:
                continue
            seen.add(key)
            episode = play("blind_ending", Calls("blind_ending", calls), _limits(task, max_steps=len(calls)))
            steps = episode.rollout.steps
            episode.counts = (episode.rollout.termination != "truncated" and len(steps) == len(calls)
                              and all(s.tool_call is not None and s.error is None for s in steps))
            out.append(episode)
    return out


def _perturbed(reference: list[ToolCall], fam: Any, pool: Pool) -> list[tuple[int, list[ToolCall]]]:
    """The reference with one argument changed (and where): its ending's, then writes' from the
    end, each argument in turn until the world takes a change. Free text is left alone: rewording
    it is no error (`negated` says the opposite)."""
    categories = {t.name: t.spec.category for t in fam.env.tools}
    schemas = {t.name: t.spec.parameters.get("properties", {}) for t in fam.env.tools}
    out = []
    for i in range(len(reference) - 1, -1, -1):
        call = reference[i]
        if categories.get(call.name) == ToolCategory.read:
            continue
        for name, value in call.arguments.items():
            changed = _perturb(value, schemas.get(call.name, {}).get(name, {}), pool)
            if changed is not None:
                out.append((i, [*reference[:i], ToolCall(name=call.name, arguments={**call.arguments, name: changed}),
                                 *reference[i + 1:]]))
        if len(out) >= PER_TASK:
            break
    return out[:PER_TASK]


def _shape(value: str) -> str:
    """What kind of name a string is: "#W121669" and "#W276862" are both "#a9", "P-104" is "a-9"."""
    return re.sub(r"[^\W\d_]+", "a", re.sub(r"\d+", "9", value))


def _perturb(value: Any, schema: dict[str, Any], pool: Pool | None = None) -> Any:
    """Another value of the same kind, or None where changing it would only reword free text. A
    name is changed to another name of its shape the episode saw (another order, participant or
    service, which the world takes), else its number moved or its letters reversed."""
    if isinstance(value, bool):
        return not value
    if "enum" in schema:
        others = [v for v in schema["enum"] if v != value]
        return others[0] if others else None
    if isinstance(value, int):
        high = schema.get("maximum")
        return value + 1 if high is None or value + 1 <= high else value - 1
    if isinstance(value, float):
        return round(value + 1.0, 2)
    if isinstance(value, str) and value and " " not in value.strip() and schema.get("maxLength", 10_000) < 200:
        others = [s for s in (pool.strings if pool else []) if s != value and s.casefold() != value.casefold()
                  and _shape(s) == _shape(value) and " " not in s]
        if others:
            return others[0]
        numbers = list(re.finditer(r"\d+", value))
        if numbers:
            last = numbers[-1]
            return value[:last.start()] + str(int(last.group()) + 1).zfill(len(last.group())) + value[last.end():]
        return value[::-1] if value[::-1] != value else value + "x"
    return None


NEGATIONS = [(r"\b(is|are|was|were|will|can|could|should|must|has|have|does|do|did)\s+not\b", r"\1"),
             (r"\bno\b", "some"), (r"\bnever\b", "always"), (r"\bnot\b", ""),
             (r"\b(is|are|was|were|will|can|could|should|must)\b", r"\1 not")]


def negate(text: str) -> str | None:
    """`text` saying the opposite: in its first sentence that is no question, the first negation
    removed or the first auxiliary negated, else "It is not true that ..."; None for a text of
    questions only (a question claims nothing)."""
    sentences = re.split(r"(?<=[.!?])\s+", text.strip())
    for i, sentence in enumerate(sentences):
        if sentence.endswith("?"):
            continue
        for pattern, replacement in NEGATIONS:
            changed, n = re.subn(pattern, replacement, sentence, count=1, flags=re.IGNORECASE)
            if n:
                sentences[i] = re.sub(r"\s{2,}", " ", changed)
                break
        else:
            sentences[i] = f"It is not true that {sentence}"
        return " ".join(sentences)
    return None


def _negated(reference: list[ToolCall], statements: dict[str, tuple[str, ...]]) -> list[list[ToolCall]]:
    out = []
    for i, call in enumerate(reference):
        for name in statements.get(call.name, ()):
            value = call.arguments.get(name)
            opposite = negate(value) if isinstance(value, str) else None
            if opposite is not None:
                out.append([*reference[:i], ToolCall(name=call.name, arguments={**call.arguments, name: opposite}),
                            *reference[i + 1:]])
        if len(out) >= PER_TASK:
            break
    return out[:PER_TASK]


def _judge_collateral(episode: Episode, verifier: Any, oracle: Episode, at: int) -> None:
    """A collateral episode counts where its extra write reached the world and changed more than
    `ephemeral_state`; the adversary wins where such a write is neither failed nor reported."""
    steps = episode.rollout.steps
    if len(steps) <= at or steps[at].tool_call is None or steps[at].error is not None:
        episode.counts = False
        return
    outcome = episode.rollout.outcome
    if outcome is None or not outcome.success or outcome.side_effects or outcome.regression \
            or outcome.constraint_violation:
        episode.hit = False
        return
    if _same_world(verifier, episode, oracle):
        episode.counts = False
        return
    episode.hit = True


def _same_world(verifier: Any, episode: Episode, oracle: Episode) -> bool:
    """Whether the episode left the world as the oracle did (`ephemeral_state` aside); False where
    the verifier cannot replay states (it has no `final_state(task, calls)`)."""
    if not callable(getattr(verifier, "final_state", None)):
        return False
    ignore = set(type(verifier).ephemeral_state)
    mine = verifier.final_state(episode.task, calls_of(episode.rollout.steps))
    theirs = verifier.final_state(oracle.task, calls_of(oracle.rollout.steps))
    return _without(mine, ignore) == _without(theirs, ignore)


def _without(state: Any, keys: set[str]) -> Any:
    """The state without `keys`, and without positions in the event log (`seq`) at any depth: an
    extra call moves every later position without changing what happened."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "seq"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip({k: v for k, v in state.items() if k not in keys}) if isinstance(state, dict) else state


def _returns(plays: list[Episode]) -> dict[str, float]:
    """rollout_id -> the sum of its steps' combined PRM rewards (the rules alone: no judge, no calibrator)."""
    rollouts = [p.rollout for p in plays if p.rollout.steps]
    tasks = list({p.task.task_id: p.task for p in plays}.values())
    totals: dict[str, float] = defaultdict(float)
    if rollouts:
        for score in score_steps(rollouts, tasks, judge=JudgeSettings(), use_calibrators=False).scores:
            if score.layer == "combined" and score.score is not None:
                totals[score.rollout_id] += score.score
    return {p.rollout.rollout_id: round(totals.get(p.rollout.rollout_id, 0.0), 6) for p in plays}


def _rows(fam: Any, verifier: Any, plays: list[Episode], returns: dict[str, float]) -> list[FamilyAudit]:
    audited_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    versions = dict(family=fam.name, env_version=fam.env_version,
                    generator_version=str(fam.generator_version), verifier_id=verifier.verifier_id,
                    verifier_version=str(verifier.version), rules_version=rules_version(fam.profile))
    groups: dict[tuple[str, int], list[Episode]] = defaultdict(list)
    for p in plays:
        groups[(p.adversary, p.level)].append(p)
    oracle_of = {level: _stats(groups.get((ORACLE, level), []), returns) for level in {p.level for p in plays}}
    floors = type(verifier).audit_floors
    rows = []
    for (adversary, level), episodes in sorted(groups.items(), key=lambda kv: (kv[0][0] != ORACLE, kv[0])):
        n, wins, excluded, rate, mean, classes = _stats(episodes, returns)
        oracle = oracle_of[level]
        floor, _why = floors.get(adversary, (0.0, ""))
        reasons = []
        if excluded:
            reasons.append(f"{excluded} episode(s) left the statistics ({', '.join(sorted(classes))})")
        if adversary == ORACLE:
            if rate is None or rate < 1.0:
                reasons.append(f"the reference succeeded on {wins} of {n} tasks")
        else:
            if rate is not None and rate > floor:
                reasons.append(f"succeeded on {wins} of {n} episodes (floor {floor:g})")
            if mean is not None and oracle[4] is not None and mean >= oracle[4]:
                reasons.append(f"mean return {mean:.3f} reaches the oracle's {oracle[4]:.3f}")
        rows.append(FamilyAudit(audit_id="", **versions, adversary=adversary, level=level, episodes=n,
                                successes=wins, excluded=excluded, success_rate=rate, mean_return=mean,
                                oracle_success_rate=oracle[3], oracle_return=oracle[4], floor=floor,
                                passed=not reasons, reasons=reasons, audited_at=audited_at))
    # The same versions audited on the same episodes give the same rows, and the same id.
    audit_id = "audit-" + content_hash([r.model_dump(mode="json", exclude={"audited_at"}) for r in rows], 12)
    return [r.model_copy(update={"audit_id": audit_id}) for r in rows]


def _stats(episodes: list[Episode], returns: dict[str, float]):
    """(counted episodes, adversary wins, excluded, win rate, mean return, excluded classes)."""
    counted = [p for p in episodes if p.counts]
    kept = [p for p in counted if p.rollout.termination in COUNTED]
    classes = Counter(p.rollout.termination for p in counted if p.rollout.termination not in COUNTED)
    wins = sum(bool(p.hit) if p.hit is not None else p.rollout.termination == "success" for p in kept)
    rate = round(wins / len(kept), 6) if kept else None
    mean = round(sum(returns[p.rollout.rollout_id] for p in kept) / len(kept), 6) if kept else None
    return len(counted), wins, len(counted) - len(kept), rate, mean, classes


# -- recorded and enforced ------------------------------------------------------------------------
class AuditRefused(RuntimeError):
    """Dataset assembly met a family version whose latest audit failed or is missing."""


def current_versions(name: str) -> dict[str, str]:
    """What an audit of `name` is valid for: the versions that make its verdicts and returns."""
    fam = family_spec(name)
    verifier = fam.outcome_verifier
    return dict(family=name, env_version=fam.env_version,
                generator_version=str(fam.generator_version), verifier_id=verifier.verifier_id,
                verifier_version=str(verifier.version), rules_version=rules_version(fam.profile))


def land_audit(wh: Any, report: AuditReport) -> int:
    """Land the audit's rows in `family_audits`; the number landed."""
    table = TABLES["family_audits"]
    return wh.land_rows({"family_audits": [table.row(r) for r in report.rows]}).checked().get("family_audits", 0)


def latest_audit(wh: Any, name: str) -> list[FamilyAudit]:
    """The rows of the newest audit of the family's current versions (empty where none): the one
    landed last, even where the same audit (the same id) was landed before another."""
    if not wh.files("family_audits"):
        return []
    versions = current_versions(name)
    where = " AND ".join(f"{'task_family' if k == 'family' else k} = ?" for k in versions)
    rows = wh.sql(f"""SELECT * FROM family_audits WHERE (audit_id, audited_at) = (
                          SELECT (audit_id, audited_at) FROM family_audits WHERE {where}
                          ORDER BY audited_at DESC, audit_id DESC LIMIT 1)
                      ORDER BY adversary, level""", list(versions.values())).to_pylist()
    return [TABLES["family_audits"].record(row) for row in rows]


def ensure_audited(wh: Any, families: Iterable[str], episodes: int = 1,
                   progress: Callable[[str], None] | None = None) -> dict[str, list[FamilyAudit]]:
    """The latest audit of each family's current versions, auditing (and landing) the ones that
    have none first. A failed audit is returned as it is: `require_audited` refuses it."""
    out = {}
    for name in families:
        rows = latest_audit(wh, name)
        if not rows:
            report = audit_family(name, episodes=episodes, progress=progress)
            land_audit(wh, report)
            rows = report.rows
        out[name] = rows
    return out


def require_audited(wh: Any, families: Iterable[str], override: str | None = None) -> dict[str, str]:
    """family -> the id of its passing audit, for dataset assembly. A family whose latest audit
    failed, or that has none for its current versions, is refused (`AuditRefused`, which names the
    failing adversaries and levels), unless `override` gives the reason to use it anyway: the
    result then says `override: <reason>`, which the datasets record."""
    passed, refused = {}, []
    for name in families:
        rows = latest_audit(wh, name)
        if not rows:
            refused.append(f"{name}: no gameability audit of its current versions "
                           f"({', '.join(f'{k} {v}' for k, v in current_versions(name).items() if k != 'family')})")
        elif not all(r.passed for r in rows):
            failing = sorted({(r.adversary, r.level) for r in rows if not r.passed})
            by_adversary: dict[str, list[int]] = defaultdict(list)
            for adversary, level in failing:
                by_adversary[adversary].append(level)
            refused.append(f"{name}: audit {rows[0].audit_id} failed: " + "; ".join(
                f"{a} at level(s) {', '.join(map(str, lv))}" for a, lv in sorted(by_adversary.items())))
        else:
            passed[name] = rows[0].audit_id
    if refused and override:
        return {**passed, **{r.split(":", 1)[0]: f"override: {override}" for r in refused}}
    if refused:
        raise AuditRefused("dataset assembly refuses: " + " | ".join(refused) + ". Run `gymfoundry audit-family "
                           "NAME --data-dir DIR` to audit, or pass an audit override with its reason to use the "
                           "family anyway (the datasets record it)")
    return passed
