"""One rule for every test that needs the sandbox: where the bubblewrap sandbox cannot run, the
test is skipped on a developer's machine, but under CI (the environment variable CI is "true",
"1" or "yes", as CI services set it) it FAILS with the reason: a guarantee that cannot be tested is not a passed one.

    from tests.sandbox_guard import needs_sandbox

    @needs_sandbox                 # or, for a whole module: pytestmark = needs_sandbox
    def test_something(): ...

    def some_fixture():
        require_sandbox()          # the same rule from inside a fixture or a test
"""

from __future__ import annotations

import os

import pytest

from gymfoundry.envs.sandbox import bubblewrap

REASON = "the bubblewrap sandbox cannot run here"


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def require_sandbox() -> None:
    """Return if the sandbox runs here; else skip the test, or fail it under CI=true."""
    ok, why = bubblewrap.probe()
    if ok:
        return
    message = f"the bubblewrap sandbox cannot run here: {why}"
    if under_ci():
        pytest.fail(f"{message} (CI=true: a sandbox test that cannot run fails instead of skipping)",
                    pytrace=False)
    pytest.skip(message)


class _CannotRun:
    """A skipif condition pytest evaluates when each test is set up: true (skip) where the
    sandbox cannot run, except under CI, where evaluating it fails the test."""

    def __bool__(self) -> bool:
        if not bubblewrap.probe()[0]:
            require_sandbox()  # fails under CI (pytest.fail is not an Exception: it propagates)
            return True
        return False


needs_sandbox = pytest.mark.skipif(_CannotRun(), reason=REASON)
