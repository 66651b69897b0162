"""PRM layer 2 against a real OpenAI-protocol HTTP server on 127.0.0.1 (tests/verifiers/openai_stub.py)."""

import json

import pytest

from gymfoundry.envs.inventory import InventoryEnv
from gymfoundry.envs.profile import ScoreWeights
from gymfoundry.tasks.stages.score import score_steps
from tests.verifiers.openai_stub import OpenAIStub, split_prompt
from tests.verifiers.test_rules import AUTH, FIND, RESERVE, STOCK, SUBMIT, TASK, FlakyEnv, rollout
from gymfoundry.verifiers.judge import (DEFAULT_RUBRIC, Judge, JudgeCache, JudgeSettings, parse_verdict, prompt_version,
                             rubric_of)

PROFILE = InventoryEnv.profile
PROFILES = {"inventory": PROFILE}
TASKS = {TASK.task_id: TASK}
THOUGHTFUL_RESERVE = ("I was approved, so I reserve the item with the token now.\n<tool_call>"
                      + json.dumps(RESERVE) + "</tool_call>")


def settings(server, **kwargs):
    values = {"base_url": server.base_url, "model": "stub-judge", "api_key": "sk-test", "retry_backoff_s": 0,
              "timeout_s": 5, **kwargs}
    return JudgeSettings(**values)


@pytest.fixture
def server():
    with OpenAIStub() as stub:
        yield stub


def judge_scores(judge_settings, actions, cache=None):
    return Judge(judge_settings, cache).score([rollout(actions)], TASKS, PROFILES)


def test_without_an_endpoint_the_judge_is_not_configured_and_rewards_are_the_rules():
    assert not JudgeSettings.from_env({}).configured
    scores, stats = judge_scores(JudgeSettings(), [FIND, STOCK, AUTH, RESERVE, SUBMIT])
    assert {(s.status, s.score, s.layer) for s in scores} == {("not_configured", None, "judge")}
    assert stats.requests == 0

    run = score_steps([rollout([FIND, STOCK, AUTH, RESERVE, SUBMIT])], [TASK], judge=JudgeSettings())
    rules = [s.score for s in run.scores if s.layer == "rules"]
    combined = [s for s in run.scores if s.layer == "combined"]
    assert [s.score for s in combined] == rules == [0.0, 0.0, 0.2, 0.7, 0.1]
    assert all("|judge:none|" in s.scorer_version and "judge" not in s.components for s in combined)


def test_settings_come_from_the_environment_and_the_key_is_never_shown():
    env = {"GYMFOUNDRY_JUDGE_BASE_URL": "http://127.0.0.1:9/v1", "GYMFOUNDRY_JUDGE_MODEL": "qwen",
           "GYMFOUNDRY_JUDGE_API_KEY": "sk-secret", "GYMFOUNDRY_JUDGE_MAX_CONCURRENCY": "3",
           "GYMFOUNDRY_JUDGE_JSON_MODE": "0"}
    s = JudgeSettings.from_env(env, model="override")
    assert s.configured and s.model == "override" and s.max_concurrency == 3 and not s.json_mode
    assert s.api_key.get_secret_value() == "sk-secret"
    assert "sk-secret" not in repr(s) and "sk-secret" not in s.model_dump_json()


