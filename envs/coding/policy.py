"""Scripted, observation-only policy for the coding family.

It reads the bug reports in the goal and what its tools return, nothing else. It runs the
visible tests, takes suspects from failing tracebacks and from the functions named in the
reports, reads them, and tries plausible one-line fixes (the inverse of common bugs: swapped
comparison or arithmetic operators, off-by-one, a constant or default the docstring
contradicts), checking each against the reports' examples (one `run` of a small script) or the
visible tests, and reverting what does not help. Missing branches are beyond it.

With probability `mistake_rate` per opportunity it makes a realistic mistake: "fixing" a
failing test instead of the code, trying to fetch something from the network, keeping a fix
it never checked, not reverting a failed attempt, or submitting before every report is fixed."""

from __future__ import annotations

import json
import re
from collections.abc import Generator

from gymfoundry.envs.scripted import ScriptedPolicy, tool_result as _result

REPORT = re.compile(r"^\d+\. (?:after `(?P<setup>[^`]*)`, )?`(?P<call>[^`]+)` from `(?P<module>[\w.]+)`"
                    r"(?: \(in (?P<file>[\w/.]+)\))? (?:should return `(?P<expected>.+)`|should raise (?P<exc>\w+))\.$",
                    re.MULTILINE)
VAGUE = re.compile(r"^\d+\. `(?P<function>\w+)` from `(?P<module>[\w.]+)` gives wrong results", re.MULTILINE)
FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\w+): (?P<src>.*)$', re.MULTILINE)
CALLED = re.compile(r"\b([a-z_]\w*)\(")
NOT_SUSPECTS = {"sorted", "list", "range", "len", "repr", "print", "int", "str", "sum", "max", "min", "dict",
                "set", "tuple", "raises", "isinstance"}
SWAPS = [(" <= ", " < "), (" < ", " <= "), (" >= ", " > "), (" > ", " >= "), (" == ", " != "), (" != ", " == "),
         (" + ", " - "), (" - ", " + "), (" // ", " / "), (" and ", " or "), (" or ", " and "),
         (".rjust(", ".ljust("), (".ljust(", ".rjust("), ("min(", "max("), ("max(", "min("), (":d}", ":02d}")]
MAX_TURNS = 80
MAX_CANDIDATES = 14

# The check the policy writes for itself: evaluates each report's call and prints one verdict each.
CHECK_SCRIPT = '''import json, sys
sys.path.insert(0, ".")
verdicts = []
for module, setup, call, expected in json.loads(sys.argv[1]):
    scope = {}
    try:
        exec("from %s import *" % module, scope)
        for line in setup:
            exec(line, scope)
        got = repr(eval(call, scope))
    except Exception as exc:
        got = "raises " + type(exc).__name__
    verdicts.append(got == expected)
print(json.dumps(verdicts))
'''


