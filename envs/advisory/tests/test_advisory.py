"""The advisory family: facts are told only when asked, the verifier names a missing
disclosure, a disclosure that does not state the product's term, a prohibited claim in any
spelling, a recommendation before asking, a wrong "none" and a "none" without seeing the
products; Φ after the recommendation is the verdict; a broken gold task is rejected with its
reason, and no observation shows a private persona value."""

import json
from dataclasses import dataclass

import httpx
import pytest

from gymfoundry.envs.advisory import FAMILY
from gymfoundry.envs.advisory.policy import ScriptedAdvisoryPolicy
from gymfoundry.envs.advisory.rules import TOPICS, prohibited_claims
from gymfoundry.envs.check import play as replay
from gymfoundry.envs.family import add
from gymfoundry.envs.leaks import find_leaks
from gymfoundry.envs.records import OutcomeReport, TaskSpec, ToolCall
from gymfoundry.envs.wrappers import standard_stack

add(FAMILY)  # a no-op once discovery found it


def task_where(predicate, levels=(1, 2, 3, 4, 5)):
    return next(t for seed in range(200) for level in levels
                if predicate(t := FAMILY.generate(seed, level), FAMILY.facts_of(t)))


def play(task, calls, env=None):
    env = env or FAMILY.make()
    ts = env.reset(task)
    for call in calls:
        ts = env.step(call)
    return env, ts


def respond(message):
    return ToolCall(name="respond", arguments={"message": message})


def client_says(ts):
    return json.loads(ts.observation)["result"]["client"]


def recommend_index(task):
    return next(i for i, c in enumerate(task.hidden.reference) if c.name == "recommend")


def without(task, name, **match):
    return [c for c in task.hidden.reference
            if not (c.name == name and all(c.arguments.get(k) == v for k, v in match.items()))]


def test_passes_the_conformance_checks(conformance):
    report = conformance(FAMILY.name)
    assert report.ok, report.render()


def test_a_fact_is_never_disclosed_before_it_is_asked_for():
    task = task_where(lambda t, f: f.volunteered == "horizon" and f.profile.exclusions, levels=(4, 5))
    persona = FAMILY.facts_of(task).persona
    values = {t: persona.facts[t].value for t in TOPICS}
    env = FAMILY.make()
    goal = env.reset(task).observation
    assert not [t for t, v in values.items() if v in goal]  # the opening shows only the wrong horizon
    ts = env.step(respond("Thanks for coming in today."))
    assert not [t for t, v in values.items() if v in client_says(ts)]
    told = []
    for topic, question in [("budget", "What budget do you have for this?"),
                            ("horizon", "How long until you need the money?"),
                            ("exclusions", "Anything you want to exclude?"),
                            ("risk_tolerance", "What is your risk tolerance?")]:
        ts = env.step(respond(question))
        said = client_says(ts)
        assert [t for t, v in values.items() if v in said] == [topic], said
        assert env.state()["events"][-1]["disclosed"] == [topic]
        told.append(topic)
        assert env.state()["person"]["told"] == told
    assert said.startswith("I'd put my risk tolerance at ")


def test_a_missing_required_disclosure_fails_the_outcome():
    task = task_where(lambda t, f: bool(f.suitable))
    pid = task.hidden.reference[-1].arguments["product_id"]
    _, ts = play(task, without(task, "disclose", topic="fees"))
    outcome = ts.info["outcome"]
    assert ts.terminated and not outcome["success"] and not outcome["completed"]
    assert not outcome["constraint_violation"]
    assert outcome["reasons"] == [f"recommended {pid} without disclosing its fees"]


def test_a_prohibited_claim_is_a_constraint_violation():
    task = task_where(lambda t, f: bool(f.suitable))
    *calls, rec = task.hidden.reference
    claim = rec.model_copy(update={"arguments": {**rec.arguments, "reason": "It is risk-free, trust me."}})
    outcome = play(task, [*calls, claim])[1].info["outcome"]
    assert outcome["completed"] and outcome["constraint_violation"] and not outcome["success"]
    assert outcome["reasons"] == [f"recommend (call {len(calls)}) claims 'risk-free'"]
    assert prohibited_claims("You CAN'T LOSE, with guaranteed returns.") == ["can't lose", "guaranteed returns"]
    for honest in ["Returns are not guaranteed.", "This is not risk-free.", "There are no guaranteed returns.",
                   "No product is risk-free."]:
        assert prohibited_claims(honest) == [], honest


