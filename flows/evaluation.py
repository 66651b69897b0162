"""The evaluation flow: run a model as a policy on held-out tasks of a family, land its
rollouts (with rule-layer step scores) and report its success rate."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from gymfoundry.envs.records import PolicySpec, Rollout, Sampling, TaskSpec
from gymfoundry.flows.config import EvaluationConfig, flow_parameters
from gymfoundry.tasks.ops.evaluate import evaluate_policy, expected_rollout_id, heldout_tasks, summarize
from gymfoundry.tasks.stages.land import land_or_spool
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.stages.score import score_rollouts
from gymfoundry.warehouse import Warehouse


@task(name="evaluate-rollouts", task_run_name="evaluate-rollouts", cache_policy=NO_CACHE)
def run_heldout(tasks: list[TaskSpec], family: str, policy: PolicySpec, seed: int,
                samples_per_task: int, data_dir: str | None = None) -> list[Rollout]:
    """Episodes of every task, up to the spec's `max_concurrency` in flight; with `data_dir`,
    those already landed for this very policy version and seed (same rollout ids) are read back
    instead of played again."""
    agent = make_policy(policy, family)
    landed = landed_rollouts(data_dir, tasks, agent, seed, samples_per_task) if data_dir else {}
    todo = [t for t in tasks if any(expected_rollout_id(t, agent, seed, k) not in landed
                                    for k in range(samples_per_task))]
    played = {r.rollout_id: r for r in evaluate_policy(todo, agent, seed, samples_per_task)}
    both = {**landed, **played}
    return [both[expected_rollout_id(t, agent, seed, k)] for t in tasks for k in range(samples_per_task)]


def landed_rollouts(data_dir: str, tasks: list[TaskSpec], agent, seed: int, samples_per_task: int) -> dict[str, Rollout]:
    ids = [expected_rollout_id(t, agent, seed, k) for t in tasks for k in range(samples_per_task)]
    try:
        with Warehouse(data_dir, read_only=True) as wh:
            return {r.rollout_id: r for r in wh.load_rollouts("rollout_id in (select unnest(?))", [ids])}
    except FileNotFoundError:
        return {}


@task(name="land-evaluation", task_run_name="land-evaluation", cache_policy=NO_CACHE)
def land_evaluation(data_dir: str, rollouts: list[Rollout], tasks: list[TaskSpec]) -> dict[str, int]:
    """One batch, as the factory lands one: the tasks (already there for held-out tasks; GRPO's training
    tasks may be new), the rollouts with their verdicts in `outcomes`, and their scores; waited for and
    spooled like every writer's (`gymfoundry.tasks.stages.land.land_or_spool`): {} when spooled."""
    scores = score_rollouts(rollouts, tasks)
    landing = land_or_spool(data_dir, {"tasks": tasks, "rollouts": rollouts, "scores": scores},
                            {"rollout_outcomes": True})
    return landing.checked()


def evaluation_spec(policy: PolicySpec | str, model: str | None, max_new_tokens: int | None,
                    temperature: float | None, policy_kwargs: dict[str, Any] | None) -> PolicySpec:
    """The spec `evaluate` plays: `policy` itself, or the one its kind name and the flow's older
    keywords name (`policy_kwargs`: the scripted `mistake_rate`, an endpoint's `base_url`, and the
    policy class's own keywords)."""
    if isinstance(policy, PolicySpec):
        return policy
    if isinstance(policy, dict):  # a deployment's parameters arrive as JSON
        return PolicySpec.model_validate(policy)
    options = dict(policy_kwargs or {})
    if policy == "scripted":
        return PolicySpec(kind="scripted", mistake_rate=options.pop("mistake_rate", None), options=options)
    sampling = Sampling(max_tokens=max_new_tokens, temperature=temperature) if policy in ("hf", "openai") else Sampling()
    return PolicySpec(kind=policy, model=model, base_url=options.pop("base_url", None), sampling=sampling,
                      options=options)


@flow(name="evaluate")
@flow_parameters(EvaluationConfig)
def evaluate(**params: Any) -> dict[str, Any]:
    """Success rate of a policy on the family's held-out tasks: a `PolicySpec` (its sampling
    and `max_concurrency` included), or a kind name with `model` (a local checkpoint directory
    for `policy="hf"`; a model name on an OpenAI-compatible endpoint for `policy="openai"`),
    `max_new_tokens`, `temperature` and `policy_kwargs` (see `evaluation_spec`). `concurrency`
    replaces the spec's `max_concurrency` (episodes in flight; an hf checkpoint's decoding batch).
    The parameters are `flows.config.EvaluationConfig`'s."""
    config = EvaluationConfig(**params)
    model, family, data_dir, policy = config.model, config.family, config.data_dir, config.policy
    splits, limit, levels, seed, samples_per_task = (config.splits, config.limit, config.levels, config.seed,
                                                     config.samples_per_task)
    max_new_tokens, temperature, policy_kwargs = config.max_new_tokens, config.temperature, config.policy_kwargs
    land, reuse, concurrency = config.land, config.reuse, config.concurrency
    logger = get_run_logger()
    tasks = heldout_tasks(data_dir, family, tuple(splits), limit, tuple(levels) if levels else None)
    if not tasks:
        raise ValueError(f"no held-out tasks of {family!r} in {data_dir}; run the factory first")
    spec = evaluation_spec(policy, model, max_new_tokens, temperature, policy_kwargs)
    if concurrency is not None:
        spec = spec.model_copy(update={"max_concurrency": concurrency})
    rollouts = run_heldout(tasks, family, spec, seed, samples_per_task, data_dir if reuse else None)
    report = summarize(rollouts, tasks)
    report.update(model=spec.model, family=family, policy=spec.model_dump(mode="json"), policy_id=rollouts[0].policy_id,
                  policy_version=rollouts[0].policy_version)
    if land:
        report["landed"] = land_evaluation(data_dir, rollouts, tasks)
    logger.info("%s on %d held-out %s tasks: success %s", spec.model or spec.kind, len(tasks), family,
                _percent(report["success_rate"]))
    create_markdown_artifact(key="evaluation-report", markdown=render_report(report),
                             description="Held-out evaluation of a model")
    return report


def _percent(rate: float | None) -> str:
    """A rate as a percentage; "n/a" for one over no model outcome (never 0.0%)."""
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def render_report(report: dict[str, Any]) -> str:
    excluded = ", ".join(f"{k}={v}" for k, v in report.get("excluded_by_class", {}).items()) or "none"
    lines = [f"# Evaluation of `{report['model'] or report['policy_id']}` on {report['family']}", "",
             f"Success rate: **{_percent(report['success_rate'])}** over {report['episodes'] - report['excluded']} "
             f"model outcomes ({report['excluded']} of {report['episodes']} episodes excluded, by class: {excluded})",
             "",
             "| level | success |", "|---|---|"]
    lines += [f"| {level} | {100 * rate:.1f}% |" for level, rate in report["by_level"].items()]
    for family, by_k in report.get("pass_at_k", {}).items():
        lines += ["", f"pass@k and pass^k on {family} (mean over the tasks with at least k model outcomes)", "",
                  "| k | pass@k | pass^k | tasks |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['pass@k']:.4f} | {v['pass^k']:.4f} | {v['tasks']} |" for k, v in by_k.items()]
    lines += ["", "Terminations: " + ", ".join(f"{k}={v}" for k, v in report["terminations"].items())]
    return "\n".join(lines)
