"""The coding family: generator, env, scripted policy, and a hostile agent through the real
env and sandbox (every attack contained, the right failure class, no surviving process)."""

import hashlib
import json
import random
import socket
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from gymfoundry import envs
from gymfoundry.envs.coding import verifier as coding_verifier
from gymfoundry.envs.coding import GENERATOR_VERSION, CodingEnv, generate_task
from gymfoundry.envs.coding.generator import LEVELS, Site, TEMPLATES_DIR, inject, load_templates
from gymfoundry.envs.coding.policy import ScriptedCodingPolicy
from gymfoundry.envs.coding.world import RUNNER_SOURCE
from gymfoundry.envs.records import TaskSpec, Termination, ToolCall, content_hash
from gymfoundry.envs.sandbox import bubblewrap, create_sandbox
from gymfoundry.tasks.stages.isolate import find_leaks
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.stages.validate import validate_tasks
from gymfoundry.envs.coding.tests.helpers import ScriptPolicy, alive_with, local_listener, quick_task, run, sandbox_processes

from tests.sandbox_guard import needs_sandbox  # skips here, fails under CI=true


def obs(ts) -> dict:
    return json.loads(ts.observation)


# -- generator ----------------------------------------------------------------------------
def test_generator_is_deterministic_and_records_its_source():
    assert generate_task(5, 3) == generate_task(5, 3)
    assert generate_task(5, 3).task_id != generate_task(6, 3).task_id != generate_task(5, 4).task_id
    task = generate_task(5, 2)
    assert task.task_id == "t-" + content_hash(task.model_dump(mode="json", exclude={"task_id", "split"}))
    assert (task.source.generator, task.source.version, task.source.seed) == ("coding", GENERATOR_VERSION, 5)
    assert task.env_id == "gymfoundry/coding-v0" and task.family == "coding"
    with pytest.raises(ValueError):
        generate_task(1, 6)


def test_difficulty_knobs_by_level():
    for level, knobs in LEVELS.items():
        for seed in range(8):
            task = generate_task(seed, level)
            bugs = task.hidden.checks["bugs"]
            assert len(bugs) == knobs["bugs"] == task.difficulty.features["n_bugs"]
            assert all(b["distance"] <= knobs["max_distance"] for b in bugs)
            assert max(b["distance"] for b in bugs) >= knobs["min_distance"]
            assert ("(in " in task.goal) == knobs["name_file"]
            assert task.goal.count("gives wrong results") == knobs["vague"]


def test_hidden_tests_and_bug_sites_stay_out_of_everything_visible():
    for seed in range(10):
        task = generate_task(seed, 1 + seed % 5)
        visible = task.goal + json.dumps(task.initial_state)
        assert task.hidden.secrets and not find_leaks(task, [visible])
        assert not any(path.startswith("hidden") or "test_hidden" in path for path in task.initial_state["files"])
        for source in task.hidden.checks["hidden_tests"].values():
            assert source not in visible


def test_reference_is_the_inverse_patch_through_edit_file():
    for seed in range(10):
        task = generate_task(seed, 1 + seed % 5)
        template = load_templates()[task.hidden.checks["template"]]
        files = dict(task.initial_state["files"])
        assert files != template.files
        for call in task.hidden.reference:
            if call.name == "edit_file":
                assert files[call.arguments["path"]].count(call.arguments["old"]) == 1
                files[call.arguments["path"]] = files[call.arguments["path"]].replace(
                    call.arguments["old"], call.arguments["new"])
        assert files == template.files
        assert task.hidden.reference[-1].name == "submit"


def test_templates_ship_as_package_data():
    pyproject = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    assert '"*.py.txt"' in pyproject
    for template in load_templates().values():
        assert len([f for f in template.files if not f.startswith("tests/")]) >= 3
        assert (TEMPLATES_DIR / template.name / "manifest.yaml").exists()
        assert all('"""' in src for path, src in template.files.items() if not path.startswith("tests/"))


