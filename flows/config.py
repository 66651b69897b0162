"""The typed run configurations: one pydantic model per flow (factory, evaluation, training).

Each model is the one owner of its settings' names, types, allowed values, defaults and
descriptions. The flow's signature is made from it (`flow_parameters`), so the Prefect UI shows a
described form with enums and Prefect validates a deployment's parameters; the CLI's options are
made from it (`add_options`, `from_args`); `prefect.yaml` and `deployments/serve.py` are tested
against it; and the factory stores the whole validated configuration in `runs.params`.

Nothing here imports Prefect, so the CLI can refuse a bad value before anything slow starts."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from gymfoundry.envs.records import FaultConfig, ParallelismReward, PolicySpec, RetryPolicy
from gymfoundry.envs.family import families
from gymfoundry.flows.defaults import DEFAULT_DATA_DIR
from gymfoundry.tasks.ops.evaluate import HELDOUT_SPLITS
from gymfoundry.tasks.stages.isolate import HOLDOUT_FRACTION, check_holdout_fraction

TaskRunner = Literal["threads", "dask", "ray"]
Learnability = Literal["p(1-p)", "1-p", "uniform"]
Method = Literal["sft", "dpo", "grpo"]
ARMS = ("sft", "sft_weighted", "sft_then_grpo")  # the closed loop's training arms (flows.loop)


def known_families() -> list[str]:
    return sorted(fam.name for fam in families())


def checked_families(value: list[str]) -> list[str]:
    known = known_families()
    unknown = [f for f in value if f not in known]
    if unknown:
        raise ValueError(f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; "
                         f"known families: {', '.join(known)}")
    if len(set(value)) != len(value):
        raise ValueError("a family is named twice")
    return value


def _policy(value: Any) -> Any:
    """A plain kind name ("scripted", ...) is the spec it stands for."""
    return PolicySpec(kind=value) if isinstance(value, str) else value


class Config(BaseModel):
    # an error never repeats the value it refuses (a URL's password); `explain` names the field
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    def params(self) -> dict[str, Any]:
        """The fields as the flow's keyword arguments (nested records stay records)."""
        return {name: getattr(self, name) for name in type(self).model_fields}


