"""Scripted, observation-only policy of the advisory family.

It reads the goal (the kind of product the client wants, and anything the client volunteered
in the opening) and the tool results it is shown, nothing else. It asks for each suitability
fact (sometimes two in one message), records them, lists the catalog, picks the cheapest product
that fits what it heard, reads its terms, gives its disclosures and recommends it, or "none".
With probability `mistake_rate` per opportunity it makes a realistic mistake: it trusts a fact
the client volunteered instead of asking, skips a question (recommending before asking), ignores
the client's exclusions, skips a disclosure, or promises too much."""

from __future__ import annotations

import re
from collections.abc import Generator

from gymfoundry.envs.scripted import ScriptedPolicy, tool_result

from .rules import EXPOSURES, FIELD, TOPICS, required_disclosures, unsuitable_reasons

GOAL_KIND = re.compile(r"Recommend one (savings|insurance) product")
OPENING = re.compile(r'A client says: "(.*)"')
RISK = re.compile(r"(\d) out of 5")
HORIZON = re.compile(r"(\d+) years?\b")
BUDGET = re.compile(r"\$([\d,]+)")
GUESS = {"risk_tolerance": 3, "horizon_years": 10, "budget": 10_000, "exclusions": []}  # what it assumes unasked
QUESTIONS = {
    "risk_tolerance": ["What is your risk tolerance, from 1 to 5?",
                       "How much risk are you comfortable taking, on a 1-5 scale?",
                       "How would you describe your attitude to risk, 1 to 5?"],
    "horizon": ["How long can you leave the money invested?", "What is your time frame for this money?",
                "When will you need the money back?"],
    "budget": ["How much money would you like to put in?", "What is your budget?",
               "What amount to invest do you have in mind?"],
    "exclusions": ["Is there anything you'd like to avoid investing in?", "Do you have any ethical exclusions?",
                   "Are there any sectors you want to exclude?"],
}
CLAIMS = ["It's practically risk-free.", "You can't lose with it.", "It comes with guaranteed returns."]
TEXTS = {"fees": "{name} charges an annual fee of {fee}% a year.",
         "risk": "{name} has a risk rating of {risk} out of 5; its value can fall.",
         "no_guarantee": "Please note returns are not guaranteed.",
         "lock_up": "Your money is locked in for {lockup} years."}


def heard_in(text: str) -> dict:
    """The suitability facts a reply (or the opening) states; the last statement of each wins
    (a client who corrects themselves says the right value last)."""
    out: dict = {}
    for field, pattern, cast in (("risk_tolerance", RISK, int), ("horizon_years", HORIZON, int),
                                 ("budget", BUDGET, lambda s: int(s.replace(",", "")))):
        found = pattern.findall(text)
        if found:
            out[field] = cast(found[-1])
    lowered = text.lower()
    if "no exclusions" in lowered:
        out["exclusions"] = []
    elif "avoid" in lowered:
        out["exclusions"] = [e for e in EXPOSURES if e.replace("_", " ") in lowered]
    return out


class ScriptedAdvisoryPolicy(ScriptedPolicy):
    policy_id = "scripted-advisory"
    max_turns = 30

    def _final_call(self, reason: str) -> str:
        return self._say(f"Stopping ({reason}).", "recommend", {"product_id": "none", "reason": reason})

    def _run(self, goal: str) -> Generator[str, str, None]:
        kind = GOAL_KIND.search(goal)
        opening = OPENING.search(goal)
        if kind is None:
            yield self._final_call("I cannot read the goal")
            return
        kind = kind.group(1)
        heard = heard_in(opening.group(1)) if opening else {}
        volunteered = {t for t in TOPICS if FIELD[t] in heard}
        skip = {t for t in volunteered if self._mistake()}  # trusts what the client volunteered
        if self._mistake():  # recommends before asking one of the facts
            skip.add(self.rng.choice(TOPICS))
        heard.update((yield from self._ask([t for t in TOPICS if t not in skip])))
        profile = {k: heard.get(k, v) for k, v in GUESS.items()}
        yield self._say("Record what the client told me.", "record_suitability", profile)
        obs = yield self._say(f"Which {kind} products are there?", "list_products", {"kind": kind})
        products = (tool_result(obs) or {}).get("products", [])
        ignore_exclusions = self._mistake()
        fitting = [p for p in products if _fits(p, profile, kind, ignore_exclusions)]
        if not fitting:
            yield self._say("Nothing fits.", "recommend", {"product_id": "none", "reason": (
                "None of these products fits your risk tolerance, horizon, budget and exclusions together.")})
            return
        pick = min(fitting, key=lambda p: (p["annual_fee_pct"], p["product_id"]))
        pid = pick["product_id"]
        obs = yield self._say(f"{pid} is the cheapest fit; read its terms.", "get_product", {"product_id": pid})
        pick = tool_result(obs) or pick
        topics = required_disclosures(pick)
        if self._mistake():  # skips a disclosure
            topics.remove(self.rng.choice(topics))
        for topic in topics:
            text = TEXTS[topic].format(name=pick["name"], fee=pick["annual_fee_pct"], risk=pick["risk_rating"],
                                       lockup=pick["lockup_years"])
            yield self._say(f"Disclose the {topic.replace('_', ' ')}.", "disclose",
                            {"product_id": pid, "topic": topic, "text": text})
        reason = f"{pick['name']} fits what you told me at a fee of {pick['annual_fee_pct']}%."
        if self._mistake():  # promises too much
            reason += " " + self.rng.choice(CLAIMS)
        yield self._say(f"Recommend {pid}.", "recommend", {"product_id": pid, "reason": reason})

    def _ask(self, topics: list[str]) -> Generator[str, str, dict]:
        heard: dict = {}
        while topics:
            ask = topics[:2] if len(topics) > 1 and self.rng.random() < 0.3 else topics[:1]
            topics = topics[len(ask):]
            questions = [self.rng.choice(QUESTIONS[t]) for t in ask]
            obs = yield self._say(f"Ask about {' and '.join(t.replace('_', ' ') for t in ask)}.", "respond",
                                  {"message": " ".join(questions)})
            reply = str((tool_result(obs) or {}).get("client", ""))
            heard.update(heard_in(reply))
        return heard


def _fits(product: dict, profile: dict, kind: str, ignore_exclusions: bool) -> bool:
    """Whether the product suits the client as the policy heard them (the goal's rule)."""
    believed = {**profile, "exclusions": [] if ignore_exclusions else profile["exclusions"]}
    try:
        return not unsuitable_reasons(product, believed, kind)
    except (KeyError, TypeError):  # a product shown without its terms
        return False
