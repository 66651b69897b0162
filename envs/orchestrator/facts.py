"""What an orchestrator task's generator tells its verifier (`task.hidden.checks`), typed."""

from __future__ import annotations

from gymfoundry.envs.family import HiddenFacts


class OrchestratorFacts(HiddenFacts):
    subtasks: list[str]  # the sub-task ids, in the order the goal lists them
    families: list[str]  # each sub-task's family, in the same order
    max_attempts: int  # delegations allowed per sub-task
