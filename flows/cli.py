"""`gymfoundry` command line: run the factory, list envs, query the warehouse.

Exit status: 0 done; 2 the command line names something missing or not allowed (checked before
Prefect starts, or refused by a flow as bad input: one line, no traceback); 1 the command ran and
failed (a failed check, a refused or cancelled query, damaged or locked storage: one line; any
other exception is a crash and shows its traceback)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from pathlib import Path

DEFAULT_DATA_DIR = ".gymfoundry"


class UsageError(ValueError):
    """The command line names something that is missing or not allowed."""


def existing_warehouse(data_dir: str) -> None:
    """Commands that read or repair a warehouse refuse a data dir without one (a mistyped path),
    creating nothing there."""
    from gymfoundry.warehouse import CATALOG_FILE

    if not (Path(data_dir) / CATALOG_FILE).is_file():
        raise UsageError(f"--data-dir {data_dir}: no warehouse there (no {CATALOG_FILE}); nothing was done")


def check_families(families: list[str] | None) -> None:
    """Each family named is registered (one line naming the known ones otherwise)."""
    from gymfoundry.flows.config import _families

    if families:
        _families(families)


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


def _prefect_defaults() -> None:
    # A cold ephemeral Prefect server can need 20 s to start on a small machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def cmd_run(args: argparse.Namespace) -> int:
    """Validate the whole run configuration first (in well under a second, before Prefect is
    imported), then check the warehouse, then run the factory flow with rich progress bars."""
    from gymfoundry.envs.records import FaultConfig, RetryPolicy
    from gymfoundry.flows.config import FactoryConfig, from_args

    get = lambda name, default=None: getattr(args, name, default)  # noqa: E731

    def values() -> dict:
        retry = {"max_retries": get("max_retries"), "backoff_s": get("retry_backoff"), "on_exhausted": get("on_exhausted")}
        return {"policy": policy_spec(args), "retry": RetryPolicy(**{k: v for k, v in retry.items() if v is not None}),
                "faults": FaultConfig(rate=args.fault_rate, seed=get("seed", 0)) if get("fault_rate") else None,
                "train_hyperparameters": {"time_limit_s": get("train_seconds", 900)} if get("train_after") else None}

    try:
        config = from_args(FactoryConfig, args, values)
    except ValueError as exc:  # one line naming each invalid option
        print(f"gymfoundry run: {exc}", file=sys.stderr)
        return 2
    from gymfoundry.warehouse import assert_intact

    assert_intact(config.data_dir)  # damaged storage fails here, before any episode runs, naming the files
    _prefect_defaults()
    from gymfoundry.flows.factory import factory
    from gymfoundry.flows.progress_bars import progress_bars

    with progress_bars(enabled=not get("quiet", False)):
        report = factory(**config.params())
    print_report(report)
    if "training" in report:
        training = report["training"]
        print(f"\ntrained {training['method']} run {training['run_id']}: checkpoint {training['checkpoint']}")
    return 2 if report["quarantined"] else 0


SPEC_OPTIONS = {"max_tokens": "--max-tokens", "top_p": "--top-p", "seed": "--sampling-seed", "stop": "--stop",
                "temperature": "--temperature", "max_concurrency": "--concurrency", "timeout_s": "--request-timeout",
                "max_retries": "--request-retries", "api_key_env": "--api-key-env", "kind": "--policy",
                "mistake_rate": "--mistake-rate", "base_url": "--base-url", "model": "--model"}


def policy_spec(args: argparse.Namespace):
    """The PolicySpec the run options name (`--policy` and its model, endpoint and sampling).
    An invalid one raises ValueError with one line naming the option."""
    from pydantic import ValidationError

    from gymfoundry.envs.records import PolicySpec, Sampling

    get = lambda name: getattr(args, name, None)  # noqa: E731  (demo sets only the scripted options)
    optional = {"timeout_s": get("request_timeout"), "max_retries": get("request_retries"),
                "max_concurrency": get("concurrency")}
    try:
        sampling = Sampling(temperature=get("temperature"), top_p=get("top_p"), max_tokens=get("max_tokens"),
                            seed=get("sampling_seed"), stop=get("stop"))
        spec = PolicySpec(kind=args.policy, model=get("model"), base_url=get("base_url"),
                          api_key_env=get("api_key_env"), sampling=sampling,
                          mistake_rate=get("mistake_rate") if args.policy == "scripted" else None,
                          options={"request_token_ids": True} if get("request_token_ids") else {},
                          **{k: v for k, v in optional.items() if v is not None})
    except ValidationError as exc:
        raise ValueError("; ".join(f"{SPEC_OPTIONS.get(str(e['loc'][-1]) if e['loc'] else '', '--policy')}: "
                                   f"{e['msg'].removeprefix('Value error, ')}"
                                   + (f" (got {e['input']!r})" if e["type"].startswith(("greater", "less")) else "")
                                   for e in exc.errors())) from None
    if spec.kind not in ("scripted", "hf", "openai"):  # a custom kind: the registry knows it or says which are
        from gymfoundry.tasks.policies.registry import make_policy

        try:
            make_policy(spec, "inventory")
        except ValueError as exc:
            raise ValueError(f"--policy: {exc}") from None
    return spec


def print_report(report: dict) -> None:
    print(f"\nwarehouse: {report['data_dir']}/catalog.duckdb  (lake: {report['data_dir']}/lake)")
    print("landed rows: " + ", ".join(f"{k}={v}" for k, v in sorted(report["landed"].items())))
    for kind, d in report["datasets"].items():
        print(f"{kind} dataset {d['dataset_id']}: {d['rows']} rows  {d['path'] or ''}")
    print("\nrollouts by family and termination:")
    width = max([len(r["termination"]) for r in report["summary"]] + [11])
    for r in report["summary"]:
        print(f"  {r['task_family']:<12} {r['termination']:<{width}} {r['rollouts']:>6}")
    run = report["run"]
    print(f"\nrun {run['run_id']}: {run['attempted']} rollouts attempted, {run['retries']} retries, "
          f"{run['skips']} skipped; " + ", ".join(f"{k}={v}" for k, v in run["by_class"].items()))
    for path in report["quarantined"]:
        print(f"QUARANTINED: a batch failed the quality gates; rows and report in {path}", file=sys.stderr)


def cmd_envs(args: argparse.Namespace) -> int:
    from gymfoundry.envs.family import families

    for fam in families():
        tools = ", ".join(f"{t.name}({t.category.value})" for t in fam.profile.tools)
        print(f"{fam.env_id}  tools: {tools}")
    return 0


def cmd_check_family(args: argparse.Namespace) -> int:
    """Exit 1, with the report, when a conformance check or the gameability audit fails."""
    from gymfoundry.envs.check import check_family

    report = check_family(args.name, seeds=args.seeds)
    print(report.render(), file=sys.stdout if report.ok else sys.stderr)
    if args.no_audit or not report.ok:  # a family failing its checks is not worth auditing yet
        return 0 if report.ok else 1
    audited = cmd_audit_family(argparse.Namespace(name=args.name, episodes=args.audit_episodes, data_dir=None))
    return 0 if report.ok and audited == 0 else 1


def cmd_audit_family(args: argparse.Namespace) -> int:
    """Exit 1, with the table, when an adversary beats its floor or reaches the oracle's return.
    With a data dir, the audit lands in `family_audits` (what dataset assembly asks for)."""
    from gymfoundry.tasks.stages.audit import audit_family, land_audit

    report = audit_family(args.name, episodes=args.episodes)
    print(report.render(), file=sys.stdout if report.ok else sys.stderr)
    if args.data_dir:
        from gymfoundry.warehouse import Warehouse

        with Warehouse(args.data_dir) as wh:
            landed = land_audit(wh, report)
        print(f"audit {report.rows[0].audit_id}: {landed} row(s) landed in family_audits under {args.data_dir}")
    return 0 if report.ok else 1


def cmd_new_family(args: argparse.Namespace) -> int:
    """Exit 2, writing nothing, for a refused name."""
    from gymfoundry.envs.scaffold import ScaffoldError, main_message, new_family

    try:
        folder = new_family(args.name, args.dir)
    except ScaffoldError as exc:
        print(f"gymfoundry new-family: {exc}", file=sys.stderr)
        return 2
    print(main_message(folder, args.name))
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from gymfoundry.warehouse.console import check_size, query, render

    existing_warehouse(args.data_dir)
    if not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout:g}: the time limit must be more than 0 seconds")
    table = query(args.data_dir, args.query, timeout_s=args.timeout,
                  max_memory=check_size(args.max_memory) if args.max_memory else None)
    print(render(table, args.format, args.max_rows))
    return 0


def cmd_warehouse_check(args: argparse.Namespace) -> int:
    import json
    from datetime import datetime, timezone
    from pathlib import Path

    from gymfoundry.warehouse import Warehouse

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
    from gymfoundry.tasks.stages.assemble import rebuild_dataset
    from gymfoundry.warehouse import Warehouse

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


def cmd_labels_export(args: argparse.Namespace) -> int:
    from gymfoundry.tasks.ops.calibrate import export_label_sample

    existing_warehouse(args.data_dir)
    check_families(args.families)
    out = export_label_sample(args.data_dir, args.out, n=args.n, seed=args.seed, families=args.families)
    print(f"{out['rows']} steps from {out['strata']} strata (family x score bucket x termination)")
    print(f"label them -1 / 0 / +1 in the `label` column, with your `labeller_id`:\n  {out['csv']}\n  {out['parquet']}")
    return 0


def cmd_labels_import(args: argparse.Namespace) -> int:
    from gymfoundry.tasks.ops.calibrate import import_labels

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
    _prefect_defaults()
    from gymfoundry.flows.scoring import calibrate
    from gymfoundry.tasks.ops.calibrate import render_agreement

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
    _prefect_defaults()
    from gymfoundry.flows.scoring import rescore

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


def add_prm_commands(sub) -> None:
    """labels export|import, calibrate, rescore: the PRM's human calibration and re-scoring."""
    def judge_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--judge-base-url", help="OpenAI-compatible API root (default: GYMFOUNDRY_JUDGE_BASE_URL); "
                                                "the key comes only from GYMFOUNDRY_JUDGE_API_KEY")
        p.add_argument("--judge-model", help="default: GYMFOUNDRY_JUDGE_MODEL")

    labels = sub.add_parser("labels", help="human labels for PRM calibration")
    labels_sub = labels.add_subparsers(dest="action", required=True)
    export = labels_sub.add_parser("export", help="write a stratified sample of steps to label (CSV + Parquet)")
    export.add_argument("--out", required=True, help="path without suffix; writes <out>.csv and <out>.parquet")
    export.add_argument("--n", type=int, default=200, help="steps in the sample")
    export.add_argument("--seed", type=int, default=0)
    export.add_argument("--families", nargs="+")
    export.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    export.set_defaults(func=cmd_labels_export)
    imp = labels_sub.add_parser("import", help="import labelled CSV / Parquet files (-1 / 0 / +1)")
    imp.add_argument("files", nargs="+")
    imp.add_argument("--labeller", help="labeller id for rows without one")
    imp.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    imp.set_defaults(func=cmd_labels_import)

    cal = sub.add_parser("calibrate", help="fit PRM calibrators on the imported labels (the calibrate flow)")
    cal.add_argument("--families", nargs="+")
    cal.add_argument("--kind", default="isotonic", choices=["isotonic", "logistic"])
    cal.add_argument("--holdout", type=float, default=0.3, help="share of labelled rollouts held out")
    cal.add_argument("--seed", type=int, default=0)
    cal.add_argument("--min-labels", type=int, default=20)
    cal.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    judge_options(cal)
    cal.set_defaults(func=cmd_calibrate)

    re = sub.add_parser("rescore", help="re-score stored rollouts under the current PRM versions (the rescore flow)")
    re.add_argument("--families", nargs="+")
    re.add_argument("--where", help="SQL filter on the rollouts view")
    re.add_argument("--profile", nargs="+", help="DomainProfile YAML files replacing their family's profile")
    re.add_argument("--no-calibrator", action="store_true", help="do not apply the current calibrators")
    re.add_argument("--batch-size", type=int, default=200, help="rollouts per scoring task")
    re.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    judge_options(re)
    re.set_defaults(func=cmd_rescore)


