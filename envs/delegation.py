"""Delegation: a main agent hands whole sub-tasks to frozen sub-agents, several in parallel within
a stage, with a barrier between stages (the orchestrator setup of Kimi K2.5's PARL).

Any family can enable it: keep `new_delegations()` in the env state, hold the sub-tasks (full
`TaskSpec`s of any registered family, hidden fields and all, in the hidden state) and call
`delegate_stage(env, state, subtasks)` from a tool. Each sub-task is then played from a clean
state in its own env, through the same runtime stack (wrappers, budgets, permission guard) and
with its own family's outcome verifier, by a frozen sub-agent: by default that family's scripted
policy at `SUBAGENT_MISTAKE_RATE`, seeded from (task, sub-task, attempt), so a replay of the main
agent's calls replays its sub-agents' episodes exactly. What the main agent sees of an episode is
what a harness would: its sub-agent's last call, how it ended and the verdict of its family's
verifier; its hidden reasons stay in the state.

The runtime (tasks/rollout/episodes.py) turns the sub-episodes into sub-rollouts linked to the main
rollout (`Rollout.parent_rollout_id`) and records the stages (`envs.records.Delegation`:
critical and serial steps)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gymfoundry.envs.family import family
from gymfoundry.envs.timestep import EpisodeEnd
from gymfoundry.envs.records import Delegation, DelegationStage, Rollout, Step, TaskSpec, check_task, content_hash
from gymfoundry.envs.wrappers import standard_stack

SUBAGENT_MISTAKE_RATE = 0.2
MAX_PARALLEL = 6   # sub-agents in one stage
MAX_ATTEMPTS = 3   # delegations of one sub-task


@dataclass
class SubEpisode:
    """One sub-agent's episode, as the runtime needs it to make a sub-rollout."""

    subtask_id: str
    task: TaskSpec
    policy_id: str
    policy_version: str
    seed: int
    attempt: int
    steps: list[Step] = field(default_factory=list)
    end: EpisodeEnd = field(default_factory=EpisodeEnd)  # how it ended: the last time step's
    policy_error: str | None = None
    env_error: str | None = None
    env_info: dict[str, Any] = field(default_factory=dict)

    @property
    def terminated(self) -> bool:
        return self.end.terminated

    @property
    def truncated(self) -> bool:
        return self.end.truncated

    @property
    def outcome(self) -> dict[str, Any] | None:
        return self.end.outcome

    @property
    def success(self) -> bool:
        return bool(self.terminated and self.outcome and self.outcome.get("success"))

    def summary(self) -> dict[str, Any]:
        """What the main agent sees: how the episode ended, the sub-agent's last tool, the verdict."""
        last = next((s.tool_call for s in reversed(self.steps) if s.tool_call is not None), None)
        ended = ("finished" if self.terminated else "out of budget" if self.truncated
                 else "sub-agent failed" if self.policy_error else "environment failed")
        return {"subtask": self.subtask_id, "attempt": self.attempt, "ended": ended, "steps": len(self.steps),
                "policy": f"{self.policy_id}@{self.policy_version}",
                "last_call": None if last is None else last.name,  # its arguments may hold the sub-task's secrets
                "verdict": "succeeded" if self.success else "failed"}


def new_delegations() -> dict[str, Any]:
    """The part of an env state that delegation keeps: attempts per sub-task and every stage's
    sub-episode summaries (with the hidden verdicts)."""
    return {"attempts": {}, "stages": []}


SubAgentFactory = Callable[[TaskSpec, int], Any]


def is_default(summary: dict[str, Any], task: TaskSpec) -> bool:
    """Whether a stage result's sub-agent was the default frozen policy (so a replay replays it)."""
    policy = scripted_subagent(task, 0)
    return summary["policy"] == f"{policy.policy_id}@{policy.version}"


def scripted_subagent(task: TaskSpec, seed: int) -> Any:
    """The frozen default: the sub-task family's scripted policy at SUBAGENT_MISTAKE_RATE."""
    policy_class = family(task.env_id).scripted_policy
    if policy_class is None:
        raise ValueError(f"{task.env_id} registers no scripted policy to delegate to")
    return policy_class(mistake_rate=SUBAGENT_MISTAKE_RATE, seed=seed)


