"""The fleet model: every health check, metric and log line is computed from the state, so a fix
really heals and a wrong fix really does not. Plain functions over `state["services"]`, shared by
the world (what the agent sees) and the verifier (what is true now and after a later period).

A service is `down` when one of its own checks fails, `degraded` when it is up but a dependency
is not healthy, else `healthy`. Its own checks:

- replicas: 0 replicas serve nothing;
- deploy: the running version is one that fails requests (`bad_versions`); a rollback fixes it;
- memory: resident memory over `memory_limit_mb`. A bounded cache costs a fixed amount; an
  unbounded one (`cache_max_entries: 0`) grows `LEAK_MB_H` per hour of uptime, so a restart clears
  it for a while and it comes back: the config is the cause;
- disk: logs plus datasets at or over `DISK_FULL` of the volume; logs grow every hour;
- credential: expired (`expires_h` at or before the fleet's clock `now_h`);
- queue: the message at the head of the consumer's queue is poison (it crash-loops on it);
- timeout: a request timeout (`timeout_ms`) below a dependency's latency: every call to it times out;
- pool: the connection pool (`pool_size` per replica) smaller than the connections it needs;
- connections: a database whose clients' pools add up to more than its `max_connections`.

Config edits are written to `config` and take effect when the service (re)starts (`running_config`)."""

from __future__ import annotations

import math
from typing import Any

LATER_H = 24  # the simulated later period the verifier checks after the episode
DISK_FULL = 0.95
LEAK_MB_H = 900  # growth of an unbounded cache per hour of uptime
ENTRY_MB = 0.002  # memory per entry of a bounded cache
NODE_MEMORY_MB = 4096  # the largest memory limit a service may be given
MAX_POOL = 500
LOG_GB_H = 0.05  # log growth per hour (x10 at log_level debug)
ROTATED_GB = 0.2  # what stays on disk after a rotation (the current file)
LOG_FLOOR_GB = 0.5  # logs at or below this: nothing to rotate
CONFIG_KEYS = {"memory_limit_mb": int, "cache_max_entries": int, "pool_size": int, "max_connections": int,
               "timeout_ms": int, "log_level": str}
LOG_LEVELS = ("debug", "info", "warn", "error")
CACHE_WARNING = "cache is unbounded"
# The own checks a service's metrics show failing (a bad deploy or a too-short timeout shows only
# as an error rate there, which names no cause).
METRIC_CHECKS = ("replicas", "memory", "disk", "credential", "queue", "pool", "connections")


def memory_mb(svc: dict[str, Any]) -> int:
    entries = svc["running_config"]["cache_max_entries"]
    if entries == 0:
        return svc["baseline_mb"] + LEAK_MB_H * svc["uptime_h"]
    return svc["baseline_mb"] + round(entries * ENTRY_MB)


def disk_used_gb(svc: dict[str, Any]) -> float:
    disk = svc["disk"]
    return round(disk["logs_gb"] + sum(disk["datasets"].values()), 3)


def pool_capacity(svc: dict[str, Any]) -> int:
    return svc["running_config"].get("pool_size", 0) * svc["replicas"]


def db_connections(services: dict[str, dict], db: str) -> int:
    return sum(pool_capacity(s) for s in services.values() if db in s["deps"] and "pool_size" in s["running_config"])


