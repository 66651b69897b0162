"""Time and tokens are charged to whoever spent them (envs.wrappers.TimeLimit), through the public
interface (`gymfoundry.tasks.rollout.episodes.run_episode` with small policies, the real stack and verifiers):

- the policy's own time (a stall in `act`) and its reported tokens running out end the episode
  `truncated`, a counted model outcome: stalling cannot take a failure out of a success rate;
- a step past the environment's limit is an environment fault, and the environment's time is
  not the policy's; steps each within their limit that together use up the episode's time ran
  the agent's own actions: `truncated`, counted;
- the time an endpoint policy waits on failed inference (its retries and backoff) is not the
  model's;
- grading runs on a clock of its own, outside the step: past its budget a grader fault (retried,
  out of every statistic), within it the verdict, however slow the step clock;
- a discussion moderated with long comma-spliced messages gets its untimed verdict;
- no rate is computed over zero model outcomes: evaluation and `success_by_cell` say None/NULL
  and how many episodes were left out, by class."""

from __future__ import annotations

import json
import threading
import time

import pytest

from gymfoundry import envs  # noqa: F401
from gymfoundry.envs.discussion import FAMILY as DISCUSSION
from gymfoundry.envs.records import (MODEL_OUTCOMES, Budget, OutcomeReport, PolicySpec, RetryPolicy, TaskSpec, Termination,
                          ToolCall)
from gymfoundry.envs.family import family
from gymfoundry.tasks.ops.evaluate import summarize
from gymfoundry.tasks.policies.base import PolicyOutput
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.rollout.retry import collect_with_retries
from gymfoundry.tasks.stages.generate import generate_tasks
from tests.envs.counter_env import CounterEnv, HeldSleep, register
from tests.tasks.test_openai_history import scripted_model
from tests.verifiers.openai_stub import OpenAIStub
from gymfoundry.warehouse import Warehouse

COUNTER = "gymfoundry/counter-v0"
SLOW_GRADER = "gymfoundry/slowgrader-v0"
CLOCK_S = 0.3  # the small clocks these tests run under


def text(call: ToolCall | dict) -> str:
    call = call if isinstance(call, dict) else {"name": call.name, "arguments": call.arguments}
    return json.dumps(call)


class Plays:
    """Plays the given calls in order (then repeats the last), sleeping `stall_s` before turn
    `stall_at` (0-based); with `tokens`, each turn reports that many sampled token ids."""

    policy_id, version = "test-plays", "1"

    def __init__(self, calls, stall_s: float = 0.0, stall_at: int = 0, tokens: int | None = None):
        self.calls, self.stall_s, self.stall_at, self.tokens = [text(c) for c in calls], stall_s, stall_at, tokens

    def reset(self, seed=None):
        self.turn = 0

    def act(self, observation: str):
        if self.stall_s and self.turn == self.stall_at:
            time.sleep(self.stall_s)
        self.turn += 1
        action = self.calls[min(self.turn, len(self.calls)) - 1]
        return PolicyOutput(text=action, token_ids=list(range(self.tokens))) if self.tokens else action


class Raises:
    policy_id, version = "test-raises", "1"

    def reset(self, seed=None):
        pass

    def act(self, observation: str):
        raise RuntimeError("the policy's own bug")


class SlowVerifier:
    """A verifier whose verdict (success when the counter is at its target) takes `delay_s`."""

    verifier_id, version, delay_s = "test-slow", "1", 1.0

    def verify(self, task, steps, final_state=None):
        time.sleep(self.delay_s)
        ok = final_state is not None and final_state["value"] == final_state["target"]
        return OutcomeReport(verifier_id=self.verifier_id, verifier_version=self.version, success=ok, completed=ok,
                             regression=False, constraint_violation=False)

    def terminal_reward(self, task, steps, final_state):
        report = self.verify(task, steps, final_state)
        return float(report.success), report.model_dump(mode="json")


class SlowGraderEnv(CounterEnv):
    family = "slowgrader"


@pytest.fixture(autouse=True, scope="module")
def _registered():
    register(COUNTER, CounterEnv)
    register(SLOW_GRADER, SlowGraderEnv, verifier=SlowVerifier)


def slow_grader_task(seed: int = 3) -> TaskSpec:
    task = CounterEnv.generate_task(seed)
    return TaskSpec.model_validate({**task.model_dump(exclude={"task_id"}), "family": "slowgrader", "env_id": SLOW_GRADER})


