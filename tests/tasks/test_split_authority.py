"""One split authority for every path that picks tasks or text for training.

The adversarial setup of every test here: a warehouse records as held out some templates that
the hash rule alone would put in train (the factory ran with another holdout fraction, an
operator locked them, or another run landed them first). A path that asks the hash rule instead
of the authority then trains on the holdout."""

from __future__ import annotations

import re
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gymfoundry import envs  # noqa: F401  registers the built-in families
from gymfoundry.envs.coding import generate_task
from gymfoundry.envs.coding.generator import LEVELS
from gymfoundry.envs.records import GRPORow, Split
from gymfoundry.tasks.stages.generate import family_env_class, generate_tasks
from gymfoundry.tasks.stages.isolate import HoldoutError, assign_split, landed_splits, recorded_splits, tasks_of_split
from gymfoundry.warehouse import Warehouse


class Stop(Exception):
    """Raised by a spy once it has seen what it came for (no model gets built or trained)."""


def record(data_dir, tasks, split: Split) -> None:
    """Land `tasks` under `split`, as a factory run with other fractions would have."""
    with Warehouse(data_dir) as wh:
        wh.land(tasks=[t.model_copy(update={"split": split}) for t in tasks]).checked()


def hash_train(tasks):
    return [t for t in tasks if assign_split(t) == Split.train]


def values_of(task) -> list[str]:
    """What identifies a task in any text: its goal, its order ids and its hidden secrets."""
    return [task.goal, *re.findall(r"ORD-\d+", task.goal), *task.hidden.secrets]


def assert_absent(tasks, texts) -> None:
    joined = "\n".join(texts)
    for task in tasks:
        shown = [v for v in values_of(task) if v in joined]
        assert not shown, f"held-out task {task.task_id} ({task.template_id}) in training text: {shown}"


# --- the authority itself -------------------------------------------------------------------

def test_recorded_holdout_beats_the_hash_rule_and_the_strictest_recorded_split_wins(tmp_path):
    tasks = generate_tasks("inventory", 40, seed=5)
    victim, other, third = hash_train(tasks)[:3]
    record(tmp_path, [victim], Split.holdout)
    record(tmp_path, [other], Split.train)
    # The same template recorded twice (a bug, an import): the strictest split is the template's.
    twin = third.model_copy(update={"goal": third.goal + " ", "task_id": ""})
    twin = type(twin).model_validate(twin.model_dump())
    record(tmp_path, [third], Split.train)
    record(tmp_path, [twin], Split.test)
    known = landed_splits(tmp_path)
    assert known == {victim.template_id: Split.holdout, other.template_id: Split.train,
                     third.template_id: Split.test}
    assert assign_split(victim) == Split.train and assign_split(victim, known) == Split.holdout
    assert assign_split(third, known) == Split.test
    # A landed split is locked: even a holdout fraction of 1 does not move a recorded train template.
    assert assign_split(other, known, holdout_fraction=1.0) == Split.train
    # A task that says it is held out stays held out, whatever the warehouse says of its template.
    assert assign_split(other.model_copy(update={"split": Split.holdout}), known) == Split.holdout
    with Warehouse(tmp_path, read_only=True) as wh:
        assert recorded_splits(wh, ["coding"]) == {}
    assert landed_splits(tmp_path / "nowhere") == {} and landed_splits(None) == {}


# --- coding: one bug site, one split ----------------------------------------------------------

def site_splits(tasks, known=None, holdout_fraction=0.1):
    by_site: dict[tuple[str, str], set[Split]] = defaultdict(set)
    for task in tasks:
        split = assign_split(task, known, holdout_fraction)
        for bug in task.hidden.checks["bugs"]:
            by_site[(task.hidden.checks["template"], bug["id"])].add(split)
    return by_site