def subagent_seed(key: str, subtask: TaskSpec, attempt: int) -> int:
    """The seed of a sub-agent's episode: the delegating task's key, the sub-task itself and the attempt."""
    return int(content_hash(["subagent", key, subtask.task_id, attempt], 8), 16)


def play_subtask(subtask_id: str, task: TaskSpec, policy: Any, seed: int, attempt: int) -> SubEpisode:
    """One sub-agent episode from a clean state in its family's env, verified by that family."""
    episode = SubEpisode(subtask_id=subtask_id, task=task, policy_id=policy.policy_id,
                         policy_version=policy.version, seed=seed, attempt=attempt)
    env = standard_stack(family(task.env_id).make())
    try:
        policy.reset(seed)
        ts = env.reset(task=task)
        while not ts.done:
            try:
                action = policy.act(ts.observation)
            except Exception as exc:
                episode.policy_error = f"sub-agent raised {type(exc).__name__}: {exc}"
                break
            ts = env.step(action, policy_version=policy.version)
        episode.end = ts.end
        episode.env_info = env.unwrapped.runtime_info()
    except Exception as exc:  # the sub-task's env failed: the sub-agent's episode says so, the main one goes on
        episode.env_error = f"{type(exc).__name__}: {exc}"
    finally:
        episode.steps = list(getattr(env, "steps", []))
        env.close()
    return episode


def delegate_stage(key: str, delegations: dict[str, Any], subtasks: dict[str, TaskSpec | dict],
                   ids: list[str], subagent: SubAgentFactory | None = None) -> list[SubEpisode]:
    """Play the sub-tasks `ids` in parallel (one stage; returns once all have ended) and record the
    stage in `delegations`; `key` seeds the sub-agents (with each sub-task and attempt). Raises ValueError for an unknown, repeated or exhausted sub-task id."""
    if not ids:
        raise ValueError("name at least one sub-task")
    if len(ids) > MAX_PARALLEL:
        raise ValueError(f"at most {MAX_PARALLEL} sub-agents per stage, not {len(ids)}")
    unknown = [i for i in ids if i not in subtasks]
    if unknown:
        raise ValueError(f"unknown sub-task(s) {unknown}; the sub-tasks are {sorted(subtasks)}")
    if len(set(ids)) != len(ids):
        raise ValueError("a sub-task is named twice in one stage")
    spent = [i for i in ids if delegations["attempts"].get(i, 0) >= MAX_ATTEMPTS]
    if spent:
        raise ValueError(f"sub-task(s) {spent} were already delegated {MAX_ATTEMPTS} times")
    subagent = subagent or scripted_subagent
    plans = []
    for sub_id in ids:
        attempt = delegations["attempts"].get(sub_id, 0)
        task = check_task(subtasks[sub_id])
        seed = subagent_seed(key, task, attempt)
        plans.append((sub_id, task, subagent(task, seed), seed, attempt))
    with ThreadPoolExecutor(max_workers=len(plans), thread_name_prefix="subagent") as pool:
        episodes = list(pool.map(lambda p: play_subtask(*p), plans))
    for sub_id in ids:
        delegations["attempts"][sub_id] = delegations["attempts"].get(sub_id, 0) + 1
    delegations["stages"].append([{**e.summary(), "reasons": list((e.outcome or {}).get("reasons", []))}
                                  for e in episodes])
    return episodes


def parallelism_gain(rollout: Rollout) -> float:
    """1 - critical / serial steps of a successful delegating episode, counting only useful work:
    the main agent's steps and each sub-task's first successful sub-agent episode. A failed or
    repeated sub-agent adds nothing, so the gain grows with how much of the required work ran in
    parallel, never with the number of sub-agents (spawning more is not rewarded). 0 for an
    episode that failed or delegated nothing."""
    if not rollout.success or rollout.delegation is None:
        return 0.0
    done: set[str] = set()
    useful: list[DelegationStage] = []
    by_id = {r.rollout_id: r for r in rollout.subrollouts}
    for stage in rollout.delegation.stages:
        steps = []
        for rid in stage.sub_rollout_ids:
            sub = by_id.get(rid)
            if sub is not None and sub.success and sub.task_id not in done:
                done.add(sub.task_id)
                steps.append(sub.cost.steps)
        useful.append(DelegationStage(main_steps=stage.main_steps, sub_steps=steps))
    layout = Delegation(stages=useful)
    return 0.0 if layout.serial_steps == 0 else 1.0 - layout.critical_steps / layout.serial_steps
