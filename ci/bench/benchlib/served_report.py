#!/usr/bin/env python3
"""Table and plot of a served benchmark: served.json -> served.md and served.svg beside it.

    python3 ci/bench/benchlib/served_report.py ci/bench/results/served-<model>-<vllm>-<gpu>

served.json is the list of rows bench_served.py writes ({"model", "gpu", "vllm", "config", "batch",
"context", "tok_s", "kv_tokens", "first_tok_s", "phase", "note"}, and "tok_s_runs", each window's rate, where a
cell was measured more than once). The Markdown holds decode tok/s
per context and batch with each configuration's ratio to stock, KV capacity and time to first
token, and the first requests after start next to the steady rate, with the warm-up lines the mods
logged at start (servers/<config>/server.log: whether their kernels compiled before the first
request); the SVG draws tok/s against batch, one panel per context, one line per configuration.
Stdlib only, so it runs anywhere.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence
from xml.sax.saxutils import escape

if not __package__:  # run as a script: the benchmarks' folder, where benchlib is found
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlib import served_profile

COLOURS = ("#4d4d4d", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
KEYS = ("model", "gpu", "vllm", "config", "batch", "context", "tok_s", "kv_tokens", "first_tok_s")
SPREAD = 1.05  # windows of one cell further apart than this are listed under the table
# What a mod logs of its start-up warm-up (done, skipped or failed), without vLLM's log prefix.
WARMUP_LINE = re.compile(r"sparkmods [\w-]+: warm-up .*")


class ReportError(Exception):
    """An unusable served.json; the message names it."""


def load(results: Path) -> list[dict]:
    path = results / "served.json"
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: cannot read the rows ({exc}); run bench_served.py first") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(KEYS) <= set(r) for r in rows):
        raise ReportError(f"{path}: not a list of bench_served.py rows (each needs {', '.join(KEYS)})")
    return rows


def _configs(rows: Iterable[dict]) -> list[str]:
    return list(dict.fromkeys(r["config"] for r in rows))


def _steady(rows: Sequence[dict]) -> dict[tuple[str, int, int], dict]:
    return {(r["config"], r["context"], r["batch"]): r for r in rows if r.get("phase", "steady") == "steady"}


def _context(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def _cell(row: dict | None, stock: dict | None) -> str:
    if row is None:
        return ""
    if row["tok_s"] is None:
        note = row.get("note") or "no figure"
        return "- (skipped)" if note.startswith("skipped") else f"- ({note})"
    text = f"{row['tok_s']:.1f}"
    if stock is not None and stock["tok_s"] and row["config"] != "stock":
        text += f" ({row['tok_s'] / stock['tok_s']:.2f}x)"
    return text


def warmup_lines(results: Path, configs: Iterable[str]) -> dict[str, list[str]]:
    """Each configuration's warm-up lines from its server log (none when no mod logged one)."""
    found = {}
    for config in configs:
        log = results / "servers" / config / "server.log"
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        found[config] = [m.group(0).strip() for m in WARMUP_LINE.finditer(text)]
    return found


def profiles(results: Path, configs: Iterable[str]) -> dict[str, dict]:
    """Each configuration's profiled decode step (servers/<config>/profile.json), where one was taken."""
    found = {}
    for config in configs:
        path = results / "servers" / config / "profile.json"
        if path.is_file():
            try:
                found[config] = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise ReportError(f"{path}: not JSON ({exc}); run bench_served.py --profile again") from None
    return found


