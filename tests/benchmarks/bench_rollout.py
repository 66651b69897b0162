"""Benchmark: rollout steps per second of the scripted inventory policy through the runtime stack
(`standard_stack`) with the outcome verifier at each episode's end (its replays included), side by
side with the code path before the per-step overheads were removed. Not a test.

    .venv/bin/python tests/benchmarks/bench_rollout.py [--episodes 200] [--repeats 5] \
        [--mistake-rate 0.25] [--json out.json]

Each repeat plays the same episodes in both arms, alternating `current` and `legacy` every 10
episodes (A, B, A, B ...) after an unmeasured warm-up of each, so both arms share the machine's
noise; an episode's policy seed comes from its task, so both arms play the same actions. `legacy` monkeypatches the old
implementations, copied below and used by this benchmark only: a thread started per step by
`TimeLimit`, `copy.deepcopy` for crash rollback, `state()` and the event log's arguments.
Figures: the median steps/s of each arm and the median of the per-repeat ratios current/legacy.
Both arms must produce the same steps, rewards and verdicts (checked on every repeat).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAMILY = "inventory"


# -- the old code path, for this benchmark only ------------------------------------------------
def _legacy_run_with_timeout(fn: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """The old `envs.wrappers._run_with_timeout`: one daemon thread per step."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box["value"]


def _legacy_time_limit_step(self, action):
    """The old `TimeLimit.step` (the same limits, a thread per step)."""
    from envs.base import render_error
    from envs.wrappers import TIMEOUT, _end

    if self._over:
        raise RuntimeError("the episode is over; call reset()")
    timeout = min(self.step_timeout_s, self.deadline - time.monotonic())
    if timeout <= 0:
        self._over = True
        reason = "episode time limit reached"
        return _end(render_error(None, TIMEOUT, reason), TIMEOUT, reason, {"error": {"kind": TIMEOUT, "message": reason}})
    finished, ts = _legacy_run_with_timeout(lambda: self.env.step(action), timeout)
    self.steps_taken += 1
    if not finished:
        self._over = True
        which = "step" if timeout == self.step_timeout_s else "episode"
        reason = f"{which} time limit of {timeout:.3g}s reached during the step"
        return _end(render_error(None, TIMEOUT, reason), TIMEOUT, reason, {"error": {"kind": TIMEOUT, "message": reason}})
    if not ts.done and self.steps_taken >= self.max_steps:
        ts.truncated = True
        ts.info.update(termination="truncated", termination_reason=f"step limit {self.max_steps} reached")
    self._over = ts.done
    return ts


@contextlib.contextmanager
def legacy() -> Iterator[None]:
    """Swap the old implementations in for the duration (and back, even on error)."""
    import envs.base
    import envs.wrappers

    saved = [(envs.base, "copy_state", envs.base.copy_state),
             (envs.wrappers.TimeLimit, "step", envs.wrappers.TimeLimit.step)]
    envs.base.copy_state = copy.deepcopy
    envs.wrappers.TimeLimit.step = _legacy_time_limit_step
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


# -- the measurement ---------------------------------------------------------------------------
def tasks_for(episodes: int) -> list:
    from envs.family import family

    fam = family(FAMILY)
    return [fam.generate(seed, level) for seed in range(episodes // len(fam.levels) + 1)
            for level in fam.levels][:episodes]


def play(tasks: list, mistake_rate: float) -> tuple[int, float, list]:
    """Steps, seconds and what the episodes produced (to check both arms agree)."""
    from envs.registry import make
    from envs.wrappers import standard_stack
    from tasks.policies import make_policy

    policy = make_policy("scripted", FAMILY, mistake_rate=mistake_rate)
    steps, produced = 0, []
    started = time.perf_counter()
    for task in tasks:
        env = standard_stack(make(task.env_id, verified=True))
        try:
            policy.reset(int(task.source.seed) * 10 + task.difficulty.level)
            ts = env.reset(task=task)
            while not ts.done:
                ts = env.step(policy.act(ts.observation))
                steps += 1
            produced.append((len(env.steps), [s.result for s in env.steps], ts.reward,
                             (ts.info.get("outcome") or {}).get("success")))
        finally:
            env.close()
    return steps, time.perf_counter() - started, produced


def one_repeat(tasks: list, mistake_rate: float, block: int) -> tuple[float, float, int]:
    """Both arms over the same episodes, alternating every `block` episodes (so a burst of load
    from elsewhere on the machine lands on both): steps/s of each, and the steps."""
    totals = {"current": [0, 0.0], "legacy": [0, 0.0]}
    for start in range(0, len(tasks), block):
        chunk = tasks[start:start + block]
        steps, seconds, produced = play(chunk, mistake_rate)
        with legacy():
            legacy_steps, legacy_seconds, legacy_produced = play(chunk, mistake_rate)
        if produced != legacy_produced:
            raise SystemExit("current and legacy code paths produced different episodes")
        totals["current"][0] += steps
        totals["current"][1] += seconds
        totals["legacy"][0] += legacy_steps
        totals["legacy"][1] += legacy_seconds
    (steps, seconds), (legacy_steps, legacy_seconds) = totals["current"], totals["legacy"]
    return steps / seconds, legacy_steps / legacy_seconds, steps


def measure(episodes: int, repeats: int, mistake_rate: float, block: int = 10) -> dict[str, Any]:
    tasks = tasks_for(episodes)
    one_repeat(tasks[:block], mistake_rate, block)  # warm-up of both arms
    current, old, ratios = [], [], []
    for i in range(repeats):
        sps, legacy_sps, steps = one_repeat(tasks, mistake_rate, block)
        current.append(sps)
        old.append(legacy_sps)
        ratios.append(sps / legacy_sps)
        print(f"repeat {i + 1}/{repeats}: current {sps:.0f} steps/s  legacy {legacy_sps:.0f} steps/s  "
              f"ratio {ratios[-1]:.2f}x", flush=True)
    med = statistics.median
    return {"family": FAMILY, "episodes": episodes, "repeats": repeats, "mistake_rate": mistake_rate,
            "block_episodes": block, "steps": steps, "cpus": os.cpu_count(),
            "current_steps_per_s": current, "legacy_steps_per_s": old, "ratios": ratios,
            "current_median_steps_per_s": round(med(current), 1),
            "legacy_median_steps_per_s": round(med(old), 1), "median_ratio": round(med(ratios), 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mistake-rate", type=float, default=0.25)
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    import envs  # noqa: F401  registers the families

    fig = measure(args.episodes, args.repeats, args.mistake_rate)
    print(f"\n{args.episodes} episodes ({fig['steps']} steps) of scripted {FAMILY} (mistake_rate "
          f"{args.mistake_rate}) through standard_stack with the verifier, {args.repeats} repeats, "
          f"{fig['cpus']} CPUs")
    print(f"{'arm':<10}{'median steps/s':>16}")
    print(f"{'current':<10}{fig['current_median_steps_per_s']:>16.1f}")
    print(f"{'legacy':<10}{fig['legacy_median_steps_per_s']:>16.1f}")
    print(f"median ratio current/legacy: {fig['median_ratio']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
