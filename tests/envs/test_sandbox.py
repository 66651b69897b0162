"""The sandbox backends: selection, isolation, limits, and that nothing outlives a command."""

import dataclasses
import os
import random
import shutil
import socket
import sys
import tempfile
import time

import pytest

from gymfoundry.envs.base import EnvFault
from gymfoundry.envs.family import family
from gymfoundry.envs.family import masked_dirs as declared_masks
from gymfoundry.envs.sandbox import (Limits, PathError, SandboxError, SandboxUnavailable, backend_status, create_sandbox,
                          select_backend)
from gymfoundry.envs.sandbox import bubblewrap, docker_backend
from gymfoundry.envs.sandbox.base import normalize_path
from gymfoundry.envs.coding.tests.helpers import alive_with, local_listener

from tests.sandbox_guard import needs_sandbox as needs_bwrap, require_sandbox

FAST = Limits(wall_s=3, cpu_s=5)


pytestmark = pytest.mark.sandbox  # the bubblewrap sandbox's own tests


@pytest.fixture
def box():
    require_sandbox()
    with create_sandbox({"main.py": "print('hi')\n", "pkg/mod.py": "X = 1\n"}, {"tool.py": "print(42)\n"},
                        FAST, backend="bubblewrap") as sandbox:
        yield sandbox


# -- selection ---------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_docker_is_skipped_quickly_when_no_engine_answers(monkeypatch):
    docker = pytest.importorskip("docker")
    asked, from_env = [], docker.from_env
    monkeypatch.setattr(docker, "from_env", lambda **kw: asked.append(kw) or from_env(**kw))
    ok, why = docker_backend.probe.__wrapped__()
    assert asked == [{"timeout": docker_backend.PING_TIMEOUT_S}]  # the engine is given a bounded wait to answer
    if not ok:
        assert "Docker" in why or "image" in why


@needs_bwrap
def test_auto_selection_prefers_an_isolating_backend(monkeypatch):
    monkeypatch.delenv("GYMFOUNDRY_SANDBOX", raising=False)
    assert select_backend() in ("docker", "bubblewrap")
    monkeypatch.setenv("GYMFOUNDRY_SANDBOX", "bubblewrap")
    assert select_backend() == "bubblewrap"
    assert backend_status()["bubblewrap"][0]


