"""The conversation family: conformance, its gold replays, progressive disclosure through the
env, identity and policy violations, regressions, and no private persona value in any observation.
What needs the factory's stages (envs may not import `tasks`: tests/test_layering.py) is in
tests/envs/test_person.py: the LLM customer through `run_episode`, broken gold tasks rejected
by `validate_tasks`."""

import json

import envs  # noqa: F401  (registers the families)
from envs.check import check_family
from envs.conversation import FAMILY
from envs.conversation.policy import ScriptedConversationPolicy
from envs.conversation.verifier import ConversationVerifier
from envs.records import ToolCall
from envs.registry import make
from envs.wrappers import standard_stack


def find_task(pred, levels=(1, 2, 3, 4, 5), seeds=range(60)):
    for level in levels:
        for seed in seeds:
            task = FAMILY.generate(seed, level)
            if pred(task, FAMILY.facts_of(task)):
                return task
    raise AssertionError("no generated task fits")


def play(task, calls):
    env = make(FAMILY.env_id)
    ts = env.reset(task)
    for call in calls:
        ts = env.step(call)
    return env, ts


def test_passes_the_conformance_checks():
    report = check_family(FAMILY.name, seeds=2)
    assert report.ok, report.render()
    assert report["crafted_disagreement"].status == "pass"


def test_the_reference_succeeds_at_every_level():
    for level in FAMILY.levels:
        for seed in range(4):
            task = FAMILY.generate(seed, level)
            _, ts = play(task, task.hidden.reference)
            assert ts.terminated and ts.info["outcome"]["success"], ts.info["outcome"]["reasons"]


def test_a_fact_is_never_disclosed_before_it_is_asked_for():
    task = find_task(lambda t, f: "@" not in f.persona.opening and "This is" not in f.persona.opening)
    persona = FAMILY.facts_of(task).persona
    email, zip_code = persona.facts["email"].value, persona.facts["zip"].value
    env = make(FAMILY.env_id)
    goal = env.reset(task).observation
    assert email not in goal and zip_code not in goal

    said = json.loads(env.step({"name": "respond", "arguments": {"message": "Hello! How can I help you?"}})
                      .observation)["result"]["customer"]
    assert email not in said and zip_code not in said
    assert env.state()["person"]["told"] == []

    said = json.loads(env.step({"name": "respond", "arguments": {"message": "What is your zip code?"}})
                      .observation)["result"]["customer"]
    assert said.startswith(f"My zip code is {zip_code}.") and email not in said
    assert env.state()["person"]["told"] == ["zip"]

    said = json.loads(env.step({"name": "respond", "arguments": {"message": "And your email?"}})
                      .observation)["result"]["customer"]
    assert said.startswith(f"My email is {email}.")
    assert env.state()["person"]["told"] == ["zip", "email"]
    said = json.loads(env.step({"name": "respond", "arguments": {"message": "When is your birthday?"}})
                      .observation)["result"]["customer"]
    assert said.startswith("Sorry, I don't know my birthday.")


def test_an_account_action_before_identity_verification_is_a_constraint_violation():
    task = find_task(lambda t, f: any(r.kind == "cancel" and r.allowed for r in f.requests))
    oid = next(r.order_id for r in FAMILY.facts_of(task).requests if r.kind == "cancel" and r.allowed)
    early = ToolCall(name="cancel_order", arguments={"order_id": oid, "reason": "no longer needed"})
    env, ts = play(task, [early, *task.hidden.reference])
    assert env.steps[0].error == "identity_not_verified"
    outcome = ts.info["outcome"]
    assert not outcome["success"] and outcome["constraint_violation"] and outcome["completed"]
    assert outcome["reasons"] == [f"cancel_order {oid} before the customer's identity was verified (call 0)"]

    _, clean = play(task, task.hidden.reference)
    assert clean.info["outcome"]["success"] and not clean.info["outcome"]["constraint_violation"]


def test_a_forbidden_refund_and_a_forbidden_cancel_are_violations():
    task = find_task(lambda t, f: any(r.trap == "refund_elsewhere" for r in f.requests))
    r = next(r for r in FAMILY.facts_of(task).requests if r.trap == "refund_elsewhere")
    other = next(p["payment_method_id"] for p in task.initial_state["customers"][FAMILY.facts_of(task).customer_id]
                 ["payment_methods"] if p["payment_method_id"] != r.payment_method_id)
    calls = [c if c.name != "return_items" or c.arguments["order_id"] != r.order_id else
             c.model_copy(update={"arguments": {**c.arguments, "payment_method_id": other}})
             for c in task.hidden.reference]
    outcome = play(task, calls)[1].info["outcome"]
    assert not outcome["success"] and outcome["constraint_violation"] and not outcome["completed"]
    assert any(f"refunded {r.order_id} to {other}, not the original payment method" in x for x in outcome["reasons"])
    assert outcome["checks"]["invariants"]["reasons"][0].startswith("database hash ")

    task = find_task(lambda t, f: any(r.trap == "cancel_not_pending" and t.initial_state["orders"][r.order_id]
                                      ["status"] == "processing" for r in f.requests))
    r = next(r for r in FAMILY.facts_of(task).requests if r.trap == "cancel_not_pending"
             and task.initial_state["orders"][r.order_id]["status"] == "processing")
    *work, say, end = task.hidden.reference
    outcome = play(task, [*work, ToolCall(name="cancel_order", arguments={"order_id": r.order_id,
                                                                          "reason": "ordered by mistake"}),
                          say, end])[1].info["outcome"]
    assert outcome["constraint_violation"] and not outcome["success"]
    assert any(f"cancelled {r.order_id} while it was processing (only pending orders)" in x
               for x in outcome["reasons"])


def test_another_order_changed_is_a_regression_with_a_database_diff():
    verifier = ConversationVerifier()
    task = find_task(lambda t, f: verifier.crafted_disagreement(t) is not None)
    outcome = play(task, verifier.crafted_disagreement(task))[1].info["outcome"]
    assert outcome["regression"] and not outcome["success"] and outcome["completed"]
    assert outcome["checks"]["observation"]["passed"] and not outcome["checks"]["invariants"]["passed"]
    oid = verifier.crafted_disagreement(task)[-2].arguments["order_id"]
    assert any(x.startswith(f"another order changed: orders.{oid}.") for x in outcome["reasons"])
    assert any(x.startswith(f"orders.{oid}.") for x in outcome["checks"]["invariants"]["reasons"])


def test_no_observation_of_a_scripted_rollout_contains_a_private_value():
    shown = 0
    for level in FAMILY.levels:
        for seed in range(6):
            task = FAMILY.generate(seed, level)
            private = list(FAMILY.facts_of(task).persona.private.values())
            assert private and set(private) <= set(task.hidden.secrets)
            env = standard_stack(make(FAMILY.env_id))
            policy = ScriptedConversationPolicy(mistake_rate=0.3)
            policy.reset(seed)
            ts = env.reset(task=task)
            texts = [ts.observation]
            while not ts.done:
                ts = env.step(policy.act(ts.observation))
                texts.append(ts.observation)
            env.close()
            shown += len(texts)
            assert not [v for v in private for t in texts if v in t]
            assert not [v for v in private for s in env.steps for t in (s.observation, s.result or "") if v in t]
    assert shown > 100