class ScriptedCodingPolicy(ScriptedPolicy):
    policy_id = "scripted-coding"
    max_turns = MAX_TURNS

    def _final_call(self, reason: str) -> str:
        if reason == "out of turns":
            return self._say("Out of turns; submitting.", "submit", {"summary": "out of turns"})
        return self._say("Done.", "submit", {"summary": "done"})

    # -- the script -------------------------------------------------------------------
    def _run(self, goal: str) -> Generator[str, str, None]:
        reports = [m.groupdict() for m in REPORT.finditer(goal)]
        vague = [m.groupdict() for m in VAGUE.finditer(goal)]
        checks = [[r["module"], [s.strip() for s in (r["setup"] or "").split(";") if s.strip()], r["call"],
                   r["expected"] if r["expected"] is not None else f"raises {r['exc']}"] for r in reports]

        if self._mistake() and self._mistake():  # looks for help online, which the sandbox refuses
            yield self._say("Let me check the docs online.", "run",
                            {"argv": ["python", "-c", "import urllib.request; "
                                      "print(urllib.request.urlopen('https://docs.python.org/3/').status)"]})
        yield self._say("See what is in the repository.", "list_files", {})
        obs = yield self._say("Run the visible tests first.", "run_tests", {})
        failing, precise, loose, test_fixes = _failures(_result(obs))
        suspects = list(precise)  # a traceback into the package first, then what the reports name
        for report in reports:
            names = [CALLED.findall(report["call"])] + [CALLED.findall(s) for s in (report["setup"] or "").split(";")[::-1]]
            suspects += [(report.get("file"), n, None) for group in names for n in group if n not in NOT_SUSPECTS]
        suspects += loose + [(None, v["function"], None) for v in vague]

        if failing and test_fixes and self._mistake() and self.rng.random() < 0.4:  # edits the test, not the code
            path, old, new = test_fixes[0]
            yield self._say(f"The test in {path} looks wrong; align it with the code.", "edit_file",
                            {"path": path, "old": old, "new": new})
            failing -= 1

        score = yield from self._score(checks, failing)
        tried: set[tuple[str, str]] = set()
        for file, function, line_hint in _unique(suspects):
            if score == 0:
                break
            if file is None:
                obs = yield self._say(f"Where is {function} defined?", "search", {"pattern": f"def {function}("})
                hits = (_result(obs) or {}).get("matches", [])
                if not hits:
                    continue
                file = hits[0]["path"]
            obs = yield self._say(f"Read {file}.", "read_file", {"path": file})
            content = (_result(obs) or {}).get("content", "")
            for line, new in _candidates(content, function, line_hint)[:MAX_CANDIDATES]:
                if (file, new) in tried or content.count(line) != 1:
                    continue
                tried.add((file, new))
                obs = yield self._say(f"Try changing line {content.splitlines().index(line) + 1} of {file}.", "edit_file",
                                      {"path": file, "old": line, "new": new})
                if _result(obs) is None:
                    continue
                if self._mistake() and self._mistake():  # keeps a fix it never checked
                    content = content.replace(line, new)
                    break
                new_score = yield from self._score(checks, None if checks else failing)
                if new_score < score:
                    score = new_score
                    content = content.replace(line, new)
                    if score and self._mistake() and self.rng.random() < 0.5:  # calls it done too early
                        score = 0
                    break
                if self._mistake() and self.rng.random() < 0.5:  # forgets to undo a failed attempt
                    content = content.replace(line, new)
                    continue
                yield self._say("That did not help; undo it.", "edit_file", {"path": file, "old": new, "new": line})
        yield self._say("Run the visible tests once more.", "run_tests", {})
        yield self._say("Submit the fix.", "submit", {"summary": "fixed the reported bugs"})

    def _score(self, checks: list, failing: int | None) -> Generator[str, str, int]:
        """How many reports (by their examples) or visible tests still fail; lower is better."""
        if checks:
            obs = yield self._say("Check the reported examples.", "run",
                                  {"argv": ["python", "-c", CHECK_SCRIPT, json.dumps(checks)]})
            try:
                verdicts = json.loads(((_result(obs) or {}).get("stdout") or "").strip().splitlines()[-1])
                return sum(not v for v in verdicts)
            except (IndexError, ValueError, TypeError):
                return len(checks)
        if failing is None:
            obs = yield self._say("Run the tests.", "run_tests", {})
            failing = _failures(_result(obs))[0]
        return failing



def _failures(result: dict | None) -> tuple[int, list, list, list]:
    """(number of failing tests, suspects from tracebacks into the package, functions the
    failing asserts call, edits that would make a failing test expect what the code does)."""
    output = (result or {}).get("output", "")
    summary = re.search(r"(\d+) passed, (\d+) failed", (result or {}).get("summary") or "")
    failing = int(summary.group(2)) if summary else 0
    precise, loose, test_fixes = [], [], []
    for block in re.split(r"^FAIL ", output, flags=re.MULTILINE)[1:]:
        frames = [m.groupdict() for m in FRAME.finditer(block)]
        inside = [f for f in frames if not f["file"].startswith("tests/")]
        if inside:
            precise.append((inside[-1]["file"], inside[-1]["func"], int(inside[-1]["line"])))
        elif frames:
            loose += [(None, n, None) for n in CALLED.findall(frames[-1]["src"]) if n not in NOT_SUSPECTS]
        got = re.search(r"AssertionError: got (.+), expected (.+)$", block, re.MULTILINE)
        if got and frames and frames[-1]["file"].startswith("tests/") and " == " in frames[-1]["src"]:
            src = frames[-1]["src"]
            test_fixes.append((frames[-1]["file"], src, src.rsplit(" == ", 1)[0] + " == " + got.group(1)))
    return failing, precise, loose, test_fixes


