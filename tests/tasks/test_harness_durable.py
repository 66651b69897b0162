"""serve-env as a durable service facing hostile clients: episodes owned by their tokens, nothing
acknowledged before it is on disk (kill -9 of the real command), one client's unreadable record
failing that episode alone, memory and connections bounded."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gymfoundry.envs.records import Termination
from gymfoundry.tasks.harness.hub import EpisodeHub
from gymfoundry.tasks.harness.mcp_server import build_app, served
from gymfoundry.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]  # the harness servers, over HTTP and as CLI subprocesses
MCP_HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
               "mcp-method": "tools/call"}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tool_call(url: str, name: str, tool: str, arguments: dict, headers: dict | None = None) -> httpx.Response:
    """One tools/call of the current (stateless) MCP protocol, as a harness's client sends it."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"_meta": meta, "name": tool, "arguments": arguments}}
    return httpx.post(f"{url}/episodes/{name}/mcp", json=body, headers={**MCP_HEADERS, "mcp-name": tool,
                                                                         **(headers or {})}, timeout=60)


def poison(data_dir: Path, name: str) -> None:
    """What the issue found: a record nested 250 deep (past the JSON reader's limit) and half a line
    left by a full disk, in the episode's call log."""
    deep: object = "x"
    for _ in range(250):
        deep = [deep]
    record = {"episode_id": name, "index": 0, "messages": [{"role": "user", "content": deep}]}
    with open(data_dir / "harness" / "calls" / f"{name}.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n" + '{"episode_id": "' + name + '", "ind\n')


def landed(data_dir: Path) -> dict[str, list]:
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = wh.load_rollouts()
    out: dict[str, list] = {}
    for r in rollouts:
        out.setdefault(r.env_info["harness"]["episode"], []).append(r)
    return out


# -- tokens ----------------------------------------------------------------------------------

def test_a_client_knowing_only_the_name_can_neither_record_into_nor_finish_an_episode(tmp_path):
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with served(build_app(hub)) as url:
        opened = httpx.post(f"{url}/episodes/mine/open")
        assert opened.status_code == 201 and set(opened.json()) == {"episode", "token"}
        token = opened.json()["token"]
        assert token not in (tmp_path / "harness" / "calls" / "mine.open").read_text()  # only its hash is kept
        assert httpx.post(f"{url}/episodes/mine/open").status_code == 409  # a name is one episode per run
        assert tool_call(url, "mine", "find_items", {"query": "a"}, auth(token)).status_code == 200
        for headers in ({}, auth("guessed"), auth(token[:-1]), {"Authorization": token}):
            assert tool_call(url, "mine", "find_items", {"query": "b"}, headers).status_code == 401
            assert tool_call(url, "mine", "submit", {"status": "denied"}, headers).status_code == 401
            assert httpx.post(f"{url}/episodes/mine/finish", headers=headers).status_code == 401
            assert httpx.delete(f"{url}/episodes/mine/mcp", headers=headers).status_code == 401
        assert tool_call(url, "never", "find_items", {"query": "a"}, auth(token)).status_code == 404
        assert httpx.post(f"{url}/episodes/never/finish", headers=auth(token)).status_code == 404
        mine = hub.episode("mine")
        assert mine.rollout is None and mine.calls == 1  # nothing recorded, nothing ended
        finished = httpx.post(f"{url}/episodes/mine/finish", headers=auth(token))
        assert finished.status_code == 200
        assert tool_call(url, "mine", "find_items", {"query": "a"}, auth(token)).status_code == 404  # closed
    hub.close()
    [rollout] = hub.rollouts
    assert [s.tool_call.arguments for s in rollout.steps] == [{"query": "a"}]
    assert rollout.rollout_id == finished.json()["rollout_id"]


# -- durable before acknowledged ---------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(data_dir: Path, port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "gymfoundry.flows.cli", "serve-env", "--family", "inventory", "--port",
                               str(port), "--tasks", "4", "--data-dir", str(data_dir)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"http://127.0.0.1:{port}/episodes/probe/finish", timeout=2).status_code == 404:
                return server
        except httpx.TransportError:
            assert server.poll() is None, server.communicate()[1]
            time.sleep(0.2)
    server.kill()
    raise AssertionError("serve-env did not start")


