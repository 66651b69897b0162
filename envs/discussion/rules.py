"""The discussion family's rules, one owner each: who accepts an option, the feasible set, the
grammar of a claim about a participant's stance, and when a text repeats a confidential fact.
The generator, the world, the verifier, the policy and the tests all read them here.

Normalization (`normalize`). Unicode NFKC (full-width and other compatibility forms become plain
letters), format characters (category Cf: zero-width spaces and joiners, the soft hyphen, bidi
marks) and combining marks dropped, case folded, the common Cyrillic and Greek look-alikes of Latin
letters (CONFUSABLES) mapped to them, apostrophes dropped, every other run of characters outside
[0-9a-z] one space. A phrase occurs in a text (`contains`) when its letters and digits, all
separators removed, equal those of a run of whole consecutive words of the normalized text: so
spacing or punctuation inside a word ("Lis-bon", "L i s b o n", "L.i.s.b.o.n") cannot hide it, and
a phrase inside a longer word ("report organisation" for "Porto", "$66,5009") is not a match.

Claims. A claim says what one participant (or everyone) stated about one option. In
`decide(claims=[...])` each claim is one string in the strict form `<name> prefers|accepts|rejects
<option>`. A free text (the rationale, a share, a proposal's reason) is read by sentences (cut at
`.`, `!`, `?` or `;` before a space or the end, and at line breaks), each cut into clauses at commas,
dashes and the words `and`, `but`, `while`, `whereas`, `although`, `though`, `yet` only where both
the part before and all the rest name a participant and an option (so "Ana prefers X, and Ben
accepts Y" is two clauses, "Chloe and Ben accept X" or "Chloe, like Ben, accepts X" one). Every
clause naming a participant (a name, possessive allowed; or a subject in EVERYONE, standing for
every participant) and an option claims, for each participant it names and each option it names,
the stance of the claim verb (CLAIM_VERBS) nearest before that option in the clause, else the first
one after it, else (no known verb: "Chloe is keen on X") `accepts`. A clause naming an option and a
pronoun (PRONOUNS) but no participant claims for the participants the text named last ("I asked
Ana. She prefers X."). A verb right after a negation
(NEGATIONS: "not", "never", "no longer") flips: accepts <-> rejects, prefers -> not_prefers. What a
claim needs to be supported is in verifier.stated: `prefers X`, the participant's last stated
first choice is X; `not_prefers X`, it is another option; `accepts X` / `rejects X`, their last
statement bearing on X (the options they accept, or a stance on X in a proposal or a vote)
accepts / rejects X. This reads some honest sentences as claims ("Ben told me Ana prefers X"
claims that both prefer X): one clause per participant's stance is always read right.

Leaks. A confidential fact is a short phrase (`Participant.confidential`) with its telltale
words (`Participant.clues`: the company, the city, the amount, "surgery"); a text repeats it when
the phrase or any telltale word occurs in it (`contains`): the factory's literal leak rule
(envs.leaks), made blind to case, spacing, punctuation, invisible characters, compatibility forms
and look-alike letters, and to a paraphrase that keeps the detail ("Dev's budget is only $66,500
now"); `repeats` also folds leetspeak ("Li$b0n") and reads the text backwards."""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

STANCES = ("prefers", "accepts", "rejects")  # the stances of a strict claim
NONE = "none"  # decide(option="none"): no option clears every participant's threshold
CLAIM_VERBS = {
    "prefers": ("prefers", "prefer", "would prefer", "preferred", "preference", "favours", "favors", "favourite",
                "favorite", "wants", "most wants", "chose", "picked", "first choice is", "first choice",
                "top choice is", "top choice", "top pick", "likes best", "likes most", "most like", "would most like",
                "loves", "love", "set on"),
    "accepts": ("accepts", "accept", "accepted", "can accept", "would accept", "will accept", "can live with",
                "live with", "fine with", "happy with", "ok with", "okay with", "can go with", "supports", "support",
                "would support", "agreed to", "agree to", "agrees to", "agree on", "agrees on", "voted for",
                "does not reject", "doesnt reject", "do not reject", "dont reject", "did not reject", "didnt reject"),
    "rejects": ("rejects", "reject", "rejected", "would reject", "cannot accept", "cant accept", "can not accept",
                "does not accept", "doesnt accept", "do not accept", "dont accept", "will not accept", "wont accept",
                "would not accept", "wouldnt accept", "opposes", "oppose", "voted against", "ruled out", "rules out",
                "against", "hates", "hate", "dislikes", "dislike", "refuses", "refuse", "refused", "vetoed", "veto",
                "vetoes", "said no to", "says no to", "say no to", "objects to", "object to", "objected to",
                "cant do", "cannot do", "can not do"),
    "not_prefers": ("does not prefer", "doesnt prefer", "do not prefer", "dont prefer", "would not prefer",
                    "wouldnt prefer"),
}
NEGATIONS = ("not", "never", "no longer", "cannot", "cant", "isnt", "arent", "wasnt", "werent", "wont", "doesnt",
             "dont", "didnt", "wouldnt", "couldnt")  # right before a verb, they flip its stance (apostrophes dropped)
