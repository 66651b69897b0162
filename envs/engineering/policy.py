"""Scripted, observation-only on-call engineer for the engineering family.

It reads the goal and the tool results it is shown, nothing else: lists the fleet, walks from the
symptom down the failing dependencies to the services that are down on their own, reads their
logs and fixes what the error lines say (roll back a bad deploy, bound an unbounded cache and
restart, size an exhausted pool and restart, rotate logs or delete an old snapshot with approval,
rotate an expired credential or drop a poisoned queue with approval), looks at the fleet again
and resolves. With probability `mistake_rate` per opportunity it makes a realistic mistake:

- restarts a down service instead of fixing it (an unbounded cache then looks healthy and
  relapses later: the verifier's hidden later period fails it);
- restarts the symptom, downstream of the cause, and resolves (fails: the cause is upstream);
- turns on debug logging on a healthy, unrelated service "for more detail" (collateral change);
- calls an irreversible tool before asking for approval (refused by the runtime: permission_denied,
  then it asks and recovers);
- asks to delete an old snapshot when the full disk has logs to rotate (denied, then it rotates)."""

from __future__ import annotations

import math
import re
from collections.abc import Generator

from gymfoundry.envs.scripted import ScriptedPolicy, tool_result as _result

SYMPTOM = re.compile(r"Users report errors from ([a-z0-9-]+)\.")
MAX_ROUNDS = 3