def add_policy_options(parser: argparse.ArgumentParser, default: str = "scripted") -> None:
    """The options `policy_spec` reads: which policy, its model, endpoint, sampling and concurrency."""
    parser.add_argument("--policy", default=default,
                        help="scripted, hf (a checkpoint: --model DIR), openai (an endpoint: --model NAME --base-url "
                             "URL), or a registered custom kind")
    parser.add_argument("--model", help="hf: the checkpoint directory; openai: the served model's name")
    parser.add_argument("--base-url", help="openai: the endpoint, e.g. http://localhost:8000/v1")
    parser.add_argument("--api-key-env", help="openai: the NAME of the environment variable holding the key")
    parser.add_argument("--concurrency", type=int, help="episodes in flight at once per worker process (the "
                                                        "spec's max_concurrency; hf: the decoding batch)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--max-tokens", "--max-new-tokens", dest="max_tokens", type=int, help="tokens per model turn")
    parser.add_argument("--sampling-seed", type=int, help="combined with each episode's seed")
    parser.add_argument("--stop", nargs="+", help="stop sequences")
    parser.add_argument("--request-timeout", type=float, help="seconds per endpoint request (default 60)")
    parser.add_argument("--request-retries", type=int, help="retries of a failed endpoint request (default 2) "
                                                            "before the episode is an inference fault")
    parser.add_argument("--request-token-ids", action="store_true",
                        help="openai: ask a vLLM server for the sampled token ids (return_token_ids)")


