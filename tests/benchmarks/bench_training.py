"""Seconds per step of the step-weighted SFT trainer against plain TRL SFT (assistant-only
loss) on the same rows and model, and peak memory. Usage:

    python tests/benchmarks/bench_training.py SFT_PARQUET [--steps 10] [--hidden 128 --layers 4]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def plain_trl(rows, base, out, steps, batch_size):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from tasks.training.base_model import load_model

    model, tokenizer = load_model(base)
    data = Dataset.from_list([{"messages": r["messages"], "tools": r["tools"]} for r in rows])
    args = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=batch_size, use_cpu=True,
                     bf16=False, report_to=[], save_strategy="no", assistant_only_loss=True, max_length=1024,
                     disable_tqdm=True, logging_steps=steps)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    started = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - started) / steps


def weighted(rows_path, base, out, steps, batch_size):
    from tasks.train import train

    metrics = train(rows_path, "sft", base, out, {"max_steps": steps, "batch_size": batch_size,
                                                  "logging_steps": steps})
    return metrics["seconds_per_step"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    from datasets import Dataset

    from tasks.training.base_model import build_base_model, factory_texts

    rows = Dataset.from_parquet(args.dataset).to_list()
    with tempfile.TemporaryDirectory() as tmp:
        base = str(build_base_model(f"{tmp}/base", factory_texts(n_tasks=100), vocab_size=1024,
                                    hidden_size=args.hidden, layers=args.layers))
        plain = plain_trl(rows, base, f"{tmp}/plain", args.steps, args.batch_size)
        ours = weighted(args.dataset, base, f"{tmp}/weighted", args.steps, args.batch_size)
    print(f"plain TRL SFT (assistant-only loss): {plain:.3f} s/step")
    print(f"step-weighted, chunked SFT:          {ours:.3f} s/step  (ratio {ours / plain:.2f})")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