class FactoryConfig(Config):
    """One factory run: generate → validate → isolate → rollout → score → land → assemble."""

    families: list[str] = Field(["inventory"], min_length=1, description="task families to run",
                                json_schema_extra={"cli": "--families"})
    tasks_per_family: int = Field(50, ge=1, description="tasks generated per family", json_schema_extra={"cli": "--tasks"})
    seed: int = Field(0, description="seed of task generation and of the episodes", json_schema_extra={"cli": "--seed"})
    policy: PolicySpec | str = Field(default_factory=PolicySpec,
                               description="the policy that collects: a PolicySpec (kind scripted, hf, openai or a "
                                           "registered kind; model, endpoint, sampling, max_concurrency)")
    mistake_rate: float = Field(0.25, ge=0, le=1, description="the scripted policy's mistake rate (when its spec "
                                                               "sets none)", json_schema_extra={"cli": "--mistake-rate"})
    samples_per_task: int = Field(2, ge=1, description="rollouts per task", json_schema_extra={"cli": "--samples"})
    batch_size: int | None = Field(None, ge=1, description="tasks per rollout batch (one Prefect task run each); "
                                   "none: chosen from the work (two batches per worker of the task runner, at most "
                                   "500 tasks each)", json_schema_extra={"cli": "--batch-size"})
    data_dir: str = Field(DEFAULT_DATA_DIR, min_length=1, description="the warehouse directory",
                          json_schema_extra={"cli": "--data-dir"})
    task_runner: TaskRunner = Field("threads", description="where rollout batches run: threads (one machine), "
                                                           "dask or ray (needs the extra)",
                                    json_schema_extra={"cli": "--task-runner"})
    cluster_address: str | None = Field(None, description="with task_runner dask or ray: the address of an existing "
                                        "cluster (tcp://host:8786, ray://host:10001); none: a local cluster",
                                        json_schema_extra={"cli": "--cluster-address"})
    retry: RetryPolicy | None = Field(default_factory=RetryPolicy, description="which episode classes are retried, how "
                                                                        "often, and what happens when retries run out")
    faults: FaultConfig | None = Field(None, description="environment faults to inject (tests of the retry policy)")
    holdout_fraction: float = Field(HOLDOUT_FRACTION, description="share of each family's template groups locked "
                                    "in the holdout, in [0, 1]", json_schema_extra={"cli": "--holdout-fraction"})
    learnability: Learnability = Field("p(1-p)", description="curriculum weight of a family × level cell from its "
                                       "success rate p", json_schema_extra={"cli": "--learnability"})
    min_margin: float = Field(0.5, ge=0, description="DPO trajectory pairs: minimum value margin",
                              json_schema_extra={"cli": "--min-margin"})
    subagent: PolicySpec | None = Field(
        None, description="the frozen policy that plays delegated sub-tasks (delegating families such as "
                          "orchestrator); none: each sub-task family's scripted policy")
    parallelism_reward: ParallelismReward | None = Field(
        None, description="offer GRPO an auxiliary reward for parallel delegation (weight, anneal_steps), stored "
                          "with the GRPO dataset; none by default")
    train_after: Method | None = Field(None, description="then train on this run's dataset of that kind (a subflow of factory-then-train; the factory flow alone refuses it)",
                                       json_schema_extra={"cli": "--train-after"})
    train_hyperparameters: dict[str, Any] | None = Field(None, description="hyperparameters of train_after")
    audit_episodes: int = Field(1, ge=1, le=20, description="tasks per level of a family's gameability audit, run "
                                "before assembly where its current versions have none",
                                json_schema_extra={"cli": "--audit-episodes"})
    audit_override: str | None = Field(None, min_length=1, description="why to assemble datasets from a family whose "
                                       "gameability audit failed (recorded with the datasets); none: refuse",
                                       json_schema_extra={"cli": "--audit-override"})

    @field_validator("families")
    @classmethod
    def _check_families(cls, v: list[str]) -> list[str]:
        return checked_families(v)

    @field_validator("policy", mode="before")
    @classmethod
    def _check_policy(cls, v: Any) -> Any:
        return _policy(v)

    @field_validator("holdout_fraction")
    @classmethod
    def _check_fraction(cls, v: float) -> float:
        check_holdout_fraction(None, [], v)  # the rule's owner (the lock is checked when the run starts)
        return v

    @field_validator("cluster_address")
    @classmethod
    def _check_address(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v and info.data.get("task_runner") == "threads":
            raise ValueError("a cluster address needs the task runner dask or ray")
        return v

    @field_validator("retry", mode="before")
    @classmethod
    def _default_retry(cls, v: Any) -> Any:
        return RetryPolicy() if v is None else v

    def collecting_policy(self) -> PolicySpec:
        """The spec the rollouts use: a scripted spec without a mistake rate takes `mistake_rate`."""
        if self.policy.kind == "scripted" and self.policy.mistake_rate is None:
            return self.policy.model_copy(update={"mistake_rate": self.mistake_rate})
        return self.policy


class EvaluationConfig(Config):
    """Held-out evaluation of a policy on one family."""

    model: str | None = Field(None, description="with a kind name: the checkpoint dir (hf) or the endpoint's model")
    family: str = Field("inventory", description="the family whose held-out tasks are played",
                        json_schema_extra={"cli": "--family"})
    data_dir: str = Field(DEFAULT_DATA_DIR, min_length=1, description="the warehouse directory",
                          json_schema_extra={"cli": "--data-dir"})
    policy: PolicySpec | str = Field("hf", description="a PolicySpec, or a kind name with `model`")
    splits: list[Literal["test", "val"]] = Field(default_factory=lambda: list(HELDOUT_SPLITS), min_length=1,
                                                 description="held-out splits played")
    limit: int | None = Field(40, ge=1, description="at most this many tasks", json_schema_extra={"cli": "--limit"})
    levels: list[int] | None = Field(None, description="only these difficulty levels")
    seed: int = Field(0, description="the episodes' seed", json_schema_extra={"cli": "--seed"})
    samples_per_task: int = Field(1, ge=1, description="episodes per task (n); the report gives pass@k and pass^k "
                                  "for k = 1..n", json_schema_extra={"cli": "--samples"})
    max_new_tokens: int = Field(96, ge=1, description="with a kind name: tokens per model turn")
    temperature: float = Field(0.0, ge=0, description="with a kind name: sampling temperature")
    land: bool = Field(True, description="land the episodes and their rule-layer scores")
    policy_kwargs: dict[str, Any] | None = Field(None, description="with a kind name: the policy class's keywords")
    reuse: bool = Field(True, description="read back episodes already landed for this policy version and seed")
    concurrency: int | None = Field(None, ge=1, description="episodes in flight (replaces the spec's max_concurrency)")

    @field_validator("family")
    @classmethod
    def _check_family(cls, v: str) -> str:
        return checked_families([v])[0]


class TrainingConfig(Config):
    """A training run on a factory dataset (TRL)."""

    dataset: str | None = Field(None, description="dataset id under <data_dir>/datasets/ or a Parquet path "
                                "(not for grpo)", json_schema_extra={"cli": "--dataset"})
    method: Method = Field("sft", description="SFT, DPO or step-level GRPO", json_schema_extra={"cli": "--method"})
    base_model: str | None = Field(None, description="a local checkpoint dir; default: build the embedded tiny model",
                                   json_schema_extra={"cli": "--base-model"})
    base_config: dict[str, Any] | None = Field(None, description="without base_model: the embedded default's settings "
                                               "(vocab_size, hidden_size, layers, heads, copy_steps, seed)")
    data_dir: str = Field(DEFAULT_DATA_DIR, min_length=1, description="the warehouse directory",
                          json_schema_extra={"cli": "--data-dir"})
    output_dir: str | None = Field(None, description="where the checkpoint goes (default <data_dir>/checkpoints/<run>)",
                                   json_schema_extra={"cli": "--output-dir"})
    hyperparameters: dict[str, Any] | None = Field(None, description="see tasks.training.train.Hyperparameters")
    evaluate_family: str | None = Field(None, description="evaluate the checkpoint on held-out tasks of this family",
                                        json_schema_extra={"cli": "--evaluate"})
    eval_limit: int | None = Field(40, ge=1, description="held-out tasks evaluated")
    min_rows: int = Field(0, ge=0, description="train only when the dataset has at least this many rows (else the "
                          "run completes without training)", json_schema_extra={"cli": "--min-rows"})
    eval_concurrency: int = Field(1, ge=1, description="held-out episodes decoded in one batch")

    @field_validator("evaluate_family")
    @classmethod
    def _check_family(cls, v: str | None) -> str | None:
        return v if v is None else checked_families([v])[0]


def flow_parameters(model: type[Config]):
    """Give a flow function (written `def flow(**params)`) the model's fields as its parameters:
    names, types with their constraints, defaults, and an `Args:` section of the descriptions
    (which Prefect shows in the deployment form). Apply it under `@flow`."""
    def apply(fn):
        params, annotations, lines = [], {}, []
        for name, field in model.model_fields.items():
            annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
            default = field.get_default(call_default_factory=True)
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                            annotation=annotation))
            annotations[name] = annotation
            lines.append(f"    {name}: {field.description or name}")
        fn.__signature__ = inspect.Signature(params, return_annotation=dict[str, Any])
        fn.__annotations__ = {**annotations, "return": dict[str, Any]}
        fn.__doc__ = inspect.cleandoc(fn.__doc__ or "") + "\n\nArgs:\n" + "\n".join(lines) + "\n"
        return fn
    return apply


