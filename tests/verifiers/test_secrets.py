"""Secrets never reach a stored or logged text, even from an endpoint that echoes them: stub
endpoints here repeat the request's Authorization header in replies, in error bodies and in
response headers, and the key must appear in no step, score row, rationale, cache file,
termination reason or log record."""

import json
import logging

import pytest

from gymfoundry.envs.secrets import MASK, known_secrets, redact, register_secret
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.hf import family_tools
from gymfoundry.tasks.policies.openai import OpenAIPolicy
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.stages.score import score_steps
from tests.verifiers.openai_stub import OpenAIStub, chat_reply
from tests.verifiers.test_rules import AUTH, FIND, STOCK, TASK, rollout
from gymfoundry.verifiers.judge import JudgeSettings

JUDGE_KEY = "sk-judge-0123456789abcdefXYZ"
POLICY_KEY = "sk-policy-9876543210fedcbaQRS"


def test_redact_replaces_every_form_of_every_known_secret():
    env = {"GYMFOUNDRY_JUDGE_API_KEY": "sk-a/b+c=d&e", "OPENAI_API_KEY": "abc", "GYMFOUNDRY_POLICY_API_KEY": ""}
    text = 'raw sk-a/b+c=d&e, quoted sk-a%2Fb%2Bc%3Dd%26e, json "sk-a/b+c=d&e", short abc'
    assert redact(text, env) == f'raw {MASK}, quoted {MASK}, json "{MASK}", short abc'
    assert known_secrets({"GYMFOUNDRY_JUDGE_API_KEY": "k" * 7}) == known_secrets({})  # too short to be a secret
    # a bearer token is redacted whoever's it is; the English word is left alone
    assert redact("Authorization: Bearer tok_live_ABCDEF123456", {}) == f"Authorization: Bearer {MASK}"
    assert redact("the bearer token is sent by the client", {}) == "the bearer token is sent by the client"
    register_secret("passed-in-code-key-42")
    assert redact("x passed-in-code-key-42 y", {}) == f"x {MASK} y"
    assert redact(None) is None and redact("") == ""


@pytest.mark.parametrize("placeholder", ["EMPTY", "sk-no-key-required", "dummy", "not-needed"])
def test_a_placeholder_key_of_a_local_server_redacts_nothing(placeholder):
    text = f"EMPTY cart; no-key mode; {placeholder.lower()} and {placeholder} stay as written"
    assert known_secrets({"OPENAI_API_KEY": placeholder}) == known_secrets({})
    assert redact(text, {"OPENAI_API_KEY": placeholder}) == text


def test_a_fragment_of_a_key_is_redacted_down_to_twelve_characters():
    env = {"GYMFOUNDRY_JUDGE_API_KEY": JUDGE_KEY}
    assert redact(f"cut: {JUDGE_KEY[:13]}| tail: {JUDGE_KEY[-20:]} mid: {JUDGE_KEY[5:17]}.", env) == \
        f"cut: {MASK}| tail: {MASK} mid: {MASK}."
    assert redact(f"short: {JUDGE_KEY[:11]}", env) == f"short: {JUDGE_KEY[:11]}"  # too short to tell from text


def test_a_key_that_contains_another_is_replaced_whole():
    env = {"GYMFOUNDRY_JUDGE_API_KEY": "sk-long-key-1234", "GYMFOUNDRY_POLICY_API_KEY": "long-key"}
    assert redact("a sk-long-key-1234 b long-key", env) == f"a {MASK} b {MASK}"


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("GYMFOUNDRY_JUDGE_API_KEY", JUDGE_KEY)
    monkeypatch.setenv("GYMFOUNDRY_POLICY_API_KEY", POLICY_KEY)


def assert_nowhere(key: str, *texts: str, records=()) -> None:
    for text in texts:
        assert key not in text and key[3:15] not in text
    leaked = [r.getMessage() for r in records if key[3:15] in r.getMessage()]
    assert leaked == []


