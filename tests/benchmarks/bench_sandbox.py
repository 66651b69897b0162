"""Benchmark: the sandbox's overhead per command, and coding-family episodes per minute.
Not a test (pytest collects test_*.py only).

    .venv/bin/python tests/benchmarks/bench_sandbox.py [--commands 40] [--episodes 20] [--grades 10]
        [--root CHECKOUT] [--json out.json]

Overhead: the same argument vector run as a bare subprocess and in one bubblewrap sandbox
(A, B, A, B ... so both share the machine's noise; one unmeasured warm-up each); medians.
Episodes: the scripted policy (mistake rate 0.25) on generated tasks of levels 1-5 through
the real env stack, grading included; task validation is timed on its own line.
Grading: the outcome verifier on the reference solution of each task, cold (the grader's
per-task caches cleared: reference and baseline runs included) and warm (what each later
episode of the task pays); medians. `--root` imports another checkout (e.g. a `git worktree`
of an older commit) so before and after run the same measurement; `--commands 0` skips the
overhead part.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = sys.argv[sys.argv.index("--root") + 1] if "--root" in sys.argv[:-1] else str(Path(__file__).resolve().parents[2])
sys.path.insert(0, ROOT)


def overhead(n: int) -> dict:
    from gymfoundry.envs.sandbox import create_sandbox
    from gymfoundry.envs.sandbox.bubblewrap import sandbox_python

    python = sandbox_python()
    out = {}
    with create_sandbox({"main.py": "pass\n"}, backend="bubblewrap") as box:
        guarantees = box.guarantees()
        for label, bare, boxed in [("true", ["/bin/true"], ["/bin/true"]),
                                   ("python -c pass", [python, "-c", "pass"], ["python", "-c", "pass"])]:
            subprocess.run(bare, check=True)
            box.run(boxed)
            bare_s, boxed_s = [], []
            for _ in range(n):
                started = time.perf_counter()
                subprocess.run(bare, check=True)
                bare_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                assert box.run(boxed).exit_code == 0
                boxed_s.append(time.perf_counter() - started)
            out[label] = {"bare_ms": round(statistics.median(bare_s) * 1000, 2),
                          "sandboxed_ms": round(statistics.median(boxed_s) * 1000, 2),
                          "overhead_ms": round((statistics.median(boxed_s) - statistics.median(bare_s)) * 1000, 2)}
    out["cgroup"] = guarantees["cgroup"]
    return out


def episodes(n: int, mistake_rate: float) -> dict:
    from gymfoundry import envs  # noqa: F401  registers the coding family
    from gymfoundry.envs.coding import generate_task
    from gymfoundry.envs.coding.policy import ScriptedCodingPolicy
    from gymfoundry.tasks.rollout.episodes import run_episode
    from gymfoundry.tasks.stages.validate import validate_tasks

    tasks = [generate_task(seed, 1 + seed % 5) for seed in range(n)]
    started = time.perf_counter()
    valid, rejected = validate_tasks(tasks)
    validate_s = time.perf_counter() - started
    terminations: collections.Counter = collections.Counter()
    steps = 0
    started = time.perf_counter()
    for i, task in enumerate(valid):
        rollout = run_episode(task, ScriptedCodingPolicy(mistake_rate), seed=i)
        terminations[rollout.termination.value] += 1
        steps += len(rollout.steps)
    elapsed = time.perf_counter() - started
    return {"episodes": len(valid), "episodes_per_min": round(len(valid) / elapsed * 60, 1),
            "mean_steps": round(steps / max(1, len(valid)), 1), "terminations": dict(terminations),
            "validated_tasks_per_min": round(len(tasks) / validate_s * 60, 1), "rejected": len(rejected)}


def grading(n: int) -> dict:
    import gymfoundry.envs.coding.verifier as grader
    from gymfoundry.envs.coding import CodingEnv, generate_task

    cold, warm = [], []
    for seed in range(n):
        task = generate_task(1000 + seed, 1 + seed % 5)
        env = CodingEnv()
        env.reset(task)
        for call in task.hidden.reference:
            env.step(call)
        steps, state = env.steps, env.state()
        env.close()
        for cache in ("_BASELINES", "_EXAMS"):
            getattr(grader, cache, {}).clear()
        for times in (cold, warm):
            started = time.perf_counter()
            assert grader.CodingVerifier().verify(task, steps, state).success
            times.append(time.perf_counter() - started)
    return {"tasks": n, "cold_ms": round(statistics.median(cold) * 1000, 1),
            "warm_ms": round(statistics.median(warm) * 1000, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commands", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--grades", type=int, default=10)
    parser.add_argument("--mistake-rate", type=float, default=0.25)
    parser.add_argument("--root", help="the checkout whose code is measured (default: this one)")
    parser.add_argument("--json")
    args = parser.parse_args()
    result = {"root": ROOT, "overhead": overhead(args.commands) if args.commands else {},
              "grading": grading(args.grades), "coding": episodes(args.episodes, args.mistake_rate)}
    for label, figures in result["overhead"].items():
        if label != "cgroup":
            print(f"{label:>16}: bare {figures['bare_ms']} ms, sandboxed {figures['sandboxed_ms']} ms, "
                  f"overhead {figures['overhead_ms']} ms (median of {args.commands})")
    grade = result["grading"]
    print(f"grading per coding task ({ROOT}): {grade['cold_ms']} ms cold (first of the task), "
          f"{grade['warm_ms']} ms warm (median of {grade['tasks']})")
    coding = result["coding"]
    print(f"coding family, scripted policy (mistake rate {args.mistake_rate:g}): {coding['episodes_per_min']} "
          f"episodes/min over {coding['episodes']} episodes, {coding['mean_steps']} steps each; "
          f"terminations {coding['terminations']}")
    print(f"task validation (reference replay + hidden tests on the initial snapshot): "
          f"{coding['validated_tasks_per_min']} tasks/min")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
