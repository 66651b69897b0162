import json
import re

import pytest

from gymfoundry.envs.inventory import GENERATOR_VERSION, InventoryEnv, generate_task
from gymfoundry.envs.inventory.policy import ScriptedInventoryPolicy
from gymfoundry.envs.records import TaskSpec, ToolCall, content_hash
from gymfoundry.envs.family import family
from gymfoundry.envs.inventory.verifier import InventoryVerifier

ENV_ID = "gymfoundry/inventory-v0"


def obs(text: str) -> dict:
    return json.loads(text)


def approved_task(level: int = 1, min_targets: int = 1) -> TaskSpec:
    return next(t for s in range(200) if (t := generate_task(s, level)).hidden.checks["approved"]
                and len(t.hidden.checks["targets"]) >= min_targets)


def denied_task() -> TaskSpec:
    return next(t for s in range(200) if not (t := generate_task(s, 5)).hidden.checks["approved"])


def run_policy(task: TaskSpec, policy: ScriptedInventoryPolicy, seed: int):
    env = InventoryEnv(outcome_fn=InventoryVerifier().terminal_reward)
    policy.reset(seed)
    ts = env.reset(task)
    while not ts.done:
        assert len(env.steps) < 60, "the scripted policy must end its episodes"
        ts = env.step(policy.act(ts.observation))
    return env, ts


# -- generator -------------------------------------------------------------------------
def test_generator_is_deterministic_per_seed_and_level():
    assert generate_task(11, 3) == generate_task(11, 3)
    assert generate_task(11, 3).task_id != generate_task(12, 3).task_id
    assert generate_task(11, 3).task_id != generate_task(11, 4).task_id


def test_task_id_is_the_content_hash_and_source_is_recorded():
    task = generate_task(5, 2)
    content = task.model_dump(mode="json", exclude={"task_id", "split"})
    assert task.task_id == "t-" + content_hash(content)
    assert task.source.generator == "inventory" and task.source.version == GENERATOR_VERSION
    assert task.source.seed == 5 and task.env_id == ENV_ID and task.family == "inventory"
    assert task.allowed_tools == ["find_items", "get_stock", "request_authorization", "reserve", "release", "submit"]
    with pytest.raises(ValueError):
        generate_task(1, 6)


def test_names_skus_and_goal_format():
    for level in range(1, 6):
        for seed in range(20):
            task = generate_task(seed, level)
            catalog = task.initial_state["catalog"]
            names = [item["name"] for item in catalog.values()]
            assert len(names) == len(set(names))
            assert all(re.fullmatch(r"[a-z]+( [a-z]+)+", n) for n in names)
            assert all(re.fullmatch(r"SKU-\d{3}", sku) for sku in catalog)
            assert "SKU-" not in task.goal and task.goal.isascii()
            checks = task.hidden.checks
            assert checks["order_id"] in task.goal
            for t in checks["targets"]:
                assert f'- {t["quantity"]} x "{t["name"]}"' in task.goal
                assert catalog[t["sku"]]["stock"] >= t["quantity"]  # solvable


def test_difficulty_knobs_scale_with_level():
    def features(level):
        return [generate_task(s, level).difficulty.features for s in range(100)]

    one, five = features(1), features(5)
    assert {f["n_targets"] for f in one} == {1.0} and {f["n_targets"] for f in five} == {3.0}
    assert all(f["denied"] == 0.0 and f["n_distractors"] == 0.0 for f in one)
    assert 0 < sum(f["denied"] for f in five) < 100
    assert max(f["n_skus"] for f in one) < min(f["n_skus"] for f in five)
    assert all(f["deny_prob"] == 0.45 for f in five)


def test_template_id_groups_near_duplicates():
    task = generate_task(3, 2)
    names = sorted(t["name"] for t in task.hidden.checks["targets"])
    denied = not task.hidden.checks["approved"]
    assert task.template_id == "inventory-" + content_hash(["inventory", names, denied], 12)


def test_secrets_are_distinctive_credit_limit_strings():
    task = generate_task(9, 3)
    cents = task.initial_state["auth"]["credit_limit_cents"]
    limit = f"{cents // 100}.{cents % 100:02d}"
    assert task.hidden.secrets == [limit, f"credit_limit={limit}"]
    assert limit not in task.goal


# -- the world ---------------------------------------------------------------------------
def test_registered_and_made_through_its_family():
    env = family(ENV_ID).make()
    assert isinstance(env, InventoryEnv)
    task = approved_task()
    ts = env.reset(task)
    assert ts.observation.startswith(task.goal) and '{"name": <tool>, "arguments": {...}}' in ts.observation
    for call in task.hidden.reference:
        ts = env.step(call)
    assert ts.terminated and ts.reward == 1.0 and ts.info["outcome"]["success"] is True