def reach(task: TaskSpec) -> list[dict]:
    return [{"name": "add", "arguments": {"n": task.initial_state["target"]}}, {"name": "finish", "arguments": {}}]


# -- the policy's own time and tokens ------------------------------------------------------------
def test_a_policy_that_stalls_past_its_clock_ends_truncated_a_counted_model_outcome():
    task = generate_tasks("inventory", 1, seed=1)[0]
    limits = task.budget.model_copy(update={"episode_timeout_s": CLOCK_S})
    played = run_episode(task, Plays(task.hidden.reference), 0, limits=limits)
    assert played.termination == Termination.success  # the same calls in time succeed
    stalled = run_episode(task, Plays(task.hidden.reference, stall_s=2 * CLOCK_S, stall_at=1), 0, limits=limits)
    assert stalled.termination == Termination.truncated and stalled.termination in MODEL_OUTCOMES
    assert stalled.termination_reason.startswith("the policy's own time ran out")
    # its late action was never run: the last step is the clock's, with no call
    assert [s.error for s in stalled.steps] == [None, "timeout"] and stalled.steps[-1].tool_call is None


def test_stalling_on_the_episodes_it_would_fail_cannot_lift_a_success_rate(tmp_path):
    """The issue's policy: it plays the reference on half of the tasks and stalls past the clock on
    the others. Before, the stalled ones were `timeout`, outside every rate: success 1.0 with half
    of the episodes excluded. They are its own outcome: 0.5, none excluded, in evaluation and in
    the warehouse."""
    tasks = generate_tasks("inventory", 4, seed=2)
    rollouts = []
    for n, task in enumerate(tasks):
        policy = Plays(task.hidden.reference, stall_s=2 * CLOCK_S if n % 2 else 0.0, stall_at=1)
        rollouts.append(run_episode(task, policy, n, limits=task.budget.model_copy(
            update={"episode_timeout_s": CLOCK_S})))
    assert [r.termination.value for r in rollouts] == ["success", "truncated"] * 2
    report = summarize(rollouts, tasks)
    assert (report["success_rate"], report["model_outcomes"], report["excluded"], report["excluded_by_class"]) \
        == (0.5, 4, 0, {})
    with Warehouse(tmp_path) as wh:
        wh.land(tasks=tasks, rollouts=rollouts).checked()
        cells = wh.sql("select sum(rollouts) as rollouts, sum(model_outcomes) as counted, sum(successes) as successes, "
                       "sum(excluded) as excluded from success_by_cell").to_pylist()
    assert cells == [{"rollouts": 4, "counted": 4, "successes": 2, "excluded": 0}]


def test_the_environments_time_is_not_the_policys():
    """Steps that take most of the episode's clock leave the policy its own: it thinks for less
    than the clock and the world for less than the clock, together for more. Before, one wall
    clock ran out on the policy (`timeout`)."""
    task = CounterEnv.generate_task(3)
    calls = [{"name": "sleep", "arguments": {"seconds": 0.3}}] * 2 + reach(task)
    policy = Plays(calls, stall_s=0.6, stall_at=2)
    rollout = run_episode(task, policy, 0, limits=Budget(step_timeout_s=1.0, episode_timeout_s=1.0))
    assert [s.error for s in rollout.steps] == [None] * 4
    assert rollout.cost.wall_time_s > 1.0
    assert rollout.termination == Termination.verifier_error  # ended by `finish`; counter has no verifier


def test_a_turn_or_an_episode_over_its_token_budget_is_truncated_and_not_run():
    task = CounterEnv.generate_task(3)
    add = {"name": "add", "arguments": {"n": 1}}
    over_turn = run_episode(task, Plays([add], tokens=50), 0, limits=Budget(max_turn_tokens=10))
    assert over_turn.termination == Termination.truncated and over_turn.termination in MODEL_OUTCOMES
    assert over_turn.termination_reason.startswith("the policy's turn of 50 tokens is over its budget of 10")
    assert [(s.error, s.tool_call, len(s.token_ids)) for s in over_turn.steps] == [("token_budget", None, 50)]
    over_episode = run_episode(task, Plays([add], tokens=5), 0, limits=Budget(max_episode_tokens=12))
    assert over_episode.termination == Termination.truncated
    assert over_episode.termination_reason.startswith("the policy's 15 tokens are over its budget of 12 per episode")
    assert [s.error for s in over_episode.steps] == [None, None, "token_budget"]
    # no budget set: the task's id, the runtime and the rollout's identity are what they were
    assert set(Budget().model_dump()) == {"max_steps", "max_tool_calls", "step_timeout_s", "episode_timeout_s",
                                          "max_action_chars"}
    free = run_episode(task, Plays([add] * 3 + [{"name": "finish", "arguments": {}}], tokens=50), 0)
    assert [s.error for s in free.steps] == [None] * 4


