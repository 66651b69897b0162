import json

import pytest

from gymfoundry.envs.base import EnvFault
from gymfoundry.envs.inventory import InventoryEnv, generate_task
from gymfoundry.envs.profile import ScoreWeights
from gymfoundry.envs.records import Rollout, TaskSpec, Termination
from gymfoundry.envs.inventory.verifier import InventoryVerifier
from gymfoundry.verifiers.rules import COMPONENTS, RULES_VERSION, rule_frame, rules_version, score_rules

PROFILES = {"inventory": InventoryEnv.profile}
POTENTIALS = {"inventory": InventoryVerifier().potentials}


def level_one_task() -> TaskSpec:
    """One target, approved, and a non-target item with enough stock to reserve by mistake."""
    def ok(t):
        q = t.hidden.checks["targets"][0]["quantity"]
        return t.hidden.checks["approved"] and any(
            s not in t.hidden.checks["expected_reservations"] and i["stock"] >= q
            for s, i in t.initial_state["catalog"].items())
    return next(t for s in range(200) if ok(t := generate_task(s, 1)))


TASK = level_one_task()
TARGET = TASK.hidden.checks["targets"][0]
TOKEN = TASK.initial_state["auth"]["token"]
OTHER = next(s for s, i in TASK.initial_state["catalog"].items()
             if s != TARGET["sku"] and i["stock"] >= TARGET["quantity"])


ZERO = dict.fromkeys(COMPONENTS, 0.0)


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


FIND = call("find_items", query=TARGET["name"])
STOCK = call("get_stock", sku=TARGET["sku"])
AUTH = call("request_authorization", order_id=TASK.hidden.checks["order_id"])
RESERVE = call("reserve", sku=TARGET["sku"], quantity=TARGET["quantity"], auth_token=TOKEN)
SUBMIT = call("submit", status="reserved")


def rollout(actions, attempt=0, env=None, task=TASK) -> Rollout:
    env = env or InventoryEnv()
    env.reset(task)
    for action in actions:
        env.step(action)
    return Rollout(task_id=task.task_id, family="inventory", env_id=task.env_id, env_version="0",
                   policy_id="test", policy_version="1", seed=0, attempt=attempt, steps=env.steps,
                   termination=Termination.failure)


def last_score(actions, profiles=PROFILES):
    scores = score_rules([rollout(actions)], {TASK.task_id: TASK}, profiles, POTENTIALS)
    return scores[-1]


def test_scores_carry_layer_scorer_and_version_for_every_step():
    r = rollout([FIND, STOCK, AUTH, RESERVE, SUBMIT])
    scores = score_rules([r], {TASK.task_id: TASK}, PROFILES, POTENTIALS)
    assert [s.step_index for s in scores] == [0, 1, 2, 3, 4]
    assert {(s.layer, s.scorer_id, s.scorer_version, s.rollout_id) for s in scores} == {
        ("rules", "rules", rules_version(InventoryEnv.profile), r.rollout_id)}
    assert scores[0].scorer_version.startswith(RULES_VERSION + "+w")
    assert all(set(s.components) == set(COMPONENTS) for s in scores)
    assert [s.components["progress"] for s in scores] == [0.0, 0.0, 0.2, 0.7, 0.1]
    assert [s.score for s in scores] == [0.0, 0.0, 0.2, 0.7, 0.1]


def test_reward_changes_with_the_action():
    prefix = [AUTH, FIND, STOCK]
    right = last_score(prefix + [RESERVE])
    wrong = last_score(prefix + [call("reserve", sku=OTHER, quantity=TARGET["quantity"], auth_token=TOKEN)])
    repeat = last_score(prefix + [STOCK])
    assert right.components == {**ZERO, "progress": 0.7}
    assert right.score == 0.7
    # Φ: 0.2 (authorised) -> max(0, 0.2 - 0.7) = 0
    assert wrong.components["progress"] == -0.2
    # OTHER was never shown to the agent: half its grounded values (sku, token) are unseen
    assert wrong.components["information_use"] == -0.5 and wrong.score == -0.3
    assert repeat.components == {**ZERO, "non_redundant": -1.0}
    assert repeat.score == -0.1


