"""The factory on Dask (prefect-dask): a local cluster of two worker processes, reached by its
address as an existing cluster is (`--task-runner dask --cluster-address tcp://...`), plays the
rollout batches and lands the same rows as the thread runner for the same inputs. The workers
only return records; this process alone writes the catalog."""

from __future__ import annotations

import pytest

from gymfoundry.flows.factory import factory
from gymfoundry.warehouse import Warehouse

distributed = pytest.importorskip("distributed", reason="prefect-dask is in the dev extra")

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(240)]

RUN = dict(families=["inventory", "advisory"], tasks_per_family=10, seed=4, samples_per_task=2)


def landed_rows(data_dir) -> dict[str, list[tuple]]:
    """What landed, by content (not when or by which run): tasks, each rollout's outcome and
    calls, every step score."""
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = wh.load_rollouts()
        return {
            "tasks": sorted((t.task_id, t.split) for t in wh.load_tasks()),
            "rollouts": sorted((r.rollout_id, r.family, r.termination.value, r.attempt,
                                tuple(s.tool_call.name if s.tool_call else None for s in r.steps)) for r in rollouts),
            "step_scores": sorted(tuple(row.values()) for row in wh.sql(
                "select rollout_id, step_index, layer, status, score from step_scores").to_pylist()),
        }


def test_dask_cluster_lands_what_the_thread_runner_lands(tmp_path):
    threads = factory(**RUN, data_dir=str(tmp_path / "threads"))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        on_dask = factory(**RUN, data_dir=str(tmp_path / "dask"), task_runner="dask",
                          cluster_address=cluster.scheduler_address)
        # each family's batches ran on the cluster's workers: 2 workers x 1 thread, so 4 batches of 3, 3, 3, 1
        ran = client.run_on_scheduler(lambda dask_scheduler: {
            name: dict(p.state_counts) for name, p in dask_scheduler.task_prefixes.items()})
    assert {name: counts["memory"] for name, counts in ran.items()} == {"rollout_batch": 8}, ran
    assert on_dask["landed"] == threads["landed"] and on_dask["landed"]["rollouts"] == 2 * 2 * 10
    assert {k: d["dataset_id"] for k, d in on_dask["datasets"].items()} == \
        {k: d["dataset_id"] for k, d in threads["datasets"].items()}
    dask_rows, thread_rows = landed_rows(tmp_path / "dask"), landed_rows(tmp_path / "threads")
    assert dask_rows == thread_rows and len(dask_rows["rollouts"]) == 40
    assert {r[1] for r in dask_rows["rollouts"]} == {"inventory", "advisory"}
    # the run records its runner, not where the cluster was (an address, like the data dir, is a place)
    assert on_dask["run"]["params"]["task_runner"] == "dask" and "cluster_address" not in on_dask["run"]["params"]