def act(env: InventoryEnv, name: str, **arguments) -> dict:
    return obs(env.step({"name": name, "arguments": arguments}).observation)


def test_reference_walkthrough_observations():
    task = approved_task(level=1)
    t, order_id = task.hidden.checks["targets"][0], task.hidden.checks["order_id"]
    token = task.initial_state["auth"]["token"]
    env = InventoryEnv()
    env.reset(task)
    assert {"sku": t["sku"], "name": t["name"]} in act(env, "find_items", query=t["name"].upper())["result"]["items"]
    available = task.initial_state["catalog"][t["sku"]]["stock"]
    stock = act(env, "get_stock", sku=t["sku"])["result"]
    assert stock == {"sku": t["sku"], "name": t["name"], "available": available}
    auth = act(env, "request_authorization", order_id=order_id)["result"]
    assert auth == {"order_id": order_id, "status": "approved", "auth_token": token}
    assert re.fullmatch(r"AUTH-[0-9a-f]{12}", token)
    made = act(env, "reserve", sku=t["sku"], quantity=t["quantity"], auth_token=token)["result"]
    assert made == {"reservation_id": "R-1", "sku": t["sku"], "quantity": t["quantity"],
                    "remaining": available - t["quantity"]}
    ts = env.step({"name": "submit", "arguments": {"status": "reserved"}})
    assert ts.terminated
    assert obs(ts.observation)["result"] == {"submitted": True, "status": "reserved", "reservations": ["R-1"]}
    with pytest.raises(RuntimeError):
        env.step({"name": "get_stock", "arguments": {"sku": t["sku"]}})


def test_tool_errors_are_observations_with_kinds():
    task = approved_task(level=3)
    env = InventoryEnv()
    env.reset(task)
    t = task.hidden.checks["targets"][0]
    stock = task.initial_state["catalog"][t["sku"]]["stock"]

    def err(name, **arguments):
        ts = env.step({"name": name, "arguments": arguments})
        assert not ts.done
        body = obs(ts.observation)
        assert body["ok"] is False
        return body["error"]["type"]

    assert err("reserve", sku=t["sku"], quantity=1, auth_token="AUTH-guess") == "not_authorized"
    assert err("request_authorization", order_id="ORD-1") == "unknown_order"
    act(env, "request_authorization", order_id=task.hidden.checks["order_id"])
    token = task.initial_state["auth"]["token"]
    assert err("reserve", sku=t["sku"], quantity=1, auth_token="AUTH-000000000000") == "not_authorized"
    assert err("reserve", sku="SKU-000", quantity=1, auth_token=token) == "unknown_sku"
    assert err("get_stock", sku="SKU-000") == "unknown_sku"
    assert err("reserve", sku=t["sku"], quantity=stock + 1, auth_token=token) == "insufficient_stock"
    assert err("release", reservation_id="R-1") == "unknown_reservation"
    # the tool's own refusal: "permission_denied" is only the runtime's approval refusal
    assert err("release", reservation_id=task.initial_state["holds"][0]["hold_id"]) == "held_by_another_order"
    # reservation ids count only successful reserves
    made = act(env, "reserve", sku=t["sku"], quantity=1, auth_token=token)["result"]
    assert made["reservation_id"] == "R-1" and made["remaining"] == stock - 1
    assert act(env, "release", reservation_id="R-1")["ok"] is True
    assert err("release", reservation_id="R-1") == "already_released"
    state = env.state()
    assert state["catalog"][t["sku"]]["stock"] == stock and state["holds"] == task.initial_state["holds"]
    assert [e["outcome"] for e in state["events"]][:3] == ["not_authorized", "unknown_order", "ok"]


def test_denial_says_only_insufficient_credit():
    task = denied_task()
    env = InventoryEnv()
    env.reset(task)
    order_id = task.hidden.checks["order_id"]
    ts = env.step({"name": "request_authorization", "arguments": {"order_id": order_id}})
    assert obs(ts.observation)["result"] == {"order_id": order_id, "status": "denied",
                                              "message": "denied: insufficient credit"}
    t = task.hidden.checks["targets"][0]
    ts = env.step({"name": "reserve", "arguments": {"sku": t["sku"], "quantity": 1, "auth_token": "x"}})
    assert obs(ts.observation)["error"]["type"] == "not_authorized"
    assert not any(s in ts.observation for s in task.hidden.secrets)


