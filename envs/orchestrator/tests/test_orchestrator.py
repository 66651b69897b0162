"""The orchestrator family: sub-tasks are played by frozen sub-agents in parallel stages, a
verdict is each sub-task family's own, finishing with a failed sub-task or redoing a success
fails, replays reproduce every sub-agent's episode, and the stage layout gives the seed's
critical steps."""

import json

from gymfoundry.envs.delegation import MAX_ATTEMPTS
from gymfoundry.envs.orchestrator import FAMILY
from gymfoundry.envs.records import Delegation, DelegationStage, ToolCall
from gymfoundry.envs.wrappers import standard_stack


def play(task, calls, subagent=None):
    env = standard_stack(FAMILY.make(subagent=subagent) if subagent else FAMILY.make())
    ts = env.reset(task=task)
    for call in calls:
        ts = env.step(call)
    return env, ts


def retried(level):
    """A task whose reference delegates in more than one stage (some sub-agent failed first)."""
    return next(t for s in range(60) for t in [FAMILY.generate(s, level)]
                if sum(c.name == "delegate" for c in t.hidden.reference) > 1)


def delegate(*ids):
    return ToolCall(name="delegate", arguments={"subtasks": list(ids)})


FINISH = ToolCall(name="finish", arguments={"summary": "done"})


def test_seed_example_critical_and_serial_steps():
    d = Delegation(stages=[DelegationStage(main_steps=2, sub_steps=[3, 5]),
                           DelegationStage(main_steps=1, sub_steps=[4, 2])])
    assert (d.critical_steps, d.serial_steps, d.sub_agents) == (12, 17, 4)
    forged = Delegation(stages=d.stages, critical_steps=1, serial_steps=1)  # totals are computed, never given
    assert (forged.critical_steps, forged.serial_steps) == (12, 17)


def test_reference_succeeds_and_stage_results_carry_the_sub_verdicts():
    task = FAMILY.generate(1, 3)
    env, ts = play(task, task.hidden.reference)
    assert ts.terminated and ts.info["outcome"]["success"], ts.info["outcome"]["reasons"]
    stages = env.unwrapped.sub_episodes
    assert [[e.subtask_id for e in stage] for stage in stages] == [c.arguments["subtasks"] for c in
                                                                    task.hidden.reference if c.name == "delegate"]
    first = json.loads(env.steps[1].result)["result"]["results"]
    assert {r["subtask"] for r in first} == set(FAMILY.facts_of(task).subtasks)
    assert all(set(r) == {"subtask", "attempt", "ended", "steps", "policy", "last_call", "verdict"} for r in first)
    for stage in stages:  # every verdict shown is the sub-task family's own verifier's
        for e in stage:
            assert e.success == bool(e.outcome["success"]) and e.outcome["verifier_id"].startswith(e.task.family)


def test_finishing_with_a_failed_subtask_fails_naming_it():
    task = retried(3)
    first = task.hidden.reference[1]
    env, ts = play(task, [first, FINISH])
    failed = [e.subtask_id for e in env.unwrapped.sub_episodes[0] if not e.success]
    outcome = ts.info["outcome"]
    assert failed and not outcome["success"] and not outcome["completed"]
    assert [r for r in outcome["reasons"] if "did not succeed" in r] == [
        f"{s} did not succeed (its last attempt failed)" for s in failed]


def test_redelegating_a_success_is_a_violation():
    task = retried(2)
    env, _ = play(task, task.hidden.reference[:2])
    succeeded = next(e.subtask_id for e in env.unwrapped.sub_episodes[0] if e.success)
    calls = list(task.hidden.reference)
    retry = next(i for i, c in enumerate(calls) if c.name == "delegate" and i > 1)
    calls[retry] = delegate(*calls[retry].arguments["subtasks"], succeeded)
    env, ts = play(task, calls)
    outcome = ts.info["outcome"]
    assert not outcome["success"] and outcome["constraint_violation"]
    assert f"{succeeded} was delegated again in stage 2 after it had succeeded" in outcome["reasons"]


def test_bad_delegations_are_error_observations_and_change_nothing():
    task = FAMILY.generate(2, 2)
    env, _ = play(task, [])
    before = env.state()
    for ids in (["S9"], ["S1", "S1"], []):
        ts = env.step(delegate(*ids))
        assert json.loads(ts.observation)["ok"] is False and not ts.info.get("env_bug")
    after = env.state()
    assert [e["outcome"] for e in after.pop("events")] == ["invalid_arguments"] * 2  # the log keeps attempts
    before.pop("events")
    assert after == before and env.unwrapped.sub_episodes == []
    for _ in range(MAX_ATTEMPTS):
        env.step(delegate("S1"))
    ts = env.step(delegate("S1"))
    assert f"already delegated {MAX_ATTEMPTS} times" in json.loads(ts.observation)["error"]["message"]


def test_replay_reproduces_every_sub_agent_episode():
    task = FAMILY.generate(4, 4)
    env, ts = play(task, task.hidden.reference)
    again, _ = play(task, task.hidden.reference)
    one = [[(e.subtask_id, e.seed, [s.action_text for s in e.steps]) for e in st] for st in env.unwrapped.sub_episodes]
    two = [[(e.subtask_id, e.seed, [s.action_text for s in e.steps]) for e in st] for st in again.unwrapped.sub_episodes]
    assert one == two
    assert ts.info["outcome"]["checks"]["hidden_variation"]["passed"]


def test_a_custom_frozen_subagent_plays_and_is_recorded():
    from gymfoundry.envs.inventory.policy import ScriptedInventoryPolicy
    from gymfoundry.envs.advisory.policy import ScriptedAdvisoryPolicy

    def perfect(task, seed):  # another frozen policy: the families' scripted agents without mistakes
        cls = ScriptedInventoryPolicy if task.family == "inventory" else ScriptedAdvisoryPolicy
        return cls(mistake_rate=0.0, seed=seed)

    task = FAMILY.generate(5, 2)
    ids = FAMILY.facts_of(task).subtasks
    env, ts = play(task, [delegate(*ids), FINISH], subagent=perfect)
    versions = {e.policy_version for e in env.unwrapped.sub_episodes[0]}
    assert versions and all(v.endswith("+mistakes0") for v in versions)
    outcome = ts.info["outcome"]
    assert outcome["success"], outcome["reasons"]
    # the verifier replays only the default frozen sub-agents; another policy's episodes are not replayed
    assert outcome["checks"]["hidden_variation"]["reasons"] == [
        "not replayed: sub-agents other than the default frozen policy played this episode"]


def test_potential_rises_along_the_reference():
    task = FAMILY.generate(3, 5)
    env, _ = play(task, task.hidden.reference)
    phi = FAMILY.outcome_verifier.potentials(task, env.steps)
    assert phi[0] == 0.0 and phi[-1] == 1.0 and all(a <= b for a, b in zip(phi, phi[1:]))
