"""The `--vllm SPEC` options every command shares, and turning them into sources."""

from __future__ import annotations

import argparse
from typing import List, Sequence

DEFAULT_SPEC = ">=0.18.0"


def add_target_args(parser: argparse.ArgumentParser, default: "str | None" = DEFAULT_SPEC) -> None:
    group = parser.add_argument_group("vLLM targets")
    help_default = f" (default: {default!r})" if default else ""
    group.add_argument(
        "--vllm", action="append", metavar="SPEC", default=None,
        help="0.19.1, pypi:0.19.1, latest, '>=0.18', index:URL#VERSION, wheel:PATH, dir:PATH, "
             "git:PATH@REF, image:NAME; repeatable" + help_default,
    )
    group.add_argument("--index-url", help="package index (default: $SPARKMODS_INDEX_URL or PyPI)")
    group.add_argument("--offline", action="store_true", help="use only the on-disk cache, no network")
    group.add_argument("--pre", action="store_true", help="include pre-releases when expanding ranges")
    parser.set_defaults(_default_spec=default)


def add_cache_arg(parser: argparse.ArgumentParser, flag: str = "--no-cache") -> None:
    """The switch that makes a command check every row again instead of reusing results stored
    for the same inputs (resultcache.py); the fresh results are stored."""
    parser.add_argument(flag, dest="no_cache", action="store_true",
                        help="check every row again instead of reusing stored results for unchanged inputs")


def open_sources(args: argparse.Namespace) -> List:
    """Every VllmSource the --vllm options name, in the order given (ranges oldest first)."""
    from sparkmods.sources import open_targets

    specs: Sequence[str] = args.vllm or ([args._default_spec] if args._default_spec else [])
    sources: List = []
    for spec in specs:
        sources.extend(open_targets(spec, index_url=args.index_url, offline=args.offline, prereleases=args.pre))
    return sources
