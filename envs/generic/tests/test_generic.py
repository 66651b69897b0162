"""The generic family: a domain from a YAML file alone. The shipped room-booking domain passes the
conformance checks and its verifier judges states, not text; a second domain file in a user
folder becomes a family with no code change; broken files are refused naming the file and the
field without stopping the others; preconditions refuse as declared and change nothing; the
expression language refuses what is outside its grammar; the scripted policy's mistakes fail for
the intended reasons."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.family import FamilyError, add, family
from gymfoundry.envs.generic import FAMILY
from gymfoundry.envs.generic.domain import read_domain
from gymfoundry.envs.generic.loader import load_family
from gymfoundry.envs.generic.expr import EvalError, check, evaluate, parse_path, ExprProblem
from gymfoundry.envs.records import ToolCall
from gymfoundry.envs.wrappers import standard_stack

add(FAMILY)  # a no-op once discovery found it
ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
LIBRARY = (HERE / "library.yaml").read_text(encoding="utf-8")
ROOMS = (HERE.parent / "rooms.yaml").read_text(encoding="utf-8")


def task_at(level, seed=0):
    return FAMILY.generate(seed, level)


def play(task, calls):
    env = FAMILY.make()
    ts = env.reset(task)
    for call in calls:
        ts = env.step(call)
    return env, ts


def call(name, **arguments):
    return ToolCall(name=name, arguments=arguments)


def without_events(state):
    return {k: v for k, v in state.items() if k != "events"}


# -- the shipped family -----------------------------------------------------------------------
def test_the_shipped_domain_is_the_family_generic_and_passes_the_conformance_checks(conformance):
    assert family("generic") is FAMILY and FAMILY.env_id == "gymfoundry/generic-v0"
    assert str(HERE.parent) in FAMILY.masked_dirs()  # the domain file holds the rules: no sandbox shows it
    report = conformance("generic")
    assert report.ok, report.render()
    assert report["crafted_disagreement"].status == "pass", report.render()


def test_every_reference_succeeds_at_every_level_and_its_potential_rises():
    verifier = FAMILY.outcome_verifier
    for level in FAMILY.levels:
        for seed in range(6):
            task = task_at(level, seed)
            env, ts = play(task, task.hidden.reference)
            outcome = ts.info["outcome"]
            assert ts.terminated and outcome["success"], (level, seed, outcome["reasons"])
            phi = verifier.potentials(task, env.steps)
            assert phi[-1] == 1.0 and phi[0] < 1.0 and all(b >= a for a, b in zip(phi, phi[1:])), phi


def test_levels_add_the_knobs_they_declare():
    one, five = task_at(1), task_at(5)
    assert len(one.initial_state["rooms"]) == 3 and len(five.initial_state["rooms"]) == 11
    assert [c.name for c in one.hidden.reference] == ["find_rooms", "book", "submit"]
    assert [c.name for c in five.hidden.reference] == ["list_bookings", "cancel", "find_rooms", "book", "set_note",
                                                       "submit"]
    assert "cancel it first" in five.goal and "cancel" not in one.goal
    assert FAMILY.generate(7, 4) == FAMILY.generate(7, 4) and FAMILY.generate(7, 4) != FAMILY.generate(8, 4)


def test_the_rubric_and_weights_come_from_the_domain_file():
    profile = FAMILY.profile
    assert [d.name for d in profile.judge_rubric.dimensions] == ["goal_progress", "correctness", "grounding"]
    assert profile.score_weights.layers == {"rules": 1.0, "judge": 0.5}
    assert profile.permission_refusals == ["not_yours"] and profile.undoes["cancel"].reverts == "book"
    assert profile.outcome_rules == ["completed", "no_side_effects"]


# -- preconditions --------------------------------------------------------------------------
def refused(task, prefix, bad):
    env, _ = play(task, prefix)
    before = env.state()
    ts = env.step(bad)
    after = env.state()
    assert without_events(after) == without_events(before)  # nothing changed but the log
    assert after["events"][-1]["outcome"] == ts.info["error"]["kind"]
    assert not ts.done
    return ts.info["error"]


def test_preconditions_refuse_with_the_declared_message_and_leave_the_state_untouched():
    task = task_at(3)
    facts = FAMILY.facts_of(task).params
    team, target, stale, size = facts["team"], facts["target"], facts["stale_room"], facts["size"]
    taken = next(r for r, v in task.initial_state["rooms"].items() if v["booked_by"] not in (None, team))
    small = [r for r, v in task.initial_state["rooms"].items() if v["capacity"] < size and v["booked_by"] is None]
    assert refused(task, [], call("book", room=target, size=size)) == {
        "kind": "already_booked", "message": f"team {team} already holds a booking; cancel it first"}
    assert refused(task, [], call("book", room="R-999", size=2)) == {"kind": "unknown_room", "message": "no room R-999"}
    assert refused(task, [], call("cancel", room=taken)) == {
        "kind": "not_yours", "message": f"room {taken} is booked by another team"}
    assert refused(task, [], call("set_note", room=taken, text="mine")) == {
        "kind": "not_yours", "message": f"room {taken} is not booked by your team"}
    cancel = call("cancel", room=stale)
    assert refused(task, [cancel], call("book", room=taken, size=size))["kind"] == "room_taken"
    assert refused(task, [cancel], call("cancel", room=stale)) == {"kind": "not_booked",
                                                                  "message": f"room {stale} is not booked"}
    seats = task.initial_state["rooms"][stale]["capacity"]
    assert refused(task, [cancel], call("book", room=stale, size=size)) == {
        "kind": "too_small", "message": f"room {stale} seats {seats}, not {size}"}
    for room in small:
        assert refused(task, [cancel], call("book", room=room, size=size))["kind"] == "too_small"


def test_a_path_through_a_hostile_argument_reads_data_never_objects():
    task = task_at(2)
    for room in ["__class__", "__dict__", "rooms", "$state", "{$team}", "R-1.__class__"]:
        assert refused(task, [], call("book", room=room, size=3))["kind"] == "unknown_room"
    env, _ = play(task, [])
    ts = env.step(call("set_note", room=task.hidden.reference[1].arguments["room"], text="{$state.team}"))
    assert ts.info["error"]["kind"] == "not_yours"  # not booked yet; and the text is never rendered as a template


# -- the verifier judges states -----------------------------------------------------------------
def outcome_of(task, calls):
    return play(task, calls)[1].info["outcome"]


def test_hostile_rollouts_fail_with_the_rule_they_break():
    task = task_at(4)
    facts = FAMILY.facts_of(task).params
    ref = task.hidden.reference
    submit = call("submit")
    early = outcome_of(task, [submit])
    assert not early["success"] and [r.split(":")[0] for r in early["reasons"][:3]] == ["booked", "stale_cancelled",
                                                                                         "noted"]
    away = next(r for r in facts["away"] if task.initial_state["rooms"][r]["capacity"] >= facts["size"])
    wrong_floor = outcome_of(task, ref[:2] + [call("book", room=away, size=facts["size"]), submit])
    assert not wrong_floor["success"]
    assert any(r.startswith("booked: room " + facts["target"]) for r in wrong_floor["reasons"])
    assert any(r.startswith("others_untouched") for r in wrong_floor["reasons"])
    # the right room, then the note overwritten: every call was accepted, the door says otherwise
    crafted = outcome_of(task, ref[:-1] + [call("set_note", room=facts["target"], text="all good"), submit])
    assert not crafted["success"] and crafted["checks"]["observation"]["passed"]
    assert not crafted["checks"]["invariants"]["passed"]
    assert f"noted: the door of {facts['target']} does not say {facts['topic']}" in crafted["reasons"]
    # the agent's own words decide nothing: a submit note claiming success is not an argument it has
    claims = play(task, [{"name": "submit", "arguments": {"note": "success: all rules hold"}}])[1]
    assert claims.info["error"]["kind"] == "invalid_arguments" and not claims.done


def test_the_hidden_variants_replay_the_calls_on_changed_worlds():
    task = task_at(2)
    outcome = outcome_of(task, [call("submit")])
    variation = outcome["checks"]["hidden_variation"]
    assert not variation["passed"]
    assert {r.split(":")[0] for r in variation["reasons"]} == {"decoy_taken", "reordered"}
    good = outcome_of(task, task.hidden.reference)["checks"]["hidden_variation"]
    assert good == {"passed": True, "reasons": []}


def test_a_task_whose_facts_were_edited_is_refused():
    task = task_at(2)
    hidden = task.hidden.model_dump()
    hidden["checks"]["outcome"] = []
    forged = task.model_copy(update={"hidden": type(task.hidden).model_validate(hidden)})
    with pytest.raises(ValueError):
        FAMILY.make().reset(forged)  # its id is no longer its content hash


# -- the scripted policy ------------------------------------------------------------------------
def rollout(task, policy, seed=0):
    env = standard_stack(FAMILY.make())
    policy.reset(seed)
    ts = env.reset(task)
    while not ts.done:
        ts = env.step(policy.act(ts.observation))
    return env.steps, ts.info["outcome"]


def test_without_mistakes_the_policy_makes_the_reference_calls_and_succeeds():
    for level in FAMILY.levels:
        task = task_at(level, 3)
        steps, outcome = rollout(task, FAMILY.scripted_policy(mistake_rate=0.0))
        assert [(s.tool_call.name, s.tool_call.arguments) for s in steps] == \
               [(c.name, c.arguments) for c in task.hidden.reference]
        assert outcome["success"]


def test_each_mistake_fails_for_its_reason():
    task = task_at(5, 1)
    policy = FAMILY.scripted_policy
    steps, stop = rollout(task, policy(mistake_rate=1.0, mistakes=["stop"]))
    assert [s.tool_call.name for s in steps] == ["submit"]
    assert [r.split(":")[0] for r in stop["reasons"]][:3] == ["booked", "stale_cancelled", "noted"]
    steps, skip = rollout(task, policy(mistake_rate=1.0, mistakes=["skip"]))
    assert [s.tool_call.name for s in steps] == ["list_bookings", "find_rooms", "submit"]  # every write skipped
    assert {r.split(":")[0] for r in skip["reasons"]} >= {"booked", "stale_cancelled", "noted"}
    for seed in range(8):
        steps, wrong = rollout(task, policy(mistake_rate=1.0, mistakes=["distractor"]), seed)
        writes = [s for s in steps if s.tool_call.name in ("cancel", "book")]
        assert writes[0].error == "not_yours"  # another team's booking, refused
        first_book = next(s for s in writes if s.tool_call.name == "book")
        assert first_book.error in ("room_taken", "too_small", "already_booked")
        booked = any(s.tool_call.name == "book" and s.error is None for s in steps)
        assert wrong["success"] == booked and ("booked" in {r.split(":")[0] for r in wrong["reasons"]}) != booked


def test_the_default_policy_gives_a_mix_of_outcomes():
    results = [rollout(task_at(level, seed), FAMILY.scripted_policy(), seed)[1]["success"]
               for level in FAMILY.levels for seed in range(8)]
    assert 0.2 < sum(results) / len(results) < 0.8


# -- the expression language --------------------------------------------------------------------
def test_the_expression_language_refuses_what_is_outside_its_grammar():
    names = {"state", "room"}
    assert "unknown op 'eval'" in check({"eval": "1 + 1"}, "x", names, predicate=True)[0]
    assert "unknown op '__import__'" in check({"__import__": "os"}, "x", names, predicate=True)[0]
    assert "not allowed" in check("$state.__class__", "x", names)[0]
    assert "bad path" in check("${__import__('os')}", "x", names)[0]
    assert "$globals is not defined" in check("$globals", "x", names)[0]
    assert "only allowed where tasks are generated" in check({"int": [1, 3]}, "x", names)[0]
    assert "does not give true or false" in check({"add": [1, 2]}, "x", names, predicate=True)[0]
    assert check("lambda: __import__('os')", "x", names) == []  # plain text is text
    assert evaluate("lambda: __import__('os')", {}) == "lambda: __import__('os')"
    with pytest.raises(ExprProblem):
        parse_path("$state.rooms[__class__]")
    with pytest.raises(EvalError):
        evaluate("$state.rooms.keys", {"state": {"rooms": {}}})  # a dict's method is not a key
    with pytest.raises(EvalError):
        evaluate({"lt": [1, "2"]}, {})
    with pytest.raises(EvalError):
        evaluate({"int": [1, 2]}, {})  # no draws outside generation


def test_the_expression_language_computes_exactly():
    scope = {"state": {"rooms": {"a": {"n": 2}, "b": {"n": 5}}}, "k": "b", "xs": [3, 1, 2]}
    assert evaluate("$state.rooms.$k.n", scope) == 5 == evaluate("$state.rooms[$k].n", scope)
    assert evaluate({"filter": {"in": "$state.rooms", "where": {"gt": ["$item.n", 3]}}}, scope) == ["b"]
    assert evaluate({"map": {"in": "$xs", "to": {"mul": ["$item", 10]}}}, scope) == [30, 10, 20]
    assert evaluate({"count": {"in": "$xs", "where": {"ge": ["$key", 1]}}}, scope) == 2
    assert evaluate("room {$k} has {$state.rooms.$k.n}", scope) == "room b has 5"
    assert evaluate({"eq": [True, 1]}, {}) is False and evaluate({"eq": [1, 1.0]}, {}) is True
    assert evaluate({"sorted": "$xs"}, scope) == [1, 2, 3] and evaluate({"get": ["$xs", 9, None]}, scope) is None


def test_arithmetic_never_makes_a_value_no_record_can_hold():
    for expr, scope in (({"mul": ["$x", "$x"]}, {"x": 1e200}), ({"add": ["$x", "$x"]}, {"x": 1.7e308}),
                        ({"mul": ["$x", "$x"]}, {"x": 2 ** 40}), ({"add": ["$x", 1]}, {"x": 2 ** 63 - 1})):
        with pytest.raises(EvalError, match="not a finite number|past 64 bits"):
            evaluate(expr, scope)
    assert evaluate({"mul": ["$x", "$x"]}, {"x": 2 ** 31}) == 2 ** 62  # within 64 bits: exact


# -- domain files: refused naming the file and the field ---------------------------------------
def broken(tmp_path, name, old, new, text=ROOMS):
    assert old in text, old
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("name: generic", f"name: {name}", 1).replace(old, new, 1), encoding="utf-8")
    return path


def refusal(path):
    with pytest.raises(FamilyError) as info:
        load_family(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_malformed_domains_are_refused_naming_the_file_and_the_field(tmp_path):
    assert "tools.book.effects[1]: unknown op 'mul'" in refusal(
        broken(tmp_path, "mul", "- set: [$state.rooms.$room.attendees, $size]",
               "- mul: [$state.rooms.$room.attendees, $size]"))
    assert "tools.book.preconditions[1].check.eq[0]: bad path '$state.rooms.$rom.booked_by': $rom is not defined" in refusal(
        broken(tmp_path, "path", "{eq: [$state.rooms.$room.booked_by, null]}", "{eq: [$state.rooms.$rom.booked_by, null]}"))
    assert "tools.cancel.description: missing field" in refusal(
        broken(tmp_path, "missing", "    description: Cancel your team's booking of a room.\n", ""))
    assert "tasks.book_room.outcome[0].check: unknown op 'equals'" in refusal(
        broken(tmp_path, "op", "check: {eq: [$state.rooms.$target.booked_by, $team]}",
               "check: {equals: [$state.rooms.$target.booked_by, $team]}"))
    assert "tools.submit.effects[0].set[0]: bad path" in refusal(
        broken(tmp_path, "target", "- set: [$state.submitted, true]", "- set: [$team, true]"))
    assert "tasks.book_room.reference[3].args.room: bad path '$target'" in refusal(  # the goal never shows it
        broken(tmp_path, "peek", "args: {room: $room, size: $size}", "args: {room: $target, size: $size}"))
    assert "tools.book.preconditions[0].error: 'env_bug' is a runtime error kind" in refusal(
        broken(tmp_path, "kind", "error: unknown_room", "error: env_bug"))
    assert "tols: unknown field" in refusal(broken(tmp_path, "typo", "tools:\n", "tols:\n"))
    assert "tools.book.result.size.int: draw 'int' is only allowed where tasks are generated" in refusal(
        broken(tmp_path, "draw", "result: {room: $room, team: $state.team, size: $size}",
               "result: {room: $room, team: $state.team, size: {int: [1, 3]}}"))
    assert "tasks.book_room.params.item: a parameter name must be a new identifier" in refusal(
        broken(tmp_path, "shadow", "      decoy: {first: $away}", "      decoy: {first: $away}\n      item: 1"))
    assert "not YAML at line" in refusal(broken(tmp_path, "yaml", "finish_when: $state.submitted",
                                                "finish_when: [$state.rooms[$x]"))


def test_a_reference_that_fails_its_own_outcome_rules_is_refused(tmp_path):
    why = refusal(broken(tmp_path, "selfish", "check: {eq: [$state.rooms.$target.booked_by, $team]}",
                         "check: {eq: [$state.rooms.$target.booked_by, Nobody]}"))
    assert "tasks.book_room.reference (level 1, seed 0): fails its own outcome rule booked: room" in why
    why = refusal(broken(tmp_path, "falling", "check: $state.submitted\n", "check: {not: $state.submitted}\n"))
    assert "(submit) makes fewer outcome rules hold" in why and "the potential would fall" in why
    why = refusal(broken(tmp_path, "unfinished", "finish_when: $state.submitted", "finish_when: $state.finished"))
    assert "finish_when cannot be evaluated on its initial state: $state.finished: no key 'finished'" in why
    why = refusal(broken(tmp_path, "endless", "  final: {tool: submit}", "  final: {tool: submit, args: {}}\n"
                         "  max_turns: 10", text=ROOMS.replace("""      - set: [$state.submitted, true]
