"""Credentials never reach a log or a stored record.

    redact(text) -> text with every known secret replaced by "[REDACTED]"

An endpoint can echo what it was sent (an `Authorization` header in an error body, in a
"reply"), and that text then travels into judge rationales, policy outputs, exception messages,
termination reasons, log records and Prefect's database. Every place that keeps or logs text
from an endpoint passes it through `redact` first, and before it clips the text (a key cut in
half by clipping would no longer match).

Known secrets are the values of `SECRET_ENV_VARS` in the current environment and every value
given to `register_secret` (keys passed in code rather than through the environment). Each is
also redacted URL-quoted and JSON-escaped, and any token-like `Bearer <token>` is redacted whoever's token
it is. Values shorter than `MIN_SECRET_CHARS` are not treated as secrets (redacting "x" would
destroy the text and protect nothing)."""

from __future__ import annotations

import json
import os
import re
import threading
from urllib.parse import quote

SECRET_ENV_VARS = ("GYMFOUNDRY_JUDGE_API_KEY", "GYMFOUNDRY_POLICY_API_KEY", "OPENAI_API_KEY")
MIN_SECRET_CHARS = 4
MASK = "[REDACTED]"
# a token-like word (12+ characters, a digit, dash or underscore among them) after "Bearer"
_BEARER = re.compile(r"(?i)\b(bearer\s+)(?=[A-Za-z0-9._~+/=-]*[0-9_-])[A-Za-z0-9._~+/=-]{12,}")
_registered: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Treat `value` as a secret from now on, in this process."""
    if value and len(value) >= MIN_SECRET_CHARS:
        with _lock:
            _registered.add(value)


def known_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """Every secret value and its URL-quoted and JSON-escaped forms, longest first (so a key that
    contains another is replaced whole)."""
    environ = os.environ if environ is None else environ
    with _lock:
        values = set(_registered)
    values |= {v for name in SECRET_ENV_VARS if len(v := environ.get(name) or "") >= MIN_SECRET_CHARS}
    forms = {form for v in values for form in (v, quote(v, safe=""), json.dumps(v)[1:-1])}
    return sorted(forms, key=lambda s: (-len(s), s))


def redact(text: str | None, environ: dict[str, str] | None = None) -> str | None:
    """`text` with every known secret and bearer token replaced by MASK."""
    if not text:
        return text
    for secret in known_secrets(environ):
        text = text.replace(secret, MASK)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)
