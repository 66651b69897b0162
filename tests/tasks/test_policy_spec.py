"""PolicySpec names the model everywhere: make_policy, factory(), the CLI and runs.params; the
rollouts' policy id is the model's and its sampling knobs are part of their identity."""

import pytest
from pydantic import ValidationError

from gymfoundry.envs.records import PolicySpec, Run, Sampling
from gymfoundry.flows.cli import main
from gymfoundry.flows.factory import factory
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.openai import OpenAIPolicy
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import policy_params, run_episode
from tests.tasks.policy_endpoint import inventory_agent
from tests.verifiers.openai_stub import OpenAIStub
from gymfoundry.warehouse import Warehouse


def test_the_spec_validates_and_names_its_model():
    with pytest.raises(ValidationError, match="needs a model"):
        PolicySpec(kind="openai")
    with pytest.raises(ValidationError):
        PolicySpec(kind="openai", model="m", api_key_env="sk-not a name")  # a name, never the key itself
    spec = PolicySpec(kind="openai", model="m", base_url="http://x/v1", sampling=Sampling(temperature=0.7))
    assert spec.policy_id == "openai:m" and PolicySpec(kind="hf", model="/d/checkpoints/run-1/").policy_id == "hf:run-1"
    # identity: what changes the episodes, not how many run at once or how long a request may take
    assert spec.identity == spec.model_copy(update={"max_concurrency": 64, "timeout_s": 5}).identity
    assert spec.identity != spec.model_copy(update={"sampling": Sampling(temperature=0.2)}).identity
    assert PolicySpec.model_validate(spec.model_dump(mode="json")) == spec


def test_make_policy_builds_from_the_spec_and_the_old_form_still_works(monkeypatch):
    monkeypatch.setenv("MY_POLICY_KEY", "sk-test-123")
    spec = PolicySpec(kind="openai", model="stub", base_url="http://127.0.0.1:9/v1", api_key_env="MY_POLICY_KEY",
                      sampling=Sampling(temperature=0.7, top_p=0.9, max_tokens=64, stop=["</tool_call>"]))
    policy = make_policy(spec, "inventory")
    assert isinstance(policy, OpenAIPolicy) and policy.policy_id == "openai:stub" and policy.spec is spec
    assert (policy.temperature, policy.top_p, policy.max_new_tokens, policy.stop) == (0.7, 0.9, 64, ["</tool_call>"])
    assert policy.client.headers["Authorization"] == "Bearer sk-test-123"
    assert "sk-test" not in str(spec.model_dump())
    params = policy_params(policy)  # from the spec's sampling, not attribute names
    assert {k: params[k] for k in ("temperature", "top_p", "max_tokens", "stop")} == \
        {"temperature": 0.7, "top_p": 0.9, "max_tokens": 64, "stop": ["</tool_call>"]}
    monkeypatch.delenv("MY_POLICY_KEY")
    with pytest.raises(ValueError, match="MY_POLICY_KEY is not set"):
        make_policy(spec, "inventory")
    scripted = make_policy(PolicySpec(kind="scripted", mistake_rate=0.2), "inventory")
    old = make_policy("scripted", "inventory", mistake_rate=0.2)
    assert (scripted.policy_id, scripted.version) == (old.policy_id, old.version)
    assert policy_params(scripted) is None and policy_params(old) is None  # ids as before
    with pytest.raises(ValueError, match="unknown policy kind"):
        make_policy(PolicySpec(kind="nope"), "inventory")


def test_sampling_knobs_are_part_of_rollout_identity():
    task = generate_tasks("inventory", 1, seed=3)[0]
    with OpenAIStub(respond=inventory_agent) as server:
        ids = set()
        for temperature in (0.0, 0.7):
            spec = PolicySpec(kind="openai", model="stub", base_url=server.base_url,
                              sampling=Sampling(temperature=temperature))
            rollout = run_episode(task, make_policy(spec, "inventory"), seed=5)
            assert rollout.policy_id == "openai:stub" and rollout.policy_params["temperature"] == temperature
            ids.add(rollout.rollout_id)
    assert len(ids) == 2 and server.requests[0]["temperature"] == 0.0 and server.requests[-1]["temperature"] == 0.7


@pytest.mark.usefixtures("prefect_harness")
def test_factory_collects_with_an_endpoint_spec_and_stores_it(tmp_path):
    with OpenAIStub(respond=inventory_agent) as server:
        spec = PolicySpec(kind="openai", model="stub", base_url=server.base_url, max_concurrency=8,
                          sampling=Sampling(temperature=0.0, max_tokens=128))
        report = factory(families=["inventory"], tasks_per_family=4, samples_per_task=1, seed=2,
                         data_dir=str(tmp_path), policy=spec)
    with Warehouse(tmp_path, read_only=True) as wh:
        rows = wh.sql("select policy_id, termination from rollouts").to_pylist()
        (params,) = wh.sql("select params from runs").to_pylist()
    assert rows and {r["policy_id"] for r in rows} == {"openai:stub"}
    assert not {r["termination"] for r in rows} & {"inference_fault", "policy_error"}
    stored = params["params"]
    stored = Run.model_validate({"params": __import__("json").loads(stored) if isinstance(stored, str) else stored,
                                 "retry_policy": {}}).params
    assert PolicySpec.model_validate(stored["policy"]) == spec and report["run"]["params"]["policy"] == \
        spec.model_dump(mode="json")


@pytest.mark.usefixtures("prefect_harness")
def test_cli_run_with_an_endpoint(tmp_path, capsys):
    with OpenAIStub(respond=inventory_agent) as server:
        code = main(["run", "--policy", "openai", "--model", "stub", "--base-url", server.base_url, "--tasks", "4",
                     "--samples", "1", "--concurrency", "64", "--temperature", "0.7", "--data-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    with Warehouse(tmp_path, read_only=True) as wh:
        rows = wh.sql("select policy_id, policy_params from rollouts").to_pylist()
    assert rows and {r["policy_id"] for r in rows} == {"openai:stub"}
    assert main(["run", "--policy", "openai", "--data-dir", str(tmp_path)]) == 2  # no model: a clear message
    assert "needs a model" in capsys.readouterr().err


def test_the_endpoint_deployment_names_its_model_with_a_spec():
    from pathlib import Path

    import yaml

    prefect_yaml = Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml"
    deployments = {d["name"]: d for d in yaml.safe_load(prefect_yaml.read_text())["deployments"]}
    for name, entrypoint in [("factory-endpoint", "flows/factory.py:factory"),
                             ("evaluate-endpoint", "flows/evaluation.py:evaluate")]:
        assert deployments[name]["entrypoint"] == entrypoint
        spec = PolicySpec.model_validate(deployments[name]["parameters"]["policy"])
        assert spec.kind == "openai" and spec.base_url and spec.api_key_env and spec.policy_id.startswith("openai:")
        assert spec.max_concurrency >= 128