""", """      - set: [$state.submitted, {gt: [{count: {in: $state.rooms, where: {eq: [$item.booked_by, $state.team]}}}, 0]}]
""")))
    assert "policy.final (submit) does not end an episode from the initial state: the episode goes on" in why
    why = refusal(broken(tmp_path, "blind", '"Book a meeting room for team {$team}: {$size} people, on floor {$floor}."',
                         '"Book a meeting room for team {$team}: {$size} people."'))
    assert "tasks.book_room.reference[2].args.floor: bad path '$floor'" in why


def test_a_domain_with_two_templates_draws_both_and_its_policy_tells_them_apart():
    fam = load_family(HERE / "library.yaml")  # proven: the policy at rate 0 makes every reference's calls
    made = [fam.generate(seed, 2) for seed in range(12)]
    assert {fam.facts_of(t).template for t in made} == {"lend", "take_back"}
    back = next(t for t in made if fam.facts_of(t).template == "take_back")
    assert [c.name for c in back.hidden.reference] == ["find_book", "take_back", "finish"]
    env = fam.env(outcome_fn=None)
    env.reset(back)
    member = fam.facts_of(back).params["member"]
    for c in back.hidden.reference:
        env.step(c)
    assert env.state()["members"][member]["loans"] == [] and env.state()["done"] is True


def test_the_domain_file_is_checked_into_typed_models():
    domain = read_domain(HERE.parent / "rooms.yaml")
    assert domain.name == "generic" and list(domain.tools) == ["find_rooms", "list_bookings", "book", "cancel",
                                                               "set_note", "submit"]
    assert domain.tasks["book_room"].visible() == {"team", "size", "floor", "stale", "noted", "topic"}


# -- a user folder: a family with no code change ------------------------------------------------
def run(args, env, timeout=240):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.integration  # fresh Python processes
def test_a_domain_file_in_a_user_folder_becomes_a_family_in_a_fresh_process(tmp_path):
    (tmp_path / "library.yaml").write_text(LIBRARY, encoding="utf-8")
    (tmp_path / "broken.yaml").write_text(LIBRARY.replace("name: library", "name: broken").replace(
        "- add: [$state.books.$book.copies, -1]", "- mul: [$state.books.$book.copies, -1]"), encoding="utf-8")
    (tmp_path / "dup.yaml").write_text(ROOMS, encoding="utf-8")  # declares `generic`, which is taken
    env = {**os.environ, "GYMFOUNDRY_FAMILY_DIRS": os.pathsep.join([str(tmp_path), str(tmp_path / "absent")])}
    probe = ("import json, warnings\nwarnings.simplefilter('ignore')\nfrom gymfoundry import envs\n"
             "from gymfoundry.envs.family import family, families, load_errors\n"
             "print(json.dumps({'families': [f.name for f in families()], 'errors': load_errors(),"
             " 'masked': family('library').masked_dirs(), 'env_id': family('library').env_id}))")
    out = run([sys.executable, "-c", probe], env)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"library", "generic", "inventory"} <= set(seen["families"]) and "broken" not in seen["families"]
    assert seen["env_id"] == "gymfoundry/library-v1" and str(tmp_path) in seen["masked"]
    assert f"{tmp_path / 'broken.yaml'}: tools.lend.effects[0]: unknown op 'mul'" in seen["errors"]["broken"]
    assert "a family named 'generic' is already registered" in seen["errors"]["generic"]
    check = run([str(Path(sys.executable).parent / "gymfoundry"), "check-family", "library"], env)  # the venv running the tests
    assert check.returncode == 0, check.stdout + check.stderr
    assert "family library (gymfoundry/library-v1) passes" in check.stdout


@pytest.mark.integration  # fresh Python processes
def test_without_the_setting_no_user_domain_is_loaded(tmp_path):
    (tmp_path / "library.yaml").write_text(LIBRARY, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "GYMFOUNDRY_FAMILY_DIRS"}
    out = run([sys.executable, "-c", "from gymfoundry import envs; from gymfoundry.envs.family import families; "
                                     "print([f.name for f in families()])"], env)
    assert out.returncode == 0 and "library" not in out.stdout and "generic" in out.stdout


def test_a_tool_expression_that_fails_at_run_time_is_an_env_bug_rolled_back(tmp_path):
    # A domain whose result reads a key no precondition guards: the domain's bug, never the agent's.
    path = broken(tmp_path, "buggy", "result: {room: $room, note: $text}",
                  "result: {room: $room, note: $text, was: $state.rooms.$room.nowhere}")
    assert "tasks.book_room (level 2, seed 0): buggy template 'book_room' (seed 0, level 2): reference[4] " \
           "(set_note" in refusal(path)  # the proof at load plays set_note at level 2 and finds it
    fam = load_family(path, prove=False)
    task = fam.generate(0, 1)  # level 1 asks for no note
    env = fam.env(outcome_fn=None)
    env.reset(task)
    for c in task.hidden.reference[:2]:
        assert env.step(c).info["error"] is None
    before = env.state()
    ts = env.step(call("set_note", room=task.hidden.reference[1].arguments["room"], text="hello"))
    assert ts.info["env_bug"] and ts.info["error"]["kind"] == "env_bug" and "nowhere" in ts.info["error"]["message"]
    assert env.state() == before and not ts.done  # rolled back: a replay of this step does nothing


def test_an_argument_is_data_never_an_expression():
    task = task_at(2)
    booked = task.hidden.reference[1].arguments["room"]
    env, _ = play(task, task.hidden.reference[:2])
    text = "{$state.team} $state.team {eq: [1, 1]}"
    ts = env.step(call("set_note", room=booked, text=text))
    assert json.loads(ts.observation)["result"] == {"room": booked, "note": text}
    assert env.state()["rooms"][booked]["note"] == text


def test_a_domain_file_cannot_construct_python_objects(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text(ROOMS.replace("name: generic", "name: evil").replace(
        "finish_when: $state.submitted", "finish_when: !!python/object/apply:os.system [echo pwned]"))
    assert "not YAML at line" in refusal(path)
    bomb = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
        for i in range(1, 9)])
    path.write_text(bomb + "\n" + ROOMS.replace("name: generic", "name: evil"))
    assert "too large" in refusal(path)  # refused at once, not after checking 8**8 aliased values


def test_the_classes_of_a_domain_pickle_by_name():
    import pickle

    policy = pickle.loads(pickle.dumps(FAMILY.scripted_policy(mistake_rate=0.0)))
    assert type(policy) is FAMILY.scripted_policy and policy.mistake_rate == 0.0
    assert pickle.loads(pickle.dumps(FAMILY.env)) is FAMILY.env
    assert pickle.loads(pickle.dumps(type(FAMILY.outcome_verifier))) is type(FAMILY.outcome_verifier)


def test_a_task_whose_world_is_not_this_domains_is_refused_at_reset():
    from gymfoundry.envs.records import TaskSpec

    task = task_at(2)
    rooms = {k: {**v, "capacity": "big"} for k, v in task.initial_state["rooms"].items()}
    alien = TaskSpec.model_validate({**task.model_dump(), "task_id": "",
                                     "initial_state": {**task.initial_state, "rooms": rooms}})
    with pytest.raises(ValueError, match=r"initial_state is not a generic world: rooms/R-\d+/capacity: 'big' is not"):
        FAMILY.make().reset(alien)


def test_no_tool_shows_another_teams_private_agenda():
    from gymfoundry.envs.leaks import find_leaks

    for level in FAMILY.levels:
        for seed in range(4):
            task = task_at(level, seed)
            assert task.hidden.secrets and all(s.startswith("private: ") for s in task.hidden.secrets)
            env = FAMILY.make()
            texts = [env.reset(task).observation]
            probes = [call("find_rooms", floor=f) for f in range(1, 6)] + [call("list_bookings")]
            probes += [call(t, room=r, **extra) for r in task.initial_state["rooms"]
                       for t, extra in (("book", {"size": 1}), ("cancel", {}), ("set_note", {"text": "x"}))]
            for probe in probes:
                ts = env.step(probe)
                texts.append(ts.observation)
                if ts.done:
                    break
            texts.append(env.step(call("submit")).observation if not ts.done else "")
            assert find_leaks(task, texts) == [], (level, seed)


# -- hostile domain files ----------------------------------------------------------------------------
def _chain(name, levels, width):
    """`name1: [$name0, $name0, ...]`, ... : a value `width` ** `levels` times the size of name0."""
    return ", ".join(f"{name}{i}: [{', '.join([f'${name}{i - 1}'] * width)}]" for i in range(1, levels + 1))


LOOPS = {  # each would run for hours (or fill memory) if evaluated naively
    "nested": "{count: {in: {map: {in: {range: [0, 10000]}, to: {map: {in: {range: [0, 10000]}, to: 1}}}}}}",
    "iterate": "{count: {in: {range: [0, 10000]}, where: {all: {in: {range: [0, 10000]}, where: true}}}}",
    "doubling": "{len: {table: {keys: [k], let: {a0: {range: [0, 10000]}, b0: {range: [0, 10000]}, "
                f"{_chain('a', 20, 2)}, {_chain('b', 20, 2)}}}, row: {{eq: [$a20, $b20]}}}}}}}}",
    "text": f"{{len: {{table: {{keys: [k], let: {{a0: {{range: [0, 10000]}}, {_chain('a', 8, 4)}}}, "
            "row: \"{$a8}\"}}}",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_an_expression_that_would_run_for_hours_is_refused_in_seconds(tmp_path, loop):
    """Hostile: a domain file whose task state loops (nested maps over ranges, a value doubled
    twenty times, a template rendering it) made the loader, and so `import gymfoundry.envs` with the user's
    folder set, hang. Evaluation has a budget of steps: over it, the file is refused naming it."""
    why = refusal(broken(tmp_path, f"loop_{loop}", "      submitted: false\n",
                         f"      submitted: false\n      junk: {LOOPS[loop]}\n"))
    assert "steps" in why, why  # the evaluation's step budget refused it (a loop let run is stopped by the timeout)


@pytest.mark.timeout(120)
def test_a_tool_that_loops_when_the_agent_calls_it_is_an_env_bug_not_a_hang(tmp_path):
    """Hostile: a tool no reference calls (so the proof at load never runs it) whose result loops;
    an agent calling it gets an env_bug observation in seconds, the state rolled back."""
    path = broken(tmp_path, "loop_tool", "  submit:\n", "  spin:\n    description: Spin.\n    category: read\n"
                  f"    result: {LOOPS['nested']}\n  submit:\n")
    fam = load_family(path)
    env = fam.env(outcome_fn=None)
    env.reset(fam.generate(0, 1))
    before = env.state()
    ts = env.step(call("spin"))
    assert ts.info["env_bug"] and "steps" in ts.info["error"]["message"] and not ts.done  # the step budget
    assert env.state() == before


def test_a_file_nested_too_deeply_is_refused_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("name: deep\ndescription: x\nfinish_when: " + "[" * 50_000 + "]" * 50_000 + "\n", encoding="utf-8")
    assert "nested too deeply" in refusal(path)


@pytest.mark.parametrize("name", ["domain", "tool", "scripted"])
def test_a_domain_named_like_the_interpreters_own_classes_is_refused(tmp_path, name):
    """Hostile: a domain named `domain` made the class DomainEnv, the interpreter's own base class:
    its env could not be pickled (a worker process could not run it) and its verifier was the
    abstract base. Such names are refused, naming the clash."""
    why = refusal(broken(tmp_path, name, "x", "x", text=ROOMS.replace("x", "x")))
    assert "name:" in why and "reserved" in why, why


def test_two_domains_whose_class_names_clash_are_not_both_loaded(tmp_path):
    """Hostile: `a_b` and `a__b` both made the classes ABEnv and ABVerifier: the second domain was
    judged by the first's verifier. The second is refused, naming the first."""
    first = load_family(broken(tmp_path, "clash_a", "x", "x", text=ROOMS.replace("name: generic", "name: one_two", 1)))
    assert first.name == "one_two"
    why = refusal(broken(tmp_path, "clash_b", "x", "x", text=ROOMS.replace("name: generic", "name: one__two", 1)))
    assert "one_two" in why and "OneTwo" in why, why
    assert load_family(broken(tmp_path, "again", "x", "x", text=ROOMS.replace("name: generic", "name: one_two", 1)))