# -- the environment's and the grader's time -----------------------------------------------------
@pytest.mark.timeout(60)  # an episode that waited for the held tool would hang
def test_a_step_past_the_environments_limit_is_an_environment_fault_retried(monkeypatch):
    held = HeldSleep(monkeypatch)
    task = CounterEnv.generate_task(3)
    policy = Plays([{"name": "add", "arguments": {"n": 1}}, {"name": "sleep", "arguments": {"seconds": 1.2}}])
    rollout = run_episode(task, policy, 0, limits=Budget(step_timeout_s=CLOCK_S))
    assert held.holding()  # cut off at its deadline while the tool still ran
    held.end()
    assert rollout.termination == Termination.env_fault and rollout.termination not in MODEL_OUTCOMES
    assert rollout.termination_reason.startswith("environment fault: the environment's step time limit of 0.3s")
    assert Termination.env_fault in RetryPolicy().retry_on


def test_the_agents_own_actions_using_up_the_environments_time_end_truncated_and_counted():
    """A coding agent's way out of the statistics: commands that each sleep a little under the
    step limit until the episode's environment time is gone. Before, `env_fault` (retried, out of
    every rate); it is the agent's own doing, a counted outcome. One step past its own limit (the
    world hung) stays an environment fault."""
    task = CounterEnv.generate_task(3)
    sleeps = [{"name": "sleep", "arguments": {"seconds": 0.2}}]
    rollout = run_episode(task, Plays(sleeps), 0, limits=Budget(step_timeout_s=CLOCK_S, episode_timeout_s=0.5))
    assert rollout.termination == Termination.truncated and rollout.termination in MODEL_OUTCOMES
    assert rollout.termination_reason == ("the episode's time ran out on the agent's own actions: the environment's "
                                          "time running them reached the episode's limit of 0.5s")
    assert [s.error for s in rollout.steps] == [None, None, "timeout"]
    report = summarize([rollout], [task])
    assert (report["model_outcomes"], report["excluded"]) == (1, 0)
    hung = run_episode(task, Plays([{"name": "sleep", "arguments": {"seconds": 1.0}}]), 0,
                       limits=Budget(step_timeout_s=CLOCK_S, episode_timeout_s=5.0))
    assert hung.termination == Termination.env_fault
    assert hung.termination_reason.startswith("environment fault: the environment's step time limit of 0.3s")


def test_an_endpoints_retries_and_backoff_are_not_the_models_time():
    """A busy server (429 on every other request) and the policy's backoff before each answer
    together take longer than the episode's clock; the model itself answers at once. Before, the
    waiting was charged to the policy: `truncated`."""
    task = generate_tasks("inventory", 1, seed=3)[0]
    model, asked = scripted_model(task), []

    def busy(body, headers):
        asked.append(1)
        if len(asked) % 2:
            return 429, {"error": {"message": "rate limited", "type": "rate_limit"}}
        return 200, model(body)

    limits = task.budget.model_copy(update={"episode_timeout_s": 0.5})
    with OpenAIStub(respond=busy) as server:
        policy = make_policy(PolicySpec(kind="openai", model="stub", base_url=server.base_url, max_retries=1,
                                        timeout_s=5, options={"retry_backoff_s": 0.2}), "inventory")
        rollout = run_episode(task, policy, 0, limits=limits)
    assert rollout.termination == Termination.success, rollout.termination_reason
    assert len(asked) == 2 * len(task.hidden.reference)
    assert policy.inference_wait_s >= 0.2 * len(task.hidden.reference) > limits.episode_timeout_s  # the waits alone


