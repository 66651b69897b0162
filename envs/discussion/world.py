"""The discussion world: the agent moderates a group of simulated participants (envs.person)
choosing among options. Each participant tells, only when asked (`ask`), their first choice and
the options they can accept, with a confidential reason they do not want repeated; one of them
may misstate both at first ("let me check my notes") and correct them when asked again, or
volunteer the correction when an option they wrongly accepted is proposed. The agent can speak
to the whole group (`share`), propose an option (each participant reacts with their true
stance), call a vote on the proposal, and decide (an option, or "none" when no option clears
every participant's threshold), which ends the episode.

What a participant states is recorded by the world as they say it (`state["statements"]`: a
first choice, the options they accept — `final` once it is the truth — or a stance on one option
from a proposal or a vote), and everything the agent says to anyone is kept in `state["said"]`,
so the verifier judges claims and leaks from the state, never by parsing the agent's text."""

from __future__ import annotations

import copy
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from gymfoundry.envs.base import ToolEnv, ToolError
from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.person import asks, make_simulator, new_memory
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.tools import tool

from .facts import Participant
from .rules import NONE, normalize, spoken_list, strict_claim

ROLE = "a participant in a group discussion run by a moderator"
ACCEPT_MARK = "the options I can accept are: {}."  # how a participant states what they accept (the truth)
TOPICS = ("preference", "acceptable")  # the persona facts that are statements of a stance


class Refusal(str, Enum):
    unknown_participant = "unknown_participant"
    unknown_option = "unknown_option"
    no_proposal = "no_proposal"
    invalid_claim = "invalid_claim"


Name = Annotated[str, Field(min_length=1, max_length=40, description="a participant's name, as in the goal")]
Option = Annotated[str, Field(min_length=1, max_length=60, description="an option's name, as in the goal")]
Text = Annotated[str, Field(min_length=1, max_length=1000)]
Claims = Annotated[list[Annotated[str, Field(min_length=1, max_length=120)]], Field(max_length=24, description=(
    'each "<participant> prefers|accepts|rejects <option>", stating what that participant said'))]
_PARTICIPANTS = TypeAdapter(list[Participant])


