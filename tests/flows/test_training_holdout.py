"""The `train` flow asks the split authority (tasks/stages/isolate.py) with the splits its data dir
recorded: a dataset naming a held-out task is refused before any step, and GRPO's live tasks
leave out a holdout the warehouse recorded for a template the hash rule would put in train."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gymfoundry.envs.records import Split
from gymfoundry.flows.training import train
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.stages.isolate import HoldoutError, assign_split, landed_splits
from gymfoundry.warehouse import Warehouse

pytestmark = pytest.mark.usefixtures("prefect_harness")


class Stop(Exception):
    pass


def hash_train(tasks):
    return [t for t in tasks if assign_split(t) == Split.train]


@pytest.fixture
def recorded(tmp_path):
    """A data dir recording as held out the first 12 tasks the hash rule alone would train on."""
    victims = hash_train(generate_tasks("inventory", 48, 0))[:12]
    with Warehouse(tmp_path) as wh:
        wh.land(tasks=[t.model_copy(update={"split": Split.holdout}) for t in victims]).checked()
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    return tmp_path, victims


@pytest.mark.parametrize("method", ["sft", "dpo"])
def test_train_refuses_a_dataset_naming_a_holdout_task(recorded, method):
    data_dir, victims = recorded
    path = data_dir / "foreign.parquet"
    pq.write_table(pa.Table.from_pylist([{"task_id": victims[0].task_id, "task_family": "inventory",
                                          "messages": "[]", "difficulty": 1}]), path)
    with pytest.raises(HoldoutError, match=victims[0].task_id):
        train(dataset=str(path), method=method, base_model=str(data_dir / "base"), data_dir=str(data_dir))
    with Warehouse(data_dir, read_only=True) as wh:
        assert wh.sql("select count(*) as n from training_runs").to_pylist() == [{"n": 0}]


def test_grpo_flow_plays_no_task_of_a_recorded_holdout(recorded, monkeypatch):
    import gymfoundry.tasks.training.grpo as grpo

    data_dir, victims = recorded
    played = []

    def spy(tasks, *args, **kwargs):
        played.extend(tasks)
        raise Stop

    monkeypatch.setattr(grpo, "load_model", lambda path: (None, None))
    monkeypatch.setattr(grpo, "LiveEpisodes", spy)
    with pytest.raises(Stop):
        train(method="grpo", base_model=str(data_dir / "base"), data_dir=str(data_dir),
              hyperparameters={"tasks": 12, "family": "inventory"})
    known = landed_splits(data_dir)
    assert len(played) == 12 and all(assign_split(t, known) == Split.train for t in played)
    assert not {t.task_id for t in played} & {t.task_id for t in victims}