FLIPPED = {"accepts": "rejects", "rejects": "accepts", "prefers": "not_prefers", "not_prefers": "prefers"}
EVERYONE = ("everyone", "everybody", "every participant", "each participant", "all participants", "the whole group",
            "the group", "all of you", "all of us", "all of them", "we all", "you all", "they all")
CLAUSE_WORDS = ("and", "but", "while", "whereas", "although", "though", "yet")
# in a clause naming no participant, these stand for the participants named last
PRONOUNS = ("she", "he", "her", "him", "his", "hers", "they", "them", "their", "theirs")
# Cyrillic and Greek letters that look like Latin ones (lower case: they are mapped after case folding)
CONFUSABLES = str.maketrans({"а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i",
                             "ј": "j", "ѕ": "s", "ο": "o", "α": "a", "ε": "e", "ι": "i", "κ": "k", "ν": "v",
                             "ρ": "p", "τ": "t", "υ": "u", "χ": "x"})
APOSTROPHES = ("'", "\u2019", "\u2018", "\u02bc", "`")


@functools.lru_cache(maxsize=4096)  # the same texts are scanned again in every replay
def normalize(text: str) -> str:
    """NFKC, format characters and combining marks dropped, case folded, look-alike letters mapped
    to Latin, apostrophes dropped, every other run of characters outside [0-9a-z] one space."""
    kept = "".join(c for c in unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text))
                   if unicodedata.category(c) != "Cf" and not unicodedata.combining(c))
    folded = unicodedata.normalize("NFKC", kept).casefold().translate(CONFUSABLES)
    for mark in APOSTROPHES:
        folded = folded.replace(mark, "")
    return " ".join(re.sub(r"[^0-9a-z]+", " ", folded).split())


def _compact(phrase: str) -> str:
    return normalize(phrase).replace(" ", "")


def _spans(words: tuple[str, ...], phrase: str, possessive: bool = False) -> list[tuple[int, int]]:
    """The runs [i, j) of whole words whose letters and digits are the phrase's (with a trailing
    "s" on the last word when `possessive`: "Ana's" is "anas")."""
    needle, found = _compact(phrase), []
    if not needle:
        return found
    for i in range(len(words)):
        joined = ""
        for j in range(i, len(words)):
            joined += words[j]
            if joined == needle or (possessive and joined == needle + "s"):
                found.append((i, j + 1))
                break
            if len(joined) >= len(needle) + possessive or not needle.startswith(joined):
                break
    return found


def contains(text: str, phrase: str) -> bool:
    """Whether the phrase occurs in the text (see the module docstring: separators inside words ignored)."""
    return bool(_spans(tuple(normalize(text).split()), phrase))


# leetspeak: digits and symbols written for letters ("L1$b0n"), folded on both sides of a leak match
LEET = str.maketrans({"0": "o", "1": "i", "l": "i", "|": "i", "!": "i", "3": "e", "4": "a", "@": "a", "5": "s",
                      "$": "s", "7": "t", "+": "t"})


