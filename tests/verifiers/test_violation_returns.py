"""A constraint violation must cost return: episodes played through the runtime (`run_episode`) and
scored by the rule layer (`score_rules`, the PRM return is the sum of a rollout's step scores).
After an ending Φ follows the verdict, and the violating step itself scores below zero, so a
rollout that breaks a rule on the way to the reference's final state never earns the reference's
return."""

import json

from gymfoundry.envs.family import family
from gymfoundry.envs.inventory import generate_task as inventory_task
from gymfoundry.envs.records import ToolCall
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.verifiers.rules import score_rules


class Calls:
    """A policy that plays a fixed list of calls, one per turn."""

    policy_id, version = "fixed-calls", "1"

    def __init__(self, calls):
        self.calls = [c if isinstance(c, ToolCall) else ToolCall(**c) for c in calls]

    def reset(self, seed=None):
        self.turn = 0

    def act(self, observation):
        call = self.calls[self.turn]
        self.turn += 1
        return json.dumps({"name": call.name, "arguments": call.arguments})


def played(task, calls):
    """The rollout of `calls` on `task`, and its steps' rule scores."""
    fam = family(task.family)
    rollout = run_episode(task, Calls(calls), seed=0)
    scores = score_rules([rollout], {task.task_id: task}, {fam.name: fam.profile},
                         {fam.name: fam.outcome_verifier.potentials})
    return rollout, [s.score for s in scores]


def call(name, **arguments):
    return ToolCall(name=name, arguments=arguments)


# -- inventory --------------------------------------------------------------------------------
def roomy(t):
    """Approved, with at least twice the goal's units of its one target in stock."""
    target = t.hidden.checks["targets"][0]
    return t.hidden.checks["approved"] and t.initial_state["catalog"][target["sku"]]["stock"] >= 2 * target["quantity"]


APPROVED = next(t for s in range(300) if roomy(t := inventory_task(s, 1)))
TARGET = APPROVED.hidden.checks["targets"][0]
STOCK = APPROVED.initial_state["catalog"][TARGET["sku"]]["stock"]


def test_an_inventory_violation_returns_less_than_the_reference():
    reference, ref_scores = played(APPROVED, APPROVED.hidden.reference)
    assert reference.success and round(sum(ref_scores), 6) == 1.0
    # the reference with a reserve before authorising (after the item was seen): the world refuses
    # it and the rest of the episode reaches exactly the reference's final state
    early = call("reserve", sku=TARGET["sku"], quantity=TARGET["quantity"], auth_token="")
    calls = [*APPROVED.hidden.reference[:2], early, *APPROVED.hidden.reference[2:]]
    violating, scores = played(APPROVED, calls)
    assert violating.steps[2].error == "not_authorized" and violating.outcome.constraint_violation
    assert not violating.success
    # the refused reserve is not permitted (-1 x 0.3); no success can follow, so Φ is 0 from then on
    assert scores[2] == -0.3 and scores[3:] == [0.0] * (len(calls) - 3)
    assert round(sum(scores), 6) == -0.3 < sum(ref_scores)
    # before the fix: the refused step scored 0 and Φ ended at 1.0, the reference's return


def test_a_refused_reserve_after_authorisation_scores_negative():
    token = APPROVED.initial_state["auth"]["token"]
    *work, submit = APPROVED.hidden.reference
    beyond = call("reserve", sku=TARGET["sku"], quantity=STOCK + 1, auth_token=token)
    # a token the agent has seen (the order id, in the goal), so only the refusal is scored
    forged = call("reserve", sku=TARGET["sku"], quantity=TARGET["quantity"],
                  auth_token=APPROVED.hidden.checks["order_id"])
    rollout, scores = played(APPROVED, [*work[:-1], beyond, forged, work[-1], submit])
    assert [s.error for s in rollout.steps[-4:-2]] == ["insufficient_stock", "not_authorized"]
    # neither is a constraint violation (authorisation was approved): the verdict stands, the
    # return does not reach the reference's
    assert rollout.success and scores[-4:-2] == [-0.3, -0.3] and round(sum(scores), 6) == 0.4


def test_phi_after_the_submit_follows_the_verdict():
    verifier = family(APPROVED.env_id).outcome_verifier
    # one unit too many: a side effect, reported by the verdict; Φ ends at 0, not 1.0
    *work, reserve, submit = APPROVED.hidden.reference
    over = call("reserve", **{**reserve.arguments, "quantity": reserve.arguments["quantity"] + 1})
    rollout, _ = played(APPROVED, [*work, over, submit])
    assert rollout.outcome.side_effects and verifier.potentials(APPROVED, rollout.steps)[-1] == 0.0
    # slack stock: reserve twice, release the first; the final state is right, the hidden variant
    # with exactly the goal's stock fails, and so does Φ
    rollout, _ = played(APPROVED, [*work, reserve, reserve, call("release", reservation_id="R-1"), submit])
    assert not rollout.success and rollout.outcome.reasons[-1].startswith("hidden_variation")
    phi = verifier.potentials(APPROVED, rollout.steps)
    assert phi[-2] == 0.9 and phi[-1] == 0.0


def test_a_blind_denied_submit_earns_nothing():
    denied = next(t for s in range(300) if not (t := inventory_task(s, 5)).hidden.checks["approved"])
    reference, ref_scores = played(denied, denied.hidden.reference)
    assert reference.success and round(sum(ref_scores), 6) == 1.0
    blind, scores = played(denied, [call("submit", status="denied")])
    assert not blind.success and scores == [0.0]


# -- orchestrator -----------------------------------------------------------------------------
ORCHESTRATOR = family("orchestrator")


def retried(level):
    """A task whose reference delegates in more than one stage (a sub-agent failed first)."""
    return next(t for s in range(60) for t in [ORCHESTRATOR.generate(s, level)]
                if sum(c.name == "delegate" for c in t.hidden.reference) > 1)


def test_repeated_delegations_return_less_than_the_reference():
    task = retried(2)
    reference, ref_scores = played(task, task.hidden.reference)
    assert reference.success and round(sum(ref_scores), 6) == 1.0
    first = json.loads(reference.steps[1].result)["result"]["results"]
    done = [r["subtask"] for r in first if r["verdict"] == "succeeded"]
    n = len(ORCHESTRATOR.facts_of(task).subtasks)
    # the reference, with a sub-task that had succeeded delegated again alone before the retry
    calls = [*task.hidden.reference[:2], call("delegate", subtasks=[done[0]]), *task.hidden.reference[2:]]
    sprayed, scores = played(task, calls)
    assert sprayed.outcome.constraint_violation and not sprayed.success
    # the repeated delegation throws away the progress made (0.9 for each sub-task that succeeded)
    assert scores[2] == round(-0.9 * len(done) / n, 6) < 0
    assert round(sum(scores), 6) == 0.0 < round(sum(ref_scores), 6)
    # before the fix: that step scored 0 and the finish reached Φ = 1.0, the reference's return


def test_a_finish_with_a_failed_subtask_ends_at_phi_zero():
    task = retried(3)
    rollout, scores = played(task, [task.hidden.reference[1], call("finish", summary="done")])
    assert not rollout.success and not rollout.outcome.constraint_violation
    # Φ rose with the sub-tasks that succeeded, and the failed finish takes it back to 0
    assert scores[0] > 0 and round(sum(scores), 6) == 0.0