@pytest.mark.parametrize("holdout_fraction", [0.1, 0.3])
def test_no_coding_bug_site_appears_in_the_holdout_and_in_training(holdout_fraction):
    tasks = [generate_task(seed, level)
             for seed in range(60) for level in LEVELS]
    assert len({t.task_id for t in tasks}) > 250 and {len(t.hidden.checks["bugs"]) for t in tasks} == {1, 2, 3}
    # Hostile: a warehouse that recorded one hash-train group as held out.
    victim = next(t.template_id for t in tasks if assign_split(t, None, holdout_fraction) == Split.train)
    for known in (None, {victim: Split.holdout}):
        by_site = site_splits(tasks, known, holdout_fraction)
        straddling = {site: sorted(s.value for s in splits) for site, splits in by_site.items() if len(splits) > 1}
        assert straddling == {}, f"bug sites in two splits: {straddling}"
        splits = [assign_split(t, known, holdout_fraction) for t in tasks]
        assert Split.holdout in splits and Split.train in splits
        held = {site for site, s in by_site.items() if Split.holdout in s}
        trained = {site for site, s in by_site.items() if Split.train in s}
        assert held and trained and not held & trained


def test_a_coding_task_s_bugs_share_one_module_and_its_template_names_it():
    for seed in range(40):
        for level in LEVELS:
            task = generate_task(seed, level)
            files = {b["file"] for b in task.hidden.checks["bugs"]}
            assert len(files) == 1
            (file,) = files
            module = file.split("/", 1)[1].removesuffix(".py")
            assert task.template_id == f"coding-{task.hidden.checks['template']}-{module}"


# --- the embedded base's tokenizer text -------------------------------------------------------

@pytest.mark.training  # builds the base model's tokenizer
def test_base_model_tokenizer_text_has_no_holdout_task_recorded_or_hashed(tmp_path, monkeypatch):
    import gymfoundry.tasks.training.base_model as base_model
    from gymfoundry.flows.training import default_base_model

    generated = generate_tasks("inventory", 200, seed=0)  # what factory_texts reads
    victims = hash_train(generated)[:4]
    record(tmp_path, victims, Split.holdout)
    seen: list[str] = []

    def spy(texts, vocab_size=2048):
        seen.extend(texts)
        raise Stop

    monkeypatch.setattr(base_model, "train_tokenizer", spy)
    with pytest.raises(Stop):
        default_base_model(str(tmp_path), "inventory")
    known = landed_splits(tmp_path)
    held = [t for t in generated if assign_split(t, known) != Split.train]
    assert {t.task_id for t in victims} <= {t.task_id for t in held}
    assert len(held) > len(victims)  # recorded and hashed holdouts (and val/test) alike
    assert_absent(held, seen)
    assert all(t.goal in seen for t in generated if assign_split(t, known) == Split.train)  # all the train tasks


def test_factory_texts_leave_out_a_recorded_holdout():
    from gymfoundry.tasks.training.base_model import factory_texts

    generated = generate_tasks("inventory", 30, seed=0)
    victims = hash_train(generated)[:3]
    known = {t.template_id: Split.holdout for t in victims}
    assert_absent(victims, factory_texts("inventory", n_tasks=30, known=known))
    assert all(v.goal in factory_texts("inventory", n_tasks=30) for v in victims)  # the known mapping decided


def test_a_cached_base_is_not_reused_once_a_template_of_its_text_is_held_out(tmp_path, monkeypatch):
    import gymfoundry.flows.training as training
    import gymfoundry.tasks.training.base_model as base_model
    from gymfoundry.flows.training import default_base_model

    builds = []

    def fake_build(out, *, family, known_splits=None, **config):
        builds.append(dict(known_splits or {}))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(base_model, "build_base_model", fake_build)
    monkeypatch.setattr(training, "copy_pretraining", lambda *args, **kwargs: {})  # a stage of its own
    first = default_base_model(str(tmp_path), "inventory")
    assert default_base_model(str(tmp_path), "inventory") == first and len(builds) == 1  # cached
    (victim,) = hash_train(generate_tasks("inventory", 200, seed=0))[:1]
    record(tmp_path, [victim], Split.holdout)
    second = default_base_model(str(tmp_path), "inventory")
    assert second != first and builds[-1] == {victim.template_id: Split.holdout}


