"""The orchestrator world: a bundle of whole sub-tasks of other families that must all succeed.
The main agent does none of them itself: it delegates them (`delegate`, up to MAX_PARALLEL in one
stage, played in parallel by frozen sub-agents, a barrier after the stage), reads what came back,
delegates again what failed, and finishes. Its skill is the split and the closing, measured in
critical steps (envs.records.Delegation); a sub-task delegated again after it succeeded is waste,
which the verifier reports as a violation (a reward that grows with the number of sub-agents alone
invites spawning them).

The sub-agents' episodes are kept in `self.sub_episodes` (one list per stage) for the runtime,
which lands them as sub-rollouts; the state keeps their summaries and hidden verdicts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from gymfoundry.envs.base import ToolEnv, ToolError
from gymfoundry.envs.delegation import MAX_ATTEMPTS, MAX_PARALLEL, SubAgentFactory, SubEpisode, delegate_stage, new_delegations
from gymfoundry.envs.errors import ErrorKind
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.tools import tool

SubtaskId = Annotated[str, Field(min_length=1, max_length=16, description="a sub-task id, e.g. S2")]


class OrchestratorEnv(ToolEnv):
    family = "orchestrator"
    profile_yaml = Path(__file__).with_name("profile.yaml")

    def __init__(self, outcome_fn=None, level: int = 2, subagent: SubAgentFactory | None = None):
        """`subagent(task, seed)` makes the frozen policy that plays a sub-task (default: that
        family's scripted policy, envs.delegation.scripted_subagent)."""
        super().__init__(outcome_fn=outcome_fn, level=level)
        self.subagent = subagent
        self.sub_episodes: list[list[SubEpisode]] = []

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        subtasks = task.initial_state["subtasks"]
        if not isinstance(subtasks, dict) or not subtasks:
            raise ValueError("initial_state.subtasks must map sub-task ids to tasks")
        self.sub_episodes = []
        return {"subtasks": copy.deepcopy(subtasks), "order": list(task.initial_state["order"]),
                "seed_key": str(task.initial_state["seed_key"]),
                "delegations": new_delegations(), "finished": None, "events": []}

    def is_finished(self, state: dict[str, Any]) -> bool:
        return state["finished"] is not None

    def event_fields(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"stage": len(state["delegations"]["stages"])}

    @tool(ToolCategory.read)
    def tool_list_subtasks(self, state):
        """The sub-tasks: family, goal's first line, delegations so far and the last verdict."""
        last = {}
        for stage in state["delegations"]["stages"]:
            for result in stage:
                last[result["subtask"]] = result["verdict"]
        return {"subtasks": [{"id": i, "family": state["subtasks"][i]["family"],
                              "goal": _headline(state["subtasks"][i]["goal"]),
                              "delegated": state["delegations"]["attempts"].get(i, 0),
                              "last_verdict": last.get(i)} for i in state["order"]]}

    @tool(ToolCategory.write, hint=f"up to {MAX_PARALLEL} ids; they run in parallel, the call returns when all end")
    def tool_delegate(self, state, subtasks: Annotated[list[SubtaskId], Field(min_length=1, max_length=MAX_PARALLEL)]):
        """Hand sub-tasks to sub-agents, one stage: each plays its sub-task from a clean state."""
        try:
            episodes = delegate_stage(state["seed_key"], state["delegations"], state["subtasks"], list(subtasks),
                                      self.subagent)
        except ValueError as exc:
            raise ToolError(ErrorKind.invalid_arguments, str(exc)) from None
        self.sub_episodes.append(episodes)
        return {"stage": len(state["delegations"]["stages"]), "results": [e.summary() for e in episodes]}

    @tool(ToolCategory.irreversible)
    def tool_finish(self, state, summary: Annotated[str, Field(min_length=1, max_length=1000)]):
        """End the episode once every sub-task has succeeded (or cannot)."""
        state["finished"] = {"summary": summary, "stage": len(state["delegations"]["stages"])}
        return {"finished": True}


def _headline(goal: str) -> str:
    line = next((ln.strip() for ln in goal.splitlines() if ln.strip() and not ln.startswith("#")), "")
    return line[:160]


__all__ = ["MAX_ATTEMPTS", "OrchestratorEnv"]