def test_a_read_repeated_after_a_write_is_not_redundant():
    scores = score_rules([rollout([STOCK, AUTH, RESERVE, STOCK, STOCK])], {TASK.task_id: TASK}, PROFILES, POTENTIALS)
    assert [s.components["non_redundant"] for s in scores] == [0.0, 0.0, 0.0, 0.0, -1.0]


def test_invalid_and_refused_calls():
    invalid = last_score([FIND, '{"name": "get_stock", "arguments": {"sku": 7}}'])
    assert invalid.components["valid_call"] == -1.0 and invalid.score == -0.2
    unknown = last_score(["not a call at all"])
    assert unknown.components["valid_call"] == -1.0
    hold = TASK.initial_state["holds"][0]["hold_id"]
    refused = last_score([call("release", reservation_id=hold)])
    # another order's hold id, which the agent never saw
    assert refused.components == {**ZERO, "permitted": -1.0, "information_use": -1.0}
    assert refused.score == -0.5

    narrow = TaskSpec.model_validate({**TASK.model_dump(), "task_id": "", "allowed_tools": ["find_items", "get_stock"]})
    r = rollout([AUTH], task=narrow)
    [score] = score_rules([r], {narrow.task_id: narrow}, PROFILES, POTENTIALS)
    assert r.steps[0].error == "tool_not_allowed" and score.components["permitted"] == -1.0


def test_refused_reserves_are_not_permitted():
    early = call("reserve", sku=TARGET["sku"], quantity=TARGET["quantity"], auth_token="")
    stock = TASK.initial_state["catalog"][TARGET["sku"]]["stock"]
    beyond = call("reserve", sku=TARGET["sku"], quantity=stock + 1, auth_token=TOKEN)
    r = rollout([FIND, STOCK, early, AUTH, beyond])
    assert [s.error for s in r.steps[2::2]] == ["not_authorized", "insufficient_stock"]
    scores = score_rules([r], {TASK.task_id: TASK}, PROFILES, POTENTIALS)
    # the world refused both and nothing changed, yet each is the agent's mistake: -1 x 0.3; the
    # reserve before authorising is a constraint violation too, after which Φ stays 0
    assert [s.components for s in scores[2::2]] == [{**ZERO, "permitted": -1.0}] * 2
    assert [s.score for s in scores] == [0.0, 0.0, -0.3, 0.0, -0.3]
    # the profile declares them (permission_refusals): without, a refused reserve cost nothing
    lax = InventoryEnv.profile.model_copy(update={"permission_refusals": ["held_by_another_order"]})
    assert [s.score for s in score_rules([r], {TASK.task_id: TASK}, {"inventory": lax}, POTENTIALS)][2::2] == [0.0, 0.0]


def test_profile_weights_drive_the_score():
    actions = [FIND, STOCK, AUTH, RESERVE]
    halved = InventoryEnv.profile.model_copy(update={"score_weights": ScoreWeights(
        rules={"valid_call": 0.2, "permitted": 0.3, "non_redundant": 0.1, "progress": 0.5})})
    assert last_score(actions).score == 0.7
    assert last_score(actions, {"inventory": halved}).score == 0.35
    heavy = InventoryEnv.profile.model_copy(update={"score_weights": ScoreWeights(
        rules={"valid_call": 3.0, "permitted": 0.0, "non_redundant": 0.0, "progress": 0.0})})
    assert last_score([FIND, "garbage"], {"inventory": heavy}).score == -1.0  # clipped


class FlakyEnv(InventoryEnv):
    faults = 1

    def tool_get_stock(self, state, **args):
        if self.faults:
            self.faults -= 1
            raise EnvFault("stock service timed out")
        return super().tool_get_stock(state, **args)


class FlakyReserveEnv(InventoryEnv):
    def tool_reserve(self, state, **args):
        raise RuntimeError("database connection lost")


