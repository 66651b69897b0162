"""Benchmark: seconds per step of each of our trainers against plain TRL on the same data and the
same tiny model, as a ratio, and peak memory. Not a test (pytest collects test_*.py only).

    OMP_NUM_THREADS=1 .venv/bin/python tests/benchmarks/bench_training.py --data-dir D \\
        [--steps 10] [--grpo-steps 3] [--repeats 3] [--hidden 128 --layers 2] [--json out.json]

D is a data dir the factory has written (`gymfoundry run --families inventory --data-dir D`);
the newest D/datasets/{sft,dpo,grpo}-*.parquet are used. The model is the embedded default
tiny base (tokenizer on `factory_texts(n_tasks=100)`, vocab 1024), built once in a temp dir.

  sft   plain `trl.SFTTrainer` (assistant_only_loss=True, on the rows' `messages`/`tools`)
        vs `train(path, "sft")`: step-weighted, chunked at max_length, observation-masked.
  dpo   plain `trl.DPOTrainer` on the rows' `prompt`/`chosen`/`rejected` message lists with
        their `tools` (TRL parses the JSON string itself) vs `train(path, "dpo")`: masked DPO.
  grpo  plain `trl.GRPOTrainer` (sequence-level advantages) vs `train(path, "grpo")`:
        `StepGRPOTrainer` (per-token step advantages); both through `run_grpo`, so the same
        `LiveEpisodes` rollout_func, tasks, num_generations, max_completion_length, beta=0.
        A step includes playing its episodes.

s/step is the wall time of `trainer.train()` over the steps taken (for ours, the metrics'
`train_seconds` / `steps`, measured the same way): model loading, tokenising and trainer set-up
are excluded. Both sides share the hyperparameters of `gymfoundry.tasks.training.runners.common_args`.
Every measurement (and the base build) runs in a fresh subprocess of this script (`--one`), so
its peak RSS (ru_maxrss) is its own; this parent imports no torch. Each repeat runs plain then
ours for each trainer, side by side; figures are medians (the ratio is the median of the
per-repeat ratios).

Closed-loop figures (held-out success of the tiny model before and after each training arm)
come from `flows/loop.py` `closed_loop`; `--closed-loop DIR` runs it from here (about an
hour on 2 cores) and prints its figures as JSON after the table, or run it directly:

    gymfoundry loop --family inventory --data-dir DIR [--tasks 2000] [--train-seconds 900] \\
        [--arms sft,sft_weighted,sft_then_grpo] [--grpo-seconds 180]

It runs the factory, builds the base (copy pretraining included), evaluates it on held-out
tasks, trains each arm from that base for the same wall time, evaluates each checkpoint, and
reports success rates, steps and training seconds (a Prefect artifact too).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gymfoundry.flows.defaults import prefect_defaults

prefect_defaults(hub_offline=True)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TRAINERS = ("sft", "dpo", "grpo")


# ---- in the subprocess -------------------------------------------------------------------------

def timed_train(trainer) -> tuple[float, int]:
    started = time.perf_counter()
    trainer.train()
    return time.perf_counter() - started, trainer.state.global_step


def plain_args(hp, out: str) -> dict:
    from gymfoundry.tasks.training.runners import common_args

    # Plain TRL keeps its default: raw text columns are dropped once tokenised.
    return {**common_args(hp, out), "remove_unused_columns": True}


def plain_sft(dataset: str, base: str, out: str, hp) -> tuple[float, int]:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from gymfoundry.envs.records import SFTRow
    from gymfoundry.tasks.policies.checkpoint import load_model
    from gymfoundry.tasks.training.runners import load_rows

    model, tokenizer = load_model(base)
    data = Dataset.from_list([{"messages": r.messages, "tools": r.tools} for r in load_rows(dataset, SFTRow)])
    args = SFTConfig(**plain_args(hp, out), assistant_only_loss=True, max_length=hp.max_length)
    return timed_train(SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer))


def plain_dpo(dataset: str, base: str, out: str, hp) -> tuple[float, int]:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from gymfoundry.envs.records import DPORow
    from gymfoundry.tasks.policies.checkpoint import load_model
    from gymfoundry.tasks.training.runners import load_rows

    model, tokenizer = load_model(base)
    data = Dataset.from_list([r.model_dump(include={"prompt", "chosen", "rejected", "tools"})
                              for r in load_rows(dataset, DPORow)])
    args = DPOConfig(**plain_args(hp, out), beta=hp.beta, max_length=hp.max_length, truncation_mode="keep_start")
    return timed_train(DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer))


def plain_grpo(dataset: str, base: str, out: str, hp) -> tuple[float, int]:
    from trl import GRPOTrainer

    from gymfoundry.tasks.training.grpo import run_grpo

    metrics = run_grpo(dataset, base, out, hp, trainer_class=GRPOTrainer)
    return metrics["train_seconds"], metrics["steps"]


def one(spec: dict) -> dict:
    """One measurement (or the base build), in this process; returns its figures."""
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    if spec["kind"] == "base":
        from gymfoundry.tasks.training.base_model import build_base_model, factory_texts

        build_base_model(spec["out"], factory_texts(n_tasks=100), vocab_size=1024,
                         hidden_size=spec["hidden"], layers=spec["layers"])
        return {}
    from gymfoundry.tasks.training.train import Hyperparameters, train

    kind, dataset, base, out = spec["kind"], spec["dataset"], spec["base"], spec["out"]
    hp = {"max_steps": spec["steps"], "batch_size": spec["batch_size"], "num_threads": spec["threads"],
          "logging_steps": spec["steps"]}
    if kind == "grpo":
        hp.update(beta=0.0, num_generations=spec["num_generations"],
                  max_completion_length=spec["max_completion_length"])
    if spec["variant"] == "ours":
        metrics = train(dataset, kind, base, out, hp)
        seconds, steps = metrics["train_seconds"], metrics["steps"]
    else:
        seconds, steps = {"sft": plain_sft, "dpo": plain_dpo, "grpo": plain_grpo}[kind](
            dataset, base, out, Hyperparameters.from_dict(hp))
    return {"s_per_step": seconds / max(steps, 1), "steps": steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# ---- in the parent (stdlib only, so that it adds nothing to the children's RSS) ----------------

def newest(data_dir: str, kind: str) -> str:
    paths = sorted(Path(data_dir, "datasets").glob(f"{kind}-*.parquet"), key=lambda p: p.stat().st_mtime)
    if not paths:
        raise SystemExit(f"no {kind}-*.parquet under {data_dir}/datasets (run `gymfoundry run --data-dir {data_dir}`)")
    return str(paths[-1])


def spawn(spec: dict, tmp: str) -> dict:
    """Runs `one(spec)` in a fresh interpreter; {"error": ...} if it fails."""
    result = Path(tmp, f"result-{time.monotonic_ns()}.json")
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"])}
    proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec), str(result)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode or not result.exists():
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        print(f"  {spec['kind']} {spec.get('variant', '')} failed (rc {proc.returncode}):\n    "
              + "\n    ".join(lines[-8:]), flush=True)
        return {"error": lines[-1] if lines else f"rc {proc.returncode}"}
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Our SFT / DPO / GRPO trainers vs plain TRL: s/step and peak RSS.")
    ap.add_argument("--data-dir", required=True, help="a factory data dir with datasets/*.parquet")
    ap.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    ap.add_argument("--steps", type=int, default=10, help="steps per SFT / DPO measurement")
    ap.add_argument("--grpo-steps", type=int, default=3, help="steps per GRPO measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4, help="SFT / DPO batch size")
    ap.add_argument("--num-generations", type=int, default=4, help="GRPO group size (its batch)")
    ap.add_argument("--max-completion-length", type=int, default=64, help="GRPO tokens per turn")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                    help="torch threads in each measurement")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--closed-loop", metavar="DIR", help="then run the closed loop in DIR and print its figures")
    args = ap.parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [sys.executable.replace(os.getcwd() + "/", ""), *sys.argv])
    datasets = {kind: newest(args.data_dir, kind) for kind in args.trainers}
    common = {"threads": args.threads, "batch_size": args.batch_size, "num_generations": args.num_generations,
              "max_completion_length": args.max_completion_length}
    runs: dict[str, dict[str, list[dict]]] = {k: {"plain": [], "ours": []} for k in args.trainers}
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        base = f"{tmp}/base"
        t0 = time.perf_counter()
        built = spawn({"kind": "base", "out": base, "hidden": args.hidden, "layers": args.layers, **common}, tmp)
        if "error" in built:
            return 1
        print(f"base model built in {time.perf_counter() - t0:.1f}s (excluded)", flush=True)
        for i in range(args.repeats):
            for kind in args.trainers:
                steps = args.grpo_steps if kind == "grpo" else args.steps
                for variant in ("plain", "ours"):
                    spec = {"kind": kind, "variant": variant, "dataset": datasets[kind], "base": base,
                            "out": f"{tmp}/{kind}-{variant}-{i}", "steps": steps, **common}
                    runs[kind][variant].append(spawn(spec, tmp))
                line = "  ".join(f"{v} " + (f"{r[-1]['s_per_step']:.3f} s/step" if "error" not in r[-1] else "failed")
                                 for v, r in runs[kind].items())
                print(f"repeat {i + 1}/{args.repeats} {kind}: {line}", flush=True)

    med = statistics.median
    figures = {}
    for kind, by_variant in runs.items():
        fig = {"dataset": datasets[kind], "steps": args.grpo_steps if kind == "grpo" else args.steps}
        for variant, results in by_variant.items():
            ok = [r for r in results if "error" not in r]
            fig[variant] = {"s_per_step": [r["s_per_step"] for r in ok],
                            "peak_rss_mb": [r["peak_rss_mb"] for r in ok], "steps_taken": [r["steps"] for r in ok],
                            "errors": [r["error"] for r in results if "error" in r]}
            fig[f"{variant}_s_per_step"] = med(fig[variant]["s_per_step"]) if ok else None
            fig[f"{variant}_peak_rss_mb"] = med(fig[variant]["peak_rss_mb"]) if ok else None
        ratios = [o["s_per_step"] / p["s_per_step"] for p, o in zip(by_variant["plain"], by_variant["ours"])
                  if "error" not in p and "error" not in o]
        fig["ratios"] = ratios
        fig["ratio"] = med(ratios) if ratios else None
        figures[kind] = fig

    print(f"\ncommand: {command}")
    print(f"tiny base: hidden {args.hidden}, {args.layers} layers, vocab 1024; {args.threads} torch thread(s), "
          f"{os.cpu_count()} CPUs; {args.repeats} repeats; s/step = trainer.train() wall time / steps")
    print(f"SFT/DPO: {args.steps} steps, batch {args.batch_size}; GRPO: {args.grpo_steps} steps, "
          f"{args.num_generations} generations, {args.max_completion_length} tokens/turn, beta 0")
    print("plain DPO gets the rows' tools too (TRL 1.16 parses the JSON string); plain SFT truncates at "
          "max_length where ours chunks")

    def cell(x, fmt):
        return format(x, fmt) if x is not None else "failed"

    print(f"{'trainer':<8}{'plain TRL s/step':>18}{'ours s/step':>13}{'ours/plain':>12}"
          f"{'plain RSS MB':>14}{'ours RSS MB':>13}")
    for kind, f in figures.items():
        print(f"{kind:<8}{cell(f['plain_s_per_step'], '.3f'):>18}{cell(f['ours_s_per_step'], '.3f'):>13}"
              f"{cell(f['ratio'], '.2f'):>12}{cell(f['plain_peak_rss_mb'], '.0f'):>14}"
              f"{cell(f['ours_peak_rss_mb'], '.0f'):>13}")
    for kind, f in figures.items():
        for variant in ("plain", "ours"):
            if f[variant]["errors"]:
                print(f"{kind} {variant} failed: {f[variant]['errors'][0]}")
    if args.json:
        out = {"command": command, "hidden": args.hidden, "layers": args.layers, "vocab_size": 1024,
               "threads": args.threads, "cpus": os.cpu_count(), "repeats": args.repeats,
               "batch_size": args.batch_size, "num_generations": args.num_generations,
               "max_completion_length": args.max_completion_length,
               "timing": "trainer.train() wall time / steps (ours: metrics train_seconds / steps)", "trainers": figures}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"figures written to {args.json}")
    if args.closed_loop:
        from gymfoundry.flows.loop import closed_loop

        print(json.dumps(closed_loop(data_dir=args.closed_loop), indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        Path(sys.argv[3]).write_text(json.dumps(one(json.loads(sys.argv[2]))))
        raise SystemExit(0)
    raise SystemExit(main())