def cmd_serve_env(args: argparse.Namespace) -> int:
    """The env's tools over MCP for an external harness; its episodes land as rollouts. Under
    stdio, stdout is the MCP channel: everything said here goes to stderr."""
    import signal
    import uuid

    import anyio
    import uvicorn

    from gymfoundry.tasks.harness.http_guard import check_limits, guarded_config

    check_families([args.family])  # before the hub locks a holdout for it
    try:
        check_limits(args.max_connections, args.read_timeout)  # before it too
    except ValueError as exc:
        print(f"gymfoundry serve-env: {exc}", file=sys.stderr)
        return 2
    from gymfoundry.tasks.harness.hub import EpisodeHub
    from gymfoundry.tasks.harness.mcp_server import build_app, serve_stdio

    hub = EpisodeHub(args.family, args.data_dir, tasks=args.tasks, seed=args.seed, idle_timeout_s=args.idle_timeout,
                     land_before_reply=args.transport == "stdio", max_open=args.max_open)
    # a terminated server still lands what ended (a stdio client terminates its server on close)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.transport == "stdio":
            episode = args.episode or uuid.uuid4().hex[:16]
            given = os.environ.get("GYMFOUNDRY_EPISODE_TOKEN")  # the launcher's: it started this process
            token = hub.open(episode, given or None)
            print(f"gymfoundry serve-env: one {args.family} episode {episode!r} over stdio"
                  + ("" if given else f"; its token (for the proxy): {token}"), file=sys.stderr)
            anyio.run(serve_stdio, hub, episode)
        else:
            print(f"gymfoundry serve-env: {args.family} episodes at http://{args.host}:{args.port}/episodes/<name>/mcp "
                  f"(open one: POST /episodes/<name>/open; end it: POST /episodes/<name>/finish); landing in "
                  f"{args.data_dir}", file=sys.stderr)
            uvicorn.Server(guarded_config(build_app(hub, args.host), args.host, args.port,
                                          max_connections=args.max_connections,
                                          read_timeout_s=args.read_timeout)).run()
    finally:
        landed = hub.close()
        print("gymfoundry serve-env: landed " + (", ".join(f"{k}={v}" for k, v in sorted(landed.items())) or "nothing")
              + (f"; {hub.unlanded} episodes stay spooled for the next landing" if hub.unlanded else ""),
              file=sys.stderr)
    return 0


