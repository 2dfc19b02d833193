"""A served decode step's kernels, read from the trace vLLM's torch profiler writes.

Why: a layer benchmark models one attention layer; a served step also holds what vLLM does around
it (its cache layout and page, its graphs, everything else in the model). Profiling the server
itself, while every request of a cell decodes, puts a served gap on kernels instead of guessing it.

The trace is Chrome's trace-event JSON (what torch.profiler exports; vLLM gzips it). A decode step
under full CUDA graphs is one `cudaGraphLaunch` on the host; the kernels inside the graph are
recorded as kernels. Steps are counted between the first and the last graph launch and the kernels
that started in that span are summed by name: per step, about one step of slack over the span.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Sequence

PROFILE_S = 0.5  # decode time profiled per configuration
KERNEL_CHARS = 60  # kernel names are cut to this (templates make them pages long)
TOP = 40  # kernels kept per configuration, the longest first
MAX_TRACE_BYTES = 2 << 30  # a trace is read whole: the bound on what it may inflate to


class ProfileError(Exception):
    """A trace that cannot be read or holds no decode step; the message names it."""


def profiler_flags(trace_dir: Path) -> list[str]:
    """vllm serve flags that let /start_profile and /stop_profile write a worker trace to trace_dir
    (no host stacks, no stdout table: the trace is all we read)."""
    config = {"profiler": "torch", "torch_profiler_dir": str(trace_dir), "ignore_frontend": True,
              "torch_profiler_with_stack": False, "torch_profiler_dump_cuda_time_total": False}
    return ["--profiler-config", json.dumps(config)]


def newest_trace(trace_dir: Path) -> Path:
    """The last trace file written into trace_dir (.json or .json.gz)."""
    found = [p for p in trace_dir.glob("*.json*") if p.name.endswith((".json", ".json.gz"))] if trace_dir.is_dir() else []
    if not found:
        raise ProfileError(f"{trace_dir}: no trace file; was the server started with --profiler-config?")
    return max(found, key=lambda p: p.stat().st_mtime)


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The trace's events (gzip or plain JSON), at most MAX_TRACE_BYTES of it once inflated."""
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            text = fh.read(MAX_TRACE_BYTES + 1)
        if len(text) > MAX_TRACE_BYTES:
            raise ProfileError(f"{path}: over {MAX_TRACE_BYTES} bytes once inflated; profile a shorter span (PROFILE_S)")
        trace = json.loads(text)
    except (OSError, ValueError, EOFError) as exc:
        raise ProfileError(f"{path}: not a readable trace ({exc})") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ProfileError(f"{path}: no traceEvents list; not a torch profiler trace")
    return [e for e in events if isinstance(e, dict)]


def _complete(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur"), (int, float))]


def step_kernels(events: Sequence[dict[str, Any]], source: str = "trace", top: int = TOP) -> dict[str, Any]:
    """Per decode step: host time between graph launches, GPU kernel time, and each kernel name's
    calls and microseconds (the `top` longest)."""
    timed = _complete(events)
    launches = sorted(e["ts"] for e in timed if e.get("name") == "cudaGraphLaunch")
    if len(launches) < 2:
        raise ProfileError(f"{source}: {len(launches)} CUDA graph launches; no decode step was profiled "
                           "(were the requests decoding, with CUDA graphs on?)")
    first, last = launches[0], launches[-1]
    steps = len(launches) - 1
    us: dict[str, float] = defaultdict(float)
    calls: Counter[str] = Counter()
    for e in timed:
        if e.get("cat") == "kernel" and first <= e["ts"] < last:
            name = str(e.get("name", "?")).removeprefix("void ")[:KERNEL_CHARS]
            us[name] += e["dur"]
            calls[name] += 1
    kernels = sorted(({"kernel": k, "calls": round(calls[k] / steps, 2), "us": round(v / steps, 2)} for k, v in us.items()),
                     key=lambda r: -r["us"])
    return {"steps": steps, "step_us": round((last - first) / steps, 1), "kernel_us": round(sum(us.values()) / steps, 1),
            "kernels": kernels[:top]}


def clear_traces(trace_dir: Path) -> None:
    """Remove the trace files of trace_dir (a run killed between a trace and its profile.json may
    have left one), so the next profile reads only what its own /stop_profile wrote."""
    if trace_dir.is_dir():
        for path in trace_dir.iterdir():
            if path.is_file():
                path.unlink()


def write_profile(trace_dir: Path, into: Path, cell: dict[str, Any]) -> dict[str, Any]:
    """Read the newest trace of trace_dir into `into` (profile.json: the cell and its step), then
    delete the trace files (they are large; the step is what is kept)."""
    trace = newest_trace(trace_dir)
    profile = {**cell, **step_kernels(read_trace(trace), str(trace))}
    tmp = into.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile, indent=1) + "\n")
    tmp.replace(into)
    clear_traces(trace_dir)
    return profile


def markdown(profiles: dict[str, dict[str, Any]], rows: int = 20) -> list[str]:
    """Lines of the report's section: per configuration the step's host and kernel time and the
    GPU's clock and power just before it was profiled (blank where not sampled), then the longest
    kernels side by side (microseconds per step; blank where a configuration has none)."""
    if not profiles:
        return []
    configs = list(profiles)
    cells = {(c, p["batch"], p["context"]) for c, p in profiles.items()}
    out = ["## Kernels of one decode step (vLLM's torch profiler, while every request decodes)", ""]
    out += ["| config | batch | context | steps | host us per step | kernel us per step | SM MHz | W |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c, b, x in sorted(cells, key=lambda t: configs.index(t[0])):
        clocks = profiles[c].get("clocks") or {}
        out.append(f"| {c} | {b} | {x} | {profiles[c]['steps']} | {profiles[c]['step_us']} | {profiles[c]['kernel_us']} | "
                   f"{clocks.get('sm_mhz', '')} | {clocks.get('power_w', '')} |")
    names: dict[str, float] = {}
    for p in profiles.values():
        for k in p["kernels"]:
            names[k["kernel"]] = max(names.get(k["kernel"], 0.0), k["us"])
    longest = sorted(names, key=lambda n: -names[n])[:rows]
    per = {c: {k["kernel"]: k for k in p["kernels"]} for c, p in profiles.items()}
    out += ["", "| kernel | " + " | ".join(f"{c} us (calls)" for c in configs) + " |",
            "|---|" + "---:|" * len(configs)]
    for name in longest:
        vals = [f"{per[c][name]['us']} ({per[c][name]['calls']:g})" if name in per[c] else "" for c in configs]
        out.append(f"| `{name.replace('|', '/')}` | " + " | ".join(vals) + " |")
    return out + [""]
