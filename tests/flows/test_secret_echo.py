"""No credential is kept anywhere, whatever an endpoint echoes: one OpenAI-compatible stub plays
the policy, the LLM judge and the LLM user simulator of a factory run, and repeats each request's
`Authorization` header, a `Basic` header and a URL with a password in its replies' text, tool-call
arguments, error bodies (400, 500) and a response header. Afterwards every file under the data
dir (catalog, lake, datasets, spool, caches), the HTML report, the captured logs and Prefect's
database are read for each credential and its base64 form: none is there. A URL with a user name
or password is refused where an endpoint is configured, naming where the password goes."""

from __future__ import annotations

import base64
import json
import logging
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from gymfoundry.envs.conversation.policy import ScriptedConversationPolicy
from gymfoundry.envs.person import LLMSimulator, Persona, SimulatorFault, new_memory
from gymfoundry.envs.records import PolicySpec, RetryPolicy
from gymfoundry.envs.secrets import MASK, redact
from gymfoundry.flows.config import FactoryConfig
from gymfoundry.flows.factory import factory
from gymfoundry.flows.report import write_html_report
from tests.tasks.policy_endpoint import tool_reply
from tests.verifiers.openai_stub import OpenAIStub, chat_reply
from gymfoundry.verifiers.judge import JudgeSettings

POLICY_KEY = "sk-policy-echo-0123456789abcdef"  # in a variable named only by --api-key-env
JUDGE_KEY = "sk-judge-echo-fedcba9876543210"
USER_KEY = "sk-user-echo-a1b2c3d4e5f6a7b8"
USER, PASSWORD = "alice", "hunter2-Pa55word"
CREDENTIALS = [POLICY_KEY, JUDGE_KEY, USER_KEY, PASSWORD, f"{USER}:{PASSWORD}"]
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
USERINFO_URL = f"http://{USER}:{PASSWORD}@127.0.0.1:9/v1"
REPO = Path(__file__).resolve().parents[2]


def forms(credential: str) -> list[str]:
    """The credential, its base64, and a piece of each (an echo of part of it)."""
    encoded = base64.b64encode(credential.encode()).decode().rstrip("=")
    return [credential, encoded, credential[3:15], encoded[4:16]]


def leaks(text: str) -> list[str]:
    return [f for c in CREDENTIALS for f in forms(c) if f in text]


class EchoEndpoint:
    """Policy, judge and customer in one server, told apart by the request's model name."""

    def __init__(self):
        self.modes: dict[str, int] = {}  # a conversation's first observation -> how it goes on
        self.players: dict[str, ScriptedConversationPolicy] = {}
        self.lock = threading.Lock()

    def __call__(self, body: dict, headers: dict) -> tuple[int, dict]:
        echo = (f"you sent Authorization: {headers.get('Authorization', '')}; upstream Authorization: Basic {BASIC} "
                f"at {USERINFO_URL}")
        if body["model"] == "echo-user":
            return 200, self.customer(body, echo)
        echo += f"; your last message: {json.dumps(body['messages'][-1])[:300]}"
        if body["model"] == "echo-judge":
            return self.judge(body, echo)
        return self.policy(body, echo)

    def customer(self, body: dict, echo: str) -> dict:
        """Tells the facts asked for (so reference replays and a good agent pass), and echoes."""
        system, asked = body["messages"][0]["content"], body["messages"][-1]["content"].lower()
        facts = dict(line[2:].split(": ", 1) for line in system.splitlines() if line.startswith("- "))
        told = [f"My {topic} is {value}." for topic, value in facts.items() if topic.split()[-1] in asked]
        return chat_reply(" ".join(told or ["Okay."]) + f" ({echo})")

    def judge(self, body: dict, echo: str) -> tuple[int, dict]:
        if len(body["messages"][1]["content"]) % 3 == 0:
            return 400, {"error": {"message": f"judge refused: {echo}"}}
        dimensions = list(json.loads(body["messages"][0]["content"].split("of this form:\n", 1)[1])["scores"])
        return 200, chat_reply(json.dumps({"scores": {d: 0.25 for d in dimensions}, "rationale": echo}))

    def policy(self, body: dict, echo: str) -> tuple[int, dict]:
        """By conversation in turn: the scripted agent (its thoughts and its messages to the
        customer carrying the echo), or after one message a 500 with the echo, or a 400 with the
        echo (a refused history)."""
        first, turns = body["messages"][1]["content"], sum(m["role"] == "assistant" for m in body["messages"])
        with self.lock:
            mode = self.modes.setdefault(first, len(self.modes) % 3)
            if turns == 0:
                self.players[first] = ScriptedConversationPolicy(mistake_rate=0.0)
            player = self.players[first]
        if turns and mode == 1:
            return 500, {"error": {"message": f"upstream failed: {echo}"}}
        if turns and mode == 2:
            return 400, {"error": {"message": f"refused: {echo}"}}
        thought, _, call = player.act(body["messages"][-1]["content"]).rpartition("\n")
        call = json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        if call["name"] == "respond":
            call["arguments"]["message"] += f" ({echo[:500]})"
        reply = tool_reply(call["name"], call["arguments"], f"call_{turns + 1}")
        reply["choices"][0]["message"]["content"] = f"{thought} ({echo})"
        return 200, reply


