"""A whole-request deadline for the judge and the OpenAI-compatible policy, against a real local
server that trickles a complete, valid reply one byte at a time (each read succeeds, so a
per-read timeout never fires: before the deadline a 1 s-timeout request took as long as the
server liked)."""

import httpx
import pytest

from gymfoundry.envs.records import MODEL_OUTCOMES, Termination
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.hf import family_tools
from gymfoundry.tasks.policies.openai import OpenAIPolicy
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.stages.score import score_steps
from tests.verifiers.openai_stub import OpenAIStub, TricklingServer, chat_reply
from tests.verifiers.test_rules import FIND, STOCK, TASK, rollout
from gymfoundry.verifiers.endpoint import DeadlineClient, EndpointError
from gymfoundry.verifiers.judge import Judge, JudgeSettings

DEADLINE = 1.0
VERDICT = chat_reply('{"scores": {"goal_progress": 1, "correctness": 1, "grounding": 1}, "rationale": "late"}')


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_the_judge_gives_up_at_the_deadline_and_reports_an_endpoint_error(phase):
    with TricklingServer(VERDICT, interval_s=0.2, phase=phase) as server:
        judge = Judge(JudgeSettings(base_url=server.base_url, model="m", timeout_s=DEADLINE, max_attempts=1))
        scores, stats = judge.score([rollout([FIND])], {TASK.task_id: TASK}, {})
    [score] = scores
    assert score.status == "error" and score.score is None and score.components == {}
    assert score.rationale == "judge failed after 1 attempt(s): timed out: no complete answer within the 1 s deadline"
    assert stats.errors == 1


def test_each_retry_has_its_own_deadline_and_a_timeout_is_never_a_score():
    with TricklingServer(VERDICT, interval_s=0.2) as server:
        settings = JudgeSettings(base_url=server.base_url, model="m", timeout_s=DEADLINE, max_attempts=2,
                                 retry_backoff_s=0)
        run = score_steps([rollout([FIND, STOCK])], [TASK], judge=settings)
        assert server.requests == 4  # two steps, two attempts each, each attempt given up at its deadline
    assert [s.status for s in run.judge_failed] == ["error", "error"]
    assert not [s for s in run.scores if s.layer == "judge"]  # not landed: the next re-score retries
    combined = [s for s in run.scores if s.layer == "combined"]
    assert [s.score for s in combined] == [0.0, 0.0] and all("|judge:error|" in s.scorer_version for s in combined)


def test_the_policy_gives_up_at_the_deadline_as_an_inference_fault():
    task = generate_tasks("inventory", 1, 2)[0]
    with TricklingServer(chat_reply("thinking..."), interval_s=0.2) as server:
        # one request, no retry of the policy's own: the deadline bounds it whatever the server's pace
        policy = OpenAIPolicy("m", family_tools("inventory"), base_url=server.base_url, timeout_s=DEADLINE,
                              max_retries=0)
        with pytest.raises(EndpointError, match="no complete answer within the 1 s deadline"):
            policy.act("hello")
        r = run_episode(task, policy, seed=1)
        # with retries, each request has its own deadline: (1 + retries) deadlines plus the backoffs
        retrying = OpenAIPolicy("m", family_tools("inventory"), base_url=server.base_url, timeout_s=DEADLINE,
                                max_retries=1, retry_backoff_s=0.1)
        before = server.requests
        with pytest.raises(EndpointError, match="no complete answer within the 1 s deadline"):
            retrying.act("hello")
        assert server.requests - before == 2  # the retry was asked after the first request's deadline
    assert r.termination == Termination.inference_fault and r.termination not in MODEL_OUTCOMES
    assert r.termination_reason.startswith("inference endpoint failed: ") and "1 s deadline" in r.termination_reason
    assert r.steps == []


def test_a_prompt_server_is_unaffected_and_a_deadline_must_be_positive():
    with OpenAIStub(latency_s=0.3) as server:
        with DeadlineClient(DEADLINE) as client:
            response = client.post(server.base_url + "/chat/completions", json={"messages": [
                {"content": 'of this form:\n{"scores": {"a": 0}}'}, {"content": "x"}]})
            assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"]
    with pytest.raises(ValueError, match="positive"):
        DeadlineClient(0)
