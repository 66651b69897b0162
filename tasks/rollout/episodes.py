"""Stage: collect rollouts of a policy in the real envs, batched (one call per batch of
tasks, not per step). Nothing a policy or env throws loses the episode: it is recorded
with its failure class."""

from __future__ import annotations

import time
import traceback
from collections.abc import Generator
from contextlib import nullcontext
from functools import partial
from typing import Any

from gymfoundry.envs.errors import EnvFault, InvalidTask
from gymfoundry.envs.faults import FaultInjection
from gymfoundry.envs.records import (Budget, Delegation, DelegationStage, FaultConfig, OutcomeReport, PolicySpec, Rollout,
                          TaskSpec, content_hash)
from gymfoundry.envs.family import Family, family
from gymfoundry.envs.wrappers import ENV_FAULT, GRADER_FAULT, act, grading, standard_stack
from gymfoundry.envs.timestep import EpisodeEnd
from gymfoundry.tasks.rollout.build import build_rollout
from gymfoundry.tasks.rollout.classify import classify
from gymfoundry.tasks.rollout.collector import frozen_before
from gymfoundry.tasks.rollout.scheduler import play_watched
from gymfoundry.tasks.policies.base import Policy, PolicyOutput
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.envs.verifier import ReplayVerifier
from gymfoundry.verifiers.endpoint import ContextLengthExceeded, EndpointError, ModelOutputRefused


# Attributes by which a policy's episodes differ beyond its id and version (a scripted policy's
# version carries its mistake rate; a checkpoint's version is its weights, not how it samples),
# read from a policy built without a PolicySpec. A policy built from one (`policy.spec`) takes its
# knobs from the spec's sampling instead (PolicySpec.rollout_params), plus its prompt's hash.
POLICY_KNOBS = ("temperature", "max_new_tokens", "max_thought_tokens", "system_prompt")


CLOCK_FAULTS = (ENV_FAULT, GRADER_FAULT)  # episode ends by a clock that was not the agent's


def rollout_seed(base_seed: int, task: TaskSpec, sample: int) -> int:
    return (int(task.task_id[2:10], 16) ^ (base_seed * 1000003 + sample)) & 0x7FFFFFFF


def policy_params(policy: Policy) -> dict | None:
    """The policy's knobs that are part of its rollouts' identity (the prompt by its hash)."""
    spec = getattr(policy, "spec", None)
    if isinstance(spec, PolicySpec):
        params = spec.rollout_params()
        if isinstance(getattr(policy, "system_prompt", None), str):
            params["system_prompt"] = content_hash(policy.system_prompt)
        return params or None
    params = {k: getattr(policy, k) for k in POLICY_KNOBS
              if isinstance(getattr(policy, k, None), (bool, int, float, str))}
    if "system_prompt" in params:
        params["system_prompt"] = content_hash(params["system_prompt"])
    return params or None


def run_episode(task: TaskSpec, policy: Policy, seed: int, attempt: int = 0,
                faults: FaultConfig | None = None, limits: Budget | None = None,
                subagent: PolicySpec | None = None) -> Rollout:
    """One attempt from a clean state: a fresh env, the policy reset with `seed`. `faults`
    injects environment faults (envs/faults.py), drawn anew for each attempt; an attempt they
    never hit is exactly the fault-free episode. `limits` replaces the task's budget in the
    runtime (an evaluation's cap); the task itself is never edited (reset refuses that).
    `subagent` names the frozen policy a delegating env (envs/delegation.py) hands its sub-tasks
    to; other envs ignore it. The episode is `episode(...)` played alone (`play_watched`)."""
    return play_watched([lambda: episode(task, policy, seed, attempt, faults, limits, subagent)])[0]