# --- GRPO's live tasks ------------------------------------------------------------------------

def grpo_tasks(monkeypatch, hyperparameters, dataset=None):
    """The tasks `run_grpo` would play, through `gymfoundry.tasks.training.train.train` (no model is loaded)."""
    import gymfoundry.tasks.training.grpo as grpo
    from gymfoundry.tasks.training.train import train

    chosen = []

    def spy(tasks, *args, **kwargs):
        chosen.extend(tasks)
        raise Stop

    monkeypatch.setattr(grpo, "load_model", lambda path: (None, None))
    monkeypatch.setattr(grpo, "LiveEpisodes", spy)
    with pytest.raises(Stop):
        train(dataset, "grpo", "unused", "unused", {"seed": 0, **hyperparameters})
    return chosen


def test_grpo_train_tasks_skip_a_holdout_recorded_in_the_warehouse(tmp_path, monkeypatch):
    n = 12
    pool = generate_tasks("inventory", n * 4, 0)  # what train_tasks draws from
    victims = hash_train(pool)[:n]  # every task the hash rule alone would have played
    record(tmp_path, victims, Split.holdout)
    chosen = grpo_tasks(monkeypatch, {"tasks": n, "family": "inventory", "data_dir": str(tmp_path)})
    known = landed_splits(tmp_path)
    assert chosen and all(assign_split(t, known) == Split.train for t in chosen)
    assert not {t.task_id for t in chosen} & {t.task_id for t in pool if assign_split(t, known) != Split.train}
    assert chosen == tasks_of_split(pool, Split.train, known)[:n]


def test_a_grpo_dataset_naming_a_holdout_task_is_refused(tmp_path, monkeypatch):
    env_class = family_env_class("inventory")
    tasks = [env_class.generate_task(seed, 1 + seed % 5) for seed in range(20, 26)]
    train_task, victim = hash_train(tasks)[:2]
    record(tmp_path / "wh", [victim], Split.holdout)
    rows = [GRPORow(prompt=[{"role": "user", "content": t.goal}], tools="[]", task_id=t.task_id, task_family="inventory",
                    difficulty=t.difficulty.level, env_id=t.env_id, seed=t.source.seed, level=t.difficulty.level,
                    generator=t.source.generator, generator_version=t.source.version).model_dump()
            for t in (train_task, victim)]
    path = tmp_path / "grpo.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(HoldoutError, match=victim.template_id):
        grpo_tasks(monkeypatch, {"max_steps": 4, "data_dir": str(tmp_path / "wh")}, dataset=str(path))
    pq.write_table(pa.Table.from_pylist(rows[:1]), path)  # the train task alone is fine
    assert {t.task_id for t in grpo_tasks(monkeypatch, {"max_steps": 4, "data_dir": str(tmp_path / "wh")},
                                          dataset=str(path))} == {train_task.task_id}


# --- the holdout fraction a warehouse locked --------------------------------------------------

def record_run(data_dir, families, holdout_fraction) -> None:
    from gymfoundry.envs.records import RetryPolicy, Run

    run = Run(params={"families": families, "holdout_fraction": holdout_fraction, "seed": holdout_fraction},
              retry_policy=RetryPolicy(), attempted=0, by_class={})
    with Warehouse(data_dir) as wh:
        wh.land(runs=[run]).checked()


