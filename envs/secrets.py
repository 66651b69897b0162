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
it is. Each is also redacted in base64 (at any alignment inside a longer base64 text, such as a
`Basic` header built from it). Whoever's they are, a URL's user name and password
(`http://user:pass@host` -> `http://[REDACTED]@host`) and the credentials of a `Basic` header
(base64 of `user:pass`) are redacted too. Values shorter than `MIN_SECRET_CHARS`, and the `PLACEHOLDERS` local servers take in
place of a key (`OPENAI_API_KEY=EMPTY` for vLLM), are not treated as secrets: redacting "EMPTY"
everywhere would destroy ordinary text and protect nothing.

`check_endpoint_url(url, key_from)` refuses an endpoint URL that holds a user name or password:
httpx would send them as a `Basic` header in place of the configured key, and the URL itself is
kept as run parameters and policy versions. Every place an endpoint is configured calls it.

`redact_logs(*names)` puts a filter on those loggers that redacts each record they emit (an
HTTP library logging the headers an endpoint echoed, at DEBUG)."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import threading
from functools import lru_cache
from typing import Any
from urllib.parse import quote, urlsplit

SECRET_ENV_VARS = ("GYMFOUNDRY_JUDGE_API_KEY", "GYMFOUNDRY_POLICY_API_KEY", "GYMFOUNDRY_USER_API_KEY",
                   "OPENAI_API_KEY")
MIN_SECRET_CHARS = 8
# What local servers take in place of a key (vLLM's EMPTY, llama.cpp's sk-no-key-required, ...):
# redacting them would destroy ordinary text and protect nothing.
PLACEHOLDERS = frozenset({"empty", "none", "null", "dummy", "ollama", "token", "not-needed", "no-key",
                          "sk-no-key-required", "placeholder", "changeme"})
FRAGMENT_CHARS = 12
MASK = "[REDACTED]"
# a token-like word (12+ characters, a digit, dash or underscore among them) after "Bearer"
_BEARER = re.compile(r"(?i)\b(bearer\s+)(?=[A-Za-z0-9._~+/=-]*[0-9_-])[A-Za-z0-9._~+/=-]{12,}")
# a URL's user name and password: everything between "scheme://" and the host's last "@"
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#\\\"'<>]*@")
# "Basic <base64>"; masked only when the base64 decodes to "user:password" (so "basic text" stays)
_BASIC = re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]{4,}={0,2})")
# The HTTP libraries' loggers: httpx logs each request's URL at INFO, httpcore the response
# headers at DEBUG (an endpoint echoing the key in a header would put it there).
HTTP_LOGGERS = ("httpx", "httpcore.connection", "httpcore.http11", "httpcore.http2", "httpcore.proxy",
                "httpcore.socks")
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
    forms = {form for v in values for form in (v, quote(v, safe=""), json.dumps(v)[1:-1], *_base64_forms(v))}
    return sorted(forms, key=lambda s: (-len(s), s))


def _base64_forms(value: str) -> list[str]:
    """The characters `value` becomes in base64 wherever it starts in the encoded bytes: three
    alignments, each without the characters it shares with its neighbours."""
    raw, forms = value.encode(), []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        forms.append(encoded[-(-8 * shift // 6):(8 * (shift + len(raw))) // 6])
    return [f for f in forms if len(f) >= MIN_SECRET_CHARS]


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
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _BASIC.sub(lambda m: m.group(1) + MASK if _is_userinfo(m.group(2)) else m.group(0), text)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)


def redact_json(value: Any) -> Any:
    """A JSON value with every known secret redacted wherever it appears, in keys and strings alike
    (redacted in its JSON text, which also catches a key spelled with escapes once decoded)."""
    return json.loads(redact(json.dumps(value)))


def _is_userinfo(word: str) -> bool:
    try:
        return ":" in base64.b64decode(word + "=" * (-len(word) % 4), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return False


def check_endpoint_url(url: str | None, key_from: str) -> str | None:
    """`url`, or a one-line ValueError if it holds a user name or password (`key_from` says where
    the key goes instead)."""
    if url and "@" in (urlsplit(url.strip()).netloc or ""):
        raise ValueError(f"the endpoint URL {redact(url)} holds a user name or password: put the password in "
                         f"{key_from}, not in the URL")
    return url


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
