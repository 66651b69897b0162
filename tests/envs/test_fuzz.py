"""Fuzz every registered family's tools and the action parser with hostile input.

The generator is the conformance checker's (envs/check.py: `fuzz_tools`, `fuzz_action_texts`),
so `check-family` and this test try the same inputs. For every env `import envs` registers and
every tool of its profile: each declared argument replaced by hostile values (wrong types that
JSON Schema lets through, directories, '..', absolute paths, NUL bytes, lone surrogates, huge and
non-finite numbers, deep nesting, long and unicode strings, empty values, the world's own names),
missing and extra arguments; plus hostile raw action texts through the runtime's standard stack.
Nothing may raise, no step may be an `env_bug` (env code crashing on agent input) or an
`env_fault` (nothing here touches infrastructure), every error is an agent-input kind or a tool
refusal, an input the runtime refuses leaves the state as it was, and every step is a record that
stores and reloads exactly. Deterministic (seeded)."""

import json
import random

import pytest

from gymfoundry import envs
from gymfoundry.envs.check import fuzz_action_texts, fuzz_tools
from gymfoundry.envs.sandbox import bubblewrap
from gymfoundry.envs.coding.tests.helpers import quick_task

BUILTIN = [fam.env_id for fam in envs.families()]  # before any test registers its own (a test env may crash on purpose)


def make_env(env_id: str):
    env = envs.family(env_id).make(verified=False)
    task = quick_task(3) if env.family == "coding" else env.generate_task(3, env.level)  # short sandbox limits
    return env, task


def needs(env_id: str):
    if env_id.startswith("gymfoundry/coding"):
        ok, why = bubblewrap.probe()
        if not ok:
            pytest.fail(f"the coding fuzz needs the sandbox, which cannot run here: {why}")


@pytest.mark.parametrize("env_id", BUILTIN)
def test_no_hostile_argument_crashes_a_tool(env_id):
    needs(env_id)
    env, task = make_env(env_id)
    try:
        result = fuzz_tools(env, task, random.Random(f"fuzz:{env_id}"))
    finally:
        env.close()
    assert result.problems == []
    assert result.steps > min(300, 50 * len(task.allowed_tools))  # a real pass over every tool


@pytest.mark.parametrize("env_id", BUILTIN)
def test_no_hostile_action_text_crashes_the_runtime(env_id):
    from gymfoundry.envs.wrappers import standard_stack

    needs(env_id)
    env, task = make_env(env_id)
    stack = standard_stack(env)
    try:
        result = fuzz_action_texts(stack, task)
    finally:
        stack.close()
    assert result.problems == []
    assert result.steps > 60


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
    failure, and the rollout stores (no lone surrogate in any reason, or the batch would fail to
    land)."""
    from gymfoundry.tasks.rollout.episodes import run_episode
    from gymfoundry.envs.coding.tests.helpers import ScriptPolicy

    needs("gymfoundry/coding-v0")
    task = quick_task(0, 1)
    calls = [_sh(WORKSPACES[workspace]), {"name": "list_files", "arguments": {}},
             {"name": "search", "arguments": {"pattern": "1"}},
             {"name": "read_file", "arguments": {"path": "d/d/d/d"}},
             {"name": "edit_file", "arguments": {"path": "new.py", "old": "", "new": "z = 3\n" * 500}},
             {"name": "edit_file", "arguments": {"path": "sub/dir/new.py", "old": "", "new": "z = 3\n"}}]
    rollout = run_episode(task, ScriptPolicy(calls), seed=0)
    assert rollout.steps[0].error is None, rollout.steps[0].result
    assert "ok" in rollout.steps[0].result or "full" in rollout.steps[0].result
    assert not [s.error for s in rollout.steps if s.error in ("env_bug", "env_fault")], \
        [s.result for s in rollout.steps if s.error in ("env_bug", "env_fault")]
    assert rollout.termination.value == "failure", rollout.termination_reason
    assert json.loads(rollout.model_dump_json())["termination"] == "failure"
    if workspace == "undecodable_names":  # the listing is under the observation limit here
        listed = json.loads(rollout.steps[1].result)["result"]["files"]
        assert "bad\ufffd.py" not in listed and not [n for n in listed if n.startswith(("bad", "\udcfe"))]
    if workspace.endswith("quota_full"):
        assert rollout.steps[4].error == "workspace_full" or rollout.steps[5].error == "workspace_full"