def test_without_isolation_untrusted_code_is_refused_unless_opted_in(monkeypatch):
    monkeypatch.setattr(bubblewrap, "probe", lambda: (False, "disabled for the test"))
    monkeypatch.setattr(docker_backend, "probe", lambda: (False, "no engine"))
    monkeypatch.delenv("GYMFOUNDRY_ALLOW_UNSANDBOXED", raising=False)
    monkeypatch.delenv("GYMFOUNDRY_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailable, match="GYMFOUNDRY_ALLOW_UNSANDBOXED") as err:
        create_sandbox({"a.py": "print(1)"})
    assert isinstance(err.value, EnvFault)  # an environment fault, never the agent's
    with pytest.raises(SandboxUnavailable, match="docker"):
        select_backend("docker")
    assert select_backend(allow_unsafe=True) == "unsafe-local"
    monkeypatch.setenv("GYMFOUNDRY_ALLOW_UNSANDBOXED", "1")
    with create_sandbox({"a.py": "print(1)"}, limits=FAST) as local:
        assert local.guarantees()["isolated"] is False and local.run(["python", "a.py"]).stdout == "1\n"
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        select_backend("chroot")


# -- running commands ----------------------------------------------------------------------
def test_argv_only_and_support_files_are_read_only(box):
    result = box.run(["python", "-c", "import sys; print(sys.argv[1:])", "$(id)", "; rm -rf /", "`x`"])
    assert result.ok and result.stdout.strip() == "['$(id)', '; rm -rf /', '`x`']"
    assert box.run(["python", f"{box.support_dir}/tool.py"]).stdout == "42\n"
    tamper = box.run(["sh", "-c", f"echo x > {box.support_dir}/tool.py"])
    assert tamper.exit_code != 0 and "Read-only" in tamper.stderr
    with pytest.raises(ValueError):
        box.run(["echo", "nul\x00byte"])


def test_runs_as_a_fresh_non_root_uid_with_nothing_of_the_host(box):
    result = box.run(["sh", "-c", "id -u; ls /; echo ---; ls /etc; cat /etc/shadow; ls /root /work /home"])
    uid = int(result.stdout.split()[0])
    assert uid != 0 and uid != os.getuid()
    top, etc = result.stdout.split("---")
    assert not {"root", "work", "home", "var", "srv"} & set(top.split())
    assert set(etc.split()) <= {"ld.so.cache", "alternatives", "localtime"}
    assert "/etc/shadow: No such file" in result.stderr
    guarantees = box.guarantees()
    assert guarantees["backend"] == "bubblewrap" and guarantees["isolated"] is True
    assert "net" in guarantees["namespaces"] and guarantees["network"].startswith("none")


def test_writes_outside_the_workspace_do_not_reach_the_host(box, tmp_path):
    target = tmp_path / "escape.txt"
    result = box.run(["sh", "-c", f"echo x > /usr/escape; echo x > {target}; echo x > /tmp/scratch && cat /tmp/scratch"])
    assert result.stdout == "x\n"  # the private /tmp works and is discarded
    assert not os.path.exists("/usr/escape") and not target.exists()
    assert box.run(["sh", "-c", "echo y > /escape"]).exit_code != 0


def test_network_is_unreachable_and_attempts_are_counted(box):
    with local_listener(0.5) as (listener, port):
        result = box.run(["python", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"])
        assert result.exit_code != 0 and "ConnectionRefusedError" in result.stderr
        assert result.network_attempts > 0
        with pytest.raises(socket.timeout):
            listener.accept()
    assert box.run(["true"]).network_attempts == 0


def marker() -> str:
    """A sleep duration no concurrent test run will use: finds our processes by command line."""
    return str(random.randrange(10**8, 10**9))


@pytest.mark.timeout(120)  # a loop the wall clock did not kill would run on
def test_wall_clock_kills_loops_and_setsid_escapees(box):
    mark = marker()
    result = box.run(["sh", "-c", f"setsid sleep {mark} & (sleep {mark}1 &); while :; do :; done"], timeout_s=1)
    assert result.timed_out and result.exit_code is None
    assert alive_with(mark) == []


def test_nothing_outlives_a_command_that_exits(box):
    mark = marker()
    result = box.run(["python", "-c", "import os, subprocess\n"
                      f"subprocess.Popen(['setsid', 'sleep', '{mark}'])\n"
                      f"if os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '{mark}1'])\n"
                      "print('parent done')"])
    assert result.ok and "parent done" in result.stdout
    assert alive_with(mark) == []


def test_fork_bomb_and_memory_hog_are_contained(box):
    bomb = box.run(["python", "-c", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                    "        pass"], timeout_s=2)
    assert bomb.timed_out
    if "pids" in bubblewrap.cgroups.detect().limits_in_force:
        assert any(hit.startswith("pids") for hit in bomb.limits_hit)
    huge = box.run(["python", "-c", "x = bytearray(8 * 1024 ** 3)"])
    assert huge.exit_code != 0 and "MemoryError" in huge.stderr
    if "memory" in bubblewrap.cgroups.detect().limits_in_force:
        touched = box.run(["python", "-c", "x = bytearray(1536 * 1024 ** 2); print('survived')"])
        assert "survived" not in touched.stdout and touched.exit_code != 0
    assert box.run(["python", "-c", "print('still fine')"]).stdout == "still fine\n"


# -- files, reset, destroy -----------------------------------------------------------------
def test_host_file_access_never_follows_links_planted_by_the_sandbox(box):
    box.run(["sh", "-c", "ln -s /etc/passwd stolen; ln -s / root_link; mkfifo pipe"])
    with pytest.raises(PathError) as err:
        box.read_file("stolen")
    assert err.value.kind == "symlink_refused"
    with pytest.raises(PathError):
        box.read_file("root_link/etc/passwd")
    with pytest.raises(PathError):
        box.write_file("stolen", b"x")
    with pytest.raises(PathError) as err:
        box.read_file("pipe")  # would block forever if opened naively
    assert err.value.kind == "not_a_regular_file"
    assert set(box.snapshot()) == {"main.py", "pkg/mod.py"} == set(box.list_files())


@pytest.mark.parametrize("path,kind", [("/etc/passwd", "outside_workspace"), ("../x", "outside_workspace"),
                                       ("a/../../x", "outside_workspace"), ("", "invalid_path")])
def test_paths_outside_the_workspace_are_refused(path, kind):
    with pytest.raises(PathError) as err:
        normalize_path(path)
    assert err.value.kind == kind


def test_workspace_paths_normalise():
    assert normalize_path("/workspace/pkg/../main.py") == "main.py" and normalize_path("./a/b") == "a/b"


def test_write_read_reset_and_destroy(box):
    box.write_file("new/dir/file.txt", b"data")
    assert box.read_file("new/dir/file.txt") == b"data"
    assert box.run(["cat", "new/dir/file.txt"]).stdout == "data"
    box.reset()
    assert box.list_files() == ["main.py", "pkg/mod.py"]
    directory = box.dir
    box.destroy()
    box.destroy()
    assert not os.path.exists(directory)
    with pytest.raises(SandboxError):
        box.run(["true"])


def test_destroy_kills_a_command_still_running_in_another_thread(box):
    import threading

    done, mark = {}, marker()
    worker = threading.Thread(target=lambda: done.setdefault("r", _swallow(box.run, ["sleep", mark])))
    worker.start()
    time.sleep(0.5)
    box.destroy()
    worker.join(5)
    assert not worker.is_alive() and alive_with(mark) == []


def _swallow(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        return exc


def test_guarantees_say_which_cgroup_limits_are_in_force(box):
    cgroup = box.guarantees()["cgroup"]
    assert set(cgroup["limits"]) | set(cgroup["not_enforced"]) == {"memory", "pids", "cpu"}
    assert "rlimits" in box.guarantees() and box.guarantees()["rlimits"]["address_space_mb"] == FAST.address_space_mb


# -- the Docker backend, against a stand-in for the engine (none runs here) ---------------
class FakeDocker:
    """Just enough of the docker SDK for DockerSandbox: the container's filesystem is a host
    directory and exec'd commands run there as plain processes (setup commands are no-ops)."""

    def __init__(self, root):
        import types

        self.root, self.calls = root, []
        self.volumes = types.SimpleNamespace(create=lambda **kw: types.SimpleNamespace(
            name="vol", remove=lambda force: self.calls.append("volume.remove")))
        self.containers = types.SimpleNamespace(run=self._run)
        self.api = types.SimpleNamespace(exec_create=self._exec_create, exec_start=self._exec_start,
                                         exec_inspect=lambda exec_id: {"ExitCode": self._execs[exec_id]})
        self._execs = {}

    def _path(self, path: str) -> str:
        return str(self.root) + path

    def _run(self, image, command, **kwargs):
        import types

        self.calls.append(("run", kwargs))
        for d in ("/workspace", "/opt/gymfoundry"):
            os.makedirs(self._path(d), exist_ok=True)
        return types.SimpleNamespace(id="c1", exec_run=self._exec_run, put_archive=self._put, get_archive=self._get,
                                     remove=lambda force: self.calls.append("container.remove"))

    def _exec_run(self, argv, user=None):
        import types

        self.calls.append(("exec_run", argv, user))
        if argv[0] == "find":  # reset: empty the workspace
            import shutil

            shutil.rmtree(self._path("/workspace"))
            os.makedirs(self._path("/workspace"))
        return types.SimpleNamespace(exit_code=0, output=b"")

    def _put(self, path, data):
        import io
        import tarfile

        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(self._path(path), filter="data")

    def _get(self, path):
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(self._path(path.removesuffix("/.")), arcname=os.path.basename(path.removesuffix("/.")) or ".")
        return iter([buf.getvalue()]), {}

    def _exec_create(self, container, command, user=None, workdir=None, environment=None):
        argv = [a.replace("/opt/gymfoundry", self._path("/opt/gymfoundry")) for a in command]
        self.calls.append(("exec", command, user))
        exec_id = f"e{len(self._execs)}"
        self._execs[exec_id] = (argv, self._path(workdir))
        return {"Id": exec_id}

    def _exec_start(self, exec_id, stream, demux):
        import subprocess

        argv, cwd = self._execs[exec_id]
        done = subprocess.run(argv, cwd=cwd, capture_output=True)
        self._execs[exec_id] = done.returncode
        yield done.stdout, None
        yield None, done.stderr


def test_docker_backend_logic_against_a_stand_in_engine(tmp_path):
    fake = FakeDocker(tmp_path)
    with docker_backend.DockerSandbox({"pkg/a.py": "print('a')\n"}, {"tool.txt": "x"}, FAST, client=fake) as box:
        run_kwargs = fake.calls[0][1]
        assert run_kwargs["network_mode"] == "none" and run_kwargs["read_only"] is True
        assert run_kwargs["pids_limit"] == FAST.processes and "no-new-privileges" in run_kwargs["security_opt"]
        result = box.run(["python3", "pkg/a.py"])
        assert result.ok and result.stdout == "a\n" and result.network_attempts == 0
        command = [c for c in fake.calls if c[0] == "exec"][-1]
        assert command[1][:3] == ["timeout", "-s", "KILL"] and command[2] == "65534:65534"
        assert ("exec_run", ["sh", "-c", "kill -9 -1"], "65534:65534") in fake.calls  # nothing outlives it
        echoed = box.run(["python3", "-c", "import sys; print(sys.stdin.read().upper())"], stdin=b"nonce")
        assert echoed.stdout == "NONCE\n"
        box.write_file("pkg/b.py", b"B = 2\n")
        assert box.read_file("pkg/b.py") == b"B = 2\n" and box.list_files() == ["pkg/a.py", "pkg/b.py"]
        assert set(box.snapshot()) == {"pkg/a.py", "pkg/b.py"}
        box.reset()
        assert box.list_files() == ["pkg/a.py"]
        assert box.guarantees()["backend"] == "docker" and box.guarantees()["network"].startswith("none")
    assert "container.remove" in fake.calls and "volume.remove" in fake.calls


def test_project_packages_under_a_bound_dir_are_masked(monkeypatch):
    # What is masked is what the caller passes: the families' declarations (Family.masked, by default
    # the family's package, which holds its verifier): the coding templates, hidden tests and grader.
    project = os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(bubblewrap.__file__))))
    coding, inventory, scoring = (os.path.join(project, *p) for p in (("envs", "coding"), ("envs", "inventory"),
                                                                      ("verifiers",)))
    declared = declared_masks()
    assert {coding, inventory, scoring} <= set(declared)  # the graders, and the PRM's step-reward rules
    assert bubblewrap.masked_dirs(["/usr"], declared) == [] or project.startswith("/usr")
    # every family's package under the project, whichever families are registered
    assert bubblewrap.masked_dirs([project], declared) == sorted(d for d in declared if d.startswith(project + os.sep))
    assert {coding, inventory} <= set(bubblewrap.masked_dirs([project], declared))
    assert bubblewrap.masked_dirs([coding], declared) == [coding]  # a bound dir that is itself declared
    assert bubblewrap.masked_dirs([project], []) == []  # the sandbox masks what it is told, nothing it looks up
    require_sandbox()
    # pretend the project lives under a bound system dir: its declared folders must not be visible
    # inside. A stand-in project: the clone itself may sit where the sandbox uid cannot bind it
    # (under a 0700 dir) or under /tmp (the sandbox's own /tmp hides it), and then nothing would be
    # listed for the wrong reason; /var/tmp is reachable and not shadowed.
    root = tempfile.mkdtemp(prefix="gymfoundry-mask-", dir="/var/tmp")
    try:
        os.chmod(root, 0o755)
        stand_in = os.path.join(root, "project")
        for rel in ("envs/sandbox/bubblewrap.py", "envs/coding/templates/textkit/core.py", "verifiers/grader.py",
                    "visible.txt"):
            os.makedirs(os.path.dirname(os.path.join(stand_in, rel)), mode=0o755, exist_ok=True)
            with open(os.path.join(stand_in, rel), "w") as fh:
                fh.write("x\n")
            os.chmod(os.path.join(stand_in, rel), 0o644)
        # a family declaring the stand-in's folders (the coding family's spec with its `masked`)
        stand_in_family = dataclasses.replace(family("coding"), masked=(os.path.join(stand_in, "envs", "coding"),
                                                                 os.path.join(stand_in, "verifiers")))
        # (`gymfoundry.envs.family` the attribute is the lookup function; the module is in sys.modules)
        monkeypatch.setitem(sys.modules["gymfoundry.envs.family"]._FAMILIES, "stand_in", stand_in_family)
        monkeypatch.setattr(bubblewrap, "SYSTEM_DIRS", bubblewrap.SYSTEM_DIRS + (stand_in,))
        assert bubblewrap.masked_dirs([stand_in], declared_masks()) == [os.path.join(stand_in, "envs", "coding"),
                                                      os.path.join(stand_in, "verifiers")]
        with create_sandbox({}, limits=FAST, backend="bubblewrap", masked=declared_masks()) as box:
            listing = box.run(["ls", "-R", stand_in])
        # the bound dir is really there, with what no family declares (the sandbox's own code)
        assert listing.ok and "visible.txt" in listing.stdout and "bubblewrap.py" in listing.stdout
        assert "textkit" not in listing.stdout and "templates" not in listing.stdout and "grader" not in listing.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_coding_env_and_its_grader_pass_the_sandbox_every_mask(monkeypatch):
    """The sandbox hides what its caller names: both callers that run an agent's code (the coding env's
    workspace and the grader's observation run) name every family's folder and the scoring layers'."""
    from gymfoundry.envs.coding import verifier as coding_verifier, world as coding_world
    from gymfoundry.envs.coding.tests.helpers import quick_task

    asked = []

    class Stop(Exception):
        pass

    def recording(*args, **kwargs):
        asked.append(sorted(kwargs.get("masked", args[5] if len(args) > 5 else ())))
        raise Stop

    monkeypatch.setattr(coding_world, "create_sandbox", recording)
    monkeypatch.setattr(coding_verifier, "create_sandbox", recording)
    task = quick_task(1, 1)
    env = coding_world.CodingEnv()
    try:
        env.reset(task=task)  # the workspace is made on reset or on the first tool that needs it
        env.sandbox
    except Stop:
        pass
    with pytest.raises(Stop):
        coding_verifier.observe(task, {}, {}, None, None)
    assert asked == [declared_masks(), declared_masks()]
    assert any(d.endswith(os.sep + "verifiers") for d in asked[0])