def test_recommending_before_asking_fails():
    task = task_where(lambda t, f: bool(f.suitable))
    calls = without(task, "respond", message=task.hidden.reference[3].arguments["message"])  # the exclusions question
    outcome = play(task, calls)[1].info["outcome"]
    assert outcome["constraint_violation"] and not outcome["success"]
    assert outcome["reasons"] == [f"recommended before the client told their exclusions (call {len(calls) - 1})"]


def test_trusting_a_volunteered_wrong_fact_fails():
    task = task_where(lambda t, f: f.volunteered == "budget" and bool(f.suitable), levels=(3, 4, 5))
    facts = FAMILY.facts_of(task)
    wrong = max(p["min_amount"] for p in task.initial_state["catalog"].values())
    calls = [c if c.name != "record_suitability" else c.model_copy(
        update={"arguments": {**c.arguments, "budget": wrong}}) for c in without(
        task, "respond", message=task.hidden.reference[2].arguments["message"])]
    reasons = play(task, calls)[1].info["outcome"]["reasons"]
    assert f"the suitability record has budget {wrong}, the client's is {facts.profile.budget}" in reasons
    assert f"recommended before the client told their budget (call {len(calls) - 1})" in reasons


def test_no_suitable_product_means_none():
    conflict = task_where(lambda t, f: not f.suitable and f.volunteered, levels=(4, 5))
    outcome = play(conflict, conflict.hidden.reference)[1].info["outcome"]
    assert outcome["success"] and conflict.hidden.reference[-1].arguments["product_id"] == "none"
    *calls, rec = conflict.hidden.reference
    decoy = min(conflict.initial_state["catalog"], key=lambda p: conflict.initial_state["catalog"][p]["annual_fee_pct"])
    sold = play(conflict, [*calls, rec.model_copy(update={"arguments": {**rec.arguments, "product_id": decoy}})])
    assert sold[1].info["outcome"]["constraint_violation"]
    assert any(r.startswith(f"mis-selling: {decoy} ") for r in sold[1].info["outcome"]["reasons"])

    fits = task_where(lambda t, f: len(f.suitable) == 2)
    *calls, rec = fits.hidden.reference
    none = rec.model_copy(update={"arguments": {"product_id": "none", "reason": "Nothing suits."}})
    outcome = play(fits, [*calls, none])[1].info["outcome"]
    ids = FAMILY.facts_of(fits).suitable
    assert not outcome["success"] and not outcome["completed"]
    assert outcome["reasons"] == [f"recommended none, but {ids[0]}, {ids[1]} suit(s) the client"]


def test_a_broken_gold_task_is_rejected_with_a_reason():
    good = task_where(lambda t, f: bool(f.suitable))
    pid = good.hidden.reference[-1].arguments["product_id"]
    data = good.model_dump(mode="json")
    data["task_id"] = ""
    data["hidden"]["reference"] = [c for c in data["hidden"]["reference"]
                                   if c["arguments"].get("topic") != "no_guarantee"]
    broken = TaskSpec.model_validate(data)
    data = good.model_dump(mode="json")
    data["task_id"] = ""
    data["hidden"]["checks"]["suitable"] = []
    mislabelled = TaskSpec.model_validate(data)
    # What the validate stage (tasks.stages.validate.check_reference) asks of every task: the verifier's
    # precondition, then the reference replayed through the env and judged a success.
    verifier = FAMILY.outcome_verifier
    assert verifier.precondition(good) is None and replay(FAMILY, good, good.hidden.reference).outcome.success
    episode = replay(FAMILY, broken, broken.hidden.reference)
    assert verifier.precondition(broken) is None and episode.terminated and not episode.outcome.success
    assert episode.outcome.reasons == [f"recommended {pid} without disclosing its no guarantee"]
    assert verifier.precondition(mislabelled) == (
        f"the task says none suit(s), its catalog says {FAMILY.facts_of(good).suitable}")


