"""Isolation: splits by template group, a locked holdout that no dataset includes, no hidden
value in any observation or dataset row (every family present), deduplicated rows, rejections
stored with reasons."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from gymfoundry.envs.records import DATASET_ROWS, Split, TaskSpec
from gymfoundry.envs.family import families
from gymfoundry.tasks.stages.assemble import assemble_datasets
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.isolate import (LeakError, assert_no_leaks_in_rows, assign_split, find_leaks, isolate_tasks,
                           landed_splits, row_texts)
from gymfoundry.tasks.stages.land import land_batch
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import collect_rollouts
from gymfoundry.tasks.stages.score import score_rollouts
from gymfoundry.tasks.stages.validate import validate_tasks
from gymfoundry.warehouse import Warehouse
from tests.audits import audited

FAMILIES = [fam.name for fam in families() if fam.scripted_policy]
TASKS = {"inventory": 20}  # other families are slower (sandboxes): a few tasks each
HOLDOUT = 0.25


pytestmark = pytest.mark.integration  # every family's stages end to end, generate to datasets


def build_family(data_dir, family: str) -> None:
    generated = generate_tasks(family, TASKS.get(family, 4), seed=11)
    valid, invalid = validate_tasks(generated)
    tasks, rejected = isolate_tasks(valid + valid[:2], landed_splits(data_dir), HOLDOUT)  # two duplicates
    rollouts = collect_rollouts(tasks, make_policy("scripted", family, mistake_rate=0.3), 2, seed=11)
    land_batch(str(data_dir), tasks, invalid + rejected, rollouts, score_rollouts(rollouts, tasks))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("isolation")
    for family in FAMILIES:
        build_family(data_dir, family)
    audited(data_dir, FAMILIES)
    return data_dir, assemble_datasets(data_dir, FAMILIES)


def dataset_rows(result):
    """Each dataset's rows as their records."""
    return {kind: [DATASET_ROWS[kind].model_validate(r) for r in pq.read_table(d["path"]).to_pylist()] if d["path"]
            else [] for kind, d in result.items()}


def test_no_observation_and_no_dataset_row_shows_a_hidden_value(built):
    data_dir, result = built
    with Warehouse(data_dir, read_only=True) as wh:
        tasks = {t.task_id: t for t in wh.load_tasks()}
        rollouts = wh.load_rollouts()
        rejected = wh.sql("select task_family, reason from task_rejections where stage = 'validate'").to_pylist()
    assert {t.family for t in tasks.values()} == set(FAMILIES), f"a family lost all its tasks: {rejected}"
    assert all(t.hidden.secrets for t in tasks.values())  # every family declares what must stay hidden
    for rollout in rollouts:
        texts = [s.observation for s in rollout.steps] + [s.result for s in rollout.steps]
        assert find_leaks(tasks[rollout.task_id], texts) == [], rollout.rollout_id
    rows = dataset_rows(result)
    assert rows["sft"] or rows["dpo"]
    for kind, kind_rows in rows.items():
        for row in kind_rows:
            assert find_leaks(tasks[row.task_id], row_texts(row.model_dump())) == [], (kind, row.task_id)
    # The scan bites: a row showing a secret stops the assembly.
    task = next(iter(tasks.values()))
    leaking = {"task_id": task.task_id, "messages": [{"role": "tool", "content": f"x {task.hidden.secrets[0]} y"}]}
    with pytest.raises(LeakError, match=task.task_id):
        assert_no_leaks_in_rows([leaking], tasks)


def test_no_template_group_in_two_splits(built):
    data_dir, _ = built
    with Warehouse(data_dir, read_only=True) as wh:
        straddling = wh.sql("select template_id from tasks group by 1 having count(distinct split) > 1")
        splits = {r["split"] for r in wh.sql("select distinct split from tasks").to_pylist()}
    assert straddling.num_rows == 0 and {"train", "holdout"} <= splits
    # Near-duplicates (same template, other content) follow their group, here and across runs.
    base = generate_tasks("inventory", 40, seed=3)
    twins = [TaskSpec.model_validate({**t.model_dump(exclude={"task_id", "split"}), "goal": t.goal + " Please."})
             for t in base]
    kept, _ = isolate_tasks(base + twins, holdout_fraction=HOLDOUT)
    by_template: dict[str, set] = {}
    for t in kept:
        by_template.setdefault(t.template_id, set()).add(t.split)
    assert all(len(s) == 1 for s in by_template.values()) and len(kept) == 80
    known = {t.template_id: Split.val for t in base}
    assert {assign_split(t, known, holdout_fraction=1.0) for t in twins} == {Split.val}  # landed splits win


