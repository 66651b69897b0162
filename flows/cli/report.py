"""`gymfoundry report`: the HTML report of a data dir."""

from __future__ import annotations

import argparse
from pathlib import Path

from gymfoundry.flows.cli.options import add_data_dir, existing_warehouse
from gymfoundry.flows.defaults import DEFAULT_DATA_DIR


def cmd_report(args: argparse.Namespace) -> int:
    from gymfoundry.flows.report import write_html_report  # local: the warehouse's duckdb (~0.7 s); --help needs none

    existing_warehouse(args.data_dir)
    out = args.out or Path(args.data_dir) / "reports" / "report.html"
    print(write_html_report(args.data_dir, out))
    return 0


def add_report_command(sub) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report (charts and tables, no network) of a "
                                      "data dir",
                       description="Charts (success by difficulty, reward by layer, training) and the analysis "
                                   "tables in one HTML file that opens offline. Example: gymfoundry report "
                                   f"--data-dir {DEFAULT_DATA_DIR} --out report.html",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_data_dir(p)
    p.add_argument("--out", help="the HTML file to write (default: <data-dir>/reports/report.html)")
    p.set_defaults(func=cmd_report)
