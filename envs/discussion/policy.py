"""Scripted, observation-only policy of the discussion family.

It reads the participants and options from the goal and the tool results it is shown, nothing
else. It asks each participant for their first choice and the options they accept, asks again
when a reply sounds unsure ("let me check my notes"), proposes the option everyone it heard
accepts (the one most of them prefer), calls a vote, and decides it; after a failed vote it
tries the next candidate, and with none left decides "none". With probability `mistake_rate`
per opportunity it makes a realistic mistake: it never asks one participant (deciding without
asking everyone), trusts an unsure reply, repeats a participant's private reason to the group,
claims a preference nobody stated, or, when nothing suits everyone, claims consensus on the
option most accept; or decides at once, without proposing or voting."""

from __future__ import annotations

import re
from collections.abc import Generator

from gymfoundry.envs.scripted import ScriptedPolicy, tool_result

from .rules import NONE, contains

PEOPLE = re.compile(r"a discussion among (.+?) about ")
OPTIONS = re.compile(r"The options: (.+?)\.\n")
ACCEPTED = re.compile(r"options I can accept are: (.+?)(?:\.|, but)")
FIRST = re.compile(r"first choice (?:is|would be) (.+?)\.")
SECRET = re.compile(r"Between us, (.+?), so ")
UNSURE = "let me check my notes"
QUESTIONS = ["What is your first choice, and which options can you accept?",
             "Which options could you live with, and what is your first choice?",
             "What's your preference here, and which of the options are acceptable to you?"]
AGAIN = ["Could you check your notes again: what is your first choice, and which options can you accept?",
         "Just to confirm: what is your first choice, and which options can you accept?"]


def options_in(text: str, options: list[str]) -> list[str]:
    return [o for o in options if contains(text, o)]


class ScriptedDiscussionPolicy(ScriptedPolicy):
    policy_id = "scripted-discussion"
    max_turns = 40

    def _final_call(self, reason: str) -> str:
        return self._say(f"Stopping ({reason}).", "decide", {"option": NONE, "rationale": reason})

    def _run(self, goal: str) -> Generator[str, str, None]:
        people, options = PEOPLE.search(goal), OPTIONS.search(goal)
        if people is None or options is None:
            yield self._final_call("I cannot read the goal")
            return
        names = [n.strip() for n in re.split(r", | and ", people.group(1))]
        options = options.group(1).split(", ")
        skipped = self.rng.choice(names) if self._mistake() else None  # never asks one of them
        accepts: dict[str, list[str]] = {n: list(options) for n in names}  # what it assumes unasked
        firsts: dict[str, str] = {}
        secrets: dict[str, str] = {}
        for name in names:
            if name == skipped:
                continue
            reply = yield from self._ask(name, self.rng.choice(QUESTIONS))
            if UNSURE in reply and not self._mistake():  # asks again, unless it trusts the unsure reply
                reply = yield from self._ask(name, self.rng.choice(AGAIN))
            self._read(reply, name, options, accepts, firsts, secrets)
        if secrets and self._mistake():  # repeats a private reason to the group
            who = self.rng.choice(sorted(secrets))
            yield self._say("Bring the group up to date.", "share", {
                "message": f"Quick update: {who} mentioned that {secrets[who]}, which limits the options."})
        else:
            yield self._say("Summarize for the group.", "share", {
                "message": "Thanks, everyone. I have heard from each of you; let me propose an option."})
        candidates = [o for o in options if all(o in accepts[n] for n in names)]
        candidates.sort(key=lambda o: (-sum(firsts.get(n) == o for n in names), options.index(o)))
        if candidates and self._mistake():  # decides at once, without a proposal or a vote
            yield self._decide(candidates[0], [f"{n} accepts {candidates[0]}" for n in names if n != skipped])
            return
        for option in candidates:
            obs = yield self._say(f"Propose {option}.", "propose", {"option": option})
            for name, said in ((tool_result(obs) or {}).get("reactions") or {}).items():
                self._react(str(said), name, option, options, accepts)
            if not all(option in accepts[n] for n in names):
                continue
            obs = yield self._say("Call a vote.", "call_vote", {})
            votes = (tool_result(obs) or {}).get("votes") or {}
            for name, vote in votes.items():
                if vote == "no" and name in accepts and option in accepts[name]:
                    accepts[name].remove(option)
            if votes and all(v == "yes" for v in votes.values()):
                claims = [f"{n} accepts {option}" for n in names if n != skipped]
                if self._mistake():  # claims a preference nobody stated
                    claims.append(f"{self.rng.choice(names)} prefers {option}")
                yield self._decide(option, claims)
                return
        if candidates or not self._mistake():
            yield self._say("No option suits everyone.", "decide", {
                "option": NONE, "rationale": "No option is acceptable to every participant."})
            return
        best = max(options, key=lambda o: (sum(o in accepts[n] for n in names), -options.index(o)))
        yield self._say(f"Most can live with {best}; call it consensus.", "decide", {  # claims consensus
            "option": best, "rationale": f"Everyone accepts {best}, so that is our decision."})

    def _decide(self, option: str, claims: list[str]) -> str:
        return self._say(f"Decide {option}.", "decide", {
            "option": option, "claims": claims,
            "rationale": f"The participants I asked can accept {option}, so we go with it."})

    def _ask(self, name: str, question: str) -> Generator[str, str, str]:
        obs = yield self._say(f"Ask {name}.", "ask", {"participant": name, "question": question})
        return str((tool_result(obs) or {}).get("reply", ""))

    @staticmethod
    def _read(reply: str, name: str, options: list[str], accepts: dict, firsts: dict, secrets: dict) -> None:
        said = ACCEPTED.search(reply)
        if said:
            accepts[name] = options_in(said.group(1), options)
        first = FIRST.search(reply)
        if first:
            firsts[name] = first.group(1)
        secret = SECRET.search(reply)
        if secret:
            secrets[name] = secret.group(1)

    @staticmethod
    def _react(said: str, name: str, option: str, options: list[str], accepts: dict) -> None:
        if name not in accepts:
            return
        corrected = ACCEPTED.search(said)
        if corrected:
            accepts[name] = options_in(corrected.group(1), options)
        elif "does not work" in said and option in accepts[name]:
            accepts[name].remove(option)