def test_a_judge_that_echoes_the_key_stores_and_logs_none_of_it(keys, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with OpenAIStub() as server:
        server.script.extend(["echo_key", "echo_key_error"])
        settings = JudgeSettings.from_env(base_url=server.base_url, model="echo", max_attempts=1, max_concurrency=1)
        run = score_steps([rollout([FIND, STOCK, AUTH])], [TASK], data_dir=tmp_path, judge=settings)
        assert all(h["Authorization"] == f"Bearer {JUDGE_KEY}" for h in server.headers)  # the key was sent
    judged = [s for s in run.scores if s.layer == "judge"]
    assert judged[0].rationale == f"graded 0.25; your request carried Authorization: Bearer {MASK}"
    [failed] = run.judge_failed
    assert failed.rationale.startswith("judge failed after 1 attempt(s): HTTP 400: ")
    assert f"Bearer {MASK}" in failed.rationale  # redacted before it was clipped to 200 characters
    cache = (tmp_path / "judge_cache.sqlite").read_bytes()
    assert_nowhere(JUDGE_KEY, json.dumps([s.model_dump() for s in run.scores + run.judge_failed]),
                   json.dumps(run.judge.first_errors), cache.decode("latin-1"), records=caplog.records)


def test_a_policy_endpoint_that_echoes_the_key_leaves_it_in_no_step_reason_or_log(keys, caplog):
    caplog.set_level(logging.DEBUG)
    task = generate_tasks("inventory", 1, 4)[0]
    calls = []

    def echo(body, headers):  # a reply carrying the key in its text and arguments, then an error body
        calls.append(headers)
        auth = headers.get("Authorization", "")
        if len(calls) == 1:
            reply = chat_reply(f"My credentials are {auth}.")
            reply["choices"][0]["message"]["tool_calls"] = [{"id": "c1", "type": "function", "function": {
                "name": "find_items", "arguments": json.dumps({"query": auth[-20:]})}}]
            return 200, reply
        return 500, {"error": {"message": f"upstream rejected {auth}", "echo": auth}}

    with OpenAIStub(respond=echo) as server:
        policy = OpenAIPolicy("echo", family_tools("inventory"), base_url=server.base_url, timeout_s=5)
        r = run_episode(task, policy, seed=1)
    assert calls[0]["Authorization"] == f"Bearer {POLICY_KEY}"
    assert r.steps[0].thought == f"My credentials are Bearer {MASK}."
    assert r.steps[0].tool_call.arguments == {"query": MASK}
    assert r.termination.value == "inference_fault" and "HTTP 500" in r.termination_reason
    assert f"upstream rejected Bearer {MASK}" in r.termination_reason
    scores = score_steps([r], [task], judge=JudgeSettings()).scores
    assert_nowhere(POLICY_KEY, r.model_dump_json(), json.dumps([s.model_dump() for s in scores]),
                   json.dumps(policy.messages), policy.version, records=caplog.records)


def test_a_key_echoed_in_a_response_header_stays_out_of_the_debug_log(keys, caplog):
    caplog.set_level(logging.DEBUG)

    def echo_header(body, headers):
        return 200, chat_reply("hello")

    with OpenAIStub(respond=echo_header, echo_header=True) as server:
        OpenAIPolicy("echo", base_url=server.base_url, timeout_s=5).act("hi")
    assert any("X-Echo" in r.getMessage() for r in caplog.records)  # httpcore logged the headers
    assert_nowhere(POLICY_KEY, records=caplog.records)


def test_any_exception_text_is_redacted_before_it_becomes_a_termination_reason(keys):
    """Not only the policy's own errors: whatever a policy raises (a client library quoting the
    header it sent, say) reaches the stored reason without the key."""
    class Leaky:
        policy_id, version = "leaky", "1"

        def reset(self, seed):
            pass

        def act(self, observation):
            raise RuntimeError(f"client refused: Authorization: {POLICY_KEY}")

    task = generate_tasks("inventory", 1, 4)[0]
    r = run_episode(task, Leaky(), seed=1)
    assert r.termination.value == "policy_error"
    assert r.termination_reason == f"policy raised RuntimeError: client refused: Authorization: {MASK}"
