#!/usr/bin/env python3
"""Benchmark: what reading one mod's files from every vLLM release costs, cold and warm.

For each release in SPEC (default >=0.18.0) it reads PATHS (default: the files the
int8-lm-head and hybrid-int4-fp8 mods patch) over HTTP range requests, first with an empty
cache (a temp dir), then again warm. It prints bytes transferred, requests and wall time
next to the floor (central directories + member spans: what any zip reader must fetch),
one full wheel and all of them. Exit code 1 when a goal is missed:
cold < 3 s, warm < 0.5 s, at most 2 requests per release when cold (the tail with the whole
central directory, then the members). Bytes over the floor are reported, not a goal: the
reader trades them for round trips (sources/remote.py: TAIL_BYTES, READ_AHEAD).

    .venv/bin/python ci/bench/bench_fetch.py [PATH ...] [--spec '>=0.18.0'] [--jobs 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Sequence

from sparkmods.checking.batch import SOURCE_JOBS
from sparkmods.sources import open_targets, stats
from sparkmods.sources.remote import RemoteWheel

DEFAULT_PATHS = ["vllm/model_executor/layers/logits_processor.py",
                 "vllm/model_executor/layers/quantization/inc.py"]
GOAL_COLD_S, GOAL_WARM_S, GOAL_REQUESTS_PER_RELEASE = 3.0, 0.5, 2


def read_all(spec: str, paths: Sequence[str], jobs: int, index_url: "str | None") -> dict:
    """Open every release, prefetch and read paths on each (sources in parallel, like check)."""
    stats.reset()
    started = time.monotonic()
    sources = open_targets(spec, index_url=index_url)

    def one(source) -> int:
        source.prefetch(paths)
        return sum(len(source.read(p) or b"") for p in paths)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        content = sum(pool.map(one, sources))
    wall = time.monotonic() - started
    return {"wall_s": round(wall, 3), "content_bytes": content, "sources": sources, **stats.snapshot()}


def floor_bytes(sources: List[RemoteWheel], paths: Sequence[str]) -> int:
    """Central directory (to end of file) plus each present member's span, summed over wheels."""
    total = 0
    for source in sources:
        layout = source.layout()
        total += source_size(source) - layout.central_offset
        total += sum(end - start for start, end in layout.spans(paths))
    return total


def source_size(source: RemoteWheel) -> int:
    if source.size is None:
        raise SystemExit(f"{source.label}: the index gives no file size; use a PEP 691 index")
    return source.size


def mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def main(argv: "Sequence[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS, metavar="PATH")
    parser.add_argument("--spec", default=">=0.18.0", help="vLLM target spec (default: >=0.18.0)")
    parser.add_argument("--index-url", help="package index (default: $SPARKMODS_INDEX_URL or PyPI)")
    parser.add_argument("--jobs", type=int, default=SOURCE_JOBS,
                        help=f"sources read in parallel (default {SOURCE_JOBS}, as check)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="sparkmods-bench-") as cache:
        os.environ["SPARKMODS_CACHE_DIR"] = cache
        cold = read_all(args.spec, args.paths, args.jobs, args.index_url)
        warm = read_all(args.spec, args.paths, args.jobs, args.index_url)
        sources = cold.pop("sources")
        warm.pop("sources")
        floor = floor_bytes(sources, args.paths)
    sizes = [source_size(s) for s in sources]
    result = {
        "releases": [s.version for s in sources], "paths": args.paths, "cold": cold, "warm": warm,
        "floor_bytes": floor, "one_wheel_bytes": sizes[-1], "all_wheels_bytes": sum(sizes),
        "goals": {"cold_s": cold["wall_s"] < GOAL_COLD_S, "warm_s": warm["wall_s"] < GOAL_WARM_S,
                  "cold_requests_at_most_2_per_release":
                      cold["requests"] - 1 <= GOAL_REQUESTS_PER_RELEASE * len(sources)},  # - the index page
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{len(sources)} releases ({sources[0].version} .. {sources[-1].version}), "
              f"{len(args.paths)} path(s): {' '.join(args.paths)}")
        for name, run in (("cold", cold), ("warm", warm)):
            print(f"  {name}: {run['wall_s']:.3f} s wall, {run['requests']} requests, {mib(run['bytes'])} "
                  f"transferred, {run['cache_hits']} cache hits, {run['content_bytes']:,} bytes of files read")
        print(f"  floor (central directories + member spans): {mib(floor)}; "
              f"cold / floor = {cold['bytes'] / floor:.3f}")
        print(f"  one full wheel ({sources[-1].version}): {mib(sizes[-1])}; "
              f"all {len(sizes)} wheels: {mib(sum(sizes))} "
              f"({sum(sizes) / max(cold['bytes'], 1):,.0f}x the cold transfer)")
        for goal, ok in result["goals"].items():
            print(f"  goal {goal}: {'met' if ok else 'MISSED'}")
    return 0 if all(result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