def test_holdout_tasks_never_enter_a_dataset(built, tmp_path):
    data_dir, result = built
    with Warehouse(data_dir, read_only=True) as wh:
        holdout = {t.task_id for t in wh.load_tasks("split = 'holdout'")}
        lineage = {r["task_id"] for r in wh.sql("select distinct task_id from dataset_rows").to_pylist()}
        holdout_rollouts = wh.sql("select count(*) as n from rollouts where task_id in "
                                  "(select task_id from tasks where split = 'holdout')").to_pylist()[0]["n"]
    assert holdout and holdout_rollouts > 0  # there was something to leave out
    for kind_rows in dataset_rows(result).values():
        assert not {r.task_id for r in kind_rows} & holdout
    assert lineage and not lineage & holdout
    assert result["sft"]["dropped"]["holdout_tasks"] == len(holdout)

    # The lock is per template: a task of a holdout template that reached the warehouse as "train"
    # (a bug, an import) is still refused, and `warehouse check` reports the straddling group.
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    with Warehouse(copy) as wh:
        (task,) = wh.load_tasks("task_id = ?", [sorted(holdout)[0]])
        success = next(r for r in wh.load_rollouts("task_id = ?", [task.task_id]))
        smuggled = TaskSpec.model_validate({**task.model_dump(exclude={"task_id"}), "goal": task.goal + " ",
                                            "split": "train"})
        rollout = success.model_copy(update={"task_id": smuggled.task_id, "rollout_id": ""})
        rollout = type(rollout).model_validate(rollout.model_dump())
        wh.land(tasks=[smuggled], rollouts=[rollout]).checked()
        assert not wh.check().tables["integrity"].success
    again = assemble_datasets(copy, FAMILIES)
    for kind_rows in dataset_rows(again).values():
        assert smuggled.task_id not in {r.task_id for r in kind_rows}


def test_a_template_recorded_as_holdout_later_leaves_every_dataset(built, tmp_path):
    """The adversarial setup of tests/tasks/test_split_authority.py: the warehouse records as held
    out a template whose tasks landed (and succeeded) as train, as the hash rule put them."""
    data_dir, result = built
    sft = dataset_rows(result)["sft"]
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    with Warehouse(copy) as wh:
        (task,) = wh.load_tasks("task_id = ?", [sft[0].task_id])
        group = {t.task_id for t in wh.load_tasks("template_id = ?", [task.template_id])}
        assert task.split == Split.train and assign_split(task) == Split.train
        twin = TaskSpec.model_validate({**task.model_dump(exclude={"task_id"}), "goal": task.goal + " ",
                                        "split": "holdout"})
        wh.land(tasks=[twin]).checked()
    again = assemble_datasets(copy, FAMILIES)
    for kind_rows in dataset_rows(again).values():
        assert not {r.task_id for r in kind_rows} & group
    assert again["sft"]["rows"] < result["sft"]["rows"]
    assert again["sft"]["dropped"]["holdout_tasks"] == result["sft"]["dropped"]["holdout_tasks"] + len(group) + 1


def test_dataset_rows_are_deduplicated_by_content(built, tmp_path):
    data_dir, result = built
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    sft = dataset_rows(result)["sft"]
    with Warehouse(copy) as wh:
        (original,) = wh.load_rollouts("rollout_id = ?", [sft[0].rollout_id])
        # Same steps under a seed no other rollout has (seed + 1 may be the task's second sample).
        twin = type(original).model_validate({**original.model_dump(), "rollout_id": "", "seed": original.seed + 10**6})
        wh.land(rollouts=[twin]).checked()
    again = assemble_datasets(copy, FAMILIES)
    # the twin is one more duplicate (deterministic families may already have some of their own)
    assert again["sft"]["rows"] == result["sft"]["rows"]
    assert again["sft"]["dropped"]["duplicate_rows"] == result["sft"]["dropped"]["duplicate_rows"] + 1
    assert len({r.row_id for r in dataset_rows(again)["sft"]}) == again["sft"]["rows"]


def test_rejections_are_stored_with_reasons_and_queryable(built):
    data_dir, _ = built
    with Warehouse(data_dir, read_only=True) as wh:
        rows = wh.sql("select task_family, stage, reason_kind, tasks from rejections_by_reason "
                      "where stage = 'isolate'").to_pylist()
    assert {(r["task_family"], r["reason_kind"], r["tasks"]) for r in rows} >= \
        {(f, "duplicate content hash", 2) for f in FAMILIES}