@pytest.mark.parametrize("junk,why", [
    (".inf", "not a finite number"), (".nan", "not a finite number"), ("-.inf", "not a finite number"),
    ("100000000000000000000000000000", "past 64 bits"), ("{lit: {deep: [1, 100000000000000000000000000000]}}", "past 64 bits"),
    ("{int: [0, 100000000000000000000000000000000]}", "past 64 bits")])
def test_a_number_no_record_can_hold_is_refused_when_the_file_loads(tmp_path, junk, why):
    """Hostile: a literal Infinity or NaN (stored as null, so the task played in process and the task
    landed differ) or an integer past 64 bits, written in the file or drawn, is refused like the
    arithmetic that would make one."""
    message = refusal(broken(tmp_path, "huge", "      submitted: false\n", f"      submitted: false\n      junk: {junk}\n"))
    assert "tasks.book_room" in message and why in message, message


@pytest.mark.timeout(60)
def test_a_path_that_is_no_regular_file_or_too_large_is_refused_without_reading_it(tmp_path):
    """Hostile: a "domain file" that is a FIFO (or a link to /dev/zero) blocked the loader for ever
    (or read without end); one far larger than any domain filled memory. Each is refused, naming it."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in refusal(fifo)
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    with pytest.raises(FamilyError, match="/dev/zero: not a regular file"):  # named as resolved
        load_family(zero)
    big = tmp_path / "big.yaml"
    big.write_text("name: big\ndescription: " + "x" * (9 * 2 ** 20) + "\n", encoding="utf-8")
    assert "larger than" in refusal(big)


@pytest.mark.integration  # fresh Python processes
def test_a_fifo_in_the_user_folder_is_reported_and_import_envs_goes_on(tmp_path):
    """Hostile: discovery read each user file for its name before the loader's checks, so a FIFO
    named *.yaml in the folder hung `import gymfoundry.envs` (and with it every CLI command) for ever."""
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "library.yaml").write_text(LIBRARY, encoding="utf-8")
    env = {**os.environ, "GYMFOUNDRY_FAMILY_DIRS": str(tmp_path)}
    probe = ("import json, warnings\nwarnings.simplefilter('ignore')\nfrom gymfoundry import envs\n"
             "from gymfoundry.envs.family import families, load_errors\n"
             "print(json.dumps({'families': [f.name for f in families()], 'errors': load_errors()}))")
    out = run([sys.executable, "-c", probe], env, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "library" in seen["families"] and "not a regular file" in seen["errors"]["fifo"]


def test_a_finish_predicate_that_fails_on_a_state_an_agent_reaches_is_an_env_bug_of_that_call(tmp_path):
    """Hostile: `finish_when` that cannot be evaluated only on states the proof never reaches (here:
    a note reading "boom") raised an EvalError out of `env.step` itself. It is now the call's env
    bug, rolled back like any tool expression that fails, and the episode goes on."""
    path = broken(tmp_path, "boom", "finish_when: $state.submitted",
                  'finish_when: {if: [{any: {in: $state.rooms, where: {eq: [$item.note, "boom"]}}}, '
                  '{eq: [$state.nokey, 1]}, $state.submitted]}')
    fam = load_family(path)
    task = fam.generate(0, 2)
    env = standard_stack(fam.env(outcome_fn=None))
    env.reset(task)
    *calls, last = task.hidden.reference
    for c in calls:
        if c.name == "set_note":
            before = env.state()
            ts = env.step(call("set_note", **{**c.arguments, "text": "boom"}))
            assert ts.info["env_bug"] and "nokey" in ts.info["error"]["message"] and not ts.done
            assert env.state()["rooms"] == before["rooms"]
        assert env.step(c).info["error"] is None
    assert env.step(last).done
    with pytest.raises(InvalidTask, match="finish_when"):  # a task whose initial state it fails on
        bad = broken(tmp_path, "boom_at_start", "finish_when: $state.submitted", "finish_when: $state.nokey")
        fam = load_family(bad, prove=False)
        fam.env(outcome_fn=None).reset(fam.generate(0, 1))
