"""Prefect flows composing the tasks, and the CLI.

The warehouse says on its `gymfoundry.warehouse` logger (it knows nothing of Prefect) when a writer
waits for a held catalog lock ("waiting for <program> (PID n)") and when a batch is spooled; while a
Prefect flow or task run is active in the thread that logs, the line is repeated through that run's
logger, so the run's own log shows why it waits."""

import logging
import sys


class _ToRunLogger(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "prefect" not in sys.modules:  # no flow has run in this process: nothing to repeat it to
            return
        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger

        try:
            logger = get_run_logger()
        except MissingContextError:
            return
        logger.log(record.levelno, "%s", record.getMessage())


logging.getLogger("gymfoundry.warehouse").addHandler(_ToRunLogger(logging.WARNING))
