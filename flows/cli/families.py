"""`gymfoundry envs`, `check-family`, `audit-family` and `new-family`: the families, their
conformance and gameability checks, and a new one from the scaffold."""

from __future__ import annotations

import argparse
import sys

from gymfoundry.envs.check import check_family
from gymfoundry.envs.family import families
from gymfoundry.envs.scaffold import ScaffoldError, main_message, new_family


def cmd_envs(args: argparse.Namespace) -> int:
    for fam in families():
        tools = ", ".join(f"{t.name}({t.category.value})" for t in fam.profile.tools)
        print(f"{fam.env_id}  tools: {tools}")
    return 0


def cmd_check_family(args: argparse.Namespace) -> int:
    """Exit 1, with the report, when a conformance check or the gameability audit fails."""
    report = check_family(args.name, seeds=args.seeds)
    print(report.render(), file=sys.stdout if report.ok else sys.stderr)
    if args.no_audit or not report.ok:  # a family failing its checks is not worth auditing yet
        return 0 if report.ok else 1
    audited = cmd_audit_family(argparse.Namespace(name=args.name, episodes=args.audit_episodes, data_dir=None))
    return 0 if report.ok and audited == 0 else 1


def cmd_audit_family(args: argparse.Namespace) -> int:
    """Exit 1, with the table, when an adversary beats its floor or reaches the oracle's return.
    With a data dir, the audit lands in `family_audits` (what dataset assembly asks for)."""
    from gymfoundry.tasks.stages.audit import audit_family, land_audit  # local: loads polars (~0.3 s); --help needs none

    report = audit_family(args.name, episodes=args.episodes)
    print(report.render(), file=sys.stdout if report.ok else sys.stderr)
    if args.data_dir:
        from gymfoundry.warehouse import Warehouse  # local: duckdb (~0.7 s), only to land the audit

        with Warehouse(args.data_dir) as wh:
            landed = land_audit(wh, report)
        print(f"audit {report.rows[0].audit_id}: {landed} row(s) landed in family_audits under {args.data_dir}")
    return 0 if report.ok else 1


def cmd_new_family(args: argparse.Namespace) -> int:
    """Exit 2, writing nothing, for a refused name."""
    try:
        folder = new_family(args.name, args.dir)
    except ScaffoldError as exc:
        print(f"gymfoundry new-family: {exc}", file=sys.stderr)
        return 2
    print(main_message(folder, args.name))
    return 0


def add_family_commands(sub) -> None:
    envs_cmd = sub.add_parser("envs", help="list registered environments")
    envs_cmd.set_defaults(func=cmd_envs)

    check_cmd = sub.add_parser("check-family", help="run the conformance checks on a registered family")
    check_cmd.add_argument("name", help="a family name (its newest env) or an env id")
    check_cmd.add_argument("--seeds", type=int, default=3, help="tasks generated per level (seeds 0..N-1)")
    check_cmd.add_argument("--audit-episodes", type=int, default=1, help="tasks per level of the gameability audit "
                                                                         "(default: 1)")
    check_cmd.add_argument("--no-audit", action="store_true", help="the conformance checks only")
    check_cmd.set_defaults(func=cmd_check_family)

    audit_cmd = sub.add_parser("audit-family", help="play the gameability adversaries against a family's verifier "
                                                    "beside its oracle (docs/integrity.md)")
    audit_cmd.add_argument("name", help="a family name")
    audit_cmd.add_argument("--episodes", type=int, default=2, help="tasks per level (default: 2)")
    audit_cmd.add_argument("--data-dir", help="land the audit in this warehouse's family_audits (default: print only)")
    audit_cmd.set_defaults(func=cmd_audit_family)

    new_cmd = sub.add_parser("new-family", help="write a small working family into one new folder (envs/NAME/)")
    new_cmd.add_argument("name", help="the family's name: ^[a-z][a-z0-9_]*$, not taken")
    new_cmd.add_argument("--dir", help="where to write NAME/ (default: the envs package folder, a built-in "
                                       "family; elsewhere a package for the gymfoundry.families entry point)")
    new_cmd.set_defaults(func=cmd_new_family)
