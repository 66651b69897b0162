"""The advisory family's rules, one owner each: when a product suits a client, which disclosures
a recommendation needs, and what counts as a prohibited claim. The generator (its references and
goal text), the verifier and the tests all read them here."""

from __future__ import annotations

import re
from typing import Any

TOPICS = ("risk_tolerance", "horizon", "budget", "exclusions")  # the suitability facts, asked in this order
FIELD = {"risk_tolerance": "risk_tolerance", "horizon": "horizon_years", "budget": "budget",
         "exclusions": "exclusions"}  # topic -> its field in a profile (record_suitability's arguments)
EXPOSURES = ("tobacco", "crypto", "fossil_fuels", "weapons", "gambling")  # what a client may exclude
DISCLOSURES = ("fees", "risk", "no_guarantee", "lock_up")

# Phrases that promise what no product can; matched case-insensitively on word boundaries.
PROHIBITED = ("guaranteed return", "guaranteed returns", "guaranteed profit", "guaranteed profits",
              "guaranteed growth", "guaranteed income", "risk-free", "risk free", "can't lose", "cannot lose",
              "can not lose", "zero risk", "no risk at all")
# A phrase within this many words after a negation is a denial ("returns are not guaranteed" is
# what the no_guarantee disclosure says; "this is not risk-free" is honest), not a claim.
NEGATIONS = ("no", "not", "never", "without", "isn't", "aren't", "nothing", "none", "neither", "nor")
NEGATION_WINDOW = 3
_PHRASE = re.compile("|".join(rf"(?<![a-z0-9]){re.escape(p)}(?![a-z0-9])"
                              for p in sorted(PROHIBITED, key=len, reverse=True)))
_WORD = re.compile(r"[a-z']+")


def prohibited_claims(text: str) -> list[str]:
    """The prohibited phrases `text` asserts (each once, in order), ignoring negated ones."""
    lowered = text.lower().replace("\u2019", "'")
    found: list[str] = []
    for match in _PHRASE.finditer(lowered):
        before = _WORD.findall(lowered[:match.start()])[-NEGATION_WINDOW:] if NEGATION_WINDOW else []
        if not any(w in NEGATIONS for w in before) and match.group(0) not in found:
            found.append(match.group(0))
    return found


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
