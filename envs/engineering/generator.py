"""Seeded engineering tasks: a fleet with an injected incident, its reference fix and typed facts.

`generate(family, seed, level)` is a pure function of (seed, level, GENERATOR_VERSION). Knobs by
level 1..5: fleet size (4..12 services), depth from the symptom to the cause (0 at level 1, up to
3 hops at level 5), noisy log lines per service, red herrings (healthy services that look
suspicious: a big draining queue, a hot CPU, a disk at 82%, a retried error) and the chance of a
second root cause on another branch. The causes: a bad config value (an unbounded cache: a
restart hides it for a while; or a request timeout below a dependency's latency), a bad deploy (roll back), an exhausted connection pool (within
what the database allows), a full disk (logs to rotate, or else an old snapshot to delete with
approval), expired credentials (rotate, with approval) and a poison message at the head of a
consumer's queue (drop it, with approval)."""

from __future__ import annotations

import math
import random
from typing import Any

from gymfoundry.envs.family import Family
from gymfoundry.envs.records import TaskSpec, ToolCall

from . import fleet
from .facts import Cause, EngineeringFacts

GENERATOR_VERSION = "1"

FLEET_SIZE = {1: 4, 2: 5, 3: 7, 4: 9, 5: 12}
DEPTHS = {1: (0,), 2: (0, 1), 3: (1, 2), 4: (1, 2), 5: (2, 3)}
NOISE = {1: 0, 2: 2, 3: 4, 4: 6, 5: 10}
HERRINGS = {1: 0, 2: 0, 3: 1, 4: 1, 5: 2}
TWO_CAUSES = {1: 0.0, 2: 0.0, 3: 0.15, 4: 0.35, 5: 0.6}
KINDS = ("bad_config", "bad_timeout", "bad_deploy", "pool_exhausted", "disk_full", "expired_credentials", "poison_queue")
NAMES = ["gateway", "web", "api", "orders", "payments", "billing", "inventory", "search", "catalog", "notifications",
         "ledger", "shipping", "profiles", "sessions", "reports", "pricing"]
DB = "db-main"
FIXED_CACHE = 50_000  # the reference's bounded cache


def generate(family: Family, seed: int, level: int) -> TaskSpec:
    rng = family.rng(seed, level)
    now = rng.randint(500, 5000)
    depth = rng.choice(DEPTHS[level])
    names = rng.sample(NAMES, FLEET_SIZE[level] - 1)
    chain, others = names[:depth + 1], names[depth + 1:]
    services = {n: _service(rng, n, now) for n in names}
    services[DB] = _service(rng, DB, now)
    for a, b in zip(chain, chain[1:]):
        services[a]["deps"].append(b)
    kinds = rng.sample(KINDS, 2 if rng.random() < TWO_CAUSES[level] else 1)
    causes = [Cause(service=chain[-1], kind=kinds[0], depth=depth, path=chain)]
    if len(kinds) == 2:
        at = rng.randrange(len(chain))
        second = others.pop(0)
        services[chain[at]]["deps"].append(second)
        causes.append(Cause(service=second, kind=kinds[1], depth=at + 1, path=chain[:at + 1] + [second]))
    _wire(rng, services, chain, others, {c.service for c in causes})
    for cause in causes:
        _inject(rng, services, cause.service, cause.kind, now)
    _size_database(rng, services)
    herrings = sorted(rng.sample(others, min(HERRINGS[level], len(others))))
    for name in herrings:
        _herring(rng, services[name])
    state = {"services": dict(sorted(services.items())), "now_h": now, "noise": NOISE[level]}
    involved = sorted({n for c in causes for n in c.path})
    facts = EngineeringFacts(symptom=chain[0], causes=causes, involved=involved, herrings=herrings)
    reference = _reference(state, causes)
    features = {"n_services": float(len(services)), "depth": float(max(c.depth for c in causes)),
                "n_causes": float(len(causes)), "noise": float(NOISE[level]), "n_herrings": float(len(herrings)),
                "needs_approval": float(any(c.name in ("delete_data", "drop_queue", "rotate_credentials")
                                            for c in reference))}
    return family.task(seed=seed, level=level, goal=_goal(chain[0], len(services)), initial_state=state,
                       template_id=family.template_id(sorted((c.kind, c.depth) for c in causes), len(services)),
                       reference=reference, facts=facts, max_steps=2 * len(reference) + 20, features=features,
                       secrets=[s["credential"]["secret"] for s in services.values()])