def _unique(suspects: list) -> list[tuple[str | None, str, int | None]]:
    seen, out = set(), []
    for file, function, line in suspects:
        if function not in seen:
            seen.add(function)
            out.append((file, function, line))
    return out


def _candidates(content: str, function: str, line_hint: int | None) -> list[tuple[str, str]]:
    """(line, rewritten line) pairs from the function's lines and the module constants it
    uses, most plausible first: the traceback's line, then values the docstrings state, then
    swapped operators, then off-by-one shifts."""
    lines = content.splitlines()
    start = next((i for i, l in enumerate(lines) if re.match(rf"\s*def {function}\(", l)), None)
    if start is None:
        return []
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent), len(lines))
    span = "\n".join(lines[start:end])
    body = [l for l in lines[start:end] if l.strip() and not l.strip().startswith(('"""', "#"))
            and not re.match(r"\s*(def|class|return \w+$)", l)] + [lines[start]]
    constants = [l for l in lines if re.match(r"^[A-Z_]+ = ", l) and l.split(" = ")[0] in span]
    hinted = lines[line_hint - 1] if line_hint and 0 < line_hint <= len(lines) else None
    numbers, strings = _hints(content)
    ranked = []
    for line in dict.fromkeys(body + constants):
        for new, priority in _rewrites(line, numbers, strings, span, "import math" in content):
            ranked.append((priority + 3 * (line == hinted), line, new))
    ranked.sort(key=lambda r: -r[0])
    return [(line, new) for _, line, new in ranked]


def _hints(content: str) -> tuple[list[str], list[str]]:
    """What the docstrings say the code uses: numbers in the prose (not in quoted examples)
    and quoted defaults ('default "-"')."""
    docs = " ".join(re.findall(r'"""(.*?)"""', content, re.DOTALL))
    prose = re.sub(r'"[^"]*"', " ", docs)
    return (list(dict.fromkeys(re.findall(r"\b\d+\b", prose))),
            list(dict.fromkeys(re.findall(r'default "([^"]{1,4})"', docs))))


def _rewrites(line: str, numbers: list[str], strings: list[str], span: str,
              has_math: bool) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for m in re.finditer(r"\b\d+\b", line):  # a constant the docstring contradicts
        value = int(m.group())
        for number in numbers:
            if value > 1 and number != m.group() and 0.09 <= int(number) / value <= 11:
                out.append((line[:m.start()] + number + line[m.end():], 2))
        if value <= 3 and re.search(r"[<>]=? *$", line[:m.start()]):
            for shifted in (value - 1, value + 1):
                out.append((line[:m.start()] + str(shifted) + line[m.end():], 0))
    for m in re.finditer(r'"([^"]{1,4})"', line if line.lstrip().startswith("def ") else ""):  # defaults
        for text in strings:
            if text != m.group(1):
                out.append((line[:m.start()] + f'"{text}"' + line[m.end():], 2))
    for old, new in SWAPS:
        start = line.find(old)
        while start != -1:
            out.append((line[:start] + new + line[start + len(old):], 1))
            start = line.find(old, start + 1)
    for m in re.finditer(r"\s[+-] 1\b", line):
        out.append((line[:m.start()] + line[m.end():], 0))
    for m in re.finditer(r"\[:(\w+)\]", line):
        out.append((line[:m.start()] + f"[:{m.group(1)} + 1]" + line[m.end():], 0))
    for m in re.finditer(r"\b([a-z_]\w*) \* ", line):
        out.append((line[:m.start()] + f"({m.group(1)} - 1) * " + line[m.end():], 0))
    for m in re.finditer(r"\b(\w+) // (\w+)", line):
        if has_math:
            out.append((line[:m.start()] + f"math.ceil({m.group(1)} / {m.group(2)})" + line[m.end():], 0))
    m = re.match(r"(\s+)(\w+) = (.+)$", line)
    if m and re.search(rf"\b{m.group(2)} = 0$", span, re.MULTILINE) and not m.group(3).strip() == "0":
        out.append((f"{m.group(1)}{m.group(2)} += {m.group(3)}", 1))
    seen: dict[str, int] = {}
    for new, priority in out:
        if new != line and new not in seen:
            seen[new] = priority
    return list(seen.items())
