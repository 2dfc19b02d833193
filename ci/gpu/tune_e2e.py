#!/usr/bin/env python3
"""`sparkmods tune` end to end on one GPU (the H100 stands in for a DGX Spark), no vLLM needed.

    python3 ci/gpu/tune_e2e.py --out "$OUT"

1. runs `python3 -m sparkmods tune` (tools/ on PYTHONPATH, torch 2.11 and Triton 3.6 as on the
   lent machines) with the table at OUT/kernel-tune.json (SPARKMODS_TUNE_TABLE);
2. loads both mods' kernels from their patches, as vLLM would import them, with that table in
   place, and checks that each reads it: int8-lm-head's pick_config and turboquant's
   decode_config return the tuned entries (fitted to this GPU), and their outputs match the
   shipped configs' on the GPU;
3. checks the refusals on this GPU: a table naming another GPU, one made with other kernels, one
   writable by others: each logs one line and the shipped table is used.

Writes OUT/tune.log (the command's progress), OUT/kernel-tune.json, OUT/tune_e2e.json (every
check) and OUT/summary.md. Exit 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))


class Lines(logging.Handler):
    """Collects the mods' log lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_tune(out: Path, args: argparse.Namespace) -> Dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "tools"), "SPARKMODS_TUNE_TABLE": str(out / "kernel-tune.json")}
    cmd = [sys.executable, "-m", "sparkmods", "tune", "--mods-dir", str(REPO / "mods"), "--dtypes", args.dtypes]
    start = time.monotonic()
    with open(out / "tune.log", "w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True, timeout=args.timeout)
            code, stdout = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            code, stdout = f"killed after {args.timeout} s", exc.stdout or ""
    stdout = stdout if isinstance(stdout, str) else stdout.decode()
    (out / "tune.stdout").write_text(stdout, encoding="utf-8")
    return {"command": " ".join(["sparkmods"] + cmd[3:]), "exit": code, "seconds": round(time.monotonic() - start, 1),
            "stdout": stdout.strip().splitlines()}


def check_reading(table: Path, work: Path) -> List[Dict[str, Any]]:
    import importlib

    import torch

    from sparkmods.tuning import load_mod_package

    checks: List[Dict[str, Any]] = []
    handler = Lines()
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    doc = json.loads(table.read_text(encoding="utf-8"))
    os.environ["SPARKMODS_TUNE_TABLE"] = str(table)
    int8 = importlib.import_module(load_mod_package(REPO / "mods/int8-lm-head/patches/common/int8_lm_head.patch",
                                                    "e2e_int8", work).__name__ + ".int8_lm_head")
    tqpkg = load_mod_package(REPO / "mods/turboquant/patches/common/turboquant_files.patch", "e2e_tq", work)
    tq = importlib.import_module(tqpkg.__name__ + ".sparkmods_tq_triton")
    fmt = importlib.import_module(tqpkg.__name__ + ".sparkmods_tq_format")
    device = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(0)
    gpu = int8.kt.gpu_identity(props.name, (props.major, props.minor))
    smem = getattr(props, "shared_memory_per_block_optin", int8.kt.SM12X_SHARED_MEMORY)  # as the mods read it

    def check(name: str, ok: bool, detail: Any) -> None:
        checks.append({"check": name, "ok": bool(ok), "detail": detail})

    # int8-lm-head: what pick_config serves is the tuned table, fitted
    tuned = int8.dispatch_from_entries(doc["mods"]["int8-lm-head"]["entries"])
    served = {limit or 4096: int8.pick_config(limit or 4096, device) for limit, _ in int8.DISPATCH}
    want = {limit or 4096: int8.choose_config(limit or 4096, tuned, smem) for limit, _ in int8.DISPATCH}
    check("int8-lm-head reads the tuned dispatch", served == want and int8._cuda_tuning(0)[0] == tuned,
          {m: str(c) for m, c in served.items()})
    gen = torch.Generator(device="cpu").manual_seed(1)
    weight = int8.quantize_head((torch.randn(32000, 2048, generator=gen) * 0.02).to(torch.bfloat16).to(device))
    worst = 0.0
    for m in served:
        x = torch.randn(m, 2048, generator=gen).to(torch.bfloat16).to(device)
        got, ref = int8.int8_matmul(x, weight).float(), int8.int8_matmul(x, weight, int8.choose_config(m, int8.DISPATCH, smem)).float()
        worst = max(worst, float((got - ref).abs().max() / ref.abs().max()))
    check("int8-lm-head tuned logits equal the shipped config's (relative max error)", worst <= 2e-2, worst)

    # turboquant: decode_config serves the tuned entries
    entries = tq.decode_entries(doc["mods"]["turboquant"]["entries"])
    table_now = tq._device_tuning(0)[1]
    served_tq = {}
    for (head, batch_band, context_band, dtype), cfg in entries.items():
        spec = fmt.tq_spec(dtype)
        batch, context = {"1": 1, "many": 8}[batch_band], {"short": 4096, "long": 32768}[context_band]
        got = tq.decode_config(spec, head, 16, batch, context, device)
        served_tq[f"{dtype} {batch_band}/{context_band}"] = [got.label(), tq.fitted_decode_config(cfg, spec, head, 16, smem).label()]
    check("turboquant reads the tuned decode table", all(a == b for a, b in served_tq.values())
          and all(table_now[k] == v for k, v in entries.items()), served_tq)
    check("each mod logged that it uses the table", any("int8-lm-head: dispatch from the tune table" in line for line in handler.lines)
          and any("turboquant: decode configs from the tune table" in line for line in handler.lines), handler.lines[:])

    # refusals: another GPU, other kernels, a file others may write
    def refused(mutate: Any, chmod: int = 0o644) -> List[str]:
        bad = work / f"refused-{len(checks)}.json"
        copy = json.loads(json.dumps(doc))
        mutate(copy)
        bad.write_text(json.dumps(copy), encoding="utf-8")
        bad.chmod(chmod)
        handler.lines.clear()
        a = int8.tuned_dispatch(gpu, bad)
        b = tq.tuned_decode_table(gpu, bad)
        return handler.lines[:] if a is int8.DISPATCH and b is tq.DEFAULT_DECODE else ["the table was used"]

    other_gpu = refused(lambda d: d.update(gpu={"name": "NVIDIA GB10", "capability": [12, 1]}))
    check("a table from another GPU is refused in one line per mod", len(other_gpu) == 2 and all("was made on NVIDIA GB10" in line for line in other_gpu), other_gpu)
    other_kernels = refused(lambda d: [s.update(kernels_sha256="0" * 64) for s in d["mods"].values()])
    check("a table made with other kernels is refused", len(other_kernels) == 2 and all("another version" in line for line in other_kernels), other_kernels)
    writable = refused(lambda d: None, 0o666)
    check("a table others may write is refused", len(writable) == 2 and all("writable by group or others" in line for line in writable), writable)
    logging.getLogger().removeHandler(handler)
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtypes", default="turboquant_k3v4_nc,turboquant_3bit_nc", help="passed to sparkmods tune")
    parser.add_argument("--timeout", type=int, default=420, help="seconds the tune command may take")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: Dict[str, Any] = {"tune": run_tune(args.out, args)}
    table = args.out / "kernel-tune.json"
    if result["tune"]["exit"] == 0 and table.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            result["checks"] = check_reading(table, Path(tmp))
    else:
        result["checks"] = [{"check": "sparkmods tune wrote the table", "ok": False, "detail": result["tune"]}]
    import torch

    result["device"] = torch.cuda.get_device_name(0)
    result["torch"], result["triton"] = torch.__version__, __import__("triton").__version__
    (args.out / "tune_e2e.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    lines = [f"# sparkmods tune end to end on {result['device']} (torch {result['torch']}, Triton {result['triton']})", "",
             f"`{result['tune']['command']}`: exit {result['tune']['exit']} in {result['tune']['seconds']} s", "", "```"]
    lines += result["tune"]["stdout"] + ["```", "", "| check | passed |", "|---|---|"]
    lines += [f"| {c['check']} | {'yes' if c['ok'] else 'NO'} |" for c in result["checks"]]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0 if all(c["ok"] for c in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