def _goal(symptom: str, n: int) -> str:
    return "\n".join([
        f"You are on call for a fleet of {n} services. Users report errors from {symptom}.",
        "Find the root cause (there may be more than one, and it may be upstream of the symptom), fix it so that "
        "the fleet is healthy and stays healthy, change nothing unrelated, then resolve the incident with a summary.",
        "Config edits take effect when the service restarts. delete_data, drop_queue and rotate_credentials are "
        "irreversible: they are refused unless request_approval(action, service, reason) was granted for exactly "
        "that call first, and the approver grants only what the evidence warrants."])


def _service(rng: random.Random, name: str, now: int) -> dict[str, Any]:
    major, minor = rng.randint(1, 6), rng.randint(0, 20)
    size = rng.choice([50, 100, 200, 500])
    datasets = {"primary": round(size * rng.uniform(0.2, 0.45), 1)}
    if rng.random() < 0.5:
        datasets["snapshots-2026-11"] = round(size * rng.uniform(0.05, 0.15), 1)
    config = {"memory_limit_mb": rng.choice([768, 1024, 1536, 2048]),
              "cache_max_entries": rng.choice([20_000, 50_000, 100_000]),
              "timeout_ms": rng.choice([500, 1000, 2000]), "log_level": "info"}
    version = f"{major}.{minor}.{rng.randint(1, 9)}"
    return {"name": name, "version": version, "previous_version": f"{major}.{minor}.0", "bad_versions": [],
            "config": config, "running_config": dict(config), "replicas": rng.randint(1, 3), "deps": [],
            "baseline_mb": rng.randint(200, 400), "uptime_h": rng.randint(5, 300),
            "disk": {"size_gb": size, "logs_gb": round(size * rng.uniform(0.02, 0.1), 2), "datasets": datasets},
            "credential": {"id": f"cred-{name}", "secret": f"{rng.getrandbits(96):024x}",
                           "expires_h": now + rng.randint(100, 2000)},
            "queue": None, "demand_conns": 0, "latency_ms": rng.randint(20, 120), "cpu_pct": rng.randint(10, 60),
            "log_seed": rng.randint(0, 10_000), "herring_logs": [], "history": [f"INFO deployed version {version}"],
            "restarts": 0}


def _wire(rng: random.Random, services: dict[str, dict], chain: list[str], others: list[str],
          causes: set[str]) -> None:
    """Healthy branches: off-chain services depend only on later off-chain ones (acyclic, and none
    depends on a cause), chain services sometimes on an off-chain one; about half use the database."""
    for j, name in enumerate(others):
        later = others[j + 1:]
        if later and rng.random() < 0.6:
            services[name]["deps"].append(rng.choice(later))
    for name in chain + sorted(causes - set(chain)):
        if others and rng.random() < 0.5:
            dep = rng.choice(others)
            if dep not in services[name]["deps"] and dep not in causes:
                services[name]["deps"].append(dep)
    for name in [n for n in services if n != DB]:
        if rng.random() < 0.5:
            _use_database(rng, services[name])


def _use_database(rng: random.Random, svc: dict[str, Any]) -> None:
    if DB in svc["deps"]:
        return
    svc["deps"].append(DB)
    pool = rng.randint(10, 25)
    svc["config"]["pool_size"] = svc["running_config"]["pool_size"] = pool
    svc["demand_conns"] = max(1, pool * svc["replicas"] - rng.randint(2, 8))


def _inject(rng: random.Random, services: dict[str, dict], name: str, kind: str, now: int) -> None:
    svc = services[name]
    if kind == "bad_deploy":
        major, minor, _ = svc["version"].split(".")
        svc["previous_version"], svc["version"] = svc["version"], f"{major}.{int(minor) + 1}.0"
        svc["bad_versions"] = [svc["version"]]
        svc["history"].append(f"INFO deployed version {svc['version']}")
    elif kind == "bad_config":
        for config in (svc["config"], svc["running_config"]):
            config["cache_max_entries"] = 0
        limit = svc["config"]["memory_limit_mb"]
        svc["uptime_h"] = math.ceil((limit - svc["baseline_mb"]) / fleet.LEAK_MB_H) + rng.randint(0, 2)
    elif kind == "bad_timeout":  # a typo'd timeout, below what any dependency needs
        if not svc["deps"]:
            _use_database(rng, svc)
        for config in (svc["config"], svc["running_config"]):
            config["timeout_ms"] = rng.choice([5, 10, 15])
    elif kind == "pool_exhausted":
        _use_database(rng, svc)
        svc["demand_conns"] = fleet.pool_capacity(svc) + rng.randint(8, 40)
    elif kind == "disk_full":
        size, disk = svc["disk"]["size_gb"], svc["disk"]
        if rng.random() < 0.5:  # logs to rotate
            disk["datasets"] = {"primary": round(size * 0.5, 1), "snapshots-2026-11": round(size * 0.05, 1)}
            disk["logs_gb"] = round(size * rng.uniform(0.41, 0.44), 2)
        else:  # logs already rotated: only the old snapshot can go
            disk["logs_gb"] = 0.3
            disk["datasets"] = {"primary": round(size * 0.6, 1), "snapshots-2026-11": round(size * 0.37, 1)}
    elif kind == "expired_credentials":
        svc["credential"]["expires_h"] = now - rng.randint(1, 48)
    elif kind == "poison_queue":
        svc["queue"] = {"name": f"{name}-events", "depth": rng.randint(500, 20_000), "poison": True,
                        "drain_per_min": rng.randint(200, 900), "poison_offset": rng.randint(10_000, 99_999)}


