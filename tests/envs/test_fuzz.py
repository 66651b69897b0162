"""Fuzz every registered family's tools and the action parser with hostile input.

For every env `import envs` registers and every tool of its profile: each declared argument
replaced by hostile values (wrong types that JSON Schema lets through, directories, '..',
absolute paths, NUL bytes, lone surrogates, huge and non-finite numbers, deep nesting, long
and unicode strings, empty values), missing and extra arguments; plus hostile raw action
texts through the runtime's standard stack. Nothing may raise, no step may be an `env_bug`
(env code crashing on agent input) or an `env_fault` (nothing here touches infrastructure),
every error is an agent-input kind or a tool refusal, a refused agent input leaves the state
as it was, and every step is a record that stores and reloads exactly. Deterministic (seeded)."""

import json
import random

import pytest

import envs
from envs.errors import AGENT_INPUT, RESERVED
from envs.records import Step
from envs.sandbox import bubblewrap
from envs.wrappers import standard_stack
from tests.envs.coding_helpers import quick_task

BUILTIN = envs.list_envs()  # before any test registers its own (a test env may crash on purpose)
DEEP_LIST: list = []
for _ in range(40):
    DEEP_LIST = [DEEP_LIST]
DEEP_DICT: dict = {}
for _ in range(40):
    DEEP_DICT = {"a": DEEP_DICT}
STRINGS = ["", " ", ".", "..", "../..", "a/../../b", "/", "/etc/passwd", "/workspace", "/workspace/../etc",
           "~", "$HOME", "*", "-rf", "\x00", "a\x00b", "\ud800", "x\udfffy", "é🙂\u202e", "\n\r\t", "x" * 600,
           "x" * 30000, "tests/", "./tests", "tests/../..", "NaN"]
NUMBERS = [0, -1, 1, 3.0, 1.5, 2**63, -(2**63) - 1, 10**400, float("nan"), float("inf"), float("-inf"), 1e-300,
           True, False]
OTHERS = [None, [], [""], ["\x00"], ["\ud800"], ["x"] * 300, {}, {"a": 1}, DEEP_LIST, DEEP_DICT]
HOSTILE = STRINGS + NUMBERS + OTHERS
RAW = ["", " ", "{", "}", "{}", "null", "[]", '"text"', "{{}}", '{"name": null}', '{"name": 5}', '{"name": ""}',
       '{"name": "nope"}', "<tool_call>", "<tool_call></tool_call>", "<tool_call>{}</tool_call>" * 2,
       '{"name": "x", "arguments": NaN}', '{"name": "x", "arguments": {"a": Infinity}}',
       '{"name": "x", "arguments": {"a": -Infinity}}', '{"name": "x", "arguments": "{\\"a\\": NaN}"}',
       '{"name": "x", "arguments": "[1"}', '{"name": "x", "arguments": "[]"}', '{"name": "x", "arguments": 7}',
       '{"name": "x", "arguments": {"a": ' + "9" * 5000 + "}}", '{"name": "x", "arguments": ' + "[" * 3000 + "]" * 3000 + "}",
       '{"name": "x", "arguments": ' + '{"a":' * 1500 + "1" + "}" * 1500 + "}", '{"function": "x"}',
       '{"function": {"name": ["x"]}}', '{"name": "x", "id": {"a": NaN}}', "\ud800" + '{"name": "x"}',
       '{"name": "\\ud800"}', '{"name": "x", "arguments": {"\\udc00": 1}}', "\x00" * 50, "{" * 9000]


def make_env(env_id: str):
    env = envs.make(env_id, verified=False)
    task = quick_task(3) if env.family == "coding" else None  # short sandbox time limits
    return env, task


def needs(env_id: str):
    if env_id.startswith("gymfoundry/coding"):
        ok, why = bubblewrap.probe()
        if not ok:
            pytest.fail(f"the coding fuzz needs the sandbox, which cannot run here: {why}")


def valid_value(schema: dict):
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    return {"string": "x", "integer": 1, "number": 1.0, "array": ["true"], "boolean": False}.get(kind, "x")


def argument_cases(tool, rng: random.Random, world_names: list[str], reference: list) -> list:
    """Hostile variants of the tool's arguments in the reference solution (so each variant gets as
    deep into the tool as one bad argument allows), or of schema-valid placeholders."""
    props = tool.parameters.get("properties", {})
    seen = next((c.arguments for c in reference if c.name == tool.name), {})
    base = {name: seen.get(name, valid_value(schema)) for name, schema in props.items()}
    cases: list = [{}, {**base, "state": 1}, {**base, "self": 1}, [], "x", 5, ["a"]]
    cases += [{k: v for k, v in base.items() if k != name} for name in props]
    values = HOSTILE + world_names
    if tool.category.value == "execute":  # each of these starts a sandboxed process: a sample
        values = rng.sample(values, 14)
    cases += [{**base, name: value} for name in props for value in values]
    return cases


def check_step(env, ts, before: dict) -> None:
    error = ts.info["error"]
    assert not ts.info.get("env_bug") and not ts.info.get("env_fault"), ts.observation
    observation = json.loads(ts.observation)
    if error is None:
        assert observation["ok"] is True
        return
    kind = error["kind"]
    assert kind in AGENT_INPUT or kind not in RESERVED, ts.observation
    assert observation["ok"] is False and observation["error"]["type"] == kind
    if kind in AGENT_INPUT:
        assert env.state() == before, f"a refused input changed the state: {ts.observation}"


def stored(step: Step) -> None:
    assert Step.model_validate_json(step.model_dump_json()) == step