def test_kill_9_right_after_a_finish_reply_loses_nothing_and_lands_it_once(tmp_path):
    """A reader holds the catalog (a notebook), so nothing can land while serve-env runs; the finish
    reply gives a rollout id and serve-env is killed at once (-9). Before, a finished episode lived
    in memory until it landed: gone. Now it was spooled before the reply: the restarted server lands
    it, once. An episode still open at the kill is replayed from its write-ahead log and lands as an
    environment fault (the harness lost its server), with its tool calls; its old token opens nothing."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    try:
        done, cut = (httpx.post(f"{url}/episodes/{n}/open").json()["token"] for n in ("done", "cut"))
        for query in ("a", "b"):
            assert tool_call(url, "done", "find_items", {"query": query}, auth(done)).status_code == 200
            assert tool_call(url, "cut", "find_items", {"query": query}, auth(cut)).status_code == 200
        with Warehouse(tmp_path, read_only=True):  # a reader: the catalog cannot be written meanwhile
            reply = httpx.post(f"{url}/episodes/done/finish", headers=auth(done), timeout=120)
            server.send_signal(signal.SIGKILL)
            server.wait(30)
        assert reply.status_code == 200
        rollout_id = reply.json()["rollout_id"]
        server = start_server(tmp_path, port)
        assert httpx.post(f"{url}/episodes/cut/finish", headers=auth(cut)).status_code == 404
        server.send_signal(signal.SIGTERM)
        _, said = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
    rollouts = landed(tmp_path)
    assert [r.rollout_id for r in rollouts["done"]] == [rollout_id], said
    assert rollouts["done"][0].termination == Termination.truncated
    [cut_rollout] = rollouts["cut"]
    assert cut_rollout.termination == Termination.env_fault and "serve-env stopped" in cut_rollout.termination_reason
    assert [s.tool_call.arguments for s in cut_rollout.steps] == [{"query": "a"}, {"query": "b"}]
    assert sorted(p.name for p in (tmp_path / "harness" / "wal").iterdir()) == []
    assert not list((tmp_path / "spool").glob("*.json"))


# -- one client's fault fails that episode alone --------------------------------------------------

def bystander_and_poisoned(hub: EpisodeHub, data_dir: Path) -> None:
    hub.open("bystander"), hub.open("poisoned")
    for k in range(7):
        hub.call("bystander", "find_items", {"query": "abcdefg"[k]})
    hub.call("poisoned", "find_items", {"query": "a"})
    poison(data_dir, "poisoned")


def check_landed(data_dir: Path) -> None:
    rollouts = landed(data_dir)
    [bystander], [poisoned] = rollouts["bystander"], rollouts["poisoned"]
    assert bystander.termination == Termination.truncated and len(bystander.steps) == 7
    assert poisoned.termination == Termination.failure  # the harness's own doing: in every statistic
    assert poisoned.termination_reason.startswith("the harness's model call records could not be read (2: "
                                                  "line 1 of poisoned.jsonl: ")
    assert poisoned.env_info["harness"]["unreadable_calls"] == 2


def test_a_poisoned_call_log_fails_its_episode_alone_at_shutdown(tmp_path):
    """One client's unreadable record must not stop shutdown from landing the other clients' episodes."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0)
    bystander_and_poisoned(hub, tmp_path)
    hub.close()
    check_landed(tmp_path)
    again = EpisodeHub("inventory", tmp_path, tasks=4, seed=0)  # the name is not broken across restarts
    again.open("poisoned")
    again.call("poisoned", "find_items", {"query": "a"})
    assert again.finish("poisoned").termination == Termination.truncated
    again.close()