def episode(task: TaskSpec, policy: Policy, seed: int, attempt: int = 0, faults: FaultConfig | None = None,
            limits: Budget | None = None, subagent: PolicySpec | None = None) -> Generator[tuple, Any, Rollout]:
    """`run_episode` as a play of tasks.rollout.scheduler.play_watched (which plays a batch of them in one
    thread): it yields the episode's stack and loop once, to be run watched (a step, or grading,
    over its time limit is abandoned at its deadline, and the episode ends there as the stack's
    TimeLimit says: an environment or grader fault), and returns the rollout. The verdict and the
    live potentials run on the grader's clock, never the agent's (`grading`)."""
    faults = faults if faults is not None and faults.rate > 0 else None
    fam = family(task.env_id)  # resolved once for the episode
    base = fam.make(**delegation_options(fam, subagent))
    if faults is not None:
        base = FaultInjection(base, faults, seed=seed * 1009 + attempt)
    env = standard_stack(base, limits=limits)
    started = time.perf_counter()
    try:  # the env (a coding sandbox) is closed whatever is raised
        played = _Played()
        finished, ts = yield env, lambda: _loop(env, task, policy, seed, played, fam)
        if not finished:
            played.ts = ts
        ts, policy_error, env_error, env_bug, inference = (played.ts, played.policy_error, played.env_error,
                                                           played.env_bug, played.inference)
        steps = list(getattr(env, "steps", []))
        env_info = env.unwrapped.runtime_info()
        # an episode a clock cut off has no verdict: the fault decides its class
        outcome, verifier_error = played.verdict if finished else (None, None)
        sub_episodes = list(getattr(env.unwrapped, "sub_episodes", None) or [])
    finally:
        env.close()
    termination, reason = classify(
        steps, ts.end if ts else EpisodeEnd(), outcome=outcome, policy_error=policy_error,
        env_error=env_error, verifier_error=verifier_error, env_bug=env_bug, inference_fault=inference.get("fault"),
        context_exceeded=inference.get("context"), model_refused=inference.get("refused"))
    rollout = build_rollout(task, steps, termination, reason, policy_id=policy.policy_id,
                            policy_version=policy.version, seed=seed, started=started, env_version=fam.env_version,
                            attempt=attempt, outcome=outcome, env_info=env_info, policy_params=policy_params(policy),
                            faults=faults, limits=limits)
    if sub_episodes:
        rollout = with_delegation(rollout, sub_episodes)
    if played.progress is not None:
        played.progress.keep(rollout)
    return rollout


def delegation_options(fam: Family, subagent: PolicySpec | None) -> dict:
    """The env keyword that makes `subagent` play a delegating env's sub-tasks ({} for other envs)."""
    import inspect

    if subagent is None:
        return {}
    entry = fam.env
    if not isinstance(entry, type) or "subagent" not in inspect.signature(entry).parameters:
        return {}
    def frozen(sub_task: TaskSpec, seed: int) -> Policy:
        return make_policy(subagent, sub_task.family)

    return {"subagent": frozen}


def with_delegation(rollout: Rollout, stages: list[list]) -> Rollout:
    """The rollout with its sub-agents' episodes (envs.delegation.SubEpisode, one list per stage,
    in the order of the main agent's accepted `delegate` calls) as sub-rollouts linked to it, and
    its `Delegation`: per stage, the main agent's steps up to and including that call."""
    delegated = [s.index for s in rollout.steps
                 if s.tool_call is not None and s.tool_call.name == "delegate" and s.error is None]
    # A delegate call the time limit abandoned may still finish its stage after the episode ended:
    # that stage is no accepted call's, and is not the episode's (zip stops at the accepted calls).
    subs, layout, start = [], [], 0
    for n, (index, episodes) in enumerate(zip(delegated, stages)):
        stage_subs = [sub_rollout(rollout.rollout_id, n, k, e) for k, e in enumerate(episodes)]
        layout.append(DelegationStage(main_steps=index + 1 - start, sub_steps=[r.cost.steps for r in stage_subs],
                                      sub_rollout_ids=[r.rollout_id for r in stage_subs]))
        subs += stage_subs
        start = index + 1
    if start < len(rollout.steps):
        layout.append(DelegationStage(main_steps=len(rollout.steps) - start))
    return rollout.model_copy(update={"delegation": Delegation(stages=layout), "subrollouts": subs})


def sub_rollout(parent_id: str, stage: int, index: int, episode) -> Rollout:
    """One sub-agent's episode as a rollout of its own family, classified like any other."""
    task = episode.task
    outcome = OutcomeReport.model_validate(episode.outcome) if episode.outcome else None
    termination, reason = classify(episode.steps, episode.end, outcome=outcome, policy_error=episode.policy_error,
                                   env_error=episode.env_error)
    return build_rollout(task, episode.steps, termination, reason, policy_id=episode.policy_id,
                         policy_version=episode.policy_version, seed=episode.seed, attempt=episode.attempt,
                         outcome=outcome, env_info=episode.env_info, parent_rollout_id=parent_id, stage=stage, stage_index=index)


class _Played:
    """What an episode's loop has reached: the last time step, policy error, env fault, env bug,
    each None or the reason, and `inference`, which maps "fault" (the policy's endpoint failed: an
    EndpointError, raised by its HTTP layer), "context" (the endpoint refused a context too long) or
    "refused" (it refused what the model wrote: ModelOutputRefused) to the reason (read once the
    loop ended or overran); and the verifier's live record of its progress potentials
    (envs.verifier.LiveProgress); `verdict`: (outcome, verifier error) once the loop ended."""

    def __init__(self) -> None:
        self.ts = self.policy_error = self.env_error = self.env_bug = None
        self.inference: dict[str, str] = {}
        self.progress = None
        self.verdict: tuple[OutcomeReport | None, str | None] = (None, None)


