"""Simulated people: the other side of a conversation (a customer, a client) for families whose
agent must talk to someone. A family's world owns one `Person` per episode and answers the
agent's `respond` tool with the person's reply, which is the observation.

A person has a hidden `Persona` (in the task's hidden facts): an `opening` message (what they want, in their words), `facts`
they know but tell only when asked (each with the words that ask for it), topics they do not know,
`private` values they never say (what the verifier or the leak scan keeps hidden), a `style`
(terse, chatty, impatient) and `patience` (the agent's turns they wait before giving up).

Two backends, one interface (`Simulator.reply(persona, memory, message) -> Reply`, where
`memory` is plain data the world keeps in its state):

- `ScriptedPerson` (the embedded default; deterministic for a seed): progressive disclosure — a
  fact is revealed only in reply to a message that asks for it; a question about something they
  do not know gets "I don't know"; a repeated or off-topic message gets a realistic answer; the
  person ends the conversation when the world settles the request (`close`), when out of
  patience, or asks for a human.
- `LLMSimulator`: a model behind an OpenAI-compatible chat-completions endpoint, the persona in its
  system prompt. Its key is never kept: its reply and every error message pass through
  `gymfoundry.envs.secrets.redact` first (an endpoint may echo the key), so the agent never sees it. The
  reply is then validated (a non-empty text of bounded length that says no private
  value); an invalid reply, or an endpoint that fails, raises `SimulatorFault`, an `EnvFault`:
  the simulator's failure is the environment's, never the agent's.

`Reply.disclosed` lists the topics told in that reply (both backends: a topic counts as told when
its value appears in the text as a whole, `says`), so a verifier can check what the agent learned and when."""

from __future__ import annotations

import json
import os
import random
import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from gymfoundry.envs.errors import EnvFault
from gymfoundry.envs.secrets import HTTP_LOGGERS, check_endpoint_url, redact, redact_logs, register_secret

Style = Literal["terse", "chatty", "impatient"]
redact_logs(*HTTP_LOGGERS)  # the simulator's endpoint may echo its key in a header httpcore logs


class Fact(BaseModel):
    value: str = Field(min_length=1)
    asked_by: list[str] = Field(min_length=1)  # words (any of them, case-insensitive) that ask for it
    reply: str | None = None  # how it is said ("{value}" is replaced); default "It's {value}."


class Persona(BaseModel):
    opening: str = Field(min_length=1)
    facts: dict[str, Fact] = Field(default_factory=dict)
    unknown: dict[str, list[str]] = Field(default_factory=dict)  # topic -> words asking for it
    private: dict[str, str] = Field(default_factory=dict)  # never said, by either backend
    style: Style = "chatty"
    patience: int = Field(default=12, ge=1)

    def hidden_values(self) -> list[str]:
        """What no observation may contain: the private values."""
        return [v for v in self.private.values() if v]


class Reply(BaseModel):
    text: str
    disclosed: list[str] = Field(default_factory=list)
    ended: bool = False
    reason: str | None = None  # why it ended: resolved, out_of_patience, wants_human


class SimulatorFault(EnvFault):
    """The simulated person failed (an endpoint error, an invalid reply): the environment's fault."""


def asks(message: str, words: list[str]) -> bool:
    text = message.lower()
    return any(re.search(rf"(?<![a-z0-9]){re.escape(w.lower())}(?![a-z0-9])", text) for w in words)


def says(text: str, value: str) -> bool:
    """Whether `text` states `value` as a whole (not "5 years" inside "15 years")."""
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text) is not None


FILLERS = {
    "terse": ["Ok.", "Go on.", "And?"],
    "chatty": ["Sure, happy to help however I can.", "Thanks, I appreciate it.", "Alright, what else do you need?"],
    "impatient": ["Can we hurry this up?", "Is this going to take long?", "Please just get it done."],
}


def new_memory() -> dict[str, Any]:
    """A person's memory of the conversation: plain data, kept in the env's state (so it is
    rolled back with it and copied by replays)."""
    return {"turns": 0, "told": [], "ended": None, "heard": [], "history": []}


class Simulator:
    """The interface: `reply(persona, memory, message) -> Reply`; `close` when the world settles
    the request. `memory` (from `new_memory`) is updated in place; `state(memory)` is what the
    verifier reads: the turns, the topics told in order, and how it ended."""

    def reply(self, persona: Persona, memory: dict[str, Any], message: str) -> Reply:
        if memory["ended"]:
            return Reply(text="(the person has left the conversation)", ended=True, reason=memory["ended"])
        memory["turns"] += 1
        if memory["turns"] > persona.patience:
            memory["ended"] = "out_of_patience"
            return Reply(text="This is taking too long. I'll take my business elsewhere.", ended=True,
                         reason="out_of_patience")
        out = self._reply(persona, memory, message)
        for topic, fact in persona.facts.items():
            if says(out.text, fact.value) and topic not in out.disclosed:
                out.disclosed.append(topic)
        memory["told"] += [t for t in out.disclosed if t not in memory["told"]]
        if out.ended:
            memory["ended"] = out.reason or "ended"
        return out

    @staticmethod
    def close(persona: Persona, memory: dict[str, Any], reason: str = "resolved") -> Reply:
        memory["ended"] = reason
        farewell = {"terse": "Fine. Bye.", "chatty": "Wonderful, thank you so much for your help!",
                    "impatient": "Finally. Bye."}[persona.style]
        return Reply(text=farewell, ended=True, reason=reason)

    @staticmethod
    def state(memory: dict[str, Any]) -> dict[str, Any]:
        return {"turns": memory["turns"], "told": list(memory["told"]), "ended": memory["ended"]}

    def release(self) -> None:
        """Free what the backend holds (an HTTP client); the env calls it when it closes."""

    def _reply(self, persona: Persona, memory: dict[str, Any], message: str) -> Reply:
        raise NotImplementedError


