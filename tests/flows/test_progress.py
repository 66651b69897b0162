"""Progress of long work: the rollout engine reports each finished episode and a training run its
share of the budget and its losses (tasks/rollout/progress.py); the CLI draws them with rich."""

from __future__ import annotations

import io
import threading

from gymfoundry.envs.records import RetryPolicy
from gymfoundry.tasks.rollout import progress
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.retry import collect_with_retries


class Recorder:
    def __init__(self):
        self.events, self.lock = [], threading.Lock()

    def __call__(self, event, label, n, detail):
        with self.lock:
            self.events.append((event, label, n, detail))


def test_the_engine_reports_every_finished_episode_once():
    recorder = Recorder()
    stop = progress.listen(recorder)
    try:
        tasks = generate_tasks("inventory", 3, seed=4)
        rollouts = collect_with_retries(tasks, make_policy("scripted", "inventory"), 2, 0, RetryPolicy())
    finally:
        stop()
    assert len(rollouts) == 6 and recorder.events == [("advance", "inventory", 1, None)] * 6


def test_a_listener_that_raises_never_stops_the_work_and_can_be_removed():
    calls = []

    def broken(*args):
        calls.append(args)
        raise RuntimeError("display gone")

    stop = progress.listen(broken)
    progress.start("x", 3)
    progress.advance("x")
    stop()
    progress.advance("x")
    assert calls == [("start", "x", 3, None), ("advance", "x", 1, None)]


def test_training_progress_reaches_the_whole_budget_with_loss_notes():
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from gymfoundry.tasks.training.progress import ReportProgress

    recorder = Recorder()
    stop = progress.listen(recorder)
    try:
        callback, state = ReportProgress(), TrainerState(max_steps=4)
        args, control = TrainingArguments(output_dir="/tmp/unused", use_cpu=True, report_to=[]), TrainerControl()
        callback.on_train_begin(args, state, control)
        for step in range(1, 5):
            state.global_step = step
            callback.on_step_end(args, state, control)
            if step % 2 == 0:
                callback.on_log(args, state, control, logs={"loss": 1.0 / step, "learning_rate": 1e-3})
        callback.on_train_end(args, state, control)
    finally:
        stop()
    assert recorder.events == [("start", "training", 1000, None), ("advance", "training", 250, None),
                               ("advance", "training", 250, None), ("note", "training", 0, "step 2: loss 0.5000"),
                               ("advance", "training", 250, None), ("advance", "training", 250, None),
                               ("note", "training", 0, "step 4: loss 0.2500"), ("finish", "training", 0, None)]


def test_the_cli_bars_show_each_family_and_the_notes():
    from rich.console import Console

    import gymfoundry.flows.progress_bars as bars

    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=False)
    with bars.progress_bars(console=console):
        progress.start("inventory", 4)
        progress.advance("inventory", 4)
        progress.note("training", "step 2: loss 0.5000")
        progress.finish("inventory")
    text = out.getvalue()
    assert "inventory rollouts" in text and "4/4" in text and "training: step 2: loss 0.5000" in text


def test_bars_can_be_turned_off():
    from gymfoundry.flows.progress_bars import progress_bars

    with progress_bars(enabled=False) as bar:
        assert bar is None
