"""The coding world: a small Python package with injected bugs, in a sandbox.

The agent reads and edits files, runs argument vectors and the visible tests in the
sandbox, and submits. Submitting copies the workspace out (regular files only); the
grader (envs/coding/verifier.py) runs the hidden tests on that copy in a fresh sandbox the
agent never touched. The hidden tests exist only in the task's hidden fields and in that
grading sandbox, never in any path the agent can read or write.

Failure classes (envs/errors.py): a command or a test that fails is the agent's doing (an
observation with its exit code, whatever it printed: text the agent's code can write decides
nothing); a command past its time limit is killed with every process it started (a
`command_timeout` error observation); a sandbox that cannot start or run is an environment fault
(EnvFault, raised by the sandbox itself); anything else escaping a tool is an environment bug.
A task whose files or limits are malformed is refused at reset."""

from __future__ import annotations

import copy
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from gymfoundry.envs.base import EnvFault, ToolEnv, ToolError
from gymfoundry.envs.coding import generator
from gymfoundry.envs.errors import ErrorKind, InvalidTask
from gymfoundry.envs.family import masked_dirs
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.sandbox import Limits, PathError, Sandbox, create_sandbox
from gymfoundry.envs.sandbox.base import normalize_path
from gymfoundry.envs.tools import tool

RUNNER_SOURCE = Path(__file__).with_name("runner.py").read_text(encoding="utf-8")
MAX_TEXT = 2000  # characters of file or command output per observation (the JSON stays under 4000)
MAX_MATCHES = 40
UNLOGGED_ARGS = ("old", "new")  # edit texts stay out of the event log; other strings are cut to 200


class Refusal(str, Enum):
    """The coding tools' own refusal kinds (a step's `error`); the sandbox's path refusals
    (not_found, outside_workspace, ...) pass through as its `PathError` kind."""

    file_exists = "file_exists"
    no_match = "no_match"
    ambiguous_match = "ambiguous_match"
    command_timeout = "command_timeout"  # the command or the tests ran past their limit and were killed


WorkspacePath = Annotated[str, Field(min_length=1, max_length=512)]


def sandbox_limits(task: TaskSpec, override: Limits | None = None) -> Limits:
    if override is not None:
        return override
    spec = task.initial_state.get("limits", {})
    wall = float(spec.get("test_timeout_s", 20.0))
    return Limits(wall_s=wall, cpu_s=int(wall) + 5, memory_mb=int(spec.get("memory_mb", 512)),
                  processes=int(spec.get("processes", 64)))


