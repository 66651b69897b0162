"""`rich` progress bars on the command line for what the stages report (tasks/progress.py):
one bar per family's rollouts, with counts, rate and time left."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from tasks import progress


@contextmanager
def rollout_bars(enabled: bool = True):
    """Show the bars while the block runs (on stderr; rich draws them live on a terminal and
    prints the final state otherwise)."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, \
        TimeElapsedColumn, TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed or 0:6.1f} episodes/s")

    columns = (TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(), Rate(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    bars: dict[str, tuple[int, int]] = {}
    with Progress(*columns, console=Console(file=sys.stderr), transient=False) as bar:
        def on(event: str, label: str, n: int) -> None:
            if event == "start":
                bars[label] = (bar.add_task(f"{label} rollouts", total=n), n)
            elif label in bars and event == "advance":
                bar.advance(bars[label][0], n)
            elif label in bars and event == "finish":
                bar.update(bars[label][0], completed=bars[label][1])

        stop = progress.listen(on)
        try:
            yield bar
        finally:
            stop()