def cmd_proxy(args: argparse.Namespace) -> int:
    import uvicorn

    from gymfoundry.tasks.harness.http_guard import check_limits, guarded_config
    from gymfoundry.tasks.harness.proxy import build_proxy

    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            print(f"gymfoundry proxy: the key variable {args.api_key_env} is not set", file=sys.stderr)
            return 2
    retries = {} if args.max_retries is None else {"max_retries": max(0, args.max_retries)}
    if args.max_request_bytes is not None:
        retries["max_request_bytes"] = args.max_request_bytes
    try:
        cap = check_limits(args.max_connections, args.read_timeout)
        # one upstream connection per harness connection at most
        app = build_proxy(args.upstream, args.data_dir, api_key=key, timeout_s=args.request_timeout,
                          request_logprobs=args.request_logprobs, request_token_ids=args.request_token_ids,
                          max_connections=cap, **retries)
        server = uvicorn.Server(guarded_config(app, args.host, args.port, max_connections=cap,
                                               read_timeout_s=args.read_timeout, timeout_graceful_shutdown=5))
    except ValueError as exc:
        print(f"gymfoundry proxy: {exc}", file=sys.stderr)
        return 2
    print(f"gymfoundry proxy: forwarding http://{args.host}:{args.port}/episodes/<name>/v1 to {args.upstream}, "
          f"recording in {args.data_dir}", file=sys.stderr)
    server.run()
    return 0