def _loop(env, task: TaskSpec, policy: Policy, seed: int, played: _Played, fam: Family) -> None:
    try:
        policy.reset(seed)
    except Exception as exc:
        played.policy_error = f"policy reset raised {type(exc).__name__}: {exc}"
    try:
        ts = played.ts = env.reset(task=task)
        verifier = fam.outcome_verifier
        progress = played.progress = verifier.live(env.unwrapped) if isinstance(verifier, ReplayVerifier) else None
        with progress if progress is not None else nullcontext():
            if progress is None or _observed(env, progress, played):
                _turns(env, policy, played, ts, progress)
    except InvalidTask:
        raise  # the task cannot be run as given: the caller's error, never an episode
    except EnvFault as exc:
        played.env_error = f"environment fault {type(exc).__name__}: {exc} ({_where(exc)})"
    except Exception as exc:  # env code crashed outside every tool's boundary
        played.env_bug = f"environment bug {type(exc).__name__}: {exc} ({_where(exc)})"
    _judge(env, task, played, fam)


def _observed(env, progress, played: _Played) -> bool:
    """Φ of the state now, on the grader's clock; False when that ran past it (the episode ended
    there, a grader fault: `played.ts`)."""
    finished, ended = grading(env, progress.observe)
    if not finished:
        played.ts = ended
    return finished


def _judge(env, task: TaskSpec, played: _Played, fam: Family) -> None:
    """`played.verdict`: the env's own (graded by its stack as the episode ended), or, for an
    episode that ended otherwise, the verifier's, asked now on the grader's clock (past it, the
    episode ends a grader fault: `played.ts`)."""
    ts, steps = played.ts, list(getattr(env, "steps", []))
    end = ts.end if ts is not None else EpisodeEnd()
    if end.clock in CLOCK_FAULTS:
        return  # a clock cut it off: no verdict
    if end.outcome is not None or end.verifier_error is not None or not steps \
            or fam.outcome_verifier is None:
        played.verdict = _outcome(task, ts, steps, env, fam)  # asks no verifier
        return
    finished, value = grading(env, lambda: _outcome(task, ts, steps, env, fam))
    if finished:
        played.verdict = value
    else:
        played.ts = value


def _turns(env, policy: Policy, played: _Played, ts, progress) -> None:
    """The policy's turns until the episode ends; Φ observed after each recorded step."""
    while not ts.done and played.policy_error is None:
        try:
            out = act(env, policy, ts.observation)
        except ContextLengthExceeded as exc:
            played.inference["context"] = f"the model's context is full: {exc}"
            return
        except ModelOutputRefused as exc:
            played.inference["refused"] = str(exc)
            return
        except EndpointError as exc:  # where it happened: the endpoint, whatever it said
            played.inference["fault"] = f"inference endpoint failed: {exc}"
            return
        except Exception as exc:
            played.policy_error = f"policy raised {type(exc).__name__}: {exc}"
            return
        if isinstance(out, PolicyOutput):
            ts = env.step(out.text, thought=out.thought, token_ids=out.token_ids,
                          logprobs=out.logprobs, policy_version=policy.version)
        else:
            ts = env.step(out, policy_version=policy.version)
        played.ts = ts
        if progress is not None and not _observed(env, progress, played):
            return


def _outcome(task: TaskSpec, ts, steps, env, fam: Family) -> tuple[OutcomeReport | None, str | None]:
    """The verifier's report (the env's own, asked at the end, or asked now), or its error."""
    end = ts.end if ts is not None else EpisodeEnd()
    if end.verifier_error is not None:
        return None, f"verifier raised {end.verifier_error}"
    if end.outcome is not None:
        return OutcomeReport.model_validate(end.outcome), None
    verifier = fam.outcome_verifier
    if verifier is None or not steps:
        return None, None
    try:
        return verifier.verify(task, steps, env.state()), None
    except Exception as exc:
        return None, f"verifier raised {type(exc).__name__}: {exc}"


@frozen_before()  # what exists before is out of the garbage collector's sight while it runs
def collect_rollouts(tasks: list[TaskSpec], policy: Policy, samples_per_task: int, seed: int) -> list[Rollout]:
    """`run_episode` of every (task, sample), one after another, played in one thread (`play_watched`)."""
    return play_watched([partial(episode, task, policy, rollout_seed(seed, task, k))
                         for task in tasks for k in range(samples_per_task)])


def _where(exc: Exception) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