@pytest.mark.parametrize("env_id", BUILTIN)
def test_no_hostile_argument_crashes_a_tool(env_id):
    needs(env_id)
    rng = random.Random(f"fuzz:{env_id}")
    env, task = make_env(env_id)
    env.reset(task, seed=3)
    reference = env.task.hidden.reference
    terminal = [t for t in env.profile.tools if t.category.value == "irreversible"]
    prefix = [c for c in reference if c.name not in {t.name for t in terminal}]

    def start() -> None:  # the world as the reference leaves it before it ends the episode
        env.reset(task, seed=3)
        for call in prefix:
            assert env.step(call).info["error"] is None

    start()
    files = env.task.initial_state.get("files", {})  # its directories, as paths to read or write
    names = sorted(set(env.state().get("catalog", {})) | {f.rsplit("/", 1)[0] for f in files} | set(list(files)[:1]))
    tools = [t for t in env.profile.tools if t not in terminal] + terminal  # episode-ending ones last
    steps = 0
    try:
        for tool in tools:
            for arguments in argument_cases(tool, rng, names, reference):
                before = env.state()
                ts = env.step({"name": tool.name, "arguments": arguments})
                check_step(env, ts, before)
                stored(env.steps[-1])
                steps += 1
                if ts.done:
                    start()
    finally:
        env.close()
    assert steps > 300


@pytest.mark.parametrize("env_id", BUILTIN)
def test_no_hostile_action_text_crashes_the_runtime(env_id):
    needs(env_id)
    env, task = make_env(env_id)
    stack = standard_stack(env)
    stack.reset(task, seed=3)
    tool = env.profile.tools[0].name
    texts = RAW + [t.replace('"x"', f'"{tool}"') for t in RAW]
    try:
        for text in texts:
            before = stack.state()
            ts = stack.step(text)
            check_step(stack, ts, before)
            assert ts.info["error"]["kind"] in AGENT_INPUT, (text[:80], ts.observation)
            assert stack.steps[-1].error == ts.info["error"]["kind"]
            stored(stack.steps[-1])
            if ts.done:  # the step limit: the runtime truncates, as it should
                stack.reset(task, seed=3)
    finally:
        stack.close()


# -- hostile workspaces: what the agent's own commands leave for the tools to read -----------------
def _sh(script: str) -> dict:
    return {"name": "run", "arguments": {"argv": ["python", "-c", script]}}


DEEP_TREE = ("import os\nfor i in range(1100):\n    os.mkdir('d'); os.chdir('d')\nopen('x.py', 'w').write('1')\n"
             "os.chdir('/workspace')\nfor i in range(20):\n    os.mkdir('n' * 250); os.chdir('n' * 250)\n"
             "open('y.py', 'w').write('2')\nprint('ok')")
UNDECODABLE_NAMES = ("import os\nopen(b'bad\\xff.py', 'wb').write(b'x = 1\\n')\nos.mkdir(b'\\xfe')\n"
                     "open(b'\\xfe/ok.py', 'wb').write(b'y = 2\\n')\nprint('ok')")
FULL_BYTES = ("n = 0\ntry:\n    while True:\n        open(f'f{n}', 'wb').write(b'x' * 8_000_000); n += 1\n"
              "except OSError:\n    print('full', n)")
FULL_INODES = ("n = 0\ntry:\n    while True:\n        open(f'n{n}', 'w').close(); n += 1\nexcept OSError:\n"
               "    print('full', n)")
WORKSPACES = {"deep_and_long_directories": DEEP_TREE, "undecodable_names": UNDECODABLE_NAMES,
              "byte_quota_full": FULL_BYTES, "file_quota_full": FULL_INODES}


@pytest.mark.parametrize("workspace", sorted(WORKSPACES))
def test_no_workspace_the_agent_builds_crashes_a_tool_or_the_record(workspace):
    """Directories past PATH_MAX or Python's recursion limit, names that are not UTF-8 and a full
    quota are the agent's doing: tools answer or refuse (never env_bug), the attempt is the model's
    failure, and the rollout stores (no lone surrogate in any reason). On fc25346 the deep tree made
    list_files and submit env bugs, a full quota made edit_file one, and an undecodable name put a
    lone surrogate in the side effects, so the batch failed to land."""
    from tasks.rollout import run_episode
    from tests.envs.coding_helpers import ScriptPolicy

    needs("gymfoundry/coding-v0")
    task = quick_task(0, 1)
    calls = [_sh(WORKSPACES[workspace]), {"name": "list_files", "arguments": {}},
             {"name": "search", "arguments": {"pattern": "1"}},
             {"name": "read_file", "arguments": {"path": "d/d/d/d"}},
             {"name": "edit_file", "arguments": {"path": "new.py", "old": "", "new": "z = 3\n" * 500}},
             {"name": "edit_file", "arguments": {"path": "sub/dir/new.py", "old": "", "new": "z = 3\n"}}]
    rollout = run_episode(task, ScriptPolicy(calls), seed=0)
    assert rollout.steps[0].error is None and "ok" in rollout.steps[0].result or "full" in rollout.steps[0].result
    assert not [s.error for s in rollout.steps if s.error in ("env_bug", "env_fault")], \
        [s.result for s in rollout.steps if s.error in ("env_bug", "env_fault")]
    assert rollout.termination.value == "failure", rollout.termination_reason
    assert json.loads(rollout.model_dump_json())["termination"] == "failure"
    if workspace == "undecodable_names":  # the listing is under the observation limit here
        listed = json.loads(rollout.steps[1].result)["result"]["files"]
        assert "bad\ufffd.py" not in listed and not [n for n in listed if n.startswith(("bad", "\udcfe"))]
    if workspace.endswith("quota_full"):
        assert rollout.steps[4].error == "workspace_full" or rollout.steps[5].error == "workspace_full"