def test_a_poisoned_call_log_neither_stops_the_reaper_nor_fails_finish(tmp_path):
    """The idle reaper must outlive any one episode's failure, or no episode is ever timed out again."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, idle_timeout_s=0.5)
    with served(build_app(hub)) as url:
        token = hub.open("finished")
        poison(tmp_path, "finished")
        reply = httpx.post(f"{url}/episodes/finished/finish", headers=auth(token))
        assert reply.status_code == 200 and set(reply.json()) == {"episode", "rollout_id", "task_id"}
    bystander_and_poisoned(hub, tmp_path)
    deadline = time.monotonic() + 60
    while hub.held and time.monotonic() < deadline:
        time.sleep(0.1)
    hub.open("later")  # after the poisoned one timed out: the reaper still works
    hub.call("later", "find_items", {"query": "a"})
    while "later" in hub._episodes and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not hub.log.is_open("later")
    hub.wait_landed()
    check_landed(tmp_path)
    assert landed(tmp_path)["later"][0].termination == Termination.truncated
    hub.close()


# -- bounded -----------------------------------------------------------------------------------

def test_landed_episodes_leave_memory(tmp_path):
    """A long-running server holds only what is still to land: memory must not grow per finished episode."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0)
    for k in range(120):
        hub.open(f"e{k}")
        hub.call(f"e{k}", "find_items", {"query": "a"})
        hub.finish(f"e{k}")
    hub.wait_landed(240)
    assert hub.held == 0 and hub.landed["rollouts"] == 120
    assert "e7" in hub and hub.reply("e7")["rollout_id"]  # what remains: the name, its ids
    with pytest.raises(Exception, match="opened in this server run already"):
        hub.open("e7")
    hub.close()
    with Warehouse(tmp_path, read_only=True) as wh:
        assert wh.sql_df("select count(*) from rollouts").rows() == [(120,)]


def test_a_client_that_never_finishes_its_headers_is_cut_while_others_are_served(tmp_path, caplog):
    """A slow client must not hold a connection (and a descriptor) for ever, and a flood of refused
    connections must not be a flood of log lines."""
    hub = EpisodeHub("inventory", tmp_path, tasks=4, seed=0, land=False)
    with served(build_app(hub), read_timeout_s=1.0, max_connections=4) as url:
        host, port = url.removeprefix("http://").split(":")
        slows = [socket.create_connection((host, int(port))) for _ in range(3)]
        for slow in slows:
            slow.sendall(b"POST /episodes/slow/open HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        assert httpx.post(f"{url}/episodes/fast/open").status_code == 201  # served meanwhile
        for slow in slows:
            slow.settimeout(60)
            try:
                assert slow.recv(100) == b""  # closed by the server, without a reply
            except ConnectionResetError:
                pass
        held = [socket.create_connection((host, int(port))) for _ in range(4)]  # the cap: 4 at once
        extra = socket.create_connection((host, int(port)))
        extra.settimeout(60)
        try:
            assert extra.recv(100) == b""  # a fifth is closed as it arrives
        except ConnectionResetError:
            pass
        for sock in held + [extra] + slows:
            sock.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.post(f"{url}/episodes/after/open").status_code == 201:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        assert "after" in hub
    hub.close()
    said = [r.getMessage() for r in caplog.records if f":{port}: connection " in r.getMessage()]
    # 3 slow and 4 held connections cut, 1 refused (more if "after" came too soon): a line per 10 s, not one each
    assert any("connection refused: 4 open" in line for line in said)
    assert any("connection cut: its request was not in within 1 s (--read-timeout)" in line for line in said)
    assert len(said) < 8


def test_serve_env_refuses_a_connection_cap_or_read_timeout_that_is_not_positive(tmp_path):
    """A cap of -1 would close every connection and 0 would silently mean the default: both refused."""
    for option, value, said in (("--max-connections", "-1", "a positive number of connections, not -1"),
                                ("--max-connections", "0", "a positive number of connections, not 0"),
                                ("--read-timeout", "0", "a positive number of seconds, not 0")):
        run = subprocess.run([sys.executable, "-m", "gymfoundry.flows.cli", "serve-env", "--family", "inventory", "--port",
                              str(free_port()), option, value, "--data-dir", str(tmp_path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert (run.returncode, run.stderr) == (2, f"gymfoundry serve-env: {option} must be {said}\n")
    assert list(tmp_path.iterdir()) == []  # refused before anything was opened or locked
