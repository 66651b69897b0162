"""Credentials never reach a log or a stored record.

    redact(text) -> text with every known secret replaced by "[REDACTED]"

An endpoint can echo what it was sent (an `Authorization` header in an error body, in a
"reply"), and that text then travels into judge rationales, policy outputs, exception messages,
termination reasons, log records and Prefect's database. Every place that keeps or logs text
from an endpoint passes it through `redact` first, and before it clips the text (a key cut in
half by clipping would no longer match).

Known secrets are the values of `SECRET_ENV_VARS` in the current environment and every value
given to `register_secret` (keys passed in code rather than through the environment). Each is
also redacted URL-quoted and JSON-escaped, so is any run of `FRAGMENT_CHARS` or more characters
of one (an echo of part of a key, a key cut by someone's clipping), and any token-like
`Bearer <token>` is redacted whoever's token
it is. Values shorter than `MIN_SECRET_CHARS`, and the `PLACEHOLDERS` local servers take in
place of a key (`OPENAI_API_KEY=EMPTY` for vLLM), are not treated as secrets: redacting "EMPTY"
everywhere would destroy ordinary text and protect nothing.

`redact_logs(*names)` puts a filter on those loggers that redacts each record they emit (an
HTTP library logging the headers an endpoint echoed, at DEBUG)."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from functools import lru_cache
from urllib.parse import quote

SECRET_ENV_VARS = ("GYMFOUNDRY_JUDGE_API_KEY", "GYMFOUNDRY_POLICY_API_KEY", "OPENAI_API_KEY")
MIN_SECRET_CHARS = 8
# What local servers take in place of a key (vLLM's EMPTY, llama.cpp's sk-no-key-required, ...):
# redacting them would destroy ordinary text and protect nothing.
PLACEHOLDERS = frozenset({"empty", "none", "null", "dummy", "ollama", "token", "not-needed", "no-key",
                          "sk-no-key-required", "placeholder", "changeme"})
FRAGMENT_CHARS = 12
MASK = "[REDACTED]"
# a token-like word (12+ characters, a digit, dash or underscore among them) after "Bearer"
_BEARER = re.compile(r"(?i)\b(bearer\s+)(?=[A-Za-z0-9._~+/=-]*[0-9_-])[A-Za-z0-9._~+/=-]{12,}")
_registered: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Treat `value` as a secret from now on, in this process."""
    if _is_secret(value):
        with _lock:
            _registered.add(value)


def _is_secret(value: str | None) -> bool:
    return bool(value) and len(value) >= MIN_SECRET_CHARS and value.strip().lower() not in PLACEHOLDERS


def known_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """Every secret value and its URL-quoted and JSON-escaped forms, longest first (so a key that
    contains another is replaced whole)."""
    environ = os.environ if environ is None else environ
    with _lock:
        values = set(_registered)
    values |= {v for name in SECRET_ENV_VARS if _is_secret(v := environ.get(name) or "")}
    forms = {form for v in values for form in (v, quote(v, safe=""), json.dumps(v)[1:-1])}
    return sorted(forms, key=lambda s: (-len(s), s))


def redact(text: str | None, environ: dict[str, str] | None = None) -> str | None:
    """`text` with every known secret and bearer token replaced by MASK."""
    if not text:
        return text
    secrets = tuple(known_secrets(environ))
    for secret in secrets:
        text = text.replace(secret, MASK)
    fragments = _fragments(secrets)
    if fragments is not None:
        spans = [(m.start(), m.start() + len(m.group(1))) for m in fragments.finditer(text)]
        text = _mask(text, spans)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)


@lru_cache(maxsize=32)
def _fragments(secrets: tuple[str, ...]) -> re.Pattern | None:
    """Finds every FRAGMENT_CHARS-long piece of a secret, overlapping ones included."""
    pieces = {s[i:i + FRAGMENT_CHARS] for s in secrets for i in range(len(s) - FRAGMENT_CHARS + 1)}
    return re.compile("(?=(" + "|".join(map(re.escape, sorted(pieces))) + "))") if pieces else None


def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with each union of overlapping or touching spans replaced by one MASK."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    for start, end in reversed(merged):
        text = text[:start] + MASK + text[end:]
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record whose rendered message holds a secret (runs only for emitted records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def redact_logs(*names: str) -> None:
    """Redact every record of the loggers `names` (a logger's filters do not reach its children:
    name each logger that logs)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
