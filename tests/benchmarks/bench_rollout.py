"""Benchmark: rollout + PRM scoring of the scripted inventory policy, steps per second, side by side
with the code as it was before issue 19 (commit `BASELINE`), in the same run. Not a test.

    .venv/bin/python tests/benchmarks/bench_rollout.py [--tasks 100] [--samples 2] [--block 25] \
        [--repeats 5] [--mistake-rate 0.25] [--baseline 6bd6e59] [--json out.json]

Each arm is its own long-lived Python process: `current` imports this working tree, `baseline`
imports `envs`, `verifiers`, `tasks` and `warehouse` as `git archive <BASELINE>` extracted them
into a scratch dir (the same venv). Both generate the same tasks and run the factory's two stages
on them as the factory calls them, per batch of `--block` tasks with `--samples` episodes each:
`gymfoundry.tasks.rollout.episodes.collect_rollouts` (the standard runtime stack, the outcome verifier with its
hidden-variation replays at each episode's end) and `gymfoundry.tasks.stages.score.score_rollouts` (the rule layer
with the verifier's progress potentials, the judge layer (no endpoint configured here) and the
combination). Each repeat plays tasks of its own (so nothing a process remembers of calls it saw
helps a later repeat), the arms alternating block by block (A B, then B A) after a warm-up of
each, so a burst of load from elsewhere on the machine lands on both. Per repeat: steps/s of
rollout, of scoring, and of both together (steps over the sum of both stages' seconds) for each
arm, and the ratio current/baseline of each; printed: the medians over the repeats. Both arms
must produce the same episodes and scores (a digest of the rollouts without their clocks, and of
every step score, compared per block), or the benchmark stops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FAMILY = "inventory"
BASELINE = "6bd6e59"  # the code before issue 19's rollout and scoring work
PACKAGES = ("envs", "verifiers", "tasks", "warehouse")


# -- one arm: a worker process ------------------------------------------------------------------
def worker(root: str, tasks_wanted: int, samples: int, mistake_rate: float) -> None:
    """Serve `play <start> <stop>` lines on stdin with one JSON line each on stdout."""
    sys.path.insert(0, root)
    import hashlib

    from gymfoundry import envs  # noqa: F401  registers the families
    from gymfoundry.envs.family import family
    from gymfoundry.tasks.policies.registry import make_policy
    from gymfoundry.tasks.rollout.episodes import collect_rollouts
    from gymfoundry.tasks.stages.score import score_rollouts

    assert Path(envs.__file__).resolve().is_relative_to(Path(root).resolve()), envs.__file__
    fam = family(FAMILY)
    tasks = [fam.generate(seed, level) for seed in range(tasks_wanted // len(fam.levels) + 1)
             for level in fam.levels][:tasks_wanted]
    policy = make_policy("scripted", FAMILY, mistake_rate=mistake_rate)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        _, start, stop = line.split()
        chunk = tasks[int(start):int(stop)]
        started = time.perf_counter()
        rollouts = collect_rollouts(chunk, policy, samples, 0)
        rolled = time.perf_counter()
        scores = score_rollouts(rollouts, chunk)
        scored = time.perf_counter()
        episodes_ = [r.model_dump(mode="json", exclude={"cost": {"wall_time_s"}, "steps": {"__all__": {"latency_s"}}})
                     for r in rollouts]
        text = json.dumps([episodes_, [s.model_dump(mode="json") for s in scores]], sort_keys=True)
        print(json.dumps({"steps": sum(len(r.steps) for r in rollouts), "rollout_s": rolled - started,
                          "score_s": scored - rolled, "digest": hashlib.sha256(text.encode()).hexdigest()}),
              flush=True)


class Arm:
    def __init__(self, name: str, root: Path, tasks: int, samples: int, mistake_rate: float):
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(root), "--tasks", str(tasks), "--samples", str(samples),
             "--mistake-rate", str(mistake_rate)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env, cwd=str(root))
        self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.name} worker ended (see its stderr above)")
        return json.loads(line)

    def play(self, start: int, stop: int) -> dict[str, Any]:
        self.proc.stdin.write(f"play {start} {stop}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def baseline_tree(commit: str, into: Path) -> Path:
    """The packages as they were at `commit`, extracted under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, *PACKAGES], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


