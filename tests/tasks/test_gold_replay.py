"""Every kept task's gold replay succeeds: the validate stage rejects, with a reason, a task of a
person family whose reference does not succeed or whose facts contradict its own world."""

from __future__ import annotations

from gymfoundry import envs  # noqa: F401
from gymfoundry.envs.advisory import FAMILY as ADVISORY
from gymfoundry.envs.records import TaskSpec
from gymfoundry.tasks.stages.validate import validate_tasks


def rebuilt(task: TaskSpec, edit) -> TaskSpec:
    data = task.model_dump(mode="json")
    data["task_id"] = ""
    edit(data["hidden"])
    return TaskSpec.model_validate(data)


def test_advisory_gold_tasks_that_fail_are_rejected_with_their_reason():
    good = next(t for seed in range(20) for t in [ADVISORY.generate(seed, 3)] if ADVISORY.facts_of(t).suitable)
    product = good.hidden.reference[-1].arguments["product_id"]

    def drop_disclosure(hidden):
        hidden["reference"] = [c for c in hidden["reference"] if c["arguments"].get("topic") != "no_guarantee"]

    def none_suitable(hidden):
        hidden["checks"]["suitable"] = []

    broken, mislabelled = rebuilt(good, drop_disclosure), rebuilt(good, none_suitable)
    valid, rejected = validate_tasks([good, broken, mislabelled])
    assert [t.task_id for t in valid] == [good.task_id]
    reasons = {r.task_id: r.reason for r in rejected}
    assert reasons[broken.task_id] == f"reference fails its verifier: recommended {product} without disclosing its no guarantee"
    assert "the task says none suit(s), its catalog says" in reasons[mislabelled.task_id]


def test_every_generated_person_task_passes_validation():
    from gymfoundry.envs.conversation import FAMILY as CONVERSATION

    tasks = [family.generate(seed, level) for family in (ADVISORY, CONVERSATION) for level in family.levels
             for seed in range(3)]
    valid, rejected = validate_tasks(tasks)
    assert rejected == [] and len(valid) == len(tasks) == 30