def test_end_to_end_against_the_local_server(server):
    scores, stats = judge_scores(settings(server), [FIND, AUTH, THOUGHTFUL_RESERVE, "garbage", SUBMIT])
    assert [s.status for s in scores] == ["ok"] * 5
    assert [s.score for s in scores] == [0.25, 0.25, 0.25, -1.0, 0.5]
    version = prompt_version(PROFILE.judge_rubric)
    assert {(s.layer, s.scorer_id, s.scorer_version) for s in scores} == {("judge", "judge:stub-judge", version)}
    assert set(scores[0].components) == {"goal_progress", "correctness", "grounding"}
    assert scores[0].rationale == "graded 0.25"
    assert stats.requests == 5 and stats.errors == 0

    # what the judge was shown: the rubric, the goal, the history, the step's reasoning, action and observation
    body = next(b for b in server.requests if "reserve the item with the token" in b["messages"][1]["content"])
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    assert body["model"] == "stub-judge" and body["response_format"] == {"type": "json_object"}
    assert all(d.name in system and f"weight {d.weight:g}" in system for d in PROFILE.judge_rubric.dimensions)
    assert PROFILE.judge_rubric.instructions.split()[0] in system
    assert TASK.goal in user.split("<<<BEGIN")[0]  # the goal is the authors' text, outside the fence
    data, outside = split_prompt(system, user)
    assert [json.loads(s["action"])["name"] for s in data["earlier_steps"]] == ["find_items", "request_authorization"]
    review = data["step_under_review"]
    assert review["reasoning"] == "I was approved, so I reserve the item with the token now."
    assert json.loads(review["action"]) == RESERVE and review["parsed_as_tool_call"] is True
    assert json.loads(review["observation"])["result"]["reservation_id"] == "R-1"
    assert "reserve the item" not in outside  # every agent-written span is inside the fence
    assert all(h.get("Authorization") == "Bearer sk-test" for h in server.headers)
    # the hidden fields are never shown
    assert not any(secret in json.dumps(server.requests) for secret in TASK.hidden.secrets)


def test_layer_weights_change_the_combined_reward(server):
    actions = [FIND, STOCK, AUTH, RESERVE, SUBMIT]

    def combined(layers):
        profile = PROFILE.model_copy(update={"score_weights": ScoreWeights(rules=PROFILE.score_weights.rules,
                                                                           layers=layers)})
        run = score_steps([rollout(actions)], [TASK], judge=settings(server), profiles={"inventory": profile})
        return [s.score for s in run.scores if s.layer == "combined"]

    rules_only = combined({"rules": 1.0, "judge": 0.0})
    even = combined({"rules": 1.0, "judge": 1.0})
    judge_heavy = combined({"rules": 1.0, "judge": 3.0})
    assert rules_only == [0.0, 0.0, 0.2, 0.7, 0.1]
    judge = [0.25, 0.25, 0.25, 0.25, 0.5]
    assert even == pytest.approx([(r + j) / 2 for r, j in zip(rules_only, judge)])
    assert judge_heavy == pytest.approx([(r + 3 * j) / 4 for r, j in zip(rules_only, judge)])
    assert len({tuple(rules_only), tuple(even), tuple(judge_heavy)}) == 3


@pytest.mark.parametrize("failure", ["malformed", "wrong_keys", "out_of_range", "500", "429", "timeout"])
def test_bad_replies_are_retried(server, failure):
    server.script.extend([failure, failure])
    [score], stats = judge_scores(settings(server, max_attempts=3, timeout_s=0.5), [FIND])
    assert score.status == "ok" and score.score == 0.25
    assert len(server.requests) == stats.requests == 3
    if failure in ("malformed", "wrong_keys", "out_of_range"):  # the retry says what was wrong
        assert server.requests[-1]["messages"][-1]["role"] == "user"
        assert "invalid" in server.requests[-1]["messages"][-1]["content"]


def test_a_fenced_reply_is_accepted(server):
    server.script.append("fenced")
    [score], _ = judge_scores(settings(server), [FIND])
    assert score.status == "ok" and len(server.requests) == 1


def test_exhausted_retries_give_an_error_and_no_score(server):
    server.script.extend(["500"] * 3)
    [score], stats = judge_scores(settings(server, max_attempts=3), [FIND])
    assert score.status == "error" and score.score is None and "HTTP 500" in score.rationale
    assert stats.errors == 1 and len(server.requests) == 3

    server.script.extend(["timeout"] * 2)
    [score], _ = judge_scores(settings(server, max_attempts=2, timeout_s=0.3), [STOCK])
    assert score.status == "error" and "timed out" in score.rationale

    server.script.append("401")  # a bad key is not retried
    before = len(server.requests)
    [score], _ = judge_scores(settings(server, max_attempts=3), [AUTH])
    assert score.status == "error" and "HTTP 401" in score.rationale and len(server.requests) == before + 1