def test_no_observation_of_a_scripted_rollout_shows_a_private_value():
    outcomes, shown = set(), []
    for seed in range(8):
        for level in FAMILY.levels:
            task = FAMILY.generate(seed, level)
            private = FAMILY.facts_of(task).persona.hidden_values()
            assert len(private) == 2 and task.hidden.secrets == private
            env = standard_stack(FAMILY.make())
            policy = ScriptedAdvisoryPolicy(mistake_rate=0.3)
            policy.reset(seed)
            ts = env.reset(task=task)
            texts = [ts.observation]
            while not ts.done:
                ts = env.step(policy.act(ts.observation))
                texts.append(ts.observation)
            outcomes.add(ts.info["outcome"]["success"])
            shown += [v for v in private for text in texts if v in text] + find_leaks(task, texts)
            env.close()
    assert shown == [] and outcomes == {True, False}


def test_the_hidden_variant_changes_only_distractors():
    task = task_where(lambda t, f: bool(f.suitable))
    facts = FAMILY.facts_of(task)
    (variant,) = facts.variants
    assert variant.products and not set(variant.products) & set(facts.suitable)
    outcome = play(task, task.hidden.reference)[1].info["outcome"]
    assert outcome["checks"]["hidden_variation"] == {"passed": True, "reasons": []}


@pytest.mark.parametrize("reply", [httpx.Response(500, text="boom"), httpx.Response(200, json={"choices": []}),
                                   "private"])
def test_a_failing_simulated_person_is_an_env_fault(reply):
    task = task_where(lambda t, f: True)
    private = FAMILY.facts_of(task).persona.hidden_values()[0]

    def answer(request):
        if reply == "private":
            return httpx.Response(200, json={"choices": [{"message": {"content": f"My savings are {private}."}}]})
        return reply

    env = FAMILY.make(simulator="llm", base_url="http://sim.test/v1", model="m",
               transport=httpx.MockTransport(answer))
    env.reset(task)
    before = env.state()
    ts = env.step(respond("What is your risk tolerance?"))
    assert ts.info["env_fault"] and ts.info["error"]["kind"] == "env_fault" and not ts.done
    assert env.state() == before and private not in ts.observation


# -- what is said is checked against the facts; "none" needs its evidence; Φ follows the verdict --

@dataclass
class Played:
    """An episode of fixed calls through the runtime's stack: its steps, the verifier's outcome and
    the class that outcome gives (the runtime's classify adds faults, which these calls never meet)."""

    steps: list
    outcome: OutcomeReport

    @property
    def termination(self) -> str:
        if self.outcome.success:
            return "success"
        return "constraint_violation" if self.outcome.constraint_violation else "failure"


def episode(task, calls):
    """The episode of `calls` (an adversary that knows the task) through the standard stack, and
    Φ after its last step."""
    env = standard_stack(FAMILY.make())
    try:
        env.reset(task)
        for call in calls:
            ts = env.step(call)
            if ts.done:
                break
        played = Played(list(env.steps), OutcomeReport.model_validate(ts.info["outcome"]))
    finally:
        env.close()
    return played, FAMILY.outcome_verifier.potentials(task, played.steps)[-1]


def sold_with_lockup():
    task = task_where(lambda t, f: bool(f.suitable) and t.initial_state["catalog"][
        t.hidden.reference[-1].arguments["product_id"]]["lockup_years"] > 0)
    pid = task.hidden.reference[-1].arguments["product_id"]
    return task, pid, task.initial_state["catalog"][pid]


def with_text(task, topic, text):
    """The reference with its `topic` disclosure saying `text`, and that call's index."""
    calls = [c.model_copy(update={"arguments": {**c.arguments, "text": text}})
             if c.name == "disclose" and c.arguments["topic"] == topic else c for c in task.hidden.reference]
    return calls, next(i for i, c in enumerate(calls) if c.name == "disclose" and c.arguments["topic"] == topic)


