"""Scripted, observation-only orchestrator: reads the sub-task ids from the goal, delegates them
all in one stage, then again whatever failed, and finishes. With probability `mistake_rate` per
opportunity it makes a realistic mistake: it delegates one sub-task per stage (correct, but the
critical path grows), finishes without delegating again what failed, or delegates again a
sub-task that had already succeeded."""

from __future__ import annotations

import re
from collections.abc import Generator

from gymfoundry.envs.delegation import MAX_ATTEMPTS
from gymfoundry.envs.scripted import ScriptedPolicy, tool_result

SUBTASK = re.compile(r"^- (S\d+) \(", re.M)


class ScriptedOrchestratorPolicy(ScriptedPolicy):
    policy_id = "scripted-orchestrator"
    max_turns = 30

    def _run(self, goal: str) -> Generator[str, str, None]:
        ids = SUBTASK.findall(goal)
        serial = self._mistake()
        pending, done, attempts = list(ids), [], {i: 0 for i in ids}
        while pending:
            stages = [[i] for i in pending] if serial else [pending]
            failed = []
            for stage in stages:
                if done and self._mistake():  # waste: a sub-task that already succeeded, again
                    stage = stage + [done[0]]
                obs = yield self._say(f"Delegating {', '.join(stage)}.", "delegate", {"subtasks": stage})
                for i in stage:
                    attempts[i] += 1
                result = tool_result(obs) or {}
                for r in result.get("results", []):
                    if r["verdict"] == "succeeded":
                        done.append(r["subtask"]) if r["subtask"] not in done else None
                    elif r["subtask"] not in failed:
                        failed.append(r["subtask"])
            pending = [i for i in failed if i not in done and attempts[i] < MAX_ATTEMPTS]
            if pending and self._mistake():  # gives up on the failures
                break
        yield self._final_call("done")

    def _final_call(self, reason: str) -> str:
        return self._say("Every sub-task is settled.", "finish", {"summary": f"finished ({reason})"})
