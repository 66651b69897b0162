"""`rich` progress bars on the command line for what the stages report (tasks/rollout/progress.py):
one bar per family's rollouts, with counts, rate and time left."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from gymfoundry.tasks.rollout import progress
from gymfoundry.tasks.rollout.progress import TRAINING


@contextmanager
def progress_bars(enabled: bool = True, console=None):
    """Show the bars while the block runs (on stderr; rich draws them live on a terminal and
    prints the final state otherwise): one per family's rollouts, one per training run (in
    thousandths of its budget of steps or time), and the notes (losses) printed above them."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, \
        TimeElapsedColumn, TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            if task.description.startswith(TRAINING):
                return Text("")
            return Text(f"{task.speed or 0:6.1f} episodes/s")

    columns = (TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(), Rate(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    bars: dict[str, tuple[int, int]] = {}
    with Progress(*columns, console=console or Console(file=sys.stderr), transient=False) as bar:
        def on(event: str, label: str, n: int, detail: str | None) -> None:
            if event == "note":
                bar.console.print(f"{label}: {detail}")
            elif event == "start":
                bars[label] = (bar.add_task(label if label.startswith(TRAINING) else f"{label} rollouts", total=n), n)
            elif label in bars and event == "advance":
                bar.advance(bars[label][0], n)
            elif label in bars and event == "finish":
                bar.update(bars[label][0], completed=bars[label][1])

        stop = progress.listen(on)
        try:
            yield bar
        finally:
            stop()
