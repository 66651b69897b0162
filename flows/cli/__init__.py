"""`gymfoundry` command line: run the factory, list envs, query the warehouse.

Exit status: 0 done; 2 the command line names something missing or not allowed (checked before
Prefect starts, or refused by a flow as bad input: one line, no traceback); 1 the command ran and
failed (a failed check, a refused or cancelled query, damaged or locked storage: one line; any
other exception is a crash and shows its traceback)."""
# (The docstring is `gymfoundry --help`'s description.) One module per command group adds its
# commands (run, families, warehouse, prm, reverify, training, report, harness); what they share is
# `options`; this module builds the parser and turns failures into exit statuses.

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from importlib.metadata import version

from pydantic import ValidationError

from gymfoundry.flows.cli.families import add_family_commands
from gymfoundry.flows.cli.harness import add_harness_commands
from gymfoundry.flows.cli.options import UsageError
from gymfoundry.flows.cli.prm import add_prm_commands
from gymfoundry.flows.cli.report import add_report_command
from gymfoundry.flows.cli.reverify import add_reverify_command
from gymfoundry.flows.cli.run import add_run_commands
from gymfoundry.flows.cli.training import add_training_commands
from gymfoundry.flows.cli.warehouse import add_warehouse_commands
from gymfoundry.tasks.rollout.retry import RetryExhausted
from gymfoundry.verifiers.endpoint import EndpointError


def _check_text(args: argparse.Namespace) -> None:
    """DuckDB and most tools cannot take a path that is not valid UTF-8 (DuckDB throws std::bad_cast)."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise UsageError(f"--{name.replace('_', '-')} {item!r} is not valid UTF-8; name a path "
                                     "that is") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gymfoundry", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gymfoundry {version('gymfoundry')}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_commands(sub)
    add_family_commands(sub)
    add_warehouse_commands(sub)
    add_prm_commands(sub)
    add_reverify_command(sub)
    add_training_commands(sub)
    add_report_command(sub)
    add_harness_commands(sub)
    return parser


def failures() -> tuple[type[Exception], ...]:
    """What a command that ran can fail with for a known reason: one line and exit 1, no traceback."""
    import duckdb  # local: loaded (~0.7 s with the warehouse) only when a command has failed

    from gymfoundry.warehouse import CatalogLocked, ConsoleRefused, DamagedWarehouse, QuarantinedBatch  # local: duckdb
    from gymfoundry.warehouse.console import QueryCancelled  # local: duckdb, as above

    return (duckdb.Error, CatalogLocked, ConsoleRefused, DamagedWarehouse, QuarantinedBatch, QueryCancelled,
            RetryExhausted, EndpointError)


class _UserErrorsWithoutTraceback(logging.Filter):
    """Prefect logs a failed flow or task run's exception with its traceback; bad input (a
    ValueError a flow raised) keeps Prefect's one-line summary."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ValueError):
            record.exc_info, record.exc_text = None, None
        return True


def one_line(exc: ValueError) -> str:
    """A bad-input error as one line: a pydantic error's findings joined, never repeating the input
    (it may be a credential)."""
    if isinstance(exc, ValidationError):
        return f"{exc.title}: " + "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors(include_input=False))
    return " ".join(str(exc).split())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("prefect.flow_runs", "prefect.task_runs"):  # the loggers of Prefect's run engines
        if not any(isinstance(f, _UserErrorsWithoutTraceback) for f in logging.getLogger(name).filters):
            logging.getLogger(name).addFilter(_UserErrorsWithoutTraceback())
    try:
        _check_text(args)
        return args.func(args)
    except Exception as exc:
        if os.environ.get("GYMFOUNDRY_DEBUG"):
            raise
        if isinstance(exc, ValueError):  # bad input, found before Prefect started or by a flow
            print(f"gymfoundry {args.command}: {one_line(exc)}", file=sys.stderr)
            return 2
        if not isinstance(exc, failures()):  # a crash: its traceback is what a bug report needs
            traceback.print_exc()
        print(f"gymfoundry {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
