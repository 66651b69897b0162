"""`gymfoundry labels export|import`, `calibrate` and `rescore`: the PRM's human calibration and
re-scoring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gymfoundry.flows.cli.options import UsageError, add_data_dir, add_families, check_families, existing_warehouse
from gymfoundry.flows.defaults import prefect_defaults


def cmd_labels_export(args: argparse.Namespace) -> int:
    from gymfoundry.tasks.ops.calibrate import export_label_sample  # local: duckdb and pandas (~0.5 s); --help needs none

    existing_warehouse(args.data_dir)
    check_families(args.families)
    out = export_label_sample(args.data_dir, args.out, n=args.n, seed=args.seed, families=args.families)
    print(f"{out['rows']} steps from {out['strata']} strata (family x score bucket x termination)")
    print(f"label them -1 / 0 / +1 in the `label` column, with your `labeller_id`:\n  {out['csv']}\n  {out['parquet']}")
    return 0


def cmd_labels_import(args: argparse.Namespace) -> int:
    from gymfoundry.tasks.ops.calibrate import import_labels  # local: duckdb and pandas (~0.5 s); --help needs none

    existing_warehouse(args.data_dir)
    missing = [path for path in args.files if not Path(path).is_file()]
    if missing:
        raise UsageError(f"no such file: {', '.join(missing)}; nothing was imported")
    for path in args.files:
        out = import_labels(args.data_dir, path, labeller_id=args.labeller)
        print(f"{path}: {out['imported']} labels imported, {out['skipped_unlabelled']} unlabelled rows skipped"
              + (f"; by label {out['by_label']}, labellers {out['labellers']}" if out["imported"] else ""))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    existing_warehouse(args.data_dir)
    check_families(args.families)
    if not 0 < args.holdout < 1:
        raise UsageError(f"--holdout {args.holdout:g}: the held-out share must be between 0 and 1")
    prefect_defaults()
    from gymfoundry.flows.scoring import calibrate  # local: Prefect loads only for commands that run flows
    from gymfoundry.tasks.ops.calibrate import render_agreement  # local: duckdb and pandas (~0.5 s)

    reports = calibrate(data_dir=args.data_dir, families=args.families, kind=args.kind, holdout=args.holdout,
                        seed=args.seed, min_labels=args.min_labels, judge_base_url=args.judge_base_url,
                        judge_model=args.judge_model)
    if not reports:
        print("no labels imported yet: gymfoundry labels export / import first", file=sys.stderr)
        return 1
    print(render_agreement(reports))
    print("\nagreement on held-out labels; later scoring runs (run, rescore) apply the new calibrators")
    return 0


def cmd_rescore(args: argparse.Namespace) -> int:
    existing_warehouse(args.data_dir)
    check_families(args.families)
    missing = [path for path in args.profile or [] if not Path(path).is_file()]
    if missing:
        raise UsageError(f"--profile: no such file: {', '.join(missing)}")
    prefect_defaults()
    from gymfoundry.flows.scoring import rescore  # local: Prefect loads only for commands that run flows

    report = rescore(data_dir=args.data_dir, families=args.families, where=args.where, profile_paths=args.profile,
                     judge_base_url=args.judge_base_url, judge_model=args.judge_model,
                     use_calibrators=not args.no_calibrator, batch_size=args.batch_size)
    print(f"re-scored {report['rollouts']} rollouts ({report['steps']} steps): "
          f"{report['landed'].get('step_scores', 0)} new score rows")
    for v in report["versions"]:
        print(f"  {v['layer']:<10} {v['scorer_id']:<24} {v['scorer_version']}  ({v['rows']} rows)")
    judge = report["judge"]
    print(f"judge: {judge['requests']} requests, {judge['cache_hits']} cached, {judge['errors']} failed")
    return 0


def judge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--judge-base-url", help="OpenAI-compatible API root (default: GYMFOUNDRY_JUDGE_BASE_URL); "
                                            "the key comes only from GYMFOUNDRY_JUDGE_API_KEY")
    p.add_argument("--judge-model", help="default: GYMFOUNDRY_JUDGE_MODEL")


def add_prm_commands(sub) -> None:
    labels = sub.add_parser("labels", help="human labels for PRM calibration")
    labels_sub = labels.add_subparsers(dest="action", required=True)
    export = labels_sub.add_parser("export", help="write a stratified sample of steps to label (CSV + Parquet)")
    export.add_argument("--out", required=True, help="path without suffix; writes <out>.csv and <out>.parquet")
    export.add_argument("--n", type=int, default=200, help="steps in the sample")
    export.add_argument("--seed", type=int, default=0)
    add_families(export)
    add_data_dir(export)
    export.set_defaults(func=cmd_labels_export)
    imp = labels_sub.add_parser("import", help="import labelled CSV / Parquet files (-1 / 0 / +1)")
    imp.add_argument("files", nargs="+")
    imp.add_argument("--labeller", help="labeller id for rows without one")
    add_data_dir(imp)
    imp.set_defaults(func=cmd_labels_import)

    cal = sub.add_parser("calibrate", help="fit PRM calibrators on the imported labels (the calibrate flow)")
    add_families(cal)
    cal.add_argument("--kind", default="isotonic", choices=["isotonic", "logistic"])
    cal.add_argument("--holdout", type=float, default=0.3, help="share of labelled rollouts held out")
    cal.add_argument("--seed", type=int, default=0)
    cal.add_argument("--min-labels", type=int, default=20)
    add_data_dir(cal)
    judge_options(cal)
    cal.set_defaults(func=cmd_calibrate)

    re = sub.add_parser("rescore", help="re-score stored rollouts under the current PRM versions (the rescore flow)")
    add_families(re)
    re.add_argument("--where", help="SQL filter on the rollouts view")
    re.add_argument("--profile", nargs="+", help="DomainProfile YAML files replacing their family's profile")
    re.add_argument("--no-calibrator", action="store_true", help="do not apply the current calibrators")
    re.add_argument("--batch-size", type=int, default=200, help="rollouts per scoring task")
    add_data_dir(re)
    judge_options(re)
    re.set_defaults(func=cmd_rescore)