class ScriptedSimulator(Simulator):
    """Deterministic for a seed: tells exactly the facts a message asks for, nothing else."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def _reply(self, persona: Persona, memory: dict[str, Any], message: str) -> Reply:
        rng = random.Random(self.seed * 7919 + memory["turns"])
        asked = [t for t, fact in persona.facts.items() if asks(message, fact.asked_by)]
        unknown = [t for t, words in persona.unknown.items() if asks(message, words)]
        key = " ".join(message.lower().split())
        again = key in memory["heard"]
        memory["heard"].append(key)
        if not asked and asks(message, ["human", "supervisor", "manager"]):
            return Reply(text="Yes please, let me talk to a person.")
        parts = [(persona.facts[t].reply or "It's {value}.").replace("{value}", persona.facts[t].value) for t in asked]
        parts += [f"Sorry, I don't know my {t.replace('_', ' ')}." for t in unknown]
        if not parts:
            return Reply(text="You already asked me that." if again else rng.choice(FILLERS[persona.style]))
        text = " ".join(parts)
        if persona.style == "chatty":
            text += " " + rng.choice(["Anything else?", "Hope that helps.", "Let me know what else you need."])
        elif persona.style == "impatient":
            text += " Quickly, please."
        return Reply(text=text, disclosed=asked)


class LLMSimulator(Simulator):
    """A model plays the persona. Settings: `base_url` (or GYMFOUNDRY_USER_BASE_URL), `model` (or
    GYMFOUNDRY_USER_MODEL), `api_key` (or GYMFOUNDRY_USER_API_KEY), `timeout_s`. The conversation
    so far is kept in the memory (`history`)."""

    MAX_CHARS = 2000

    def __init__(self, *, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 30.0, transport=None, seed: int = 0, role: str = "a customer talking to a "
                 "support agent"):
        import httpx

        self.base_url = (base_url or os.environ.get("GYMFOUNDRY_USER_BASE_URL") or "").rstrip("/")
        self.model = model or os.environ.get("GYMFOUNDRY_USER_MODEL")
        if not self.base_url or not self.model:
            raise ValueError("the LLM user simulator needs base_url and model (or GYMFOUNDRY_USER_BASE_URL / _MODEL)")
        check_endpoint_url(self.base_url, "the environment variable GYMFOUNDRY_USER_API_KEY")
        key = api_key or os.environ.get("GYMFOUNDRY_USER_API_KEY")
        register_secret(key)  # a key passed in code is redacted like the environment's
        self._client_args = dict(base_url=self.base_url, timeout=timeout_s, transport=transport,
                                 headers={"Authorization": f"Bearer {key}"} if key else {})
        self.client = httpx.Client(**self._client_args)
        self.seed, self.role = seed, role

    def release(self) -> None:
        import httpx

        self.client.close()
        self.client = httpx.Client(**self._client_args)  # an env may be reset again after close()

    def system_prompt(self, persona: Persona) -> str:
        facts = "\n".join(f"- {t.replace('_', ' ')}: {f.value}" for t, f in persona.facts.items())
        unknown = ", ".join(t.replace("_", " ") for t in persona.unknown) or "nothing in particular"
        return (f"You are {self.role}. Stay in character; write only what you say, in a {persona.style} style, "
                f"one short message at a time.\nYour request: {persona.opening}\n"
                f"Facts you know, to tell ONLY when the agent asks for that specific thing:\n{facts}\n"
                f"You do not know: {unknown}.\nNever mention anything else about yourself.")

    def _reply(self, persona: Persona, memory: dict[str, Any], message: str) -> Reply:
        import httpx

        messages = [{"role": "system", "content": self.system_prompt(persona)},
                    {"role": "assistant", "content": persona.opening}, *memory["history"],
                    {"role": "user", "content": message}]
        try:
            response = self.client.post("/chat/completions", json={
                "model": self.model, "messages": messages, "temperature": 0.0, "seed": self.seed, "max_tokens": 300})
            response.raise_for_status()
            text = response.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise SimulatorFault(redact(f"user simulator at {self.base_url} failed: {type(exc).__name__}: "
                                        f"{exc}")[:300]) from None
        if not isinstance(text, str) or not text.strip() or len(text) > self.MAX_CHARS:
            raise SimulatorFault(f"user simulator gave an invalid reply: {redact(json.dumps(text))[:200]}")
        text = redact(text)
        if any(v in text for v in persona.hidden_values()):
            raise SimulatorFault("user simulator said a private value of its persona")
        memory["history"] += [{"role": "user", "content": message}, {"role": "assistant", "content": text}]
        return Reply(text=text.strip())


def make_simulator(seed: int = 0, backend: str | None = None, **options: Any) -> Simulator:
    """An episode's simulator: `scripted` (default) or `llm` (GYMFOUNDRY_USER_SIMULATOR=llm, with
    GYMFOUNDRY_USER_BASE_URL and GYMFOUNDRY_USER_MODEL)."""
    backend = backend or os.environ.get("GYMFOUNDRY_USER_SIMULATOR", "scripted")
    if backend == "scripted":
        return ScriptedSimulator(seed)
    if backend == "llm":
        return LLMSimulator(seed=seed, **options)
    raise ValueError(f"unknown user simulator {backend!r}; use scripted or llm")