# -- the measurement ----------------------------------------------------------------------------
def one_repeat(arms: dict[str, Arm], first: int, tasks: int, block: int, flip: bool) -> dict[str, dict[str, float]]:
    """Tasks first .. first + tasks - 1 in both arms, block by block."""
    totals = {name: {"steps": 0, "rollout_s": 0.0, "score_s": 0.0} for name in arms}
    order = list(arms)
    for n, start in enumerate(range(first, first + tasks, block)):
        results = {}
        for name in (order if (n % 2 == 0) != flip else order[::-1]):
            results[name] = arms[name].play(start, min(start + block, first + tasks))
        if len({r["digest"] for r in results.values()}) != 1 or len({r["steps"] for r in results.values()}) != 1:
            raise SystemExit(f"the arms produced different episodes or scores on tasks {start}..{start + block}")
        for name, r in results.items():
            for key in totals[name]:
                totals[name][key] += r[key]
    return {name: {"rollout": t["steps"] / t["rollout_s"], "scoring": t["steps"] / t["score_s"],
                   "combined": t["steps"] / (t["rollout_s"] + t["score_s"]), "steps": t["steps"]}
            for name, t in totals.items()}


def measure(tasks: int, samples: int, repeats: int, mistake_rate: float, baseline: str, block: int) -> dict[str, Any]:
    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        # Each repeat plays tasks of its own (the warm-up others again): nothing a process
        # remembers of calls it has seen (argument checks) helps a later repeat.
        total = block + tasks * repeats
        arms = {"current": Arm("current", ROOT, total, samples, mistake_rate),
                "baseline": Arm("baseline", baseline_tree(baseline, Path(tmp)), total, samples, mistake_rate)}
        try:
            one_repeat(arms, 0, block, block, False)  # warm-up of both arms
            runs = []
            for i in range(repeats):
                run = one_repeat(arms, block + i * tasks, tasks, block, flip=i % 2 == 1)
                runs.append(run)
                print(f"repeat {i + 1}/{repeats}: " + "  ".join(
                    f"{stage} {run['current'][stage]:.0f} vs {run['baseline'][stage]:.0f} steps/s "
                    f"({run['current'][stage] / run['baseline'][stage]:.2f}x)"
                    for stage in ("rollout", "scoring", "combined")), flush=True)
        finally:
            for arm in arms.values():
                arm.close()
    fig: dict[str, Any] = {"family": FAMILY, "tasks": tasks, "samples": samples, "episodes": tasks * samples,
                           "repeats": repeats, "mistake_rate": mistake_rate,
                           "block_tasks": block, "baseline": baseline, "steps": runs[0]["current"]["steps"],
                           "cpus": os.cpu_count(), "runs": runs}
    for stage in ("rollout", "scoring", "combined"):
        for arm in ("current", "baseline"):
            fig[f"{arm}_{stage}_median_steps_per_s"] = round(med(r[arm][stage] for r in runs), 1)
        fig[f"{stage}_median_ratio"] = round(med(r["current"][stage] / r["baseline"][stage] for r in runs), 3)
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=100, help="tasks per repeat (each repeat its own)")
    ap.add_argument("--samples", type=int, default=2, help="episodes per task, as the factory plays them")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mistake-rate", type=float, default=0.25)
    ap.add_argument("--block", type=int, default=25,
                    help="tasks per block, i.e. per call of each stage (the factory's batch: 25 tasks)")
    ap.add_argument("--baseline", default=BASELINE, help="the commit whose code is the baseline arm")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--worker", metavar="ROOT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.tasks, args.samples, args.mistake_rate)
        return 0

    fig = measure(args.tasks, args.samples, args.repeats, args.mistake_rate, args.baseline, args.block)
    print(f"\n{args.tasks} tasks x {args.samples} samples ({fig['steps']} steps) per repeat of scripted {FAMILY} "
          f"(mistake_rate {args.mistake_rate}), {args.block} tasks per stage call: "
          f"collect_rollouts with the verifier, then score_rollouts; {args.repeats} repeats, {fig['cpus']} CPUs; "
          f"baseline = the code at {args.baseline}")
    print(f"{'stage':<22}{'current steps/s':>17}{'baseline steps/s':>18}{'ratio':>8}")
    for stage in ("rollout", "scoring", "combined"):
        print(f"{stage if stage != 'combined' else 'rollout + scoring':<22}"
              f"{fig[f'current_{stage}_median_steps_per_s']:>17.1f}{fig[f'baseline_{stage}_median_steps_per_s']:>18.1f}"
              f"{fig[f'{stage}_median_ratio']:>7.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
