"""Benchmark: env steps per second of each family with its scripted agent (and, for the person
families, the scripted simulator), no judge; and the wall time of its conformance suite. Not a
test (pytest collects test_*.py only).

    .venv/bin/python tests/benchmarks/bench_families.py [--families conversation advisory] \
        [--episodes 200] [--repeats 3] [--json out.json]

Two figures per family, medians of `--repeats`: `env` plays `--episodes` episodes (levels 1–5
in turn) through the runtime stack without the outcome verifier (`Family.make(verified=False)`),
`verified` the same episodes with it (the verdict at each episode's end, its replays included).
`check_family_s` is `gymfoundry.envs.check.check_family` on the family, once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def steps_per_second(family: str, episodes: int, verified: bool) -> float:
    from gymfoundry.envs.family import family as family_of
    from gymfoundry.envs.wrappers import standard_stack
    from gymfoundry.tasks.policies.registry import make_policy

    fam = family_of(family)
    tasks = [fam.generate(seed, level) for seed in range(episodes // 5 + 1) for level in fam.levels][:episodes]
    policy = make_policy("scripted", family)
    steps, started = 0, time.perf_counter()
    for i, task in enumerate(tasks):
        env = standard_stack(family_of(task.env_id).make(verified=verified))
        try:
            policy.reset(i)
            ts = env.reset(task=task)
            while not ts.done:
                ts = env.step(policy.act(ts.observation))
                steps += 1
        finally:
            env.close()
    return steps / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["inventory", "conversation", "advisory"])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    from gymfoundry import envs  # noqa: F401
    from gymfoundry.envs.check import check_family

    results = []
    print(f"{'family':<14} {'env steps/s':>12} {'verified steps/s':>17} {'check-family s':>15}")
    for family in args.families:
        env = statistics.median(steps_per_second(family, args.episodes, False) for _ in range(args.repeats))
        verified = statistics.median(steps_per_second(family, args.episodes, True) for _ in range(args.repeats))
        started = time.perf_counter()
        report = check_family(family)
        check_s = time.perf_counter() - started
        ok = report.ok
        results.append({"family": family, "env_steps_per_s": round(env, 1), "verified_steps_per_s": round(verified, 1),
                        "check_family_s": round(check_s, 2), "check_family_passed": ok})
        print(f"{family:<14} {env:>12.1f} {verified:>17.1f} {check_s:>15.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