@pytest.mark.parametrize("action,kind", [
    ('{"name": "get_stock", "arguments": {"sku": "SKU-1"', "invalid_json"),
    ("I will just think about it.", "no_tool_call"),
    ('{"name": "teleport", "arguments": {}}', "unknown_tool"),
    ('{"name": "reserve", "arguments": {"sku": "SKU-1", "quantity": "two", "auth_token": "x"}}', "invalid_arguments"),
    ('{"name": "reserve", "arguments": {"sku": "SKU-1", "quantity": 0, "auth_token": "x"}}', "invalid_arguments"),
    ('{"name": "reserve", "arguments": {"sku": "SKU-100"}}', "invalid_arguments"),
    ('{"name": "get_stock", "arguments": {"sku": "SKU-100", "force": true}}', "invalid_arguments"),
    ('{"name": "submit", "arguments": {"status": "done"}}', "invalid_arguments"),
    ('{"name": "find_items", "arguments": {"query": "' + "x" * 1_000_000 + '"}}', "action_too_large"),
    ({"name": "find_items", "arguments": {"query": "y" * 1_000_000}}, "action_too_large"),
    (ToolCall(name="find_items", arguments={"query": "z" * 1_000_000}), "action_too_large"),
    # NaN must not reach the tool (it would be stored as null), nor the deep one make an env fault
    ('{"name": "get_stock", "arguments": {"sku": NaN}}', "invalid_json"),
    ({"name": "get_stock", "arguments": {"sku": float("nan")}}, "invalid_json"),
    (ToolCall(name="get_stock", arguments={"sku": float("inf")}), "invalid_json"),
    ('{"name": "get_stock", "arguments": ' + "[" * 1500 + "]" * 1500 + "}", "action_too_deep"),
    ('{"name": "reserve", "arguments": {"sku": "SKU-1", "quantity": 2.0, "auth_token": "x"}}', "invalid_arguments"),
])
def test_malformed_actions_become_error_observations_and_the_episode_goes_on(action, kind):
    task = approved_task()
    env = InventoryEnv()
    env.reset(task)
    ts = env.step(action)
    body = obs(ts.observation)
    assert not ts.done and body["ok"] is False and body["error"]["type"] == kind
    assert env.steps[-1].error == kind
    assert env.state()["events"] == []  # refused before any tool: nothing happened, nothing logged
    ts = env.step({"name": "find_items", "arguments": {"query": "a"}})
    assert obs(ts.observation)["ok"] is True and not ts.done


def test_state_is_a_deep_copy():
    env = InventoryEnv()
    env.reset(approved_task())
    state = env.state()
    state["catalog"].clear()
    state["auth"]["status"] = "approved"
    assert env.state()["catalog"] and env.state()["auth"]["status"] is None
    json.dumps(env.state())  # JSON-able


# -- reference trajectories and leakage ------------------------------------------------
def test_every_reference_trajectory_succeeds_with_all_checks_passing():
    verifier = InventoryVerifier()
    for level in range(1, 6):
        for seed in range(100):
            task = generate_task(seed, level)
            env = InventoryEnv(outcome_fn=verifier.terminal_reward)
            env.reset(task)
            for call in task.hidden.reference:
                ts = env.step(call)
                assert obs(ts.observation)["ok"] is True, (seed, level, ts.observation)
            assert ts.terminated and ts.reward == 1.0, (seed, level)
            report = verifier.verify(task, env.steps, env.state())
            assert report.success and not report.disagreement, (seed, level, report.reasons)
            assert set(report.checks) == {"observation", "invariants", "hidden_variation"}
            assert all(c.passed for c in report.checks.values())


def test_no_observation_contains_a_secret_or_the_reference():
    policy = ScriptedInventoryPolicy(mistake_rate=0.3, seed=4)
    scanned = 0
    for seed in range(100):
        task = generate_task(seed, 1 + seed % 5)
        reference = json.dumps([c.model_dump(mode="json") for c in task.hidden.reference], sort_keys=True)
        calls = [json.dumps(c.model_dump(mode="json"), sort_keys=True) for c in task.hidden.reference]
        env, _ = run_policy(task, policy, seed)
        seen = [env.steps[0].observation] + [s.result for s in env.steps]
        for text in seen:
            assert text.isascii()
            assert not any(secret in text for secret in task.hidden.secrets), (seed, text)
            assert reference not in text and not any(c in text for c in calls)
            assert str(task.initial_state["auth"]["credit_limit_cents"]) not in text
            scanned += 1
    assert scanned > 500