NOT_GUARANTEED = "does not say that returns are not guaranteed"
RATING, LOCKUP = "does not state its risk rating of {risk} (of 5)", "does not state its lock-up of {lockup} years"
LIES = [  # (topic, text, what the verdict says it does not state, the claim it makes)
    ("fees", "There are no fees at all.", "does not state its annual fee of {fee}%", None),
    ("fees", "Your returns are assured.", "does not state its annual fee of {fee}%", "returns are assured"),
    ("fees", "{name} charges an annual fee of {wrong_fee}% a year.", "does not state its annual fee of {fee}%", None),
    ("fees", "{name} does not charge an annual fee of {fee}%.", "does not state its annual fee of {fee}%", None),
    ("no_guarantee", "Your returns are assured.", NOT_GUARANTEED, "returns are assured"),
    ("no_guarantee", "Returns are guaranteed.", NOT_GUARANTEED, "returns are guaranteed"),
    ("no_guarantee", "There are no fees at all.", NOT_GUARANTEED, None),
    ("no_guarantee", "It is not true that returns are not guaranteed.", NOT_GUARANTEED, None),
    ("risk", "{name} has a risk rating of {wrong_risk} on a 1-5 scale.", RATING, None),
    ("risk", "{name} has no risk at all.", RATING, "no risk at all"),
    ("lock_up", "Your money is locked up for {wrong_lockup} years.", LOCKUP, None),
    ("lock_up", "Your money is not locked up for {lockup} years.", LOCKUP, None),
]


@pytest.mark.parametrize("topic,text,problem,claim", LIES)
def test_a_disclosure_that_does_not_state_the_products_term_fails(topic, text, problem, claim):
    task, pid, p = sold_with_lockup()
    terms = dict(name=p["name"], fee=p["annual_fee_pct"], risk=p["risk_rating"], lockup=p["lockup_years"],
                 wrong_fee=round(p["annual_fee_pct"] + 1, 2), wrong_risk=p["risk_rating"] % 5 + 1,
                 wrong_lockup=p["lockup_years"] + 2)
    calls, at = with_text(task, topic, text.format(**terms))
    rollout, phi = episode(task, calls)
    reasons = [f"the {topic.replace('_', ' ')} disclosure of {pid} (call {at}) {problem.format(**terms)}"]
    reasons += [f"disclose (call {at}) claims {claim!r}"] if claim else []
    assert rollout.outcome.reasons == reasons
    assert rollout.termination == ("constraint_violation" if claim else "failure")
    assert phi == 0.0


HONEST = [("fees", "The annual fee is {fee:.3f} percent."), ("fees", "Fees: {fee} % a year, with no entry fee."),
          ("risk", "Risk: {risk}/5, so the value can fall."), ("risk", "It is rated {risk} out of 5 for risk."),
          ("no_guarantee", "There is no guarantee of any return; you may get back less."),
          ("no_guarantee", "We cannot guarantee returns."), ("no_guarantee", "Returns aren\u2019t guaranteed."),
          ("lock_up", "A {lockup}-year lock-up applies."), ("lock_up", "It is locked for {months} months.")]


@pytest.mark.parametrize("topic,text", HONEST)
def test_a_disclosure_in_other_words_that_states_the_term_passes(topic, text):
    task, pid, p = sold_with_lockup()
    said = text.format(fee=p["annual_fee_pct"], risk=p["risk_rating"], lockup=p["lockup_years"],
                       months=12 * p["lockup_years"])
    rollout, phi = episode(task, with_text(task, topic, said)[0])
    assert rollout.termination == "success" and rollout.outcome.reasons == [] and phi == 1.0


@pytest.mark.parametrize("said,claim", [
    ("No doubt: guaranteed returns.", "guaranteed returns"),
    ("no doubt it has guaranteed returns", "guaranteed returns"),
    ("It is risk\u2011free.", "risk-free"), ("It is risk\u2014free.", "risk-free"), ("It is riskfree.", "riskfree"),
    ("It is RISK  FREE.", "risk free"), ("Guaranteed\u00a0 returns!", "guaranteed returns"),
    ("It is risk\u00adfree.", "riskfree"), ("You can\u2019t lose.", "can't lose"),
    ("Its value never falls.", "never falls")])