def test_env_faults_are_never_penalised():
    r = rollout([STOCK, STOCK, STOCK], env=FlakyEnv())
    assert [s.error for s in r.steps] == ["env_fault", None, None]
    scores = score_rules([r], {TASK.task_id: TASK}, PROFILES, POTENTIALS)
    # the retry after a fault is not a repeat; the third read is
    assert [s.components["non_redundant"] for s in scores] == [0.0, 0.0, -1.0]
    assert scores[0].score == 0.0 and scores[0].components["valid_call"] == 0.0

    crashed = rollout([AUTH, RESERVE], env=FlakyReserveEnv())
    assert crashed.steps[1].error == "env_bug"  # env code crashing: rolled back, not the agent's
    score = score_rules([crashed], {TASK.task_id: TASK}, PROFILES, POTENTIALS)[1]
    assert score.components == ZERO
    assert score.score == 0.0


def test_vectorised_over_rollouts_without_crosstalk():
    a, b = rollout([STOCK, AUTH], attempt=0), rollout([STOCK, STOCK], attempt=1)
    frame = rule_frame([a, b], {TASK.task_id: TASK}, PROFILES, POTENTIALS)
    assert frame.height == 4
    by_rollout = {rid: frame.filter(frame["rollout_id"] == rid)["non_redundant"].to_list()
                  for rid in (a.rollout_id, b.rollout_id)}
    assert by_rollout == {a.rollout_id: [0.0, 0.0], b.rollout_id: [0.0, -1.0]}


def test_family_without_potential_gets_zero_progress_and_missing_task_is_an_error():
    scores = score_rules([rollout([AUTH, RESERVE])], {}, PROFILES, {})
    assert [s.components["progress"] for s in scores] == [0.0, 0.0]
    with pytest.raises(KeyError):
        score_rules([rollout([AUTH])], {}, PROFILES, POTENTIALS)


def test_empty_input():
    assert score_rules([], {}, PROFILES, POTENTIALS) == []


# -- no undo of the agent's own edit ---------------------------------------------------------

WRONG = call("reserve", sku=OTHER, quantity=TARGET["quantity"], auth_token=TOKEN)
SEEN_WRONG = [call("find_items", query=TASK.initial_state["catalog"][OTHER]["name"]), call("get_stock", sku=OTHER)]


def components(actions, name):
    r = rollout(actions)
    return [s.components[name] for s in score_rules([r], {TASK.task_id: TASK}, PROFILES, POTENTIALS)]


def test_releasing_an_own_reservation_is_an_undo():
    actions = SEEN_WRONG + [AUTH, WRONG, call("release", reservation_id="R-1"), RESERVE, SUBMIT]
    assert components(actions, "no_undo") == [0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0]
    scores = score_rules([rollout(actions)], {TASK.task_id: TASK}, PROFILES, POTENTIALS)
    # the release repairs the state (progress back up) but the round trip still costs its weight
    assert scores[4].components["progress"] == 0.2 and scores[4].score == 0.0


def test_only_a_successful_release_of_an_earlier_own_write_counts():
    hold = TASK.initial_state["holds"][0]["hold_id"]
    release = call("release", reservation_id="R-1")
    assert components([AUTH, release], "no_undo") == [0.0, 0.0]                      # nothing to undo yet
    assert components([AUTH, call("release", reservation_id=hold)], "no_undo") == [0.0, 0.0]  # refused
    twice = components(SEEN_WRONG + [AUTH, WRONG, release, release], "no_undo")
    assert twice[-2:] == [-1.0, 0.0]                                                # the second one fails


def test_undo_rules_come_from_the_profile():
    actions = SEEN_WRONG + [AUTH, WRONG, call("release", reservation_id="R-1")]
    without = InventoryEnv.profile.model_copy(update={"undoes": {}})
    r = rollout(actions)
    scores = score_rules([r], {TASK.task_id: TASK}, {"inventory": without}, POTENTIALS)
    assert [s.components["no_undo"] for s in scores] == [0.0] * 5
    by_argument = InventoryEnv.profile.model_copy(update={"undoes": {
        "release": InventoryEnv.profile.undoes["release"].model_copy(update={"matches": "arguments.sku"})}})
    scores = score_rules([r], {TASK.task_id: TASK}, {"inventory": by_argument}, POTENTIALS)
    assert scores[-1].components["no_undo"] == 0.0  # R-1 is no sku of an earlier reserve


