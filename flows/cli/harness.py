"""`gymfoundry serve-env` and `gymfoundry proxy`: an external agent harness plays episodes
(docs/harness.md); its episodes land as rollouts."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import uuid

import anyio
import uvicorn

from gymfoundry.flows.cli.options import add_data_dir, check_families
from gymfoundry.tasks.harness.http_guard import READ_TIMEOUT_S, check_limits, guarded_config


def cmd_serve_env(args: argparse.Namespace) -> int:
    """The env's tools over MCP for an external harness; its episodes land as rollouts. Under
    stdio, stdout is the MCP channel: everything said here goes to stderr."""
    check_families([args.family])  # before the hub locks a holdout for it
    try:
        check_limits(args.max_connections, args.read_timeout)  # before it too
    except ValueError as exc:
        print(f"gymfoundry serve-env: {exc}", file=sys.stderr)
        return 2
    from gymfoundry.tasks.harness.hub import EpisodeHub  # local: the warehouse's duckdb (~0.7 s); --help needs none
    from gymfoundry.tasks.harness.mcp_server import build_app, serve_stdio  # local: the mcp package (~0.6 s)

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
    from gymfoundry.tasks.harness.proxy import build_proxy  # local: the warehouse's duckdb (~0.7 s); --help needs none

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
    add_data_dir(serve)
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
    add_data_dir(proxy)
    proxy.set_defaults(func=cmd_proxy)
