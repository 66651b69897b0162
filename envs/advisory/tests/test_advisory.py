"""The advisory family: facts are told only when asked, the verifier names a missing
disclosure, a prohibited claim, a recommendation before asking and a wrong "none", a broken gold
task is rejected with its reason, and no observation shows a private persona value."""

import json

import httpx
import pytest

from envs.advisory import FAMILY
from envs.advisory.policy import ScriptedAdvisoryPolicy
from envs.advisory.rules import TOPICS, prohibited_claims
from envs.check import check_family, play as replay
from envs.family import add
from envs.leaks import find_leaks
from envs.records import TaskSpec, ToolCall
from envs.registry import make, verifier_for
from envs.wrappers import standard_stack

add(FAMILY)  # a no-op once `import envs` found it


def task_where(predicate, levels=(1, 2, 3, 4, 5)):
    return next(t for seed in range(200) for level in levels
                if predicate(t := FAMILY.generate(seed, level), FAMILY.facts_of(t)))


def play(task, calls, env=None):
    env = env or make(FAMILY.env_id)
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


def test_passes_the_conformance_checks():
    report = check_family(FAMILY.name, seeds=2)
    assert report.ok, report.render()


def test_a_fact_is_never_disclosed_before_it_is_asked_for():
    task = task_where(lambda t, f: f.volunteered == "horizon" and f.profile.exclusions, levels=(4, 5))
    persona = FAMILY.facts_of(task).persona
    values = {t: persona.facts[t].value for t in TOPICS}
    env = make(FAMILY.env_id)
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
    # What the validate stage (tasks.validate.check_reference) asks of every task: the verifier's
    # precondition, then the reference replayed through the env and judged a success.
    verifier = verifier_for(FAMILY.env_id)
    assert verifier.precondition(good) is None and replay(FAMILY.env_id, good, good.hidden.reference).outcome.success
    episode = replay(FAMILY.env_id, broken, broken.hidden.reference)
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
            env = standard_stack(make(FAMILY.env_id))
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

    env = make(FAMILY.env_id, simulator="llm", base_url="http://sim.test/v1", model="m",
               transport=httpx.MockTransport(answer))
    env.reset(task)
    before = env.state()
    ts = env.step(respond("What is your risk tolerance?"))
    assert ts.info["env_fault"] and ts.info["error"]["kind"] == "env_fault" and not ts.done
    assert env.state() == before and private not in ts.observation