def add_http_limits(parser: argparse.ArgumentParser) -> None:
    """serve-env's and the proxy's limits against slow and many clients (tasks.harness.http_guard)."""
    from gymfoundry.tasks.harness.http_guard import READ_TIMEOUT_S

    parser.add_argument("--max-connections", type=int, default=None,
                        help="connections served at once; more are closed as they arrive (default: half the "
                             "process's descriptor limit, at most 1024)")
    parser.add_argument("--read-timeout", type=float, default=READ_TIMEOUT_S,
                        help="seconds a request's headers and body may take to arrive from its first byte; a "
                             f"slower one is cut unanswered (default: {READ_TIMEOUT_S:g})")


def add_harness_commands(sub) -> None:
    """serve-env and proxy: an external agent harness plays episodes (docs/harness.md)."""
    serve = sub.add_parser("serve-env", help="serve a family's tools over MCP, one episode per harness; episodes "
                                             "land as rollouts")
    serve.add_argument("--family", required=True, help="the family whose tasks and tools are served")
    serve.add_argument("--transport", choices=["http", "stdio"], default="http",
                       help="http (streamable HTTP, default) or stdio (one episode)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--episode", help="stdio: the episode's name (the proxy address names it too)")
    serve.add_argument("--tasks", type=int, default=32, help="tasks generated for the pool (default: 32)")
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--idle-timeout", type=float, help="end an episode no call touched for this many seconds")
    serve.add_argument("--max-open", type=int, default=1024, help="episodes open at once (default: 1024)")
    add_http_limits(serve)
    serve.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    serve.set_defaults(func=cmd_serve_env)

    proxy = sub.add_parser("proxy", help="a recording OpenAI-compatible chat endpoint in front of a model server")
    proxy.add_argument("--upstream", required=True, help="the model server, e.g. http://127.0.0.1:8000/v1")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--port", type=int, default=8766)
    proxy.add_argument("--api-key-env", help="the NAME of the environment variable holding the upstream's key")
    proxy.add_argument("--request-timeout", type=float, default=60.0, help="seconds per upstream request (default 60)")
    proxy.add_argument("--max-retries", type=int, default=None,
                       help="times the proxy sends a request again that failed on the upstream's side (default 2, "
                            "as the factory's endpoint policy)")
    proxy.add_argument("--request-logprobs", action="store_true",
                       help="ask the upstream for the sampled tokens' logprobs whatever the harness asked")
    proxy.add_argument("--request-token-ids", action="store_true",
                       help="ask a vLLM upstream for the sampled token ids (return_token_ids)")
    proxy.add_argument("--max-request-bytes", type=int, default=None,
                       help="refuse (413) a request body over this many bytes (default 8 MiB)")
    add_http_limits(proxy)
    proxy.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    proxy.set_defaults(func=cmd_proxy)