def markdown(rows: Sequence[dict], warmups: "dict[str, list[str]] | None" = None,
             steps: "dict[str, dict] | None" = None) -> str:
    """served.md: decode rate grid, KV capacity and time to first token, first requests vs steady,
    each configuration's warm-up lines (warmup_lines) and profiled decode step (profiles) when given."""
    first = rows[0]
    configs = _configs(rows)
    steady = _steady(rows)
    contexts = sorted({c for _, c, _ in steady})
    batches = sorted({b for _, _, b in steady})
    gens = sorted({r["gen"] for r in rows if r.get("gen")})  # rows from before it was recorded have none
    window = f" {' or '.join(map(str, gens))} tokens (`--gen`)" if gens else ""
    sharing = max((r.get("servers_on_gpu", 1) for r in rows), default=1)
    together = (f" The configurations were served at once ({sharing} servers on the GPU, each with its share of "
                "`--gpu-memory-utilization`: KV capacities are each server's) and each cell's windows taken in turn, "
                "the same prompts for each (`--together`).") if sharing > 1 else ""
    out = [f"# Served decode speed: {first['model']}, vLLM {first['vllm']}, {first['gpu']}", "",
           f"Aggregate decode tok/s while every request of the batch decodes{window} (ratio to stock); "
           f"`--load-format dummy` weights, CUDA graphs, made by `ci/bench/bench_served.py`.{together}", "",
           "| context | batch | " + " | ".join(configs) + " |", "|---:|---:|" + "---:|" * len(configs)]
    for context in contexts:
        for batch in batches:
            stock = steady.get(("stock", context, batch))
            cells = [_cell(steady.get((c, context, batch)), stock) for c in configs]
            out.append(f"| {_context(context)} | {batch} | " + " | ".join(cells) + " |")
    skipped = sorted({r["note"] for r in steady.values() if r["tok_s"] is None and (r.get("note") or "").startswith("skipped")})
    out += [""] + [f"- {note}" for note in skipped] if skipped else []
    repeated = [r for r in steady.values() if len(r.get("tok_s_runs") or ()) > 1]
    if repeated:
        spread = [r for r in repeated if max(r["tok_s_runs"]) > SPREAD * min(r["tok_s_runs"])]
        said = f"Each cell is the median of {len(repeated[0]['tok_s_runs'])} windows; "
        apart = f"differ by more than {SPREAD - 1:.0%}"
        out += ["", said + (f"cells whose windows {apart}:" if spread else f"in none do they {apart}.")]
        out += [f"- {r['config']} {_context(r['context'])} x {r['batch']}: "
                f"{', '.join(f'{v:.1f}' for v in r['tok_s_runs'])} tok/s{_host_busy(r)}" for r in spread]
    out += ["", "| config | KV cache tokens | " + " | ".join(f"first token at {_context(c)}, batch 1 (s)" for c in contexts) + " |",
            "|---|---:|" + "---:|" * len(contexts)]
    for config in configs:
        kv = next((r["kv_tokens"] for r in rows if r["config"] == config and r["kv_tokens"]), None)
        ttft = [steady.get((config, c, 1), {}).get("first_tok_s") for c in contexts]
        out.append(f"| {config} | {kv if kv is not None else '-'} | " +
                   " | ".join("-" if t is None else f"{t:.3f}" for t in ttft) + " |")
    firsts = [r for r in rows if r.get("phase") == "first"]
    if firsts:
        out += ["", "First requests after start (nothing ran before them) against the steady rate, same cell:", "",
                "| config | batch | context | first tok/s | steady tok/s | first / steady |", "|---|---:|---:|---:|---:|---:|"]
        for r in firsts:
            s = steady.get((r["config"], r["context"], r["batch"]))
            ratio = f"{r['tok_s'] / s['tok_s']:.2f}" if r["tok_s"] and s and s["tok_s"] else "-"
            out.append(f"| {r['config']} | {r['batch']} | {_context(r['context'])} | {_cell(r, None)} | "
                       f"{_cell(s, None)} | {ratio} |")
    if warmups is not None:
        out += ["", "Warm-up at start (the mods' own lines in each server log):", "",
                "| config | warm-up |", "|---|---|"]
        out += [f"| {config} | {'<br>'.join(f'`{line}`' for line in warmups.get(config, [])) or 'none logged'} |"
                for config in configs]
    if steps:
        out += [""] + served_profile.markdown(steps)
    return "\n".join(out).rstrip("\n") + "\n"


