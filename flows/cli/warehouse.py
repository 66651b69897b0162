"""`gymfoundry sql` and `gymfoundry warehouse check|repair`: read the warehouse, re-validate it,
repair damaged files."""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from gymfoundry.flows.cli.options import UsageError, add_data_dir, existing_warehouse


def cmd_sql(args: argparse.Namespace) -> int:
    from gymfoundry.warehouse.console import check_size, query, render  # local: duckdb (~0.7 s); --help needs none

    existing_warehouse(args.data_dir)
    if not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout:g}: the time limit must be more than 0 seconds")
    table = query(args.data_dir, args.query, timeout_s=args.timeout,
                  max_memory=check_size(args.max_memory) if args.max_memory else None)
    print(render(table, args.format, args.max_rows))
    return 0


def cmd_warehouse_check(args: argparse.Namespace) -> int:
    from gymfoundry.warehouse import Warehouse  # local: duckdb (~0.7 s); --help needs none

    existing_warehouse(args.data_dir)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.report or Path(args.data_dir) / "reports" / f"check-{stamp}.json")
    try:  # before the check, which hashes every file: a report that cannot be written fails now
        out.parent.mkdir(parents=True, exist_ok=True)
        writable = os.access(out.parent, os.W_OK)  # EROFS on a read-only file system, even for root
    except OSError as exc:
        writable, why = False, "not a directory" if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
    else:
        why = "not writable"
    if not writable:
        raise UsageError(f"--report {out}: cannot write the report there ({why}); nothing was checked. "
                         "Name a writable --report")
    try:
        with Warehouse(args.data_dir, read_only=True) as wh:
            report = wh.check()
        payload, success = report.to_json(), report.success
        print_check(report)
    except Exception as exc:  # a catalog that cannot be opened still gets its report
        payload, success = {"success": False, "error": f"{type(exc).__name__}: {exc}"}, False
        print(f"FAIL the warehouse could not be checked: {payload['error']}")
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"{'all checks passed' if success else 'CHECK FAILED'}; report: {out}")
    return 0 if success else 1


def print_check(report) -> None:
    for name, table in report.tables.items():
        unit = {"integrity": "checks", "files": "files"}.get(name, "rows")
        print(f"{'ok  ' if table.success else 'FAIL'} {name:<16} {table.rows:>9} {unit}")
    for failure in report.failures:
        print(f"  {failure['table']}.{failure['column']}: {failure['expectation']} "
              f"({failure['unexpected_count']} rows) {failure.get('examples') or failure.get('error') or ''}")
    for problem in report.files:
        print(f"  {problem['kind'].upper():<16} {problem['path']}: {problem['reason']}")
    if any(p["kind"] in ("missing", "changed") for p in report.files):
        print("damaged files: `gymfoundry warehouse repair` quarantines damaged lake landings (then re-run) and "
              "rebuilds damaged datasets from the warehouse")


def cmd_warehouse_repair(args: argparse.Namespace) -> int:
    from gymfoundry.tasks.stages.assemble import rebuild_dataset  # local: duckdb (~0.7 s), as the warehouse
    from gymfoundry.warehouse import Warehouse  # local: duckdb (~0.7 s); --help needs none

    existing_warehouse(args.data_dir)
    with Warehouse(args.data_dir) as wh:
        repair = wh.repair(rebuild=rebuild_dataset)
    for dataset_id in repair.rebuilt:
        print(f"REBUILT dataset {dataset_id} from the warehouse (its file has the recorded checksum again)")
    for folder, files in repair.moved.items():
        print(f"QUARANTINED {len(files)} files of one landing to {folder}:")
        for failure in repair.failures[folder.name]:
            print(f"  {failure['expectation']}: {failure['error']}")
    for path in repair.removed_temp:
        print(f"removed {path} (temp file of a killed writer)")
    if repair.moved:
        print("views rebuilt over the intact files; re-run the factory runs that landed these rows to land them "
              "again, and see `gymfoundry warehouse check`")
    elif not repair.rebuilt:
        print("no damaged lake files; nothing quarantined")
    return 0


def add_warehouse_commands(sub) -> None:
    sql = sub.add_parser("sql", help="run a SQL query on the warehouse")
    sql.add_argument("query")
    add_data_dir(sql)
    sql.add_argument("--max-rows", type=int, default=50, help="rows shown by --format table (default: 50)")
    sql.add_argument("--format", choices=["table", "csv", "json"], default="table",
                     help="table (default), csv with a header, or json (a list of objects; every row)")
    sql.add_argument("--timeout", type=float, default=300.0,
                     help="cancel the query after this many seconds (default: 300)")
    sql.add_argument("--max-memory", help="cancel the query when it needs more memory than this, e.g. 2GB "
                                          "(default: a quarter of this machine's memory)")
    sql.set_defaults(func=cmd_sql)

    warehouse_cmd = sub.add_parser("warehouse", help="warehouse maintenance")
    warehouse_sub = warehouse_cmd.add_subparsers(dest="action", required=True)
    check = warehouse_sub.add_parser("check", help="re-validate everything landed with the quality gates")
    add_data_dir(check)
    check.add_argument("--report", help="where to write the JSON report (default <data-dir>/reports/)")
    check.set_defaults(func=cmd_warehouse_check)
    repair = warehouse_sub.add_parser("repair", help="quarantine landings with missing or changed lake files and "
                                                     "rebuild the views (re-run the factory to land them again)")
    add_data_dir(repair)
    repair.set_defaults(func=cmd_warehouse_repair)
