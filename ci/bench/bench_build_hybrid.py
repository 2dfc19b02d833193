#!/usr/bin/env python3
"""Benchmark `sparkmods checkpoint build-hybrid` on a multi-GB synthetic checkpoint.

Writes a Qwen3.5-MoE-shaped AutoRound INT4 checkpoint (default ~3.9 GB, MTP file
included) and a matching block-FP8 one under a temporary folder, then times and measures
the peak RSS of:
  cp -r            a plain copy of the INT4 folder (the speed to beat, within 2x);
  build-hybrid     our streaming builder (the CLI, as users run it);
  load-everything  the naive builder: every tensor read into memory, then written with
                   the safetensors library (the memory use we avoid).
The two builders' outputs are compared tensor by tensor. Everything is deleted at the
end unless --keep. Peak RSS is GNU time's %M (maximum resident set of the process).
Inputs are in the page cache (just written) and `sync` runs before every measurement;
cp and build-hybrid run --repeat times and the best time counts (load-everything once).

    .venv/bin/python ci/bench/bench_build_hybrid.py [--layers 16 --experts 32] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import ckptfactory as cf  # noqa: E402
from sparkmods.checkpoint.header import read_header  # noqa: E402
from sparkmods.checkpoint.hybrid_plan import plan_hybrid  # noqa: E402
from sparkmods.checkpoint.layout import INDEX_NAME, Checkpoint, Index  # noqa: E402

GNU_TIME = "/usr/bin/time"


def shape(args: argparse.Namespace) -> cf.Shape:
    """Real Qwen3.5-122B widths (hidden 3072, expert 1024), fewer layers and experts."""
    return cf.Shape(
        num_layers=args.layers, hidden=3072, num_experts=args.experts, moe_intermediate=1024,
        shared_intermediate=1024, vocab=32768, num_heads=16, num_kv_heads=2, head_dim=256,
        linear_key_heads=8, linear_value_heads=16, linear_head_dim=128, vision=False,
    )


def measured(cmd: list[str], out: Path, repeat: int) -> tuple[float, int]:
    """(best wall seconds, highest peak RSS bytes) of `repeat` runs of `cmd` writing `out`.

    `sync` before every run so no run pays for the previous one's dirty pages; `out` is
    removed between runs and kept after the last.
    """
    times, peaks = [], []
    for n in range(repeat):
        if n:
            shutil.rmtree(out)
        subprocess.run(["sync"], check=True)
        done = subprocess.run([GNU_TIME, "-f", "BENCH %M %e", *cmd], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{cmd[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        line = next(ln for ln in reversed(done.stderr.splitlines()) if ln.startswith("BENCH "))
        _, rss_kb, seconds = line.split()
        times.append(float(seconds))
        peaks.append(int(rss_kb) * 1024)
    return min(times), max(peaks)


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.iterdir() if p.is_file())


def load_everything(int4: Path, fp8: Path, out: Path) -> None:
    """The naive builder: all tensors in memory, swap, write each shard with safetensors."""
    from safetensors import deserialize

    plan = plan_hybrid(Checkpoint.open(int4), Checkpoint.open(fp8))
    loaded: dict[str, dict[str, tuple[str, tuple[int, ...], bytearray]]] = {}
    for root in (int4, fp8):
        for path in sorted(root.glob("*.safetensors")):
            loaded[str(path)] = {n: (t["dtype"], tuple(t["shape"]), t["data"]) for n, t in deserialize(path.read_bytes())}
    out.mkdir()
    for f in plan.files:
        specs = [cf.Spec(p.name, p.dtype, p.shape) for p in f.pieces]
        data = {p.name: loaded[str(p.src)][p.name][2] for p in f.pieces}
        cf.write_safetensors(out / f.name, specs, data=data, metadata=f.metadata)
    for name in plan.other_files:
        shutil.copyfile(int4 / name, out / name)
    (out / INDEX_NAME).write_text(Index(plan.weight_map(), {"total_size": plan.total_size()}).dumps())


def tensor_digests(root: Path) -> dict[str, str]:
    """sha256 per tensor, read in 8 MiB pieces (bounded memory even for GB tensors)."""
    digests = {}
    for path in sorted(root.glob("*.safetensors")):
        with open(path, "rb") as fh:
            for name, info in read_header(path).tensors.items():
                h, left = hashlib.sha256(), info.nbytes
                fh.seek(info.start)
                while left:
                    chunk = fh.read(min(left, 8 << 20))
                    h.update(chunk)
                    left -= len(chunk)
                digests[name] = f"{info.dtype}{list(info.shape)}:{h.hexdigest()}"
    return digests


def row(method: str, seconds: float, rss: int, out_bytes: int, written: int, ckpt: int) -> dict[str, Any]:
    return {
        "method": method, "seconds": round(seconds, 2), "output_gb": round(out_bytes / 1e9, 3),
        "gb_per_s": round(out_bytes / 1e9 / seconds, 3), "written_gb_per_s": round(written / 1e9 / seconds, 3),
        "peak_rss_mb": round(rss / 1e6, 1), "rss_pct_of_checkpoint": round(100 * rss / ckpt, 2),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    s = shape(args)
    t0 = time.perf_counter()
    int4 = cf.write_int4_autoround(work / "int4", s, shard_bytes=args.shard_mb << 20)
    fp8 = cf.write_fp8(work / "fp8", s, routed_experts=False, shard_bytes=args.shard_mb << 20)
    ckpt = folder_bytes(int4)
    mtp = (int4 / "model_extra_tensors.safetensors").stat().st_size
    print(f"generated {ckpt / 1e9:.2f} GB INT4 + {folder_bytes(fp8) / 1e9:.2f} GB FP8 "
          f"in {time.perf_counter() - t0:.0f} s under {work}", file=sys.stderr)
    rows = []

    seconds, rss = measured(["cp", "-r", str(int4), str(work / "copy")], work / "copy", args.repeat)
    rows.append(row("cp -r", seconds, rss, folder_bytes(work / "copy"), folder_bytes(work / "copy"), ckpt))
    shutil.rmtree(work / "copy")

    ours = work / "hybrid"
    seconds, rss = measured([sys.executable, "-m", "sparkmods", "checkpoint", "build-hybrid",
                             "--int4", str(int4), "--fp8", str(fp8), "--out", str(ours)], ours, args.repeat)
    out_bytes = folder_bytes(ours)
    rows.append(row("build-hybrid (hardlinks the unchanged MTP file)", seconds, rss, out_bytes, out_bytes - mtp, ckpt))

    naive = work / "naive"
    seconds, rss = measured([sys.executable, __file__, "--load-everything", str(int4), str(fp8), str(naive)], naive, 1)
    rows.append(row("load-everything (safetensors)", seconds, rss, folder_bytes(naive), folder_bytes(naive), ckpt))

    same = tensor_digests(ours) == tensor_digests(naive)
    same_index = Index.load(ours / INDEX_NAME).weight_map == Index.load(naive / INDEX_NAME).weight_map
    return {"checkpoint_bytes": ckpt, "mtp_bytes": mtp, "outputs_identical": same and same_index, "rows": rows}


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    head = ["method", "seconds", "GB/s (output)", "GB/s (written)", "peak RSS MB", "RSS % of ckpt"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['method']} | {r['seconds']} | {r['gb_per_s']} | {r['written_gb_per_s']} | "
                     f"{r['peak_rss_mb']} | {r['rss_pct_of_checkpoint']} |")
    cp, ours = rows[0], rows[1]
    lines += [
        "",
        f"checkpoint {result['checkpoint_bytes'] / 1e9:.2f} GB (MTP file {result['mtp_bytes'] / 1e9:.2f} GB); "
        f"outputs of both builders identical: {result['outputs_identical']}",
        f"goal peak RSS < 10 % of checkpoint: {ours['rss_pct_of_checkpoint']} % -> "
        f"{'met' if ours['rss_pct_of_checkpoint'] < 10 else 'MISSED'}",
        f"goal throughput within 2x of cp: {ours['seconds']} s vs {cp['seconds']} s "
        f"({ours['seconds'] / cp['seconds']:.2f}x) -> {'met' if ours['seconds'] <= 2 * cp['seconds'] else 'MISSED'}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--shard-mb", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3, help="runs of cp and build-hybrid (best time counts)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary folder goes")
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--load-everything", nargs=3, metavar=("INT4", "FP8", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_everything:
        load_everything(*(Path(p) for p in args.load_everything))
        return 0
    if not os.access(GNU_TIME, os.X_OK):
        raise SystemExit(f"{GNU_TIME} (GNU time) is needed to measure peak RSS: apt-get install time")
    work = Path(tempfile.mkdtemp(prefix="bench-build-hybrid-", dir=args.dir))
    try:
        result = run(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