def readable(path: Path) -> str:
    """A file's contents as text, decoded where its format compresses (Parquet, DuckDB)."""
    if path.suffix == ".parquet":
        return json.dumps(pq.read_table(path).to_pylist(), default=str)
    if path.suffix == ".duckdb":
        with duckdb.connect(str(path), read_only=True) as con:
            tables = con.sql("select schema_name, table_name from duckdb_tables()").fetchall()
            return "\n".join(str(con.sql(f'select * from "{s}"."{t}"').fetchall()) for s, t in tables)
    return path.read_bytes().decode("latin-1")


def sqlite_dump(path: Path) -> str:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return "\n".join(con.iterdump())


@pytest.fixture
def hostile(monkeypatch):
    endpoint = EchoEndpoint()
    with OpenAIStub(respond=endpoint, echo_header=True) as server:
        monkeypatch.setenv("ECHO_POLICY_KEY", POLICY_KEY)
        for name, value in {"JUDGE_BASE_URL": server.base_url, "JUDGE_MODEL": "echo-judge",
                            "JUDGE_API_KEY": JUDGE_KEY, "JUDGE_MAX_ATTEMPTS": "1",
                            "USER_SIMULATOR": "llm", "USER_BASE_URL": server.base_url, "USER_MODEL": "echo-user",
                            "USER_API_KEY": USER_KEY}.items():
            monkeypatch.setenv("GYMFOUNDRY_" + name, value)
        yield server


@pytest.mark.usefixtures("prefect_harness")
def test_every_echoed_credential_is_kept_nowhere(hostile, tmp_path, caplog, capfd):
    import prefect.settings

    caplog.set_level(logging.DEBUG)
    data = tmp_path / "data"
    policy = PolicySpec(kind="openai", model="echo-policy", base_url=hostile.base_url, api_key_env="ECHO_POLICY_KEY",
                        max_retries=0, timeout_s=10, options={"retry_backoff_s": 0.0})
    report = factory(families=["conversation"], tasks_per_family=6, samples_per_task=1, seed=5, data_dir=str(data),
                     policy=policy, retry=RetryPolicy(max_retries=1, backoff_s=0.0))
    html = write_html_report(data, tmp_path / "report.html").read_text(encoding="utf-8")
    database = Path(prefect.settings.PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])

    files = [p for p in data.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} >= {".duckdb", ".parquet", ".sqlite"}
    found = {str(p.relative_to(data)): leaks(readable(p)) for p in files}
    found["report.html"] = leaks(html)
    found["logs"] = leaks("\n".join(r.getMessage() for r in caplog.records))
    out, err = capfd.readouterr()
    found["stdout+stderr"] = leaks(out + err)
    found["prefect database"] = leaks(sqlite_dump(database))
    # what the agent and the judge were shown
    found["requests to the policy and judge"] = leaks(json.dumps([b for b in hostile.requests
                                                                  if b["model"] != "echo-user"]))
    assert {where: what for where, what in found.items() if what} == {}

    # each endpoint was sent its own key, and only that
    sent = {model: {h["Authorization"] for b, h in zip(hostile.requests, hostile.headers) if b["model"] == model}
            for model in ("echo-policy", "echo-judge", "echo-user")}
    assert sent == {"echo-policy": {f"Bearer {POLICY_KEY}"}, "echo-judge": {f"Bearer {JUDGE_KEY}"},
                    "echo-user": {f"Bearer {USER_KEY}"}}
    # every path was taken, and its echo kept redacted
    rollouts = [r for p in (data / "lake" / "rollouts").rglob("*.parquet") for r in pq.read_table(p).to_pylist()]
    reasons = " ".join(r["termination_reason"] or "" for r in rollouts)
    for shown in ("HTTP 500", "HTTP 400", f"Authorization: Bearer {MASK}", f"Basic {MASK}", f"http://{MASK}@"):
        assert shown in reasons
    steps = json.dumps([r for p in (data / "lake" / "steps").rglob("*.parquet") for r in pq.read_table(p).to_pylist()],
                       default=str)
    assert f"you sent Authorization: Bearer {MASK}" in steps  # the customer's and the policy's echoes
    assert report["datasets"]["sft"]["rows"] >= 1


