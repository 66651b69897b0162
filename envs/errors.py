"""The error model: every failure is attributed to the boundary it crossed, decided by WHERE it
happened, never by the exception's type alone and never by any text the agent could print.

Boundaries, and what a failure there is:

- agent input (the action: parsing, size, nesting, schema, tool name, permission): an error
  observation with an `AGENT_INPUT` kind; the episode continues. The model's mistake.
- tool refusal (a tool declined the call for a reason that is the agent's doing: out of stock,
  no such file, a path outside the workspace): `ToolError`, an error observation with the
  tool's own kind; the state keeps the attempt (verifiers read refused attempts). The model's.
- agent code (coding: the agent's commands and the tests of its code exit non-zero, crash or
  hang): an ordinary observation or a `ToolError`, and at the end a failure with the reason.
  A model outcome, whatever the code printed.
- environment fault (a service down, the tool infrastructure failing, a sandbox that cannot
  start): `EnvFault`, raised deliberately by infrastructure code. Kind `env_fault`; the state is
  rolled back; the attempt is retried and never enters a statistic or a dataset.
- environment bug (env code crashing on agent input): any other exception escaping a
  boundary. Kind `env_bug`; the state is rolled back and the step keeps the triggering action
  so the bug can be reported and reproduced. Never a model outcome, never in a statistic.
- grader (the outcome verifier crashed) -> `verifier_error`; inference endpoint (the policy's
  HTTP layer raised `EndpointError`: no connection, a timeout, 429, 5xx after its own retries)
  -> `inference_fault`, retried like an env fault; any other exception a policy raises ->
  `policy_error`. None is a model outcome. A context-length rejection truncates the episode.

Time and tokens are attributed the same way, by whose clock ran out (envs.wrappers.TimeLimit):
the environment's (a step past its limit, or the steps together past the episode's) is an
environment fault (`env_fault`); the grader's (the verdict or the progress potential past its
own budget, run outside the agent's step) is a grader fault (`grader_fault`), both retried and
out of every statistic; the agent's own (the time outside steps and grading, the tokens it
reports) is the model's outcome, `truncated`, so a policy cannot stall its way out of the
statistics. The endpoint's latency is the inference fault above only where its client raises it.

`boundary(where, allowed)` applies this inside the env runtime (the action's checks, each tool):
inside it, only the exceptions that code at that boundary raises on purpose pass through;
anything else becomes an `EnvBug` naming the boundary and the line that raised. The rollout
loop (`gymfoundry.tasks.rollout.episodes.run_episode`) applies the same rule to what escapes the env as a whole
(`EnvFault` -> env_fault, anything else -> env_bug), the grader and the endpoints to theirs. So a `ToolError` raised by the parser, or a
`KeyError` from a tool handler, is an env bug, not the agent's mistake.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum


class ErrorKind(str, Enum):
    """Error kinds every family shares (a step's `error`). Tools add their own refusal kinds
    (`unknown_sku`, `no_match`); any kind not listed here is a refusal by the tool."""

    # agent input: the action itself
    invalid_action = "invalid_action"  # not a ToolCall, dict or text; or text that is not valid Unicode
    no_tool_call = "no_tool_call"
    multiple_tool_calls = "multiple_tool_calls"
    invalid_json = "invalid_json"  # unparsable, or NaN / Infinity
    invalid_tool_call = "invalid_tool_call"  # no string name, not an object
    action_too_large = "action_too_large"
    action_too_deep = "action_too_deep"
    invalid_arguments = "invalid_arguments"
    unknown_tool = "unknown_tool"
    tool_not_allowed = "tool_not_allowed"
    permission_denied = "permission_denied"  # the runtime refused an unapproved category
    # not the agent's doing
    env_fault = "env_fault"
    env_bug = "env_bug"
    timeout = "timeout"  # a clock of the runtime (envs.wrappers.TimeLimit) ran out, not a tool's
    token_budget = "token_budget"  # the policy's turn went past its token budget: the action was not run


AGENT_INPUT = frozenset({
    ErrorKind.invalid_action, ErrorKind.no_tool_call, ErrorKind.multiple_tool_calls, ErrorKind.invalid_json,
    ErrorKind.invalid_tool_call, ErrorKind.action_too_large, ErrorKind.action_too_deep,
    ErrorKind.invalid_arguments, ErrorKind.unknown_tool, ErrorKind.tool_not_allowed, ErrorKind.permission_denied})
# Step error kinds after which the state was rolled back: the call did nothing, replays skip it,
# and the step is nobody's mistake in a score.
ROLLED_BACK = frozenset({ErrorKind.env_fault.value, ErrorKind.env_bug.value})


def reached_world(kind: str | None) -> bool:
    """Whether a step with this error kind may have changed the world: not rolled back, and not
    refused by the runtime before any tool ran. Replays play exactly these calls."""
    return kind not in ROLLED_BACK and kind not in NOT_REACHED


def rolled_back(kind: str | None) -> bool:
    """Whether a step with this error kind was rolled back (an env fault or bug): it did nothing,
    replays skip it, no score or statistic holds it against the agent."""
    return kind in ROLLED_BACK


# Kinds only the runtime may give; a tool refusing with one would forge an attribution. A tool that
# says no because the call was not the agent's to make uses a kind of its own, which its profile
# scores as a refused permission (`permission_refusals`).
RESERVED = frozenset(k.value for k in ErrorKind) - {ErrorKind.invalid_arguments.value}
# Step error kinds of calls the runtime refused before the world saw them (the permission guard):
# like a rolled-back step, they did nothing and replays skip them.
NOT_REACHED = frozenset({ErrorKind.permission_denied.value})


class Boundary(str, Enum):
    agent_input = "agent_input"
    tool = "tool"
    environment = "environment"
    sandbox = "sandbox"
    grader = "grader"
    inference = "inference"


class ActionError(Exception):
    """The agent's action is bad (agent input): an error observation, never a crash."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = str(getattr(kind, "value", kind))
        self.message = message


class ToolError(Exception):
    """The tool refused the call for a reason that is the agent's doing (out of stock, unknown
    id). Becomes an error observation; the state keeps the attempt."""

    def __init__(self, kind: str, message: str):
        kind = str(getattr(kind, "value", kind))
        if kind in RESERVED:
            raise ValueError(f"a tool refusal cannot use the runtime's error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message


class EnvFault(Exception):
    """The environment itself failed (service down, tool infrastructure, sandbox could not
    start), raised on purpose by infrastructure code. Never the agent's fault."""

    kind = ErrorKind.env_fault.value


class EnvBug(Exception):
    """Env code crashed where it should have answered: made by `boundary`, never raised by hand."""

    kind = ErrorKind.env_bug.value

    def __init__(self, where: str, cause: BaseException):
        self.where = where
        self.cause = f"{type(cause).__name__}: {cause}"
        self.location = _location(cause)
        self.message = f"environment bug in {where}: {self.cause} (at {self.location})"
        super().__init__(self.message)


class UnknownEnv(ValueError):
    """No registered environment has this id or family (a typo, or a spoofed task field)."""


class InvalidTask(ValueError):
    """A task that cannot be run as given: malformed, tampered (id does not match content), or
    for another family. Raised to the caller of `reset` or of the landing stage; never an episode."""


@contextmanager
def boundary(where: str, allowed: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Attribute what escapes the block to `where`: exceptions of the `allowed` types (what code
    at this boundary raises on purpose) pass through; any other Exception becomes an EnvBug."""
    try:
        yield
    except allowed:
        raise
    except Exception as exc:
        raise EnvBug(where, exc) from exc


def _location(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    last = frames[-1]
    path = last.filename.replace("\\", "/")
    for root in ("/envs/", "/verifiers/", "/tasks/"):  # project-relative where possible
        if root in path:
            path = root[1:] + path.rsplit(root, 1)[1]
            break
    return f"{path}:{last.lineno}"