# -- the command line ---------------------------------------------------------------------------

def _cli_fields(model: type[Config]):
    for name, field in model.model_fields.items():
        flag = (field.json_schema_extra or {}).get("cli") if isinstance(field.json_schema_extra, dict) else None
        if flag:
            yield name, field, flag


def add_options(parser: argparse.ArgumentParser, model: type[Config]) -> None:
    """An option per field the model marks with a `cli` flag: its type, choices, default and help."""
    for name, field, flag in _cli_fields(model):
        inner = field.annotation
        if get_origin(inner) in (Union, UnionType):  # X | None: the option gives an X
            inner = next(a for a in get_args(inner) if a is not type(None))
        options: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "metavar": flag[2:].upper().replace("-", "_"),
                                   "help": f"{field.description} (default: {field.get_default(call_default_factory=True)})"}
        if get_origin(inner) is list:
            options.update(nargs="+")
            inner = get_args(inner)[0]
        if get_origin(inner) is Literal:
            options["choices"] = list(get_args(inner))
            del options["metavar"]
        elif inner in (int, float):
            options["type"] = inner
        parser.add_argument(flag, **options)


def from_args(model: type[Config], args: argparse.Namespace, values: Callable[[], dict[str, Any]] = dict) -> Config:
    """The model from the options given (the rest take their defaults) and `values()`. Raises
    ValueError with one line naming each invalid option and what it allows."""
    given = {name: getattr(args, name) for name, _, _ in _cli_fields(model) if hasattr(args, name)}
    try:
        return model(**{**given, **values()})
    except ValidationError as exc:
        raise ValueError(explain(exc, model)) from None


def explain(error: ValidationError, model: type[Config]) -> str:
    """One line per invalid field, named as the CLI names it, with what is allowed."""
    flags = {name: flag for name, _, flag in _cli_fields(model)}
    lines = []
    for e in error.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        where = flags.get(field, field)
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "literal_error":
            message = f"{message} (got {e['input']!r})"
        elif e["type"] in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            message = f"{message} (got {e['input']!r})"
        lines.append(f"{where}: {message}")
    return "; ".join(lines)