MESSAGES = {
    "policy": "the endpoint URL http://[REDACTED]@127.0.0.1:9/v1 holds a user name or password: put the password in "
              "the environment variable named by --api-key-env (api_key_env), not in the URL",
    "judge": "the endpoint URL http://[REDACTED]@127.0.0.1:9/v1 holds a user name or password: put the password in "
             "the environment variable GYMFOUNDRY_JUDGE_API_KEY, not in the URL",
    "simulator": "the endpoint URL http://[REDACTED]@127.0.0.1:9/v1 holds a user name or password: put the password "
                 "in the environment variable GYMFOUNDRY_USER_API_KEY, not in the URL",
}


@pytest.mark.parametrize("where", sorted(MESSAGES))
def test_a_url_with_a_password_is_refused_where_the_endpoint_is_configured(where, monkeypatch):
    configure = {
        "policy": lambda: PolicySpec(kind="openai", model="m", base_url=USERINFO_URL, api_key_env="K"),
        "judge": lambda: JudgeSettings.from_env({"GYMFOUNDRY_JUDGE_BASE_URL": USERINFO_URL}, model="j"),
        "simulator": lambda: LLMSimulator(base_url=USERINFO_URL, model="u"),
    }[where]
    with pytest.raises(ValueError) as refused:
        configure()
    assert MESSAGES[where] in str(refused.value) and leaks(str(refused.value)) == []
    # the run's configuration refuses it too, without repeating it
    if where == "policy":
        with pytest.raises(ValueError) as refused:
            FactoryConfig(policy={"kind": "openai", "model": "m", "base_url": USERINFO_URL})
        assert MESSAGES[where] in str(refused.value) and leaks(str(refused.value)) == []


@pytest.mark.integration  # the CLI in a subprocess
def test_the_cli_refuses_a_base_url_with_a_password_in_one_line_and_writes_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gymfoundry.flows.cli", "run", "--policy", "openai", "--model", "m",
                           "--base-url", USERINFO_URL, "--api-key-env", "K", "--data-dir", str(tmp_path / "d")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    [line] = done.stderr.strip().splitlines()
    assert done.returncode == 2 and line.startswith("gymfoundry run: --base-url: ") and leaks(line) == []
    assert line.endswith(MESSAGES["policy"])
    assert not (tmp_path / "d").exists()


PERSONA = Persona(opening="I want to return my order.")


def test_the_simulator_s_key_is_redacted_from_its_replies_and_its_faults(monkeypatch):
    monkeypatch.setenv("GYMFOUNDRY_USER_API_KEY", USER_KEY)
    replies = [(200, chat_reply("my key? {auth}, again: {auth}")), (500, {"error": {"message": "{auth}"}}),
               (200, chat_reply("x" * 2000 + "{auth}"))]

    def respond(body, headers):
        status, payload = replies.pop(0)
        return status, json.loads(json.dumps(payload).replace("{auth}", headers["Authorization"]))

    with OpenAIStub(respond=respond, echo_header=True) as server:
        sim = LLMSimulator(base_url=server.base_url, model="u")
        memory = new_memory()
        assert sim.reply(PERSONA, memory, "hi").text == f"my key? Bearer {MASK}, again: Bearer {MASK}"
        with pytest.raises(SimulatorFault) as first:
            sim.reply(PERSONA, memory, "hi")
        with pytest.raises(SimulatorFault) as second:
            sim.reply(PERSONA, memory, "hi")
    assert leaks(json.dumps(memory) + str(first.value) + str(second.value)) == []
    assert "user simulator gave an invalid reply" in str(second.value)


@pytest.mark.parametrize("text, clean", [
    (f"see {USERINFO_URL} and https://{USER}@host/x", f"see http://{MASK}@127.0.0.1:9/v1 and https://{MASK}@host/x"),
    (f"Authorization: Basic {BASIC}", f"Authorization: Basic {MASK}"),
    (f'{{"authorization": "basic {BASIC}"}}', f'{{"authorization": "basic {MASK}"}}'),
    ("basic information about Basic plans stays", "basic information about Basic plans stays"),
])
def test_redact_covers_userinfo_and_basic_headers(text, clean):
    assert redact(text) == clean


@pytest.mark.parametrize("prefix", ["", "x", "xy", "Bearer "])
def test_a_key_in_base64_is_redacted_wherever_it_starts(prefix, monkeypatch):
    monkeypatch.setenv("GYMFOUNDRY_USER_API_KEY", USER_KEY)
    encoded = base64.b64encode((prefix + USER_KEY + "!").encode()).decode()
    redacted = redact(f"header: {encoded}.")
    assert MASK in redacted and encoded[len(prefix) * 4 // 3 + 2:-4] not in redacted
