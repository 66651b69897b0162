"""The conversation family: conformance, its gold replays, progressive disclosure through the
env, identity and policy violations, regressions, and no private persona value in any observation.
What needs the factory's stages (envs may not import `tasks`: tests/test_layering.py) is in
tests/envs/test_person.py: the LLM customer through `run_episode`, broken gold tasks rejected
by `validate_tasks`."""

import json

from gymfoundry.envs.conversation import FAMILY
from gymfoundry.envs.conversation.policy import ScriptedConversationPolicy
from gymfoundry.envs.conversation.verifier import ConversationVerifier
from gymfoundry.envs.conversation.world import money
from gymfoundry.envs.records import ToolCall
from gymfoundry.envs.wrappers import standard_stack


def find_task(pred, levels=(1, 2, 3, 4, 5), seeds=range(60)):
    for level in levels:
        for seed in seeds:
            task = FAMILY.generate(seed, level)
            if pred(task, FAMILY.facts_of(task)):
                return task
    raise AssertionError("no generated task fits")


def play(task, calls):
    env = FAMILY.make()
    ts = env.reset(task)
    for call in calls:
        ts = env.step(call)
    return env, ts


def test_passes_the_conformance_checks(conformance):
    report = conformance(FAMILY.name)
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
    env = FAMILY.make()
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
            env = standard_stack(FAMILY.make())
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


# -- what ends a conversation, and what the customer is told ------------------------------------
def refused_everything(task, facts):
    """The tasks whose right outcome is a refusal of every request (then an end, or a transfer)."""
    return all(not r.allowed for r in facts.requests)


def blind_refusal(task):
    """One message refusing every request the opening names, sent before anything was looked at,
    then the ending the task expects: what a correct refusal says, without its evidence."""
    facts = FAMILY.facts_of(task)
    said = " ".join(f'I cannot do what you ask about the "{r.product}": that cannot be done.'
                    for r in facts.requests if r.order_id)
    if facts.expected_end == "transferred":
        return [ToolCall(name="respond", arguments={"message": said}),
                ToolCall(name="transfer_to_human", arguments={"summary": "The customer needs a human."})]
    return [ToolCall(name="end_conversation", arguments={"message": said})]


def test_a_blind_refusal_fails_at_every_level_where_a_refusal_is_right():
    verifier = ConversationVerifier()
    levels = set()
    for level in FAMILY.levels:
        for seed in range(40):
            task = FAMILY.generate(seed, level)
            facts = FAMILY.facts_of(task)
            if not refused_everything(task, facts):
                continue
            levels.add(level)
            env, ts = play(task, blind_refusal(task))
            outcome, ending = ts.info["outcome"], env.steps[-1].tool_call.name
            assert ts.terminated and not outcome["success"] and not outcome["completed"]
            assert outcome["reasons"] == [f"{ending} without evidence: the customer's identity was never verified "
                                          "(find_customer)"] + [
                f"{ending} without evidence: order {r.order_id} ({r.product}), whose {r.kind} the policy refuses, "
                "was never read (get_order)" for r in facts.requests if r.order_id]
            assert verifier.potentials(task, env.steps)[-1] == 0.0

            # the same refusals with the evidence gathered (the reference) succeed, Φ ends at 1
            env, ts = play(task, task.hidden.reference)
            assert ts.info["outcome"]["success"], ts.info["outcome"]["reasons"]
            assert verifier.potentials(task, env.steps)[-1] == 1.0
    assert levels == {2, 3, 4, 5}  # level 1 has no trap


def test_a_refusal_after_verifying_but_without_reading_the_order_fails():
    task = find_task(lambda t, f: refused_everything(t, f) and f.expected_end == "resolved")
    facts = FAMILY.facts_of(task)
    identify = [c for c in task.hidden.reference if c.name != "get_order"][:-2]
    env, ts = play(task, [*identify, *task.hidden.reference[-2:]])
    assert env.state()["verified"] == facts.customer_id
    assert ts.info["outcome"]["reasons"] == [
        f"end_conversation without evidence: order {r.order_id} ({r.product}), whose {r.kind} the policy refuses, "
        "was never read (get_order)" for r in facts.requests if r.order_id]
    assert not ts.info["outcome"]["success"]


def with_said(task, extra):
    """The reference whose summary message to the customer ends with `extra`."""
    *work, say, end = task.hidden.reference
    return [*work, say.model_copy(update={"arguments": {"message": f"{say.arguments['message']} {extra}"}}), end]


def paid_with(task, method):
    return next(p["kind"] for c in task.initial_state["customers"].values() for p in c["payment_methods"]
                if p["payment_method_id"] == method)