@pytest.mark.timeout(60)  # an episode that waited for the held grader would hang
def test_a_grader_past_its_own_budget_is_a_grader_fault_retried_and_out_of_the_statistics(monkeypatch):
    released, verify = threading.Event(), SlowVerifier.verify
    monkeypatch.setattr(SlowVerifier, "verify", lambda self, *a, **kw: released.wait() and verify(self, *a, **kw))
    task = slow_grader_task()
    rollout = run_episode(task, Plays(reach(task)), 0, limits=Budget(grade_timeout_s=CLOCK_S))
    released.set()  # back while the grader was held: cut off at the grader's deadline
    assert rollout.termination == Termination.grader_fault and rollout.termination not in MODEL_OUTCOMES
    assert rollout.termination_reason == "grader fault: grading ran past its 0.3s budget"
    assert [s.error for s in rollout.steps] == [None, None] and rollout.outcome is None  # the step stands
    assert Termination.grader_fault in RetryPolicy().retry_on
    report = summarize([rollout], [task])
    assert report["success_rate"] is None and report["excluded_by_class"] == {"grader_fault": 1}


def test_grading_runs_outside_the_agents_step_clock():
    """A verdict that takes longer than the step clock (and than the episode's) is still the
    verdict: grading is no part of the step that ended the episode. Before, `timeout`."""
    task = slow_grader_task()
    rollout = run_episode(task, Plays(reach(task)), 0, limits=Budget(step_timeout_s=CLOCK_S, episode_timeout_s=0.5))
    assert rollout.termination == Termination.success, rollout.termination_reason


def test_a_slow_grader_is_retried_under_the_runs_retry_policy():
    task = TaskSpec.model_validate({**slow_grader_task().model_dump(exclude={"task_id"}),
                                    "budget": {"grade_timeout_s": CLOCK_S}})
    rollouts = collect_with_retries([task], Plays(reach(task)), 1, 0, RetryPolicy(max_retries=1, backoff_s=0),
                                    sleep=lambda s: None)
    assert [(r.attempt, r.termination.value) for r in rollouts] == [(0, "grader_fault"), (1, "grader_fault")]


def test_a_discussion_moderated_with_long_comma_spliced_messages_gets_its_untimed_verdict():
    """Messages of 1000 characters cut into hundreds of comma-spliced clauses, shared until the
    step limit, then a decision with one as its rationale: grading them used to overrun the final
    step's clock (`timeout`, out of the statistics); it is the verdict the verifier gives untimed."""
    task = DISCUSSION.generate(3, 5)
    facts = DISCUSSION.facts_of(task)
    spliced = ", ".join([facts.participants[0].name, facts.options[0]] * 200)[:1000]
    *calls, decide = task.hidden.reference
    calls += [ToolCall(name="share", arguments={"message": spliced})] * (task.budget.max_steps - len(calls) - 1)
    calls.append(decide.model_copy(update={"arguments": {**decide.arguments, "rationale": spliced}}))
    # a step clock any tool here meets and no grading of these messages does
    rollout = run_episode(task, Plays(calls), 0, limits=task.budget.model_copy(update={"step_timeout_s": 0.1}))
    assert rollout.termination == Termination.failure, rollout.termination_reason
    untimed = family(task.env_id).outcome_verifier.verify(task, rollout.steps)
    assert rollout.outcome == untimed and not untimed.success


# -- no rate over zero model outcomes ------------------------------------------------------------
def test_an_evaluation_or_a_cell_with_no_model_outcome_has_no_rate_and_says_why(tmp_path):
    tasks = generate_tasks("inventory", 3, seed=4)
    rollouts = [run_episode(task, Raises(), n) for n, task in enumerate(tasks)]
    assert {r.termination for r in rollouts} == {Termination.policy_error}
    report = summarize(rollouts, tasks)
    assert (report["success_rate"], report["model_outcomes"], report["excluded"], report["excluded_by_class"],
            report["by_level"]) == (None, 0, 3, {"policy_error": 3}, {})
    with Warehouse(tmp_path) as wh:
        wh.land(tasks=tasks, rollouts=rollouts).checked()
        cells = wh.sql("select success_rate, sum(model_outcomes) as counted, sum(excluded) as excluded, "
                       "sum(policy_errors) as policy_errors, sum(grader_faults) as grader_faults "
                       "from success_by_cell group by all").to_pylist()
    assert cells and all(c["success_rate"] is None and c["counted"] == 0 and c["grader_faults"] == 0 for c in cells)
    assert sum(c["excluded"] for c in cells) == 3 and sum(c["policy_errors"] for c in cells) == 3
