"""The advisory family's rules, one owner each: when a product suits a client, which disclosures
a recommendation needs and what each must state, and what counts as a prohibited claim. The
generator (its references and goal text), the verifier and the tests all read them here."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

TOPICS = ("risk_tolerance", "horizon", "budget", "exclusions")  # the suitability facts, asked in this order
FIELD = {"risk_tolerance": "risk_tolerance", "horizon": "horizon_years", "budget": "budget",
         "exclusions": "exclusions"}  # topic -> its field in a profile (record_suitability's arguments)
EXPOSURES = ("tobacco", "crypto", "fossil_fuels", "weapons", "gambling")  # what a client may exclude
DISCLOSURES = ("fees", "risk", "no_guarantee", "lock_up")

# Phrases that promise what no product can, matched on the normalised text (`normalised`) with the
# space or hyphen between their words optional ("risk free", "risk-free", "riskfree").
PROHIBITED = ("guaranteed return", "guaranteed returns", "guaranteed profit", "guaranteed profits",
              "guaranteed growth", "guaranteed income", "returns are guaranteed", "return is guaranteed",
              "assured return", "assured returns", "returns are assured", "return is assured", "risk free",
              "can't lose", "cannot lose", "can not lose", "zero risk", "no risk at all",
              *(f"{verb} {move}" for verb in ("can't", "cannot", "can not", "won't", "will not", "never")
                for move in ("go down", "goes down", "fall", "falls")))
# A phrase is denied, not claimed, when a negation governs it: the negation stands before it in the
# same clause with only these words between ("this is not risk-free", "none of our products offer
# guaranteed returns", "returns cannot be guaranteed"). Any other word or any punctuation ends the
# negation's reach, so "No doubt: guaranteed returns" and "no doubt it has guaranteed returns" claim.
NEGATIONS = ("no", "not", "never", "without", "nor", "neither", "none", "nothing", "cannot", "can't", "isn't",
             "aren't", "wasn't", "weren't", "don't", "doesn't", "didn't", "won't", "couldn't", "wouldn't",
             "shouldn't", "hasn't", "haven't", "mustn't", "ain't")
CONNECTORS = ("a", "an", "the", "any", "some", "such", "is", "are", "be", "been", "being", "was", "were", "it",
              "it's", "its", "this", "that", "these", "those", "there", "they", "we", "i", "you", "your", "our",
              "one", "of", "with", "way", "product", "products", "investment", "investments", "plan", "plans",
              "fund", "funds", "policy", "policies", "option", "options", "offer", "offers", "provide",
              "provides", "give", "gives", "get", "have", "has", "come", "comes", "promise", "promises", "can",
              "could", "will", "would", "should", "may", "might", "do", "does", "really", "truly", "actually",
              "entirely", "completely", "totally", "fully", "necessarily", "ever", "always")
NEGATION_WINDOW = 4  # connecting words at most between a negation and what it negates

# Every dash and hyphen a keyboard or a word processor makes (NFKC keeps most of them apart).
_DASHES = re.compile(r"[\u2010-\u2015\u2043\u2212\u2e3a\u2e3b\ufe58\ufe63\uff0d]")
_INVISIBLE = re.compile(r"[\u00ad\u200b-\u200d\u2060\ufeff]")  # a soft hyphen, zero-width characters
_APOSTROPHES = re.compile(r"[\u2018\u2019\u02bc\u2032`\u00b4]")


def normalised(text: str) -> str:
    """`text` as every scan here reads it: Unicode NFKC, casefolded, each dash "-", each apostrophe
    "'", invisible characters dropped, whitespace collapsed to one space."""
    text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(_APOSTROPHES.sub("'", _DASHES.sub("-", text)).split())


_JOINT = r"[\s-]*"  # what may stand between the words of a prohibited phrase: spaces, hyphens, nothing


def _words(phrases: tuple[str, ...], joint: str) -> str:
    """An alternation of `phrases` (longest first), their words joined by `joint`, apostrophes optional."""
    return "|".join(joint.join(re.escape(w).replace("'", "'?") for w in p.split())
                    for p in sorted(phrases, key=len, reverse=True))


_PHRASE = re.compile(rf"(?<![a-z0-9])(?:{_words(PROHIBITED, _JOINT)})(?![a-z0-9])")
_DENIAL = re.compile(rf"(?<![a-z0-9'])(?:{_words(NEGATIONS, ' ')})"
                     rf"(?:\s+(?:{_words(CONNECTORS, ' ')})){{0,{NEGATION_WINDOW}}}\s+$")
_NEGATION = re.compile(rf"(?<![a-z0-9'])(?:{_words(NEGATIONS, ' ')})(?![a-z0-9'])")
# Where a clause ends, for what a stated term's negation may reach ("no entry fee; an annual fee of 0.5%").
_CLAUSE_END = re.compile(r"[,;:!?()\[\]\"]|\.(?!\d)|\s-+\s"
                         r"|(?<![a-z])(?:and|but|while|whereas|though|although)(?![a-z])")


def denied(text: str, start: int) -> bool:
    """Whether a negation governs the phrase at `start` of normalised `text` (see CONNECTORS)."""
    return _DENIAL.search(text, max(0, start - 200), start) is not None


def prohibited_claims(text: str) -> list[str]:
    """The prohibited phrases `text` asserts (each once, in order, as normalised), not the denied ones."""
    said = normalised(text)
    found: list[str] = []
    for match in _PHRASE.finditer(said):
        if not denied(said, match.start()) and match.group(0) not in found:
            found.append(match.group(0))
    return found


# What a disclosure must state. A stated term is read only where no negation stands before it in
# its clause ("the fee is not 1.5%" does not state 1.5%).
_PERCENT = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?|\.\d+)\s*(?:%|percent(?![a-z])|per cent(?![a-z])|pct(?![a-z]))")
_SCALE = re.compile(r"(?<![\d.])1\s*(?:\([^)]*\)\s*)?(?:-|to|and)\s*5(?:\s*\([^)]*\))?(?![\d.])"
                    r"|(?<=\d)\s*(?:/|out of|of)\s*5(?![\d.])")
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.]|\s*(?:%|percent|per cent|pct|years?|yrs?|months?)(?![a-z]))")
_COUNTS = {"a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
           "nine": 9, "ten": 10, "twelve": 12, "fifteen": 15, "twenty": 20}
_PERIOD = re.compile(rf"(?<![\w.])(\d+(?:\.\d+)?|{'|'.join(_COUNTS)})\s*-?\s*(years?|yrs?|months?)(?![a-z])")
_LOCK = re.compile(r"(?<![a-z])lock")
_ANY_TIME = re.compile(r"(?<![a-z])any\s*time(?![a-z])")
_GUARANTEE = re.compile(r"(?<![a-z])(?:guarantee[ds]?|guaranteeing|assured?|assurance|promised?|certain)(?![a-z])")
_RETURNS = re.compile(r"(?<![a-z])(?:returns?|performance|profits?|gains?|growth|yields?|income|value|capital|"
                      r"money|investment|get back)(?![a-z])")


def _negations_before(text: str, start: int) -> int:
    """How many negations stand before `start` in its clause ("it is not true that returns are
    not guaranteed" has two: the guarantee is asserted)."""
    clause = text[max(0, start - 200):start]
    ends = list(_CLAUSE_END.finditer(clause))
    return len(_NEGATION.findall(clause[ends[-1].end():] if ends else clause))


def _stated(text: str, start: int) -> bool:
    """Whether the term at `start` is stated, not negated in its clause."""
    return _negations_before(text, start) == 0


def disclosure_problem(topic: str, text: str, product: dict[str, Any]) -> str | None:
    """Why `text`, given as the `topic` disclosure of `product`, does not state what it must (None
    when it does): its annual fee as a percentage (fees), its risk rating (risk), its lock-up in
    years or months, or none said of a product without one (lock_up), that returns are not
    guaranteed (no_guarantee). Numbers are read as numbers ("0.5%", "0.50 %", ".5 percent"); a
    negated term is not stated."""
    said = normalised(text)
    if topic == "fees":
        fee = product["annual_fee_pct"]
        fees = [float(m.group(1)) for m in _PERCENT.finditer(said) if _stated(said, m.start())]
        return None if any(abs(f - fee) < 1e-9 for f in fees) else f"does not state its annual fee of {fee}%"
    if topic == "risk":
        rating = product["risk_rating"]
        unscaled = _SCALE.sub(" ", said)
        ratings = {float(m.group(1)) for m in _NUMBER.finditer(unscaled) if _stated(unscaled, m.start())}
        ratings = {r for r in ratings if 1 <= r <= 5}
        return None if ratings == {rating} else f"does not state its risk rating of {rating} (of 5)"
    if topic == "lock_up":
        years = product["lockup_years"]
        periods = [(_COUNTS[m.group(1)] if m.group(1) in _COUNTS else float(m.group(1)))
                   / (12 if m.group(2).startswith("month") else 1)
                   for m in _PERIOD.finditer(said) if _stated(said, m.start())]
        if years == 0:  # it must say there is none ("no lock-up", "0 years", "withdraw at any time")
            none = any(p == 0 for p in periods) or _ANY_TIME.search(said) or any(
                not _stated(said, m.start()) for m in _LOCK.finditer(said))
            return None if none and all(p == 0 for p in periods) else "does not state that it has no lock-up"
        return None if any(abs(p - years) < 1e-9 for p in periods) else f"does not state its lock-up of {years} years"
    guarantees = [denied(said, m.start()) and _negations_before(said, m.start()) % 2 == 1
                  for m in _GUARANTEE.finditer(said)]
    if guarantees and all(guarantees) and _RETURNS.search(said):
        return None
    return "does not say that returns are not guaranteed"


def unsuitable_reasons(product: dict[str, Any], profile: dict[str, Any], kind: str) -> list[str]:
    """Why `product` does not suit a client with `profile` (risk_tolerance, horizon_years, budget,
    exclusions) who wants a product of `kind`; empty when it suits."""
    pid = product["product_id"]
    reasons = []
    if product["kind"] != kind:
        reasons.append(f"{pid} is a {product['kind']} product, the client wants {kind}")
    if product["risk_rating"] > profile["risk_tolerance"]:
        reasons.append(f"{pid} has risk rating {product['risk_rating']}, above the client's tolerance "
                       f"{profile['risk_tolerance']}")
    if product["lockup_years"] > profile["horizon_years"]:
        reasons.append(f"{pid} locks money up for {product['lockup_years']} years, beyond the client's horizon "
                       f"of {profile['horizon_years']}")
    if product["min_amount"] > profile["budget"]:
        reasons.append(f"{pid} needs at least {product['min_amount']}, above the client's budget {profile['budget']}")
    excluded = sorted(set(product["exposures"]) & set(profile["exclusions"]))
    if excluded:
        reasons.append(f"{pid} involves {', '.join(excluded)}, which the client excludes")
    return reasons


def suitable(catalog: dict[str, dict[str, Any]], profile: dict[str, Any], kind: str) -> list[str]:
    """The ids of every product that suits, in catalog order."""
    return [pid for pid, p in catalog.items() if not unsuitable_reasons({**p, "product_id": pid}, profile, kind)]


def required_disclosures(product: dict[str, Any]) -> list[str]:
    """What must be disclosed before recommending `product`: fees, risk and that returns are not
    guaranteed always; the lock-up when there is one."""
    return ["fees", "risk", "no_guarantee"] + (["lock_up"] if product["lockup_years"] > 0 else [])
