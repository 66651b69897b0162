"""Benchmark: `hf` policy collection at batch 1 vs batch N: episodes/s of the embedded tiny base
model on the same inventory tasks and seeds. Not a test (pytest collects test_*.py only).

    .venv/bin/python tests/benchmarks/bench_hf_batch.py [--episodes 16] [--repeats 3] [--steps 4] \\
        [--max-new-tokens 48] [--temperature 1.0] [--hidden 128 --layers 4 --vocab 2048] [--json out.json]

The model is the embedded default (`build_base_model`, tokenizer on `factory_texts(n_tasks=60)`,
randomly initialised, fp32), built once in a temp dir and loaded once; each arm gets a policy
of its own on those weights (so a batcher of its own). Each repeat plays the same `--episodes`
tasks (`generate_tasks("inventory", ...)`, episode seed = index) with `run_episode`, capped at
`--steps` steps, in three arms:

  serial      one thread, one policy, `max_batch=1`: one episode after another;
  threads     one thread per episode, each with a `fork()`, `max_batch=1`: concurrent
              episodes, decoding one sequence at a time (what threads alone buy);
  batched     one thread per episode, each with a `fork()`, `max_batch=--episodes`: the
              forks' turns decoded together.

Figures are medians over repeats of episodes/s (wall time of the whole arm) and sampled
tokens/s; `ratio` is batched / serial episodes/s (the median of the per-repeat ratios). The
arms sample with per-episode seeds, so their token ids should agree exactly (`same_tokens`);
the batched arm's batch sizes are listed too (the first batch of a run holds the first caller
alone: no batch has been run yet to say who else is coming).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gymfoundry.envs.records import Budget  # noqa: E402
from gymfoundry.tasks.stages.generate import generate_tasks  # noqa: E402
from gymfoundry.tasks.policies.hf import HFPolicy, family_tools  # noqa: E402
from gymfoundry.tasks.rollout.episodes import run_episode  # noqa: E402
from gymfoundry.tasks.policies.checkpoint import load_model  # noqa: E402
from gymfoundry.tasks.training.base_model import build_base_model, factory_texts  # noqa: E402


def arm(name: str, policy: HFPolicy, tasks, limits: Budget) -> tuple[float, list]:
    """Wall seconds to play every task, and each episode's sampled ids per step."""
    def play(agent, i):
        rollout = run_episode(tasks[i], agent, seed=i, limits=limits)
        return [s.token_ids for s in rollout.steps]

    started = time.perf_counter()
    if name == "serial":
        tokens = [play(policy, i) for i in range(len(tasks))]
    else:
        with ThreadPoolExecutor(len(tasks)) as pool:
            tokens = list(pool.map(play, [policy.fork() for _ in tasks], range(len(tasks))))
    return time.perf_counter() - started, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="hf policy collection: episodes/s at batch 1 vs batch N.")
    ap.add_argument("--episodes", type=int, default=16, help="episodes per arm (and the batched arm's max_batch)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="steps per episode at most")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = build_base_model(Path(tmp, "base"), factory_texts("inventory", n_tasks=60), vocab_size=args.vocab,
                                hidden_size=args.hidden, layers=args.layers, heads=4)
        model, tokenizer = load_model(path)
        tasks = generate_tasks("inventory", args.episodes, seed=0)
        limits = Budget(max_steps=args.steps)
        seconds: dict[str, list[float]] = {"serial": [], "threads": [], "batched": []}
        tokens: dict[str, list] = {}
        sizes: dict[int, int] = {}
        for _ in range(args.repeats):
            for name in seconds:
                policy = HFPolicy(path, family_tools("inventory"), model=model, tokenizer=tokenizer,
                                  max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  max_batch=args.episodes if name == "batched" else 1)
                wall, tokens[name] = arm(name, policy, tasks, limits)
                seconds[name].append(wall)
                if name == "batched":
                    for size, n in policy.batcher.batch_sizes.items():
                        sizes[size] = sizes.get(size, 0) + n

    n_tokens = sum(len(ids) for episode in tokens["serial"] for ids in episode)
    out = {"episodes": args.episodes, "repeats": args.repeats, "steps": args.steps,
           "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
           "model": {"hidden": args.hidden, "layers": args.layers, "vocab": args.vocab},
           "torch_threads": torch.get_num_threads(), "sampled_tokens_per_arm": n_tokens,
           "same_tokens": tokens["serial"] == tokens["threads"] == tokens["batched"],
           "batched_batch_sizes": dict(sorted(sizes.items()))}
    for name, walls in seconds.items():
        wall = statistics.median(walls)
        out[name] = {"seconds": round(wall, 3), "episodes_per_s": round(args.episodes / wall, 3),
                     "tokens_per_s": round(n_tokens / wall, 1)}
    out["ratio"] = round(statistics.median(s / b for s, b in zip(seconds["serial"], seconds["batched"])), 2)
    print(f"{'arm':10} {'seconds':>9} {'episodes/s':>11} {'tokens/s':>10}")
    for name in seconds:
        print(f"{name:10} {out[name]['seconds']:9.3f} {out[name]['episodes_per_s']:11.3f} "
              f"{out[name]['tokens_per_s']:10.1f}")
    print(f"batched / serial: {out['ratio']}x   same tokens: {out['same_tokens']}   "
          f"batch sizes (size: batches): {out['batched_batch_sizes']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