def test_a_failed_judgement_falls_back_to_the_rules_and_is_not_landed(server):
    server.script.extend(["500"] * 2)
    run = score_steps([rollout([FIND, AUTH])], [TASK], judge=settings(server, max_attempts=2, max_concurrency=1))
    combined = [s for s in run.scores if s.layer == "combined"]
    assert [s.status for s in run.judge_failed] == ["error"]
    assert combined[0].score == 0.0 and "|judge:error|" in combined[0].scorer_version
    assert "|judge:stub-judge@" in combined[1].scorer_version
    assert [s.step_index for s in run.scores if s.layer == "judge"] == [1]


def test_unreachable_endpoint_is_an_error_not_a_score():
    s = JudgeSettings(base_url="http://127.0.0.1:9/v1", model="m", max_attempts=2, retry_backoff_s=0, timeout_s=1)
    [score], _ = judge_scores(s, [FIND])
    assert score.status == "error" and score.score is None and "connection failed" in score.rationale


def test_verdicts_are_cached_by_content_prompt_version_and_model(server, tmp_path):
    path = tmp_path / "judge.sqlite"
    actions = [FIND, STOCK, AUTH]
    first, stats = judge_scores(settings(server), actions, JudgeCache(path))
    assert stats.requests == 3
    again, stats = judge_scores(settings(server), actions, JudgeCache(path))  # a new process, the same file
    assert stats.requests == 0 and stats.cache_hits == 3 and again == first
    _, stats = judge_scores(settings(server, model="other-judge"), actions, JudgeCache(path))
    assert stats.requests == 3
    _, stats = judge_scores(settings(server), actions + [RESERVE], JudgeCache(path))
    assert stats.requests == 1  # only the new step


def test_requests_run_concurrently_up_to_the_limit():
    with OpenAIStub(latency_s=0.1) as slow:
        scores, _ = judge_scores(settings(slow, max_concurrency=4), [FIND, STOCK] * 6)
        assert len(scores) == 12 and all(s.status == "ok" for s in scores)
        assert 1 < slow.max_in_flight <= 4


def test_environment_faults_are_not_judged(server):
    r = rollout([STOCK, STOCK], env=FlakyEnv())
    scores, _ = Judge(settings(server)).score([r], TASKS, PROFILES)
    assert [s.step_index for s in scores] == [1]


def test_parse_verdict_is_strict():
    ok = '```json\n{"scores": {"goal_progress": 1, "correctness": 0, "grounding": -0.5}, "rationale": "x"}\n```'
    assert parse_verdict(ok, DEFAULT_RUBRIC).scores["grounding"] == -0.5
    for bad in ['{"scores": {"goal_progress": 1}}', "not json", '{"scores": {}, "rationale": "", "extra": 1}',
                '{"scores": {"goal_progress": 2, "correctness": 0, "grounding": 0}}']:
        with pytest.raises(ValueError):
            parse_verdict(bad, DEFAULT_RUBRIC)
    assert rubric_of(None) is DEFAULT_RUBRIC and rubric_of(PROFILE) is PROFILE.judge_rubric


def test_a_family_whose_judge_weight_is_zero_is_not_asked(server):
    """A configured judge is not asked about a family that gives it no weight (its score would
    change nothing): one not_configured row per step, saying why, and the same combined rewards."""
    actions = [FIND, STOCK, AUTH, RESERVE, SUBMIT]
    profile = PROFILE.model_copy(update={"score_weights": ScoreWeights(rules=PROFILE.score_weights.rules,
                                                                       layers={"rules": 1.0, "judge": 0.0})})
    run = score_steps([rollout(actions)], [TASK], judge=settings(server), profiles={"inventory": profile})
    assert server.requests == [] and run.judge.requests == 0 and run.judge.steps == 5
    judged = [s for s in run.scores if s.layer == "judge"]
    assert [(s.status, s.score, s.scorer_id) for s in judged] == [("not_configured", None, "judge:stub-judge")] * 5
    assert {s.rationale for s in judged} == {"the judge's weight is 0 in this family's profile: not asked"}
    combined = [s for s in run.scores if s.layer == "combined"]
    assert [s.score for s in combined] == [0.0, 0.0, 0.2, 0.7, 0.1]
    assert all("|judge:none|" in s.scorer_version for s in combined)