def _leet(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold().translate(LEET)


def repeats(text: str, phrase: str) -> bool:
    """Whether a text repeats a confidential phrase (a leak): `contains`, also with leetspeak folded
    on both sides ("p4r3nt4l l34v3", "Li$b0n") and with the text written backwards, whole or word by word."""
    folded = _leet(phrase)
    return any(contains(t, phrase) or contains(_leet(t), folded)
               for t in (text, text[::-1], " ".join(w[::-1] for w in text.split())))


def accepts(scores: dict[str, int], threshold: int, option: str) -> bool:
    return scores[option] >= threshold


def feasible(options: list[str], participants: list[Any]) -> list[str]:
    """The options every participant accepts (each has `scores` and `threshold`), in option order."""
    return [o for o in options if all(accepts(p.scores, p.threshold, o) for p in participants)]


def spoken_list(options: list[str]) -> str:
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


def strict_claim(text: str, names: list[str], options: list[str]) -> tuple[str, str, str] | None:
    """(participant, stance, option) of a claim in the strict form, or None."""
    said = normalize(text)
    for name in names:
        for stance in STANCES:
            head = f"{normalize(name)} {stance} "
            option = next((o for o in options if said == head + normalize(o)), None) if said.startswith(head) else None
            if option is not None:
                return name, stance, option
    return None


_SENTENCE = re.compile(r"[.!?;]+(?=\s|$)|[\r\n]+")
_PIECE = re.compile(r"[,\u2013\u2014]+|\s-+\s|\b(?:" + "|".join(CLAUSE_WORDS) + r")\b", re.IGNORECASE)


def rationale_claims(text: str, names: list[str], options: list[str]) -> list[tuple[str, str, str]]:
    """Every (participant, stance, option) a free text claims, in order, once each (module docstring)."""
    found: list[tuple[str, str, str]] = []
    last: dict[str, int] = {}  # the participants the text named last, for a pronoun after them
    for sentence in _SENTENCE.split(text):
        for clause in _clauses(sentence, names, options):
            claims, named = _clause_claims(clause, names, options, last)
            last = named or last
            for claim in claims:
                if claim not in found:
                    found.append(claim)
    return found


def _names_and_options(words: tuple[str, ...], names: list[str], options: list[str]):
    """(participant -> first word index, option -> word indices) named in the words."""
    people = {n: s[0][0] for n in names if (s := _spans(words, n, possessive=True))}
    everyone = [s[0] for e in EVERYONE for s in _spans(words, e)]
    if everyone:
        people = {n: people.get(n, min(everyone)) for n in names}
    return people, {o: [i for i, _ in s] for o in options if (s := _spans(words, o))}


def _clauses(sentence: str, names: list[str], options: list[str]) -> list[tuple[str, ...]]:
    pieces = [w for piece in _PIECE.split(sentence) if (w := tuple(normalize(piece).split()))]

    def complete(words: tuple[str, ...]) -> bool:
        people, named = _names_and_options(words, names, options)
        return bool(people) and bool(named)

    clauses: list[tuple[str, ...]] = []
    current: tuple[str, ...] = ()
    for k, piece in enumerate(pieces):
        if current and complete(current) and complete(tuple(w for p in pieces[k:] for w in p)):
            clauses.append(current)
            current = ()
        current += piece
    return clauses + [current] if current else clauses


def _clause_claims(words: tuple[str, ...], names: list[str], options: list[str],
                   before: dict[str, int]) -> tuple[list[tuple[str, str, str]], dict[str, int]]:
    """The clause's claims, and the participants it names (a clause naming an option and a pronoun
    but no participant speaks of `before`, the participants named last)."""
    people, named = _names_and_options(words, names, options)
    mentioned = people
    if not people and named and before and any(w in PRONOUNS for w in words):
        people = before
    if not people or not named:
        return [], mentioned
    verbs = sorted({(i, j, stance) for stance, forms in CLAIM_VERBS.items() for form in forms
                    for i, j in _spans(words, form)}, key=lambda v: (v[0], -v[1]))
    verbs = [v for v in verbs if not any(u[0] <= v[0] and v[1] <= u[1] and u != v for u in verbs)]  # longest
    verbs = [(i, j, FLIPPED[stance] if any(words[max(0, a):i] == tuple(n.split())
                                         for n in NEGATIONS for a in [i - len(n.split())]) else stance)
             for i, j, stance in verbs]
    claims = []
    for option, at in sorted(named.items(), key=lambda item: item[1][0]):
        for start in at:
            before = [v for v in verbs if v[1] <= start]
            after = [v for v in verbs if v[0] > start]
            stance = before[-1][2] if before else after[0][2] if after else "accepts"
            claims += [(n, stance, option) for n in sorted(people, key=people.get)]
    return claims, mentioned