class DiscussionEnv(ToolEnv):
    family = "discussion"
    profile_yaml = Path(__file__).with_name("profile.yaml")

    def __init__(self, outcome_fn=None, level: int = 2, simulator: str | None = None, **simulator_options: Any):
        """`simulator`: the participants' backend (`scripted`, the default, or `llm`; envs.person)."""
        super().__init__(outcome_fn=outcome_fn, level=level)
        self.simulator_backend, self.simulator_options = simulator, simulator_options
        self.people: dict[str, Participant] = {}
        self.person = None

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        try:
            people = _PARTICIPANTS.validate_python(task.hidden.checks.get("participants"))
        except ValidationError as exc:
            raise InvalidTask(f"task {task.task_id}: hidden.checks.participants are not Participants: {exc}") from None
        _check_world(task, people)
        self.people = {p.name: p for p in people}
        options = {"role": ROLE, **self.simulator_options} if self.simulator_backend == "llm" else {}
        self.person = make_simulator(seed=task.source.seed or 0, backend=self.simulator_backend, **options)
        state = copy.deepcopy(task.initial_state)
        state.update(people={n: new_memory() for n in self.people}, spoken=[], statements=[], said=[],
                     proposal=None, votes=[], decision=None, events=[])
        return state

    def is_finished(self, state: dict[str, Any]) -> bool:
        return state["decision"] is not None

    def close(self) -> None:
        if self.person is not None:
            self.person.release()

    # -- talking ------------------------------------------------------------------------
    @tool(ToolCategory.write)
    def tool_ask(self, state, event, participant: Name, question: Text):
        """Ask one participant something in private (their first choice, the options they can accept, why). Their reply is the result."""
        name = self._participant(participant)
        state["said"].append({"seq": event["seq"], "tool": "ask", "to": name, "text": question})
        p = self.people[name]
        misstating = p.first is not None and name not in state["spoken"]
        persona = p.first if misstating else p.persona
        reply = self.person.reply(persona, state["people"][name], question)
        told = [t for t in reply.disclosed if t in TOPICS and asks(question, persona.facts[t].asked_by)]
        event["told"] = told
        for topic in told:
            if topic == "preference":
                option = p.first_prefers if misstating else p.prefers
                self._state_that(state, event, name, kind="prefers", option=option)
            else:
                self._state_that(state, event, name, kind="accepts", options=list(
                    p.first_accepts if misstating else p.accepts), final=not misstating)
        if told and name not in state["spoken"]:
            state["spoken"].append(name)
        out = {"participant": name, "reply": reply.text}
        if reply.ended:
            out["left"] = reply.reason
        return out

    @tool(ToolCategory.write)
    def tool_share(self, state, event, message: Text):
        """Say something to the whole group (a summary, a suggestion)."""
        state["said"].append({"seq": event["seq"], "tool": "share", "to": "group", "text": message})
        return {"shared_with": list(self.people)}

    @tool(ToolCategory.write)
    def tool_propose(self, state, event, option: Option, reason: Annotated[str, Field(max_length=1000)] = ""):
        """Propose an option to the group, with an optional reason; each participant reacts with their stance."""
        chosen = self._option(state, option)
        if reason:
            state["said"].append({"seq": event["seq"], "tool": "propose", "to": "group", "text": reason})
        state["proposal"] = chosen
        return {"proposed": chosen, "reactions": self._react(state, event, chosen, "propose")}

    @tool(ToolCategory.write)
    def tool_call_vote(self, state, event):
        """Call a vote on the current proposal: each participant votes yes or no."""
        if state["proposal"] is None:
            raise ToolError(Refusal.no_proposal, "there is no proposal to vote on: propose an option first")
        option = state["proposal"]
        reactions = self._react(state, event, option, "vote")
        votes = {n: "yes" if option in self.people[n].accepts else "no" for n in self.people}
        state["votes"].append({"seq": event["seq"], "option": option, "votes": votes})
        return {"option": option, "votes": votes, "passed": all(v == "yes" for v in votes.values()),
                "comments": {n: r for n, r in reactions.items() if r == correction(self.people[n])}}

    @tool(ToolCategory.irreversible, hint='option "none" when no option is acceptable to everyone')
    def tool_decide(self, state, event, option: Annotated[str, Field(min_length=1, max_length=60, description=(
            'the option decided, or "none" when no option is acceptable to every participant'))],
                    rationale: Text, claims: Claims = []):
        """Announce the group's decision with its rationale and the participants' stated stances it rests on. Irreversible; ends the discussion."""
        chosen = NONE if normalize(option) == NONE else self._option(state, option)
        parsed = []
        for claim in claims:
            found = strict_claim(claim, list(self.people), state["options"])
            if found is None:
                raise ToolError(Refusal.invalid_claim, f"claim {claim[:120]!r} is not \"<participant> prefers|accepts|"
                                                       f"rejects <option>\" with a participant and an option named "
                                                       "in the goal")
            parsed.append(list(found))
        state["said"].append({"seq": event["seq"], "tool": "decide", "to": "group", "text": rationale})
        state["decision"] = {"seq": event["seq"], "option": chosen, "claims": parsed}
        return {"decided": chosen}

    # -- the world's bookkeeping ------------------------------------------------------
    def _react(self, state: dict[str, Any], event: dict[str, Any], option: str, via: str) -> dict[str, str]:
        """Each participant's true stance on `option`; a participant who misstated accepting it corrects themselves."""
        out = {}
        for name, p in self.people.items():
            stated = [s for s in state["statements"] if s["participant"] == name and s["kind"] == "accepts"]
            if p.first is not None and stated and not stated[-1]["final"] and option in (p.first_accepts or []) \
                    and option not in p.accepts:
                out[name] = correction(p)
                self._state_that(state, event, name, kind="prefers", option=p.prefers)
                self._state_that(state, event, name, kind="accepts", options=list(p.accepts), final=True)
            elif option in p.accepts:
                out[name] = f"I can support {option}."
            else:
                out[name] = f"{option} does not work for me."
            self._state_that(state, event, name, kind="stance", option=option, accepts=option in p.accepts, via=via)
            if name not in state["spoken"]:
                state["spoken"].append(name)
        return out

    @staticmethod
    def _state_that(state: dict[str, Any], event: dict[str, Any], name: str, **statement: Any) -> None:
        state["statements"].append({"seq": event["seq"], "participant": name, **statement})

    def _participant(self, said: str) -> str:
        name = next((n for n in self.people if normalize(n) == normalize(said)), None)
        if name is None:
            raise ToolError(Refusal.unknown_participant, f"no participant {said[:60]!r}; the participants are "
                                                         f"{', '.join(self.people)}")
        return name

    @staticmethod
    def _option(state: dict[str, Any], said: str) -> str:
        option = next((o for o in state["options"] if normalize(o) == normalize(said)), None)
        if option is None:
            raise ToolError(Refusal.unknown_option, f"no option {said[:60]!r}; the options are "
                                                    f"{', '.join(state['options'])}")
        return option


def correction(p: Participant) -> str:
    """What a participant who misstated volunteers when an option they wrongly accepted comes up."""
    accepted = ACCEPT_MARK.format(spoken_list(p.accepts))
    return f"Sorry, I misspoke earlier: my first choice is {p.prefers}, and {accepted}"


def _check_world(task: TaskSpec, people: list[Participant]) -> None:
    """The world's shape, checked at reset (a task of another shape is refused there)."""
    world = task.initial_state
    options, names = world.get("options"), world.get("participants")
    good = (isinstance(world.get("topic"), str) and isinstance(options, list) and len(options) >= 2
            and all(isinstance(o, str) and o for o in options) and names == [p.name for p in people]
            and len({normalize(o) for o in options}) == len(options) and NONE not in map(normalize, options)
            and all(set(p.scores) == set(options) for p in people))
    if not good:
        raise InvalidTask(f"task {task.task_id}: initial_state is not a discussion world (topic, options, and the "
                          "participants of hidden.checks, each scoring every option)")
