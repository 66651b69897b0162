"""A TrainerCallback that reports a training run's progress and losses (tasks/rollout/progress.py):
progress in thousandths of its budget — steps, or wall time for a run bounded by time, whichever
is further along — and a note with the loss at each of the trainer's logging steps."""

from __future__ import annotations

import time

from transformers import TrainerCallback

from gymfoundry.tasks.rollout import progress
from gymfoundry.tasks.rollout.progress import PERMILLE, TRAINING


class ReportProgress(TrainerCallback):
    def __init__(self, label: str = TRAINING, time_limit_s: float | None = None):
        self.label, self.time_limit_s = label, time_limit_s
        self.started, self.done = time.perf_counter(), 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.done = time.perf_counter(), 0
        progress.start(self.label, PERMILLE)

    def on_step_end(self, args, state, control, **kwargs):
        share = state.global_step / state.max_steps if state.max_steps else 0.0
        if self.time_limit_s:
            share = max(share, (time.perf_counter() - self.started) / self.time_limit_s)
        now = min(PERMILLE, int(share * PERMILLE))
        if now > self.done:
            progress.advance(self.label, now - self.done)
            self.done = now

    def on_log(self, args, state, control, logs=None, **kwargs):
        losses = {k: v for k, v in (logs or {}).items() if "loss" in k and isinstance(v, (int, float))}
        if losses:
            progress.note(self.label, f"step {state.global_step}: " + ", ".join(f"{k} {v:.4f}" for k, v in losses.items()))

    def on_train_end(self, args, state, control, **kwargs):
        progress.finish(self.label)