def command_timeout(task: TaskSpec, limits: Limits) -> float:
    return float(task.initial_state.get("limits", {}).get("command_timeout_s", limits.wall_s))


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """Keep the head and the tail (where test summaries and tracebacks end)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]}\n...[{len(text) - limit} chars cut]...\n{text[-(limit - head):]}"


class CodingEnv(ToolEnv):
    family = "coding"
    profile_yaml = Path(__file__).with_name("profile.yaml")

    def __init__(self, outcome_fn=None, level: int = 2, sandbox_backend: str | None = None,
                 allow_unsafe: bool | None = None, limits: Limits | None = None):
        super().__init__(outcome_fn, level)
        self.sandbox_backend = sandbox_backend
        self.allow_unsafe = allow_unsafe
        self.limits_override = limits
        self._sandbox: Sandbox | None = None
        self._guarantees: dict[str, Any] | None = None

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        files = task.initial_state.get("files")  # checked here: the sandbox is made at the first call
        if not isinstance(files, dict) or not files or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise InvalidTask(f"task {task.task_id}: initial_state.files must map paths to file texts")
        for rel in files:
            _path(rel)
        limits = sandbox_limits(task, self.limits_override)
        numbers = (limits.wall_s, command_timeout(task, limits), limits.memory_mb, limits.processes)
        if not all(0 < n <= 1e6 for n in numbers):  # NaN fails every comparison
            raise InvalidTask(f"task {task.task_id}: initial_state.limits out of range: {numbers}")
        return {"events": [], "submitted": False, "submission": None, "summary": None}

    def is_finished(self, state: dict[str, Any]) -> bool:
        return bool(state["submitted"])

    def event_args(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        return {k: (v[:200] if isinstance(v, str) else copy.deepcopy(v)) for k, v in args.items()
                if k not in UNLOGGED_ARGS}

    def reset(self, task=None, seed=None):
        self._destroy_sandbox()
        self._guarantees = None
        return super().reset(task=task, seed=seed)

    def close(self) -> None:
        self._destroy_sandbox()

    def runtime_info(self) -> dict[str, Any]:
        return {"sandbox": self._guarantees}

    # -- the sandbox, made on first use ---------------------------------------------
    @property
    def limits(self) -> Limits:
        return sandbox_limits(self.task, self.limits_override)

    @property
    def command_timeout_s(self) -> float:
        return command_timeout(self.task, self.limits)

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = create_sandbox(self.task.initial_state["files"], {"runner.py": RUNNER_SOURCE},
                                           self.limits, self.sandbox_backend, self.allow_unsafe, masked_dirs())
            self._guarantees = self._sandbox.guarantees()
        return self._sandbox

    def _destroy_sandbox(self) -> None:
        if self._sandbox is not None:
            self._sandbox.destroy()
            self._sandbox = None

    # -- tools ------------------------------------------------------------------------
    @tool(ToolCategory.read)
    def tool_list_files(self, state, path: Annotated[str, Field(
            max_length=512, description="directory to list, default the workspace root")] = "."):
        """List the files of the workspace (or of one directory in it), as workspace-relative paths."""
        prefix = _path(path)
        files = [f for f in self.sandbox.list_files() if prefix == "." or f == prefix or f.startswith(prefix + "/")]
        return {"files": files[:300], "count": len(files)}

    @tool(ToolCategory.read)
    def tool_read_file(self, state, path: WorkspacePath, start_line: Annotated[int, Field(ge=1)] | None = None,
                       end_line: Annotated[int, Field(ge=1)] | None = None):
        """Read a text file of the workspace, optionally only lines start_line..end_line (1-based, inclusive)."""
        rel = _path(path)
        text = self._read(rel)
        lines = text.splitlines(keepends=True)
        first = start_line or 1
        last = min(end_line or len(lines), len(lines))
        content = "".join(lines[first - 1:last])
        out = {"path": rel, "start_line": first, "end_line": last, "total_lines": len(lines)}
        if len(content) > MAX_TEXT:
            content = content[:MAX_TEXT]
            out["truncated"] = "read fewer lines (start_line / end_line) to see the rest"
        return {**out, "content": content}

    @tool(ToolCategory.read)
    def tool_search(self, state, pattern: Annotated[str, Field(min_length=1, max_length=200)],
                    path: Annotated[str, Field(max_length=512,
                                               description="file or directory to search, default everything")] = "."):
        """Find the lines of workspace files that contain a literal string (case-sensitive)."""
        prefix = _path(path)
        matches = []
        for rel in self.sandbox.list_files():
            if not (prefix == "." or rel == prefix or rel.startswith(prefix + "/")):
                continue
            try:
                text = self._read(rel)
            except ToolError:
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if pattern in line:
                    matches.append({"path": rel, "line": number, "text": line.strip()[:200]})
        return {"pattern": pattern, "matches": matches[:MAX_MATCHES], "count": len(matches)}

    @tool(ToolCategory.write)
    def tool_edit_file(self, state, event, path: WorkspacePath, old: Annotated[str, Field(max_length=20000)],
                       new: Annotated[str, Field(max_length=20000)]):
        """Replace the exact text `old` with `new` in a file; `old` must occur exactly once. With an
        empty `old`, create a new file holding `new`."""
        rel = _path(path)
        event["path"] = rel
        event["test_file"] = rel == generator.TEST_DIR or rel.startswith(generator.TEST_DIR + "/")
        if old == "":
            if rel in self.sandbox.list_files():
                raise ToolError(Refusal.file_exists, f"{rel} exists; give the text to replace in `old`")
            self._write(rel, new)
            return {"path": rel, "created": True}
        text = self._read(rel)
        count = text.count(old)
        if count == 0:
            raise ToolError(Refusal.no_match, f"the `old` text does not occur in {rel}")
        if count > 1:
            raise ToolError(Refusal.ambiguous_match,
                            f"the `old` text occurs {count} times in {rel}; include more context")
        self._write(rel, text.replace(old, new))
        return {"path": rel, "replaced": 1}

    @tool(ToolCategory.execute, hint='an argument vector, e.g. ["python", "-c", "..."]')
    def tool_run(self, state, event,
                 argv: Annotated[list[Annotated[str, Field(max_length=8192)]], Field(min_length=1, max_length=64)],
                 timeout_s: Annotated[float, Field(gt=0, le=60)] | None = None):
        """Run a command in the sandbox as an argument vector (no shell unless you run one), in the
        workspace, without network access. Returns the exit code and output."""
        timeout = min(timeout_s or self.command_timeout_s, self.command_timeout_s)
        try:
            result = self.sandbox.run(argv, timeout_s=timeout)
        except ValueError as exc:
            raise ToolError(ErrorKind.invalid_arguments, str(exc)) from None
        self._note(event, result)
        if result.timed_out:
            hits = [h for h in result.limits_hit if not h.startswith("wall clock")]
            raise ToolError(Refusal.command_timeout,
                            f"the command ran past its {timeout:g}s limit and was killed, with every "
                            f"process it started{'; limits hit: ' + ', '.join(hits) if hits else ''}. "
                            f"Output so far:\n{clip(result.stdout + result.stderr, 800)}")
        out: dict[str, Any] = {"exit_code": result.exit_code, "stdout": clip(result.stdout),
                               "stderr": clip(result.stderr, MAX_TEXT // 2)}
        if result.limits_hit:
            out["limits_hit"] = result.limits_hit
        if result.network_attempts:
            out["network"] = "blocked: the sandbox has no network access"
        return out

    @tool(ToolCategory.execute)
    def tool_run_tests(self, state, event, path: Annotated[str, Field(
            max_length=512, description="a test file, default all of tests/")] | None = None):
        """Run the visible tests (all of tests/, or one test file) and report which pass and fail."""
        target = _path(path) if path else generator.TEST_DIR
        if getattr(self.sandbox, "python", "") is None:
            raise EnvFault("the sandbox has no Python interpreter to run the tests (missing dependency)")
        runner = f"{self.sandbox.support_dir}/runner.py"
        result = self.sandbox.run(["python", runner, target], timeout_s=self.limits.wall_s)
        self._note(event, result)
        if result.timed_out:
            raise ToolError(Refusal.command_timeout,
                            f"the tests ran past their {self.limits.wall_s:g}s limit and were killed. "
                            f"Output so far:\n{clip(result.stdout, 1200)}")
        summary = next((line for line in reversed(result.stdout.splitlines()) if line.endswith(" failed")), None)
        out: dict[str, Any] = {"exit_code": result.exit_code, "summary": summary or "the test run did not finish",
                               "output": clip(result.stdout + (("\n" + result.stderr) if result.stderr else ""))}
        if result.limits_hit:
            out["limits_hit"] = result.limits_hit
        return out

    @tool(ToolCategory.irreversible)
    def tool_submit(self, state, summary: Annotated[str, Field(max_length=1000)] | None = None):
        """Submit the workspace for grading by the hidden tests. Irreversible; ends the episode."""
        try:
            files = self.sandbox.snapshot()
        except PathError as exc:
            raise ToolError(exc.kind, str(exc)) from None
        # lossless: bytes that are not UTF-8 come back as themselves in the grader's copy (with
        # "replace" each grew to 3 bytes, and a workspace within its quota overflowed the grader's)
        state["submission"] = {k: v.decode("utf-8", "surrogateescape") for k, v in files.items()}
        state.update(submitted=True, summary=summary)
        return {"submitted": True, "files": len(files)}

    # -- helpers ----------------------------------------------------------------------
    def _note(self, event: dict[str, Any], result) -> None:
        event.update(exit_code=result.exit_code, timed_out=result.timed_out,
                     network_attempts=result.network_attempts, limits_hit=list(result.limits_hit))

    def _read(self, rel: str) -> str:
        try:
            return self.sandbox.read_file(rel, 1 << 20).decode("utf-8", "replace")
        except PathError as exc:
            raise ToolError(exc.kind, str(exc)) from None

    def _write(self, rel: str, text: str) -> None:
        try:
            self.sandbox.write_file(rel, text.encode("utf-8"))
        except PathError as exc:
            raise ToolError(exc.kind, str(exc)) from None


def _path(path: str) -> str:
    try:
        return normalize_path(path)
    except PathError as exc:
        raise ToolError(exc.kind, str(exc)) from None