# -- information use -------------------------------------------------------------------------

def test_values_seen_in_earlier_observations_count_as_informed():
    informed = [FIND, STOCK, AUTH, RESERVE]
    assert components(informed, "information_use") == [0.0, 0.0, 0.0, 0.0]
    guessed_sku = call("get_stock", sku="SKU-00000")
    guessed_token = call("reserve", sku=TARGET["sku"], quantity=TARGET["quantity"], auth_token="tok-guess")
    assert components([FIND, guessed_sku], "information_use") == [0.0, -1.0]
    assert components([FIND, STOCK, AUTH, guessed_token], "information_use")[-1] == -0.5
    # the token only counts once the observation that showed it came before the call
    early = call("reserve", sku=TARGET["sku"], quantity=TARGET["quantity"], auth_token=TOKEN)
    assert components([FIND, early, AUTH, early], "information_use") == [0.0, -0.5, 0.0, 0.0]


def test_information_use_is_case_insensitive_and_ignores_free_text():
    shouting = call("find_items", query=TARGET["name"].upper())
    noted = call("submit", status="reserved", note="a note nobody has seen before")
    assert components([shouting, noted], "information_use") == [0.0, 0.0]


def test_only_declared_arguments_are_grounded():
    undeclared = InventoryEnv.profile.model_copy(update={"grounded_arguments": None})
    assert undeclared.grounded("reserve") == [] and InventoryEnv.profile.grounded("reserve") == ["sku", "auth_token"]
    r = rollout([call("get_stock", sku="SKU-00000")])
    [score] = score_rules([r], {TASK.task_id: TASK}, {"inventory": undeclared}, POTENTIALS)
    assert score.components["information_use"] == 0.0


def test_values_escaped_in_a_json_observation_count_as_seen():
    import polars as pl

    from gymfoundry.verifiers.rules import STEP_SCHEMA, score_table

    name = 'the "big" box\nsecond line'
    seen = json.dumps({"tool": "find_items", "ok": True, "result": {"items": [{"name": name}]}})
    rows = [("r", "inventory", 0, 0, None, "find_items", json.dumps({"query": "box"}), "read", "goal", seen, 0.0, 0.0, ""),
            ("r", "inventory", 1, 1, None, "find_items", json.dumps({"query": name}), "read", seen, "{}", 0.0, 0.0, ""),
            ("r", "inventory", 2, 2, None, "find_items", json.dumps({"query": name + "!"}), "read", "{}", "{}", 0.0, 0.0,
             "")]
    table = pl.DataFrame(rows, schema=STEP_SCHEMA, orient="row")
    assert score_table(table, PROFILES)["information_use"].to_list() == [-1.0, 0.0, -1.0]


def test_new_component_weights_change_the_score():
    actions = [FIND, call("get_stock", sku="SKU-00000")]
    heavy = InventoryEnv.profile.model_copy(update={"score_weights": ScoreWeights(
        rules={**InventoryEnv.profile.score_weights.rules, "information_use": 0.9})})
    assert last_score(actions).score == -0.2
    assert last_score(actions, {"inventory": heavy}).score == -0.9
    assert rules_version(heavy) != rules_version(InventoryEnv.profile)  # re-scores land beside the old ones


def test_vectorised_rules_equal_a_per_step_loop():
    import polars as pl

    from tests.benchmarks.bench_rules import check_agreement, score_loop, synthetic_steps

    table = synthetic_steps(3000, seed=7).sort("rollout_id", "order")
    check_agreement(table, score_loop(table.to_dicts(), PROFILES))
    scores = rule_frame([rollout(SEEN_WRONG + [AUTH, WRONG, call("release", reservation_id="R-1")])],
                        {TASK.task_id: TASK}, PROFILES, POTENTIALS)
    assert isinstance(scores, pl.DataFrame) and scores["no_undo"].to_list()[-1] == -1.0
