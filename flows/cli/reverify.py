"""`gymfoundry reverify`: the `reverify` flow from the command line."""

from __future__ import annotations

import argparse

from gymfoundry.flows.cli.options import add_data_dir, add_families, check_families, existing_warehouse
from gymfoundry.flows.defaults import prefect_defaults


def cmd_reverify(args: argparse.Namespace) -> int:
    existing_warehouse(args.data_dir)
    check_families(args.families)
    prefect_defaults()
    from gymfoundry.flows.reverify import reverify  # local: Prefect loads only for commands that run flows

    report = reverify(data_dir=args.data_dir, families=args.families, where=args.where, batch_size=args.batch_size)
    print(f"re-verified {report['reverified']} of {report['rollouts']} rollouts "
          f"({report['already_verified']} already verified at the current version, {report['backfilled']} factory "
          f"verdicts backfilled): {report['landed'].get('outcomes', 0)} new outcome rows, "
          f"{report['changed']} changed class, {report['verifier_errors']} verifier errors")
    for v in report["versions"]:
        print(f"  {v['verifier_id']:<20} {v['verifier_version']:<8} {v['source']:<9} {v['termination']:<20} "
              f"{v['rollouts']:>6}")
    for line in report["first_verifier_errors"]:
        print(f"  verifier error: {line}")
    if report["faults"]:
        print(f"{report['faults']} rollouts met an environment fault in the grader (not landed; re-run reverify)")
    for reason, n in report["unverifiable"].items():
        print(f"  left out: {n} rollouts ({reason})")
    if report["rollouts_per_s"]:
        print(f"verifier: {report['verify_seconds']} s, {report['rollouts_per_s']} rollouts/s")
    print("side by side: gymfoundry sql \"pivot (select rollout_id, verifier_version, success from outcomes) "
          "on verifier_version using first(success) order by rollout_id\"")
    return 0


def add_reverify_command(sub) -> None:
    p = sub.add_parser("reverify", help="re-verify stored rollouts under the current outcome verifiers, "
                                        "beside the older verdicts (the reverify flow)")
    add_families(p)
    p.add_argument("--where", help="SQL filter on the rollouts view")
    p.add_argument("--batch-size", type=int, default=100, help="rollouts per verification task")
    add_data_dir(p)
    p.set_defaults(func=cmd_reverify)