def test_training_holds_out_unlanded_templates_by_the_fraction_the_factory_ran_with(tmp_path, monkeypatch):
    # The factory ran at holdout fraction 0.5 and landed a few tasks. Templates it has not landed yet
    # are held out at 0.5 by its next run; training must not take them as train by the default 0.1,
    # or the next run's held-out evaluation measures tasks the tokenizer and GRPO already saw.
    from gymfoundry.envs.records import Split
    from gymfoundry.flows.factory import factory
    from gymfoundry.tasks.stages.isolate import in_holdout, landed_holdout_fractions
    from gymfoundry.tasks.training.base_model import text_tasks

    record(tmp_path, generate_tasks("inventory", 3, seed=9), Split.train)
    record_run(tmp_path, ["inventory"], 0.5)
    assert landed_holdout_fractions(tmp_path) == {"inventory": 0.5}
    known = landed_splits(tmp_path)

    def later_holdout(t):  # what a factory run at 0.5 would hold out on landing it
        return t.template_id not in known and in_holdout("inventory", t.template_id, 0.5)

    pool = generate_tasks("inventory", 200, seed=0)
    assert any(later_holdout(t) for t in hash_train(pool))  # the default rule alone trains on them
    chosen = grpo_tasks(monkeypatch, {"tasks": 12, "family": "inventory", "data_dir": str(tmp_path)})
    assert chosen and not any(later_holdout(t) for t in chosen)
    from gymfoundry.flows.training import default_base_model
    import gymfoundry.tasks.training.base_model as base_model

    seen: list[str] = []

    def spy(texts, vocab_size=2048):
        seen.extend(texts)
        raise Stop

    monkeypatch.setattr(base_model, "train_tokenizer", spy)
    with pytest.raises(Stop):
        default_base_model(str(tmp_path), "inventory")
    assert not [t.task_id for t in pool if later_holdout(t) and t.goal in seen]
    assert not any(later_holdout(t) for _, t in text_tasks("inventory", known=known, holdout_fraction={"inventory": 0.5}))
    # and the factory keeps the fraction it locked: another one is refused before any episode
    with pytest.raises(ValueError, match="holdout fraction 0.1 refused.*inventory=0.5"):
        factory.fn(families=["inventory"], tasks_per_family=2, data_dir=str(tmp_path), holdout_fraction=0.1)


@pytest.mark.parametrize("fraction", [float("nan"), -0.1, 1.5])
def test_a_holdout_fraction_outside_0_1_is_refused_before_any_episode(tmp_path, fraction):
    # NaN or a negative fraction held out nothing, silently; the lock could never match NaN either.
    from gymfoundry.flows.factory import factory

    with pytest.raises(ValueError, match=r"must be a number in \[0, 1\]"):
        factory.fn(families=["inventory"], tasks_per_family=2, data_dir=str(tmp_path), holdout_fraction=fraction)
    assert not (tmp_path / "catalog.duckdb").exists()


def test_a_run_that_dies_after_landing_tasks_still_locks_its_fraction(tmp_path, monkeypatch, prefect_harness):
    # `runs` is written when a run ends; the lock must not wait for it, or a run that landed tasks
    # and then died locks nothing and training falls back to the default fraction.
    import gymfoundry.flows.factory as factory_flow
    from gymfoundry.tasks.stages.isolate import check_holdout_fraction, landed_holdout_fractions

    def die(*args, **kwargs):
        raise RuntimeError("killed while assembling")

    monkeypatch.setattr(factory_flow, "assemble", die)
    with pytest.raises(RuntimeError, match="killed while assembling"):
        factory_flow.factory(families=["inventory"], tasks_per_family=4, samples_per_task=1, data_dir=str(tmp_path),
                             holdout_fraction=0.5)
    with Warehouse(tmp_path, read_only=True) as wh:
        assert wh.count("tasks") > 0 and [r.status for r in wh.load("runs")] == ["failed"]
    assert landed_holdout_fractions(tmp_path) == {"inventory": 0.5}
    with pytest.raises(ValueError, match="holdout fraction 0.1 refused.*inventory=0.5"):
        check_holdout_fraction(tmp_path, ["inventory"], 0.1)
    check_holdout_fraction(tmp_path, ["inventory"], 0.5)


def test_a_boolean_is_no_holdout_fraction(tmp_path):
    from gymfoundry.tasks.stages.isolate import check_holdout_fraction

    with pytest.raises(ValueError, match=r"must be a number in \[0, 1\]"):
        check_holdout_fraction(tmp_path, ["inventory"], True)