def svg(rows: Sequence[dict], panel_w: int = 260, panel_h: int = 220) -> str:
    """tok/s against batch (equally spaced), one panel per context, one polyline per configuration."""
    configs = _configs(rows)
    steady = _steady(rows)
    contexts = sorted({c for _, c, _ in steady})
    batches = sorted({b for _, _, b in steady})
    left, top, gap, legend_h = 50, 40, 30, 20 * len(configs) + 10
    width = left + len(contexts) * (panel_w + gap)
    height = top + panel_h + 50 + legend_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<text x="{left}" y="20" font-size="14">{escape(rows[0]["model"])}: decode tok/s against batch, '
           f'vLLM {escape(rows[0]["vllm"])}, {escape(rows[0]["gpu"])}</text>']
    for p, context in enumerate(contexts):
        x0 = left + p * (panel_w + gap)
        values = [r["tok_s"] for (c, ctx, _), r in steady.items() if ctx == context and r["tok_s"]]
        top_value = max(values, default=1.0) * 1.1

        def xy(batch: int, value: float) -> tuple[float, float]:
            step = panel_w / max(len(batches) - 1, 1)
            return x0 + batches.index(batch) * step, top + panel_h - value / top_value * panel_h

        out.append(f'<rect x="{x0}" y="{top}" width="{panel_w}" height="{panel_h}" fill="none" stroke="#999"/>')
        out.append(f'<text x="{x0 + panel_w / 2}" y="{top - 6}" text-anchor="middle">context {_context(context)}</text>')
        out.append(f'<text x="{x0 - 4}" y="{top + 10}" text-anchor="end">{top_value:.0f}</text>')
        for batch in batches:
            bx, _ = xy(batch, 0)
            out.append(f'<text x="{bx:.1f}" y="{top + panel_h + 16}" text-anchor="middle">{batch}</text>')
        for i, config in enumerate(configs):
            points = [xy(b, steady[(config, context, b)]["tok_s"]) for b in batches
                      if (config, context, b) in steady and steady[(config, context, b)]["tok_s"]]
            if points:
                colour = COLOURS[i % len(COLOURS)]
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
                out.append(f'<polyline data-config="{escape(config)}" fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
    out.append(f'<text x="{left}" y="{top + panel_h + 34}">batch (concurrent requests); y: aggregate tok/s, from 0</text>')
    for i, config in enumerate(configs):
        y = top + panel_h + 50 + 20 * i
        out.append(f'<line x1="{left}" y1="{y}" x2="{left + 24}" y2="{y}" stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="2"/>')
        out.append(f'<text x="{left + 30}" y="{y + 4}">{escape(config)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _host_busy(row: dict) -> str:
    """ "(host CPUs busy 4, 5, 31 %)" for a row whose windows recorded it, else nothing."""
    shares = row.get("host_busy_runs")
    if not shares:
        return ""
    return " (host CPUs busy " + ", ".join("?" if b is None else f"{100 * b:.0f}" for b in shares) + " %)"


def write_report(results: Path) -> list[Path]:
    """served.md and served.svg from results/served.json; the paths written."""
    rows = load(results)
    if not rows:
        raise ReportError(f"{results / 'served.json'}: no rows yet")
    configs = _configs(rows)
    (results / "served.md").write_text(markdown(rows, warmup_lines(results, configs), profiles(results, configs)),
                                       encoding="utf-8")
    (results / "served.svg").write_text(svg(rows), encoding="utf-8")
    return [results / "served.md", results / "served.svg"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: served_report.py RESULTS_DIR (the folder holding served.json)", file=sys.stderr)
        return 2
    try:
        for path in write_report(Path(argv[0])):
            print(f"wrote {path}")
    except ReportError as exc:
        print(f"served_report.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