def _size_database(rng: random.Random, services: dict[str, dict]) -> None:
    """Room for every client's pool once an exhausted one is fixed, and little more."""
    need = sum(max(fleet.pool_capacity(s), s["demand_conns"]) for s in services.values() if DB in s["deps"])
    db = services[DB]
    db["config"]["max_connections"] = db["running_config"]["max_connections"] = need + 3 * rng.randint(4, 15)


def _herring(rng: random.Random, svc: dict[str, Any]) -> None:
    pick = rng.randrange(4)
    if pick == 0:
        svc["queue"] = {"name": f"{svc['name']}-jobs", "depth": rng.randint(5_000, 40_000), "poison": False,
                        "drain_per_min": rng.randint(300, 900), "poison_offset": 0}
        svc["herring_logs"] = [f"WARN queue {svc['name']}-jobs backlog {svc['queue']['depth']} (draining)"]
    elif pick == 1:
        svc["cpu_pct"] = rng.randint(88, 97)
        svc["herring_logs"] = [f"WARN cpu at {svc['cpu_pct']}% (batch job running)"]
    elif pick == 2:
        size = svc["disk"]["size_gb"]
        svc["disk"]["datasets"] = {"primary": round(size * 0.7, 1)}
        svc["disk"]["logs_gb"] = round(size * 0.12, 2)
        svc["herring_logs"] = ["WARN disk usage 82%"]
    else:
        svc["herring_logs"] = ["ERROR request to partner api timed out (retried, succeeded)"]


def _reference(state: dict[str, Any], causes: list[Cause]) -> list[ToolCall]:
    services = state["services"]
    calls = [ToolCall(name="list_services", arguments={})]
    seen: set[str] = set()
    for cause in causes:
        for name in cause.path:
            if name not in seen:
                seen.add(name)
                calls.append(ToolCall(name="inspect_service", arguments={"service": name}))
        calls.append(ToolCall(name="read_logs", arguments={"service": cause.service}))
        calls += fix(services[cause.service], cause.kind)
    calls.append(ToolCall(name="list_services", arguments={}))
    summary = "; ".join(f"{c.service}: {c.kind.replace('_', ' ')} fixed" for c in causes)
    return calls + [ToolCall(name="resolve", arguments={"summary": f"Root cause {summary}."})]


def fix(svc: dict[str, Any], kind: str) -> list[ToolCall]:
    """The calls that fix `kind` on `svc` (the reference's, also the scripted policy's model)."""
    name = svc["name"]

    def call(tool: str, **arguments: Any) -> ToolCall:
        return ToolCall(name=tool, arguments={"service": name, **arguments})

    if kind == "bad_deploy":
        return [call("rollback")]
    if kind == "bad_config":
        return [call("read_config"), call("edit_config", key="cache_max_entries", value=str(FIXED_CACHE)),
                call("restart")]
    if kind == "bad_timeout":
        return [call("read_config"), call("edit_config", key="timeout_ms", value="1000"), call("restart")]
    if kind == "pool_exhausted":
        return [call("get_metrics"), call("edit_config", key="pool_size", value=str(fleet.needed_pool_size(svc))),
                call("restart")]
    if kind == "disk_full":
        if svc["disk"]["logs_gb"] > fleet.LOG_FLOOR_GB:
            return [call("get_metrics"), call("rotate_logs")]
        return [call("get_metrics"), call("request_approval", action="delete_data", dataset="snapshots-2026-11",
                                          reason=f"{name}: disk full, logs already rotated; the old snapshot is "
                                                 "the only data that can go"),
                call("delete_data", dataset="snapshots-2026-11")]
    if kind == "expired_credentials":
        return [call("get_metrics"), call("request_approval", action="rotate_credentials",
                                          reason=f"{name}'s credential has expired: requests get 401"),
                call("rotate_credentials")]
    return [call("request_approval", action="drop_queue",
                 reason=f"{name} crash-loops on a poison message at the head of its queue"), call("drop_queue")]