class ScriptedEngineeringPolicy(ScriptedPolicy):
    policy_id = "scripted-engineering"
    script_version = "1"
    max_turns = 60
    MISTAKES = ("restart_instead", "restart_symptom", "debug_elsewhere", "unapproved_irreversible",
                "delete_instead_of_rotate")

    def __init__(self, mistake_rate: float = 0.3, seed: int = 0, only: tuple[str, ...] | None = None):
        """`only`: make exactly these mistakes at every opportunity and no other (targeted failures)."""
        unknown = set(only or ()) - set(self.MISTAKES)
        if unknown:
            raise ValueError(f"unknown mistakes {sorted(unknown)}; known: {', '.join(self.MISTAKES)}")
        self.only = None if only is None else tuple(only)
        super().__init__(mistake_rate=mistake_rate, seed=seed)
        if only is not None:
            self.version += "+only" + ",".join(sorted(only))

    def _slip(self, mistake: str) -> bool:
        return mistake in self.only if self.only is not None else self._mistake()

    def _final_call(self, reason: str) -> str:
        return self._say(f"Closing the incident ({reason}).", "resolve", {"summary": f"Closing: {reason}."})

    def _run(self, goal: str) -> Generator[str, str, None]:
        found = SYMPTOM.search(goal)
        if found is None:
            yield self._say("I cannot read the goal.", "resolve", {"summary": "unreadable goal"})
            return
        symptom = found.group(1)
        listing = yield from self._list("See the state of the fleet.")
        fixed: list[str] = []
        restarted: set[str] = set()
        for _ in range(MAX_ROUNDS):
            if all(s == "healthy" for s in listing.values()):
                break
            down = yield from self._walk(symptom, listing)
            if listing.get(symptom) == "degraded" and symptom not in down and self._slip("restart_symptom"):
                yield self._say(f"{symptom} is the one users see; restart it.", "restart", {"service": symptom})
                yield self._say("Restarted; that should do it.", "resolve", {"summary": f"Restarted {symptom}."})
                return
            if not fixed and not restarted and self._slip("debug_elsewhere"):
                yield from self._debug_elsewhere(listing, down + [symptom])
            for service in down:
                if self._slip("restart_instead") and service not in restarted:
                    restarted.add(service)
                    yield self._say(f"{service} is down; a restart usually clears it.", "restart",
                                    {"service": service})
                    continue
                what = yield from self._fix(service)
                if what:
                    fixed.append(what)
            listing = yield from self._list("Check the fleet after the changes.")
        summary = "; ".join(fixed) or "no root cause found"
        yield self._say("Resolve the incident.", "resolve", {"summary": f"Root cause: {summary}."})

    def _list(self, thought: str) -> Generator[str, str, dict[str, str]]:
        obs = yield self._say(thought, "list_services", {})
        services = (_result(obs) or {}).get("services", [])
        return {s["service"]: s["status"] for s in services if isinstance(s, dict) and "service" in s}

    def _walk(self, symptom: str, listing: dict[str, str]) -> Generator[str, str, list[str]]:
        """The down services reachable from the symptom through failing dependencies."""
        down, todo, seen = [], [symptom], set()
        while todo:
            name = todo.pop(0)
            if name in seen:
                continue
            seen.add(name)
            obs = yield self._say(f"Inspect {name}.", "inspect_service", {"service": name})
            info = _result(obs) or {}
            if info.get("status") == "down":
                down.append(name)
            todo += [d for d, s in sorted((info.get("dependencies") or {}).items()) if s != "healthy"]
        return down

    def _debug_elsewhere(self, listing: dict[str, str], mine: list[str]) -> Generator[str, str, None]:
        healthy = sorted(n for n, s in listing.items() if s == "healthy" and n not in mine)
        if healthy:
            name = self.rng.choice(healthy)
            yield self._say(f"Turn on debug logging on {name} for more detail.", "edit_config",
                            {"service": name, "key": "log_level", "value": "debug"})

    def _fix(self, service: str) -> Generator[str, str, str | None]:
        obs = yield self._say(f"Read the logs of {service}.", "read_logs", {"service": service, "filter": "ERROR"})
        text = " ".join((_result(obs) or {}).get("lines", []))
        if "since its deploy" in text:
            yield self._say(f"A bad deploy on {service}; roll it back.", "rollback", {"service": service})
            return f"bad deploy on {service}, rolled back"
        if "out of memory" in text:
            yield self._say(f"{service} runs out of memory; check its cache settings.", "read_config",
                            {"service": service})
            yield self._say("The cache is unbounded; bound it.", "edit_config",
                            {"service": service, "key": "cache_max_entries", "value": "50000"})
            yield self._say(f"Restart {service} to apply it.", "restart", {"service": service})
            return f"unbounded cache on {service}, bounded"
        if "time out: timeout_ms" in text:
            yield self._say(f"{service}'s requests time out; check its timeout.", "read_config", {"service": service})
            yield self._say("The timeout is far below the dependency's latency; set it to 1000ms.", "edit_config",
                            {"service": service, "key": "timeout_ms", "value": "1000"})
            yield self._say(f"Restart {service} to apply it.", "restart", {"service": service})
            return f"timeout of {service} below its dependency's latency, raised"
        if "pool exhausted" in text:
            metrics = yield from self._metrics(service)
            pool = metrics.get("pool") or {}
            need = pool.get("in_use", 0) + pool.get("waiting", 0)
            size = math.ceil(need / max(1, metrics.get("replicas", 1)))
            yield self._say(f"{need} connections needed; pool_size {size} per replica.", "edit_config",
                            {"service": service, "key": "pool_size", "value": str(size)})
            yield self._say(f"Restart {service} to apply it.", "restart", {"service": service})
            return f"connection pool of {service} too small, resized"
        if "no space left" in text:
            return (yield from self._free_disk(service))
        if "401 Unauthorized" in text:
            yield from self._irreversible(service, "rotate_credentials", f"{service}'s credential expired (401s)")
            return f"expired credential on {service}, rotated"
        if "poison message" in text:
            yield from self._irreversible(service, "drop_queue", f"{service} crash-loops on a poison message")
            return f"poison message in the queue of {service}, dropped"
        return None

    def _metrics(self, service: str) -> Generator[str, str, dict]:
        obs = yield self._say(f"Metrics of {service}.", "get_metrics", {"service": service})
        return _result(obs) or {}

    def _free_disk(self, service: str) -> Generator[str, str, str]:
        metrics = yield from self._metrics(service)
        snapshots = sorted(d for d in (metrics.get("datasets_gb") or {}) if d != "primary")
        if metrics.get("logs_gb", 0) > 0.5 and not (snapshots and self._slip("delete_instead_of_rotate")):
            yield self._say(f"Rotate the logs of {service}.", "rotate_logs", {"service": service})
            return f"disk of {service} full of logs, rotated"
        if not snapshots:
            return f"disk of {service} full, nothing to delete"
        dataset = snapshots[0]
        obs = yield from self._irreversible(service, "delete_data", f"{service}'s disk is full; {dataset} is old",
                                            dataset=dataset)
        if _result(obs) is None and metrics.get("logs_gb", 0) > 0.5:  # denied: there were logs to rotate
            yield self._say(f"Rotate the logs of {service} instead.", "rotate_logs", {"service": service})
            return f"disk of {service} full of logs, rotated"
        return f"disk of {service} full, old snapshot deleted"

    def _irreversible(self, service: str, action: str, reason: str,
                      dataset: str | None = None) -> Generator[str, str, str]:
        args = {"service": service, **({"dataset": dataset} if dataset else {})}
        if self._slip("unapproved_irreversible"):  # straight to the irreversible call; the runtime refuses it
            yield self._say(f"{reason}: {action} now.", action, args)
        obs = yield self._say(f"Ask for approval: {reason}.", "request_approval",
                              {"action": action, "reason": reason, **args})
        if _result(obs) is None:
            return obs
        return (yield self._say(f"Approved; {action} on {service}.", action, args))