def test_a_false_refund_claim_fails():
    task = find_task(lambda t, f: any(r.kind == "return" and r.allowed for r in f.requests)
                     and f.expected_end == "resolved"
                     and all(paid_with(t, r.payment_method_id) != "gift_card" for r in f.requests if r.refund_cents))
    r = next(r for r in FAMILY.facts_of(task).requests if r.kind == "return" and r.allowed)
    verifier = ConversationVerifier()
    seq = len(task.hidden.reference) - 2  # the summary's call (every reference call reaches a tool)
    for claim, read in [("I have refunded $500 to your gift card.", "i have refunded $500 to your gift card."),
                        ("I have\u00a0refunded \uff04500.00 to your GIFT\u2011card!",
                         "i have refunded $500.00 to your gift-card!")]:
        env, ts = play(task, with_said(task, claim))
        outcome = ts.info["outcome"]
        assert not outcome["success"] and outcome["constraint_violation"] and outcome["completed"]
        assert outcome["reasons"] == [f"told the customer \"{read}\" (call {seq}), but no refund to the gift card "
                                      "was made"]
        assert verifier.potentials(task, env.steps)[-1] == 0.0

    amount = money(r.refund_cents)
    wrong = money(r.refund_cents + 100)
    made = ", ".join(money(x.refund_cents) for x in FAMILY.facts_of(task).requests if x.refund_cents)
    outcome = play(task, with_said(task, f"I have refunded {wrong} to you."))[1].info["outcome"]
    assert outcome["reasons"] == [f"told the customer \"i have refunded {wrong.lower()} to you.\" (call {seq}), but no "
                                  f"refund of {wrong} was made (only {made})"]
    # the true amount said again, a question and a refusal claim nothing false
    honest = (f"Once more: a refund of {amount} was made to the original payment method. "
              "Would you like a refund to your gift card instead? I cannot refund to a gift card.")
    outcome = play(task, with_said(task, honest))[1].info["outcome"]
    assert outcome["success"], outcome["reasons"]


def test_a_false_cancellation_and_an_invented_window_fail():
    task = find_task(lambda t, f: any(r.trap == "cancel_not_pending" for r in f.requests)
                     and f.expected_end == "resolved")
    r = next(r for r in FAMILY.facts_of(task).requests if r.trap == "cancel_not_pending")
    seq = len(task.hidden.reference) - 2
    outcome = play(task, with_said(task, f"Good news: order {r.order_id} has been cancelled."))[1].info["outcome"]
    assert not outcome["success"] and outcome["constraint_violation"]
    assert outcome["reasons"] == [f"told the customer \"order {r.order_id.lower()} has been cancelled.\" (call {seq}), "
                                  f"but cancel_order was never done on {r.order_id}"]

    outcome = play(task, with_said(task, "You can return anything within 90 days."))[1].info["outcome"]
    assert not outcome["success"]
    assert outcome["reasons"] == [f"told the customer \"you can return anything within 90 days.\" (call {seq}), but "
                                  "the policy's return window is not 90 days"]


# Each outcome the reference states, said the other way round (as the gameability audit negates it).
FLIPS = [(" was made to ", " was not made to "), (" is not possible:", " is possible:"),
         (" was exchanged ", " was not exchanged "), (" was changed to ", " was not changed to "),
         (" was cancelled.", " was not cancelled."), (" was not cancelled.", " was cancelled."),
         (" was not returned.", " was returned."), (" was returned.", " was not returned.")]


def test_each_outcome_the_reference_states_said_the_other_way_round_fails():
    flipped = 0
    for level in FAMILY.levels:
        for seed in range(8):
            task = FAMILY.generate(seed, level)
            for i, call in enumerate(task.hidden.reference):
                text = call.arguments.get("message", "")
                for said, contrary in FLIPS:
                    if said not in text:
                        continue
                    calls = list(task.hidden.reference)
                    calls[i] = call.model_copy(update={"arguments": {"message": text.replace(said, contrary, 1)}})
                    outcome = play(task, calls)[1].info["outcome"]
                    assert not outcome["success"], (level, seed, said, text)
                    flipped += 1
    assert flipped > 100


def test_a_negated_refund_amount_or_refusal_is_not_said():
    task = find_task(lambda t, f: any(m.kind == "amount" for m in f.mentions) and any(
        m.kind == "refusal" for m in f.mentions) and f.expected_end == "resolved")
    facts = FAMILY.facts_of(task)
    amount = next(m for m in facts.mentions if m.kind == "amount")
    refusal = next(m for m in facts.mentions if m.kind == "refusal")
    *work, say, end = task.hidden.reference
    for said, contrary, reason in [
            (f"a refund of ${amount.text} was made", f"a refund of ${amount.text} was not made",
             f"the customer was never told the refund of {amount.text} for {amount.order_id}"),
            (f'"{refusal.text}" ({refusal.order_id}) is not possible',
             f'"{refusal.text}" ({refusal.order_id}) is possible',
             f"the customer was never told that the request about {refusal.text!r} cannot be done")]:
        message = say.arguments["message"]
        assert said in message
        negated = say.model_copy(update={"arguments": {"message": message.replace(said, contrary)}})
        outcome = play(task, [*work, negated, end])[1].info["outcome"]
        assert outcome["reasons"] == [reason] and not outcome["success"]


def test_denying_what_was_done_is_a_false_statement():
    task = find_task(lambda t, f: any(r.kind == "exchange" and r.allowed for r in f.requests)
                     and f.expected_end == "resolved")
    r = next(r for r in FAMILY.facts_of(task).requests if r.kind == "exchange" and r.allowed)
    *work, say, end = task.hidden.reference
    message = end.arguments["message"].replace(f"of order {r.order_id} was exchanged", f"of order {r.order_id} was not "
                                                                                       "exchanged")
    outcome = play(task, [*work, say, end.model_copy(update={"arguments": {"message": message}})])[1].info["outcome"]
    seq = len(task.hidden.reference) - 1
    assert outcome["reasons"] == [f"told the customer \"the \"{r.product.lower()}\" of order {r.order_id.lower()} was "
                                  f"not exchanged.\" (call {seq}), but exchange_items was done on {r.order_id}"]
