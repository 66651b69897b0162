"""What the command groups share: the usage error, the checks every command makes of its data dir
and families before anything slow starts, and the options written once (the data dir, the
families, the policy and its sampling). Nothing here imports Prefect or the warehouse at load:
`gymfoundry --help` builds every command's options."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from gymfoundry.envs.records import PolicySpec, Sampling
from gymfoundry.flows.config import checked_families
from gymfoundry.flows.defaults import DEFAULT_DATA_DIR
from gymfoundry.tasks.policies.registry import make_policy


class UsageError(ValueError):
    """The command line names something that is missing or not allowed."""


def existing_warehouse(data_dir: str) -> None:
    """Commands that read or repair a warehouse refuse a data dir without one (a mistyped path),
    creating nothing there."""
    from gymfoundry.warehouse import CATALOG_FILE  # local: the warehouse loads duckdb (~0.7 s); --help needs none

    if not (Path(data_dir) / CATALOG_FILE).is_file():
        raise UsageError(f"--data-dir {data_dir}: no warehouse there (no {CATALOG_FILE}); nothing was done")


def check_families(families: list[str] | None) -> None:
    """Each family named is registered (one line naming the known ones otherwise)."""
    if families:
        checked_families(families)


def add_data_dir(parser: argparse.ArgumentParser, default: str = DEFAULT_DATA_DIR) -> None:
    parser.add_argument("--data-dir", default=default)


def add_families(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--families", nargs="+")


SPEC_OPTIONS = {"max_tokens": "--max-tokens", "top_p": "--top-p", "seed": "--sampling-seed", "stop": "--stop",
                "temperature": "--temperature", "max_concurrency": "--concurrency", "timeout_s": "--request-timeout",
                "max_retries": "--request-retries", "api_key_env": "--api-key-env", "kind": "--policy",
                "mistake_rate": "--mistake-rate", "base_url": "--base-url", "model": "--model"}


def policy_spec(args: argparse.Namespace) -> PolicySpec:
    """The PolicySpec the run options name (`--policy` and its model, endpoint and sampling).
    An invalid one raises ValueError with one line naming the option."""
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
        try:
            make_policy(spec, "inventory")
        except ValueError as exc:
            raise ValueError(f"--policy: {exc}") from None
    return spec


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