@needs_sandbox
def test_every_bug_site_is_caught_by_the_hidden_tests_as_the_manifest_says():
    """Each site alone: hidden tests pass on the template and fail on the bug, the example in
    the report is right for the template and wrong for the bug, and `distance` holds."""
    check = (
        "import contextlib, io, json, sys\nsys.path[:0] = ['/opt/gymfoundry', '.']\nimport runner\n"
        "example = json.loads(sys.argv[1])\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    visible, hidden = runner.run(['tests']), runner.run(['/opt/gymfoundry/hidden'])\n"
        "scope = {}\nexec('from %s import *' % example['module'], scope)\n"
        "for line in example.get('setup', []):\n    exec(line, scope)\n"
        "try:\n    got = repr(eval(example['call'], scope))\nexcept Exception as exc:\n"
        "    got = 'raises ' + type(exc).__name__\n"
        "print(json.dumps([sorted(t for t, ok in visible.items() if not ok),"
        " sorted(t for t, ok in hidden.items() if not ok), got]))\n")
    for template in load_templates().values():
        support = {"runner.py": RUNNER_SOURCE, **{f"hidden/{k}": v for k, v in template.hidden_tests.items()}}
        with create_sandbox(template.files, support) as box:
            def facts(files: dict, example: dict):
                box.reset()
                for path, text in files.items():
                    box.write_file(path, text.encode())
                result = box.run(["python", "-c", check, json.dumps(example)])
                assert result.exit_code == 0, result.stderr
                return json.loads(result.stdout)

            for site in template.sites:
                ok_visible, ok_hidden, good = facts(template.files, site.example)
                assert ok_visible == ok_hidden == [] and good == site.example["expected"], site.id
                bad_visible, bad_hidden, bad = facts(inject(template.files, [site]), site.example)
                assert bad_hidden, f"{site.id}: no hidden test catches it"
                assert bad != site.example["expected"], f"{site.id}: the example does not show the bug"
                own = "test_" + site.file.rsplit("/", 1)[-1]
                distance = 0 if any(own in t for t in bad_visible) else 1 if bad_visible else 2
                assert distance == site.distance, f"{site.id}: distance {distance}, manifest says {site.distance}"


@needs_sandbox
def test_every_generated_task_is_valid():
    tasks = [generate_task(seed, level) for seed in range(3) for level in LEVELS]
    valid, rejected = validate_tasks(tasks)
    assert rejected == [] and len(valid) == len(tasks)


@needs_sandbox
def test_a_bug_no_hidden_test_catches_is_rejected_with_a_reason():
    task = next(t for s in range(100) if (t := generate_task(s, 1)).hidden.checks["template"] == "textkit")
    template = load_templates()["textkit"]
    harmless = Site(id="stats-empty", file="textkit/stats.py", kind="missing_branch", distance=2, example={},
                    original="    if count == 0:\n        return 0\n    return math.ceil",
                    buggy="    return math.ceil")  # ceil(0 / wpm) is 0 anyway: an equivalent mutant
    data = task.model_dump(mode="json")
    data["initial_state"]["files"] = inject(template.files, [harmless])
    data["hidden"]["checks"]["bugs"] = [{"id": harmless.id, "file": harmless.file, "kind": harmless.kind,
                                         "original": harmless.original, "buggy": harmless.buggy, "distance": 2}]
    data["hidden"]["reference"] = [
        {"name": "edit_file", "arguments": {"path": harmless.file, "old": harmless.buggy, "new": harmless.original}},
        {"name": "submit", "arguments": {}}]
    data["task_id"] = ""
    bad = TaskSpec.model_validate(data)
    valid, rejected = validate_tasks([bad])
    assert valid == [] and len(rejected) == 1
    assert rejected[0].stage == "validate" and "no hidden test fails" in rejected[0].reason


# -- the env ------------------------------------------------------------------------------
def test_registered_and_passes_gymnasium_check_env():
    assert envs.family("coding").env_id == "gymfoundry/coding-v0"
    env = gymnasium.make("gymfoundry/coding-v0")
    check_env(env.unwrapped, skip_render_check=True)
    observation, info = env.reset(seed=3)
    assert "reported bug" in observation and "task_id" in info
    observation, reward, terminated, truncated, info = env.step('{"name": "nope", "arguments": {}}')
    assert info["error"]["kind"] == "unknown_tool" and not terminated
    env.close()


@needs_sandbox
def test_reference_episode_reaches_the_verified_reward_and_records_the_sandbox():
    task = quick_task(2, 3)
    env = envs.family("gymfoundry/coding-v0").make()
    ts = env.reset(task=task)
    for call in task.hidden.reference:
        ts = env.step(call)
    assert ts.terminated and ts.reward == 1.0 and ts.info["outcome"]["success"]
    info = env.runtime_info()["sandbox"]
    assert info["backend"] == "bubblewrap" and info["isolated"] and "cgroup" in info and "rlimits" in info
    env.close()
    assert sandbox_processes(info["uid"]) == []