# -- scripted policy -------------------------------------------------------------------
def test_scripted_policy_without_mistakes_succeeds_on_every_task():
    policy = ScriptedInventoryPolicy(mistake_rate=0.0, seed=0)
    verifier = InventoryVerifier()
    for seed in range(50):
        task = generate_task(seed, 1 + seed % 5)
        env, ts = run_policy(task, policy, seed)
        report = verifier.verify(task, env.steps, env.state())
        assert report.success and ts.reward == 1.0, (seed, report.reasons)
        assert all(s.error is None for s in env.steps)


def test_scripted_policy_with_mistakes_gives_successes_and_failures():
    policy = ScriptedInventoryPolicy(mistake_rate=0.3, seed=1)
    outcomes = [run_policy(generate_task(seed, 1 + seed % 5), policy, seed)[1].reward for seed in range(50)]
    assert 10 <= outcomes.count(1.0) <= 40 and outcomes.count(0.0) == 50 - outcomes.count(1.0)


def test_scripted_policy_is_deterministic_and_emits_text_actions():
    task = generate_task(8, 4)
    a = [s.action_text for s in run_policy(task, ScriptedInventoryPolicy(0.3), 8)[0].steps]
    b = [s.action_text for s in run_policy(task, ScriptedInventoryPolicy(0.3), 8)[0].steps]
    assert a == b and all(isinstance(t, str) and t.strip() for t in a)
    assert ScriptedInventoryPolicy.policy_id == "scripted-inventory"
    assert ScriptedInventoryPolicy(0.25).version == "3+mistakes0.25" != ScriptedInventoryPolicy(0.1).version


def test_scripted_thoughts_carry_the_next_goal_line():
    task = next(t for s in range(100) if (t := generate_task(s, 5)).hidden.checks["approved"])
    env, ts = run_policy(task, ScriptedInventoryPolicy(mistake_rate=0.0), 0)
    assert ts.reward == 1.0
    thoughts = [s.action_text.removeprefix("Thought: ").split("\n")[0] for s in env.steps]
    targets = task.hidden.checks["targets"]
    lines = [f'{t["quantity"]} x "{t["name"]}"' for t in targets]
    assert len(lines) == 3
    calls = [s.tool_call.name for s in env.steps]
    assert calls == ["request_authorization"] + ["find_items", "reserve"] * 3 + ["submit"]
    assert thoughts[1::2][:3] == [f"Need {line}." for line in lines]
    assert thoughts[2::2][:3] == [f"Reserve {line} as {t['sku']}. Next: {upcoming}."
                                  for line, t, upcoming in zip(lines, targets, lines[1:] + ["nothing"])]
    assert thoughts[-1] == "All items are reserved."


def test_a_scripted_reserve_before_authorising_is_refused_then_redone_without_searching_again():
    runs = [run_policy(generate_task(seed, 1), ScriptedInventoryPolicy(0.3, seed), seed) for seed in range(60)]
    early = [env.steps for env, _ in runs if env.steps[1].tool_call.name == "reserve"]
    assert early
    for steps in early:
        assert [s.tool_call.name for s in steps[:4]] == ["find_items", "reserve", "request_authorization", "reserve"]
        assert steps[1].error == "not_authorized" and steps[3].error is None
        assert steps[3].tool_call.arguments["sku"] == steps[1].tool_call.arguments["sku"]


def test_scripted_policy_acts_on_observation_text_alone():
    goal = ('Order ORD-12345 (amount 700.01) needs these items reserved:\n- 2 x "blue widget"\n'
            'Get the order authorised first.')
    policy = ScriptedInventoryPolicy(mistake_rate=0.0)
    policy.reset(0)

    def call(text):
        return json.loads(re.search(r"\{.*\}", text, re.DOTALL).group(0))

    assert call(policy.act(goal)) == {"name": "request_authorization", "arguments": {"order_id": "ORD-12345"}}
    auth = {"tool": "request_authorization", "ok": True,
            "result": {"order_id": "ORD-12345", "status": "approved", "auth_token": "AUTH-abc"}}
    assert call(policy.act(json.dumps(auth))) == {"name": "find_items", "arguments": {"query": "blue widget"}}
    found = {"tool": "find_items", "ok": True, "result": {"query": "blue widget", "items": [
        {"sku": "SKU-200", "name": "blue widget xl"}, {"sku": "SKU-201", "name": "blue widget"}]}}
    assert call(policy.act(json.dumps(found))) == {
        "name": "reserve", "arguments": {"sku": "SKU-201", "quantity": 2, "auth_token": "AUTH-abc"}}
    reserved = {"tool": "reserve", "ok": True, "result": {"reservation_id": "R-1", "sku": "SKU-201", "quantity": 2}}
    assert call(policy.act(json.dumps(reserved))) == {"name": "submit", "arguments": {"status": "reserved"}}
