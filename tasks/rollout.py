"""Stage: collect rollouts of a policy in the real envs, batched (one call per batch of
tasks, not per step). Nothing a policy or env throws loses the episode: it is recorded
with its failure class."""

from __future__ import annotations

import time
import traceback

from envs.faults import FaultInjection
from envs.records import Cost, FaultConfig, OutcomeReport, Rollout, TaskSpec
from envs.registry import make, spec, verifier_for
from envs.wrappers import standard_stack
from tasks.classify import classify
from tasks.policies import Policy, PolicyOutput


def rollout_seed(base_seed: int, task: TaskSpec, sample: int) -> int:
    return (int(task.task_id[2:10], 16) ^ (base_seed * 1000003 + sample)) & 0x7FFFFFFF


def run_episode(task: TaskSpec, policy: Policy, seed: int, attempt: int = 0,
                faults: FaultConfig | None = None) -> Rollout:
    """`faults` injects environment faults (envs/faults.py), drawn anew for each attempt."""
    base = make(task.env_id)
    if faults is not None and faults.rate > 0:
        base = FaultInjection(base, faults, seed=seed * 1009 + attempt)
    env = standard_stack(base)
    verifier = verifier_for(task.env_id)
    started = time.perf_counter()
    policy_error = env_error = verifier_error = None
    outcome: OutcomeReport | None = None
    ts = None
    try:
        policy.reset(seed)
        ts = env.reset(task=task)
        while not ts.done:
            try:
                out = policy.act(ts.observation)
            except Exception as exc:
                policy_error = f"policy raised {type(exc).__name__}: {exc}"
                break
            if isinstance(out, PolicyOutput):
                ts = env.step(out.text, thought=out.thought, token_ids=out.token_ids,
                              logprobs=out.logprobs, policy_version=policy.version)
            else:
                ts = env.step(out, policy_version=policy.version)
    except Exception as exc:
        env_error = f"environment raised {type(exc).__name__}: {exc} ({_where(exc)})"
    steps = list(getattr(env, "steps", []))
    env_info = env.unwrapped.runtime_info()
    if ts is not None and "verifier_error" in ts.info:
        verifier_error = f"verifier raised {ts.info['verifier_error']}"
    elif ts is not None and "outcome" in ts.info:  # the env asked the verifier at the end
        outcome = OutcomeReport.model_validate(ts.info["outcome"])
    elif verifier is not None and steps:
        try:
            outcome = verifier.verify(task, steps, env.state())
        except Exception as exc:
            verifier_error = f"verifier raised {type(exc).__name__}: {exc}"
    env.close()
    termination, reason = classify(
        steps, terminated=bool(ts and ts.terminated), truncated=bool(ts and ts.truncated),
        end_info=ts.info if ts else {}, outcome=outcome, policy_error=policy_error,
        env_error=env_error, verifier_error=verifier_error)
    cost = Cost(steps=len(steps), tool_calls=sum(s.tool_call is not None for s in steps),
                tokens=sum(len(s.token_ids or []) for s in steps),
                wall_time_s=round(time.perf_counter() - started, 6))
    return Rollout(task_id=task.task_id, family=task.family, env_id=task.env_id,
                   env_version=spec(task.env_id).version, policy_id=policy.policy_id,
                   policy_version=policy.version, seed=seed, attempt=attempt, steps=steps,
                   termination=termination, termination_reason=reason[:2000], outcome=outcome, cost=cost,
                   env_info=env_info)


def collect_rollouts(tasks: list[TaskSpec], policy: Policy, samples_per_task: int, seed: int) -> list[Rollout]:
    return [run_episode(task, policy, rollout_seed(seed, task, k)) for task in tasks for k in range(samples_per_task)]


def _where(exc: Exception) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