RUN_EXAMPLES = """examples:
  gymfoundry run --families inventory coding --tasks 200 --samples 4
  gymfoundry run --policy openai --model Qwen/Qwen2.5-7B-Instruct --base-url http://127.0.0.1:8000/v1 \\
                 --api-key-env OPENAI_API_KEY --concurrency 128 --temperature 0.7
  gymfoundry run --policy hf --model .gymfoundry/checkpoints/<run> --concurrency 16
  gymfoundry run --fault-rate 0.05 --max-retries 3 --on-exhausted fail"""


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import version

    from gymfoundry.envs.records import RetryPolicy
    from gymfoundry.flows.config import FactoryConfig, add_options

    parser = argparse.ArgumentParser(prog="gymfoundry", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gymfoundry {version('gymfoundry')}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the factory flow", formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=RUN_EXAMPLES)
    add_options(run, FactoryConfig)
    add_policy_options(run)
    retry = RetryPolicy.model_fields
    run.add_argument("--max-retries", type=int, help=f"retries of an env- or inference-faulted episode (default: "
                                                     f"{retry['max_retries'].default})")
    run.add_argument("--retry-backoff", type=float, help=f"seconds before the first retry, doubling (default: "
                                                         f"{retry['backoff_s'].default})")
    run.add_argument("--on-exhausted", choices=["skip", "fail"], help="when an episode's retries run out (default: skip)")
    run.add_argument("--fault-rate", type=float, help="inject env faults into this share of tool calls (default: none)")
    run.add_argument("--train-seconds", type=float, default=900, help="time budget of --train-after (default: 900)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="run the factory on the embedded default (50 inventory tasks, scripted)")
    demo.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(func=cmd_run, policy="scripted")

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

    sql = sub.add_parser("sql", help="run a SQL query on the warehouse")
    sql.add_argument("query")
    sql.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
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
    check.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    check.add_argument("--report", help="where to write the JSON report (default <data-dir>/reports/)")
    check.set_defaults(func=cmd_warehouse_check)
    repair = warehouse_sub.add_parser("repair", help="quarantine landings with missing or changed lake files and "
                                                     "rebuild the views (re-run the factory to land them again)")
    repair.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    repair.set_defaults(func=cmd_warehouse_repair)
    add_prm_commands(sub)
    from gymfoundry.flows.reverify_cli import add_reverify_command

    add_reverify_command(sub, DEFAULT_DATA_DIR)
    from gymfoundry.flows.training_cli import add_training_commands

    add_training_commands(sub)
    from gymfoundry.flows.report_cli import add_report_command

    add_report_command(sub, DEFAULT_DATA_DIR)
    add_harness_commands(sub)
    return parser


def failures() -> tuple[type[Exception], ...]:
    """What a command that ran can fail with for a known reason: one line and exit 1, no traceback."""
    import duckdb

    from gymfoundry.tasks.rollout.retry import RetryExhausted
    from gymfoundry.verifiers.endpoint import EndpointError
    from gymfoundry.warehouse import CatalogLocked, ConsoleRefused, DamagedWarehouse, QuarantinedBatch
    from gymfoundry.warehouse.console import QueryCancelled

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
    from pydantic import ValidationError

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


if __name__ == "__main__":
    sys.exit(main())