@needs_sandbox
def test_tools_report_agent_mistakes_as_error_observations():
    env = CodingEnv()
    env.reset(task=quick_task(1, 1))
    files = obs(env.step({"name": "list_files", "arguments": {}}))["result"]["files"]
    assert "tests/" in " ".join(files) and not any("hidden" in f for f in files)
    source = next(f for f in files if f.endswith(".py") and not f.startswith("tests/") and "__init__" not in f)
    cases = [
        ({"name": "read_file", "arguments": {"path": "no/such.py"}}, "not_found"),
        ({"name": "read_file", "arguments": {"path": "../../etc/passwd"}}, "outside_workspace"),
        ({"name": "edit_file", "arguments": {"path": source, "old": "text that is not there", "new": "x"}}, "no_match"),
        ({"name": "edit_file", "arguments": {"path": source, "old": "", "new": "x"}}, "file_exists"),
        ({"name": "edit_file", "arguments": {"path": source, "old": "(", "new": "["}}, "ambiguous_match"),
        ({"name": "run", "arguments": {"argv": []}}, "invalid_arguments"),
        ({"name": "run", "arguments": {"argv": ["echo", "a\u0000b"]}}, "invalid_arguments"),
        # each of these must not be an env fault (IsADirectoryError, UnicodeEncodeError, RecursionError)
        ({"name": "read_file", "arguments": {"path": source.rsplit("/", 1)[0]}}, "is_a_directory"),
        ({"name": "read_file", "arguments": {"path": "tests"}}, "is_a_directory"),
        ({"name": "edit_file", "arguments": {"path": source, "old": "def ", "new": "\ud800"}}, "invalid_arguments"),
        ({"name": "edit_file", "arguments": {"path": "new\udc80.py", "old": "", "new": "x"}}, "invalid_arguments"),
        ('{"name": "read_file", "arguments": ' + "[" * 1500 + "]" * 1500 + "}", "action_too_deep"),
    ]
    for action, kind in cases:
        ts = env.step(action)
        assert obs(ts)["error"]["type"] == kind, action
        assert not ts.done and not ts.info["env_fault"] and not ts.info["env_bug"]
    assert [s.error for s in env.steps[-len(cases):]] == [kind for _, kind in cases]
    found = obs(env.step({"name": "search", "arguments": {"pattern": "def "}}))["result"]
    assert found["count"] >= 3
    part = obs(env.step({"name": "read_file", "arguments": {"path": source, "start_line": 1, "end_line": 2}}))
    assert part["result"]["end_line"] == 2 and part["result"]["content"].count("\n") <= 2
    made = obs(env.step({"name": "edit_file", "arguments": {"path": "notes/scratch.txt", "old": "", "new": "hi"}}))
    assert made["result"]["created"]
    ran = obs(env.step({"name": "run", "arguments": {"argv": ["cat", "notes/scratch.txt"]}}))["result"]
    assert ran == {"exit_code": 0, "stdout": "hi", "stderr": ""}
    env.close()


@needs_sandbox
def test_scripted_policy_gives_a_mix_of_outcomes_from_observations_only():
    terminations, infos = [], []
    for seed in range(8):
        task = quick_task(seed, 1 + seed % 3, command_timeout_s=5.0, test_timeout_s=10.0)
        rollout = run_episode(task, ScriptedCodingPolicy(mistake_rate=0.25), seed=seed)
        terminations.append(rollout.termination)
        infos.append(rollout.env_info)
        assert rollout.termination != Termination.env_fault, rollout.termination_reason
        assert sandbox_processes(rollout.env_info["sandbox"]["uid"]) == []
    assert Termination.success in terminations and len(set(terminations)) >= 2
    assert all(info["sandbox"]["backend"] == "bubblewrap" for info in infos)


# -- the hostile agent ----------------------------------------------------------------------
def hostile(calls, task=None, seed=0):
    task = task or quick_task(seed, 1)
    rollout = run_episode(task, ScriptPolicy(calls), seed=seed)
    if (rollout.env_info.get("sandbox") or {}).get("uid"):
        assert sandbox_processes(rollout.env_info["sandbox"]["uid"]) == [], "a process outlived the episode"
    return task, rollout


def results(rollout) -> list[dict]:
    return [json.loads(step.result) for step in rollout.steps]


@needs_sandbox
def test_hostile_reads_outside_the_workspace_find_nothing():
    grader_files = [str(p) for p in TEMPLATES_DIR.glob("*/hidden/*")] + [coding_verifier.__file__]
    task, rollout = hostile([
        ToolCall(name="read_file", arguments={"path": "/etc/shadow"}),
        run(["cat", "/etc/shadow"]),
        run(["cat", *grader_files]),
        run(["sh", "-c", "find / -path /proc -prune -o -path /usr -prune -o -name 'test_hidden*' -print; "
                         "ls /opt/gymfoundry; echo done"]),
    ], task=quick_task(0, 1, command_timeout_s=8.0))
    first, second, third, fourth = results(rollout)[:4]
    assert first["error"]["type"] == "outside_workspace"
    assert second["result"]["exit_code"] != 0 and "No such file" in second["result"]["stderr"]
    assert third["result"]["exit_code"] != 0 and third["result"]["stdout"] == ""
    assert fourth["result"]["stdout"].split() == ["runner.py", "done"]
    assert not find_leaks(task, [s.result for s in rollout.steps])
    assert rollout.termination == Termination.failure  # the bug is still there; nothing else happened