def own_problems(state: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """(check, what fails) for each of the service's own failing checks."""
    svc = state["services"][name]
    out = []
    if svc["replicas"] == 0:
        out.append(("replicas", "scaled to 0 replicas: nothing serves requests"))
    if svc["version"] in svc["bad_versions"]:
        out.append(("deploy", f"version {svc['version']} fails requests since its deploy"))
    mem, limit = memory_mb(svc), svc["running_config"]["memory_limit_mb"]
    if mem > limit:
        out.append(("memory", f"out of memory: {mem} MB resident, limit {limit} MB"))
    used, size = disk_used_gb(svc), svc["disk"]["size_gb"]
    if used >= DISK_FULL * size:
        out.append(("disk", f"no space left on device: {used:g} of {size} GB used"))
    if svc["credential"]["expires_h"] <= state["now_h"]:
        out.append(("credential", f"credential {svc['credential']['id']} expired"))
    queue = svc["queue"]
    if queue and queue["poison"]:
        out.append(("queue", f"cannot process the message at the head of queue {queue['name']}"))
    slow = [d for d in svc["deps"] if state["services"][d]["latency_ms"] > svc["running_config"]["timeout_ms"]]
    if slow:
        out.append(("timeout", f"requests to {slow[0]} time out: timeout_ms {svc['running_config']['timeout_ms']} "
                               f"is below its {state['services'][slow[0]]['latency_ms']}ms latency"))
    need = svc["demand_conns"]
    if need and pool_capacity(svc) < need:
        out.append(("pool", f"connection pool exhausted: {pool_capacity(svc)} connections, {need} needed"))
    if "max_connections" in svc["running_config"]:
        used_conns, cap = db_connections(state["services"], name), svc["running_config"]["max_connections"]
        if used_conns > cap:
            out.append(("connections", f"too many connections: clients hold {used_conns}, max {cap}"))
    return out


def statuses(state: dict[str, Any]) -> dict[str, str]:
    """Every service's status: down (own check fails), degraded (a dependency is not healthy), healthy."""
    out: dict[str, str] = {}

    def status(name: str) -> str:
        if name not in out:
            out[name] = "down"  # a guard against cycles; generated fleets are acyclic
            if own_problems(state, name):
                out[name] = "down"
            else:
                deps = state["services"][name]["deps"]
                out[name] = "degraded" if any(status(d) != "healthy" for d in deps) else "healthy"
        return out[name]

    for name in state["services"]:
        status(name)
    return {name: out[name] for name in state["services"]}


def later(state: dict[str, Any], hours: int = LATER_H) -> dict[str, Any]:
    """The fleet `hours` later, if nobody touches it: the clock, uptimes and logs advance."""
    services = {}
    for name, svc in state["services"].items():
        rate = LOG_GB_H * (10 if svc["running_config"]["log_level"] == "debug" else 1)
        disk = {**svc["disk"], "logs_gb": round(svc["disk"]["logs_gb"] + rate * hours, 3)}
        services[name] = {**svc, "uptime_h": svc["uptime_h"] + hours, "disk": disk}
    return {**state, "services": services, "now_h": state["now_h"] + hours}


def needed_pool_size(svc: dict[str, Any]) -> int:
    return math.ceil(svc["demand_conns"] / max(1, svc["replicas"]))


def metrics(state: dict[str, Any], name: str, status: str) -> dict[str, Any]:
    svc = state["services"][name]
    problems = {check for check, _ in own_problems(state, name)}
    error_rate = 100.0 if problems - {"deploy", "pool"} else 41.7 if "deploy" in problems else \
        23.5 if "pool" in problems else 12.0 if status == "degraded" else 0.2
    out = {"service": name, "status": status, "replicas": svc["replicas"], "error_rate_pct": error_rate,
           "p99_latency_ms": svc["latency_ms"] * (8 if status != "healthy" else 1), "cpu_pct": svc["cpu_pct"],
           "memory_mb": memory_mb(svc), "memory_limit_mb": svc["running_config"]["memory_limit_mb"],
           "disk_used_gb": disk_used_gb(svc), "disk_size_gb": svc["disk"]["size_gb"],
           "disk_used_pct": round(100 * disk_used_gb(svc) / svc["disk"]["size_gb"], 1),
           "logs_gb": svc["disk"]["logs_gb"], "datasets_gb": dict(sorted(svc["disk"]["datasets"].items())),
           "credential_expires_in_h": svc["credential"]["expires_h"] - state["now_h"]}
    if "pool_size" in svc["running_config"]:
        capacity = pool_capacity(svc)
        out["pool"] = {"size_per_replica": svc["running_config"]["pool_size"], "capacity": capacity,
                       "in_use": min(capacity, svc["demand_conns"]),
                       "waiting": max(0, svc["demand_conns"] - capacity)}
    if "max_connections" in svc["running_config"]:
        out["connections"] = {"held_by_clients": db_connections(state["services"], name),
                              "max_connections": svc["running_config"]["max_connections"]}
    if svc["queue"]:
        queue = svc["queue"]
        out["queue"] = {"name": queue["name"], "depth": queue["depth"],
                        "drain_per_min": 0 if queue["poison"] else queue["drain_per_min"]}
    return out


# -- what a read showed: recorded in its event, the evidence a fix is judged by ----------------
def shown_in_logs(state: dict[str, Any], name: str, lines: list[str]) -> list[str]:
    """The failing own checks that these log lines of the service (as returned: filtered, cut)
    show, and `cache` where they show its cache unbounded."""
    shown = {check for check, text in own_problems(state, name) if any(text in line for line in lines)}
    if any(CACHE_WARNING in line for line in lines):
        shown.add("cache")
    return sorted(shown)


def shown_in_metrics(state: dict[str, Any], name: str) -> list[str]:
    return sorted(check for check, _ in own_problems(state, name) if check in METRIC_CHECKS)


def shown_in_config(svc: dict[str, Any]) -> list[str]:
    return ["cache"] if svc["config"]["cache_max_entries"] == 0 else []


def render_config(svc: dict[str, Any]) -> str:
    """The service's config file as YAML, with the credential's secret never shown."""
    lines = [f"# {svc['name']} (read at start; restart to apply edits)"]
    for key, value in svc["config"].items():
        note = "  # 0 = unbounded" if key == "cache_max_entries" else ""
        lines.append(f"{key}: {value}{note}")
    lines.append(f"credential: {svc['credential']['id']}  # secret redacted")
    lines.append("dependencies: [" + ", ".join(svc["deps"]) + "]")
    return "\n".join(lines)


# -- logs, made from the state on each read (nothing stored) -------------------------------------
NOISE = ["WARN deprecated config key 'legacy_mode' ignored", "INFO gc pause 41ms", "WARN slow request 1.9s /health",
         "INFO cache warmup complete", "WARN retrying DNS lookup (1/3)", "INFO metrics flushed",
         "WARN client closed connection early", "INFO rebalanced worker threads"]


def log_lines(state: dict[str, Any], name: str, status_map: dict[str, str]) -> list[str]:
    """The service's recent log lines, oldest first: routine lines, noise (when the task is noisy),
    then what its checks and its dependencies say, then what was done to it."""
    svc, status = state["services"][name], status_map[name]
    seed = svc["log_seed"]
    lines = [f"INFO served {(seed * 7 + i * 13) % 900 + 100} requests" for i in range(4)]
    for i in range(state["noise"]):
        lines.append(NOISE[(seed + i * 3) % len(NOISE)])
    lines += svc["herring_logs"]
    if svc["running_config"]["cache_max_entries"] == 0:
        lines.append(f"WARN {CACHE_WARNING} (cache_max_entries: 0): heap at {memory_mb(svc)} MB and growing "
                     f"~{LEAK_MB_H} MB/h")
    for check, text in own_problems(state, name):
        lines += _problem_lines(state, svc, check, text)
    if status != "down":
        for dep in svc["deps"]:
            if status_map[dep] == "down":
                lines.append(f"ERROR upstream {dep} failed: 503 Service Unavailable")
            elif status_map[dep] == "degraded":
                lines.append(f"ERROR upstream {dep} failed: timeout after {svc['running_config']['timeout_ms']}ms")
    lines += svc["history"]
    return [f"{_stamp(state, i)} {line}" for i, line in enumerate(lines)]


def _problem_lines(state: dict[str, Any], svc: dict[str, Any], check: str, text: str) -> list[str]:
    if check == "deploy":
        return [f"ERROR panic: nil pointer dereference in handler (version {svc['version']})",
                f"ERROR {text}; previous version {svc['previous_version']}"]
    if check == "credential":
        cred = svc["credential"]
        return [f"ERROR 401 Unauthorized: {text} {state['now_h'] - cred['expires_h']}h ago; requests to "
                f"{', '.join(svc['deps']) or 'peers'} rejected"]
    if check == "queue":
        queue = svc["queue"]
        return [f"ERROR {text}: malformed payload at offset {queue['poison_offset']} (poison message); "
                "consumer crash-looping", f"WARN queue {queue['name']} depth {queue['depth']}, not draining"]
    return [f"ERROR {text}"]


def _stamp(state: dict[str, Any], i: int) -> str:
    hour = state["now_h"] % 24
    return f"2026-12-01T{hour:02d}:{(i * 3) % 60:02d}:{(i * 17) % 60:02d}Z"
