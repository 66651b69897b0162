"""The scripted policy of a YAML domain, driven by its file and by what it observes only.

It reads the goal's parameters back by matching the goal against the templates' goal lines (a
`{$param}` placeholder is a field of the line; a flagged line's presence is its flag), then plays
the template's reference steps: each step's arguments from those parameters and from what earlier
results showed (`bind`), exactly as the generator wrote the reference. With probability
`mistake_rate` per step it makes one of the domain's declared mistakes: `skip` a write step,
take a `distractor` argument (a wrong value the step's `distractors` list from what it saw;
after a refusal it notices and retries half the time), or `stop` early with the domain's `final`
call. Without mistakes it makes the reference's calls."""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar

from gymfoundry.envs.generic.expr import PLACEHOLDER, EvalError, evaluate, parse_path, truth
from gymfoundry.envs.records import ToolCategory
from gymfoundry.envs.generic.world import class_name
from gymfoundry.envs.scripted import ScriptedPolicy, tool_result

if TYPE_CHECKING:
    from gymfoundry.envs.generic.domain import Domain, TaskTemplate

_CLASSES: dict[str, type] = {}
INTEGER = re.compile(r"-?\d{1,18}")


class DomainPolicy(ScriptedPolicy):
    domain: ClassVar[Domain]
    script_version = "1"

    def __init__(self, mistake_rate: float | None = None, seed: int = 0, mistakes: list[str] | None = None):
        self.mistakes = list(self.domain.policy.mistakes if mistakes is None else mistakes)
        super().__init__(self.domain.policy.mistake_rate if mistake_rate is None else mistake_rate, seed)

    def _final_call(self, reason: str) -> str:
        final = self.domain.policy.final
        return self._say(f"Finishing ({reason}).", final.tool, evaluate(final.args, {}))

    def _run(self, goal: str) -> Generator[str, str, None]:
        found = read_goal(self.domain, goal)
        if found is None:
            yield self._final_call("I cannot read the goal")
            return
        template, scope = found
        steps = template.reference
        for i, step in enumerate(steps):
            try:
                if step.when is not None and not truth(step.when, scope):
                    continue
                args = evaluate(step.args, scope)
                wrong = {a: [v for v in evaluate(e, scope) or [] if v != args.get(a)]
                         for a, e in step.distractors.items()} if step.distractors else {}
            except EvalError:  # what it saw does not fit its script: give up
                yield self._final_call("lost track")
                return
            slip = self._slip(step, i == len(steps) - 1, wrong)
            if slip == "stop":
                yield self._final_call("stopping early")
                return
            if slip == "skip":
                continue
            thought = step.thought or f"Next: {step.tool}."
            if slip == "distractor":
                arg = self.rng.choice(sorted(a for a, vs in wrong.items() if vs))
                obs = yield self._say(thought, step.tool, {**args, arg: self.rng.choice(wrong[arg])})
                if tool_result(obs) is not None or self.rng.random() >= 0.5:
                    continue  # went through (a wrong value accepted), or it does not notice the refusal
                thought = f"That was refused; {step.tool} with the right {arg}."
            obs = yield self._say(thought, step.tool, args)
            if step.bind:
                result = tool_result(obs)
                try:
                    scope.update({n: evaluate(e, {**scope, "result": result}) for n, e in step.bind.items()})
                except EvalError:
                    yield self._final_call("lost track")
                    return

    def _slip(self, step: Any, last: bool, wrong: dict[str, list]) -> str | None:
        if last or not self.mistakes or not self._mistake():
            return None
        kinds = [k for k in self.mistakes
                 if (k == "skip" and not step.bind and self.domain.tools[step.tool].category == ToolCategory.write)
                 or (k == "distractor" and any(wrong.values())) or k == "stop"]
        return self.rng.choice(kinds) if kinds else None


def read_goal(domain: Domain, goal: str) -> tuple[TaskTemplate, dict[str, Any]] | None:
    """The template whose goal lines the text shows, and the parameters read back from it."""
    for template in domain.tasks.values():
        scope: dict[str, Any] = {}
        ok = True
        for line in template.goal:
            match = re.search(line_pattern(line.line), goal)
            if line.when is not None:
                scope[line.when.lstrip("$")] = match is not None
            if match is None:
                ok = ok and line.when is not None
                continue
            for name, value in match.groupdict().items():
                scope[name] = int(value) if INTEGER.fullmatch(value) else value
        if ok:
            for name in template.visible() - set(scope):
                scope[name] = None
            return template, scope
    return None


def line_pattern(line: str) -> str:
    """A goal line as a regex: its text literal, each `{$p}` a group (a repeat must match the same)."""
    out, seen, pos = ["^"], set(), 0
    for m in PLACEHOLDER.finditer(line):
        out.append(re.escape(line[pos:m.start()]))
        name = parse_path(m.group(1))[0]
        out.append(f"(?P={name})" if name in seen else f"(?P<{name}>.+?)")
        seen.add(name)
        pos = m.end()
    out.append(re.escape(line[pos:]) + "$")
    return "(?m)" + "".join(out)


def policy_class(domain: Domain) -> type[DomainPolicy]:
    name = class_name(domain.name, "Policy")
    cls = type(name, (DomainPolicy,), {"domain": domain, "policy_id": f"scripted-{domain.name}",
                                        "max_turns": domain.policy.max_turns, "__module__": __name__})
    cls.__qualname__ = name
    return cls


def remember(cls: type) -> None:
    _CLASSES[cls.__name__] = cls


def __getattr__(name: str) -> type:  # envs.generic.policy.<Name>Policy, as pickle looks it up
    try:
        return _CLASSES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