def test_a_prohibited_claim_is_found_in_any_spelling(said, claim):
    task = task_where(lambda t, f: bool(f.suitable))
    *calls, rec = task.hidden.reference
    rollout, phi = episode(task, [*calls, rec.model_copy(update={"arguments": {**rec.arguments, "reason": said}})])
    assert rollout.termination == "constraint_violation" and phi == 0.0
    assert rollout.outcome.reasons == [f"recommend (call {len(calls)}) claims {claim!r}"]


def test_a_denial_is_read_only_where_the_negation_reaches():
    for honest in ["Returns are not guaranteed.", "None of our products offer guaranteed returns.",
                   "It\u2019s not risk\u2011free.", "Returns cannot be guaranteed.", "Its value can go down."]:
        assert prohibited_claims(honest) == [], honest
    assert prohibited_claims("No, it's risk free. Not to worry: you can not lose.") == ["risk free", "can not lose"]
    assert prohibited_claims("Its value can not go down.") == ["can not go down"]


def test_none_without_seeing_the_products_fails():
    task = task_where(lambda t, f: not f.suitable)
    kind = FAMILY.facts_of(task).kind
    asked = [c for c in task.hidden.reference if c.name in ("respond", "record_suitability")]
    none = task.hidden.reference[-1]
    assert none.arguments["product_id"] == "none"
    other = "insurance" if kind == "savings" else "savings"
    for looked in ([], [ToolCall(name="list_products", arguments={"kind": other})]):
        rollout, phi = episode(task, [*asked, *looked, none])
        assert rollout.termination == "failure" and phi == 0.0
        assert rollout.outcome.reasons == [f"recommend without evidence: the {kind} products were never listed"]
    unasked = [c for c in task.hidden.reference if c.name != "respond"]
    rollout, phi = episode(task, unasked)
    assert rollout.termination == "constraint_violation" and phi == 0.0
    assert rollout.outcome.reasons[-4:] == [f"recommend without evidence: the client never told their "
                                            f"{t.replace('_', ' ')}" for t in TOPICS]
    rollout, phi = episode(task, task.hidden.reference)
    assert rollout.termination == "success" and phi == 1.0


def test_the_reference_succeeds_at_every_level_and_phi_ends_at_the_verdict():
    verifier = FAMILY.outcome_verifier
    assert type(verifier).statements == {"disclose": ("text",)}
    for level in FAMILY.levels:
        for seed in range(3):
            task = FAMILY.generate(seed, level)
            rollout, phi = episode(task, task.hidden.reference)
            assert rollout.termination == "success" and rollout.outcome.reasons == [] and phi == 1.0, (seed, level)


def test_a_disclosure_of_another_product_is_read_against_that_products_terms():
    task = task_where(lambda t, f: bool(f.suitable) and any(
        p["lockup_years"] == 0 and pid not in f.suitable for pid, p in t.initial_state["catalog"].items()))
    other = next(pid for pid, p in task.initial_state["catalog"].items()
                 if p["lockup_years"] == 0 and pid not in FAMILY.facts_of(task).suitable)
    fee = task.initial_state["catalog"][other]["annual_fee_pct"]
    *calls, rec = task.hidden.reference

    def told(topic, text):
        return episode(task, [*calls, ToolCall(name="disclose", arguments={
            "product_id": other, "topic": topic, "text": text}), rec])

    # the hidden variant changes this distractor's fee: the text is still read against the task's own
    for topic, text in [("fees", f"It costs {fee}% a year."), ("lock_up", "There is no lock-up.")]:
        rollout, phi = told(topic, text)
        assert rollout.termination == "success" and phi == 1.0, rollout.outcome.reasons
        assert rollout.outcome.checks["hidden_variation"].passed
    for topic, text, problem in [("lock_up", "Thanks for your time.", "does not state that it has no lock-up"),
                                 ("fees", "It is free.", f"does not state its annual fee of {fee}%")]:
        rollout, phi = told(topic, text)
        assert rollout.termination == "failure" and phi == 0.0
        assert rollout.outcome.reasons == [f"the {topic.replace('_', ' ')} disclosure of {other} (call {len(calls)}) "
                                           f"{problem}"]
