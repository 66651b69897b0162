"""Collect with a trained model: `gymfoundry run --policy hf --model <checkpoint>` lands
rollouts with the sampled token ids and logprobs, versioned by the checkpoint's fingerprint,
and the run's datasets measure their curriculum on exactly that policy."""

from __future__ import annotations

import pytest

from gymfoundry.flows.cli import main
from gymfoundry.tasks.policies.hf import checkpoint_version
from gymfoundry.warehouse import Warehouse


@pytest.mark.usefixtures("prefect_harness")
def test_cli_run_with_a_checkpoint_lands_its_tokens_and_measures_the_curriculum_on_it(tiny_model_dir, tmp_path,
                                                                                   capsys):
    data_dir = str(tmp_path / "data")
    code = main(["run", "--policy", "hf", "--model", str(tiny_model_dir), "--tasks", "4", "--samples", "1",
                 "--max-tokens", "8", "--concurrency", "4", "--data-dir", data_dir])
    assert code == 0, capsys.readouterr().err
    version = checkpoint_version(tiny_model_dir)
    with Warehouse(data_dir, read_only=True) as wh:
        rollouts = wh.load_rollouts()
        manifests = wh.sql("select kind, policy_id, policy_version from datasets").to_pylist()
    assert len(rollouts) == 4
    assert {(r.policy_id, r.policy_version) for r in rollouts} == {(f"hf:{tiny_model_dir.name}", version)}
    steps = [s for r in rollouts for s in r.steps]
    assert steps and all(s.token_ids and len(s.token_ids) == len(s.logprobs) <= 8 for s in steps)
    assert all(lp <= 0 for s in steps for lp in s.logprobs)
    assert {(m["policy_id"], m["policy_version"]) for m in manifests} == {(f"hf:{tiny_model_dir.name}", version)}