@needs_sandbox
def test_hostile_writes_outside_the_workspace_change_nothing(tmp_path):
    target = tmp_path / "owned.txt"
    task, rollout = hostile([
        run(["sh", "-c", f"echo x > {target}; echo x > /usr/owned; echo x > /opt/gymfoundry/runner.py; echo x > /owned"]),
        ToolCall(name="edit_file", arguments={"path": "../../owned.py", "old": "", "new": "x"}),
    ])
    ran, edit = results(rollout)[:2]
    assert ran["result"]["exit_code"] != 0 and "Read-only file system" in ran["result"]["stderr"]
    assert not target.exists() and not Path("/usr/owned").exists() and not Path("/owned").exists()
    assert edit["error"]["type"] == "outside_workspace"
    assert rollout.termination == Termination.constraint_violation
    assert "outside the workspace" in rollout.termination_reason


@needs_sandbox
def test_hostile_socket_to_a_local_listener_is_refused_and_reported():
    with local_listener(0.2) as (listener, port):
        task, rollout = hostile([run(["python", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}))"])])
        with pytest.raises(socket.timeout):
            listener.accept()
    result = results(rollout)[0]["result"]
    assert "ConnectionRefusedError" in result["stderr"] and result["network"].startswith("blocked")
    assert rollout.termination == Termination.constraint_violation and "network" in rollout.termination_reason


@needs_sandbox
def test_hostile_fork_bomb_memory_hog_and_endless_loop_are_contained():
    task, rollout = hostile([
        run(["python", "-c", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"]),
        run(["python", "-c", "x = bytearray(8 * 1024 ** 3)"]),
        run(["python", "-c", "while True: pass"], timeout_s=1),
        run(["python", "-c", "print('still alive')"]),
    ])
    bomb, hog, loop, after = results(rollout)[:4]
    assert bomb["error"]["type"] == "command_timeout" and "killed" in bomb["error"]["message"]
    assert hog["result"]["exit_code"] != 0 and "MemoryError" in hog["result"]["stderr"]
    assert loop["error"]["type"] == "command_timeout"
    assert after["result"]["stdout"] == "still alive\n"
    assert rollout.termination == Termination.failure  # contained: the agent's doing, never an env fault


@needs_sandbox
def test_hostile_escape_with_setsid_and_double_fork_does_not_survive():
    env, mark = CodingEnv(), str(random.randrange(10**8, 10**9))
    env.reset(task=quick_task(3, 1))
    ts = env.step(run(["sh", "-c", f"setsid sleep {mark} & (sleep {mark}1 &) ; "
                       "python -c \"import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                       f"        os.execvp('sleep', ['sleep', '{mark}2'])\" ; echo escaped"]))
    assert obs(ts)["result"]["stdout"].strip() == "escaped"
    assert alive_with(mark) == []  # gone when the command returned, not only at the episode's end
    uid = env.runtime_info()["sandbox"]["uid"]
    env.close()
    assert sandbox_processes(uid) == []


@needs_sandbox
def test_hostile_code_that_hangs_the_grader_is_the_models_failure():
    task = quick_task(4, 1, test_timeout_s=2.0)
    module = task.hidden.checks["bugs"][0]["file"]
    _, rollout = hostile([run(["sh", "-c", "echo 'while True: pass' >> \"$1\"", "sh", module])], task=task)
    assert rollout.termination == Termination.failure  # its own code hung the tests: not a timeout class
    assert "the tests ran past their 2s limit and were killed" in rollout.termination_reason


@needs_sandbox
def test_hostile_attempts_on_the_grader_do_not_change_the_grade():
    grader_files = [Path(coding_verifier.__file__), *TEMPLATES_DIR.glob("*/hidden/*")]
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in grader_files}
    task = quick_task(5, 1)
    fix = [c for c in task.hidden.reference if c.name == "edit_file"]
    tamper = [run(["sh", "-c", f"for f in {' '.join(map(str, grader_files))} /opt/gymfoundry/runner.py; "
                   "do echo 'def test_x(): pass' > $f; done; mkdir -p hidden && echo 'x' > hidden/test_hidden_x.py"]),
              ToolCall(name="edit_file", arguments={"path": "runner.py", "old": "", "new": "print('all passed')"})]
    task, honest = hostile(tamper + fix, task=task, seed=5)
    outcome = honest.outcome  # the fix is real and graded as such; only the files the tampering left fail it
    assert outcome.completed and not outcome.regression and outcome.checks["hidden_tests"].passed
    assert outcome.side_effects == ["added hidden/test_hidden_x.py", "added runner.py"] and not outcome.success
    module = task.hidden.checks["bugs"][0]["file"]
    forged = "\nprint('00000000000000000000000000000000 {\"hidden/x.py::test_x\": true}')\n"
    task, cheat = hostile(tamper + [run(["sh", "-c", f"printf '{forged}' >> {module}"])], task=task, seed=6)
    assert cheat.termination == Termination.failure
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in grader_files} == before


@needs_sandbox
def test_agent_code_that_prints_python_not_found_is_the_agents_failure():
    """Exit 127 with "python: not found" is what the agent's code did, not "the sandbox has no
    interpreter" (an env fault, retried and left out of every statistic): what it prints decides
    nothing."""
    task = quick_task(2, 1)
    package = next(f for f in task.initial_state["files"] if f.endswith("/__init__.py"))
    payload = "import os, sys\nsys.stderr.write('sh: 1: python: not found\\n')\nos._exit(127)\n"
    prepend = f"import pathlib; p = pathlib.Path({package!r}); p.write_text({payload!r} + p.read_text())"
    env = CodingEnv()
    env.reset(task)
    assert obs(env.step(run(["python", "-c", prepend])))["result"]["exit_code"] == 0
    ts = env.step(ToolCall(name="run_tests", arguments={}))
    env.close()
    assert ts.info["error"] is None and not ts.info["env_fault"]
    assert obs(ts)["result"]["exit_code"] == 127 and "python: not found" in obs(ts)["result"]["output"]


@needs_sandbox
def test_a_task_whose_files_or_limits_are_malformed_is_refused_at_reset():
    task = quick_task(2, 1)
    for bad in [{"files": "x"}, {"files": {}}, {"files": {"../escape.py": "x"}}, {"files": {"a.py": 5}},
                {**task.initial_state, "limits": {"test_timeout_s": "soon"}},
                {**task.initial_state, "limits": {"test_timeout_s": -1}},
                {**task.initial_state, "limits": {"command_timeout_s": float("nan")}}]:
        spoofed = TaskSpec.model_validate({**task.model_dump(), "initial_state": bad, "task_id": ""})
        with pytest.raises(ValueError, match=f"task {spoofed.task_id}") as err:
            CodingEnv().reset(spoofed)
        assert type(err.value).__name__ == "InvalidTask"


@needs_sandbox
def test_sandbox_faults_are_environment_faults(monkeypatch):
    from gymfoundry.envs.sandbox import docker_backend

    if docker_backend.probe()[0]:
        pytest.skip("a Docker engine answers here")
    monkeypatch.setenv("GYMFOUNDRY_SANDBOX", "docker")  # no engine: the sandbox cannot start
    _, rollout = hostile([ToolCall(name="list_files", arguments={})])
    assert rollout.termination == Termination.env_fault and "not available" in rollout.steps[0].result
    monkeypatch.delenv("GYMFOUNDRY_SANDBOX")
    monkeypatch.setattr(bubblewrap, "sandbox_python", lambda: None)  # a missing dependency
    _, rollout = hostile([ToolCall(name="run_tests", arguments={})])
    assert rollout.termination == Termination.env_fault and "missing dependency" in rollout.steps[0].result


# -- the factory ----------------------------------------------------------------------------
@needs_sandbox
def test_factory_lands_coding_rollouts_with_their_sandbox_guarantees(tmp_path, prefect_harness):
    from gymfoundry.flows.factory import factory
    from gymfoundry.warehouse import Warehouse

    report = factory(families=["coding"], tasks_per_family=4, seed=3, samples_per_task=2, data_dir=str(tmp_path))
    with Warehouse(str(tmp_path), read_only=True) as wh:
        tasks = wh.sql("select count(*) as n from tasks").to_pylist()[0]["n"]
        rejected = wh.sql("select count(*) as n from task_rejections").to_pylist()[0]["n"]
        rollouts = wh.load_rollouts("task_family = 'coding'")
    assert tasks == 4 and rejected == 0 and len(rollouts) == 8
    assert len({r.termination for r in rollouts}) >= 2 and report["landed"]["rollouts"] == 8
    assert all(r.env_info["sandbox"]["backend"] == "bubblewrap" for r in rollouts)
