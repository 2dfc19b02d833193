#!/usr/bin/env python3
"""Full-size served speed: what each mod does to a Qwen3.5-35B-A3B or 122B-A10B served by vLLM.

    python3 ci/bench/bench_served.py run --model 35b-a3b --vllm-site SITE --out DIR [--profile 8x32768] [--detach]
    python3 ci/bench/bench_served.py wait --out DIR --seconds 540      # a detached run: 0 ended, 3 running
    python3 ci/bench/bench_served.py pack --out DIR --to "$OUT"        # there: one archive per results folder
    python3 ci/bench/bench_served.py unpack ARCHIVE                    # here: into ci/bench/results/
    python3 ci/bench/bench_served.py merge INTO FROM [FROM ...]        # one run's configurations from two leases
    python3 ci/bench/benchlib/served_report.py DIR/served-<model>-<vllm>-<gpu>     # table and plot again

Why: the mods exist for speed and capacity, and a tiny model served eagerly says nothing about
either. This serves the real shape (benchlib/qwen35_shapes.py) with CUDA graphs through vLLM's OpenAI server,
weights by `--load-format dummy` (decode speed does not depend on their values), once per
configuration (stock, hybrid-int4-fp8, int8-lm-head, turboquant, the full stack; and on request
stock-again, stock by a second server of its own, whose ratio to stock is what the run itself
resolves at each cell), each mod applied by its own run.sh in a hardlink overlay of SITE (ci/gpu/e2e_serve.py). The model folders hold the
config, a tokenizer of the full vocabulary, and the safetensors files of the real checkpoint
(Intel's INT4, or the hybrid `sparkmods checkpoint build-hybrid` writes) with real headers and
sparse, zero data: hybrid-int4-fp8 finds its FP8 layers in those headers, and nothing reads the
data under `--load-format dummy`.

Per configuration: the KV capacity the log reports, then the first requests after start (context
~1k at each batch size, before anything else ran: what a fresh container's first users see), then
the grid of batch sizes and contexts. A cell streams `batch` requests of `context` random prompt
tokens at once and counts the tokens all of them decode while every one is decoding (the window
after the last prefill: benchlib/served_cells.py), so prefill never dilutes the rate; `first_tok_s`
is their mean time to first token. A cell whose prompts exceed --max-cell-tokens (prefill time) or whose tokens would not
fit the KV cache is a row that says so. Rows go to OUT/served-<model>-<vllm>-<gpu>/served.json as
they are measured, with served.md and served.svg (benchlib/served_report.py) and every server's log.

With --together the configurations are served at once, each with its share of
--gpu-memory-utilization, and each steady cell's windows go to them in turn with the same prompts
(benchlib/served_cells.interleaved_cell), so drift of the machine falls on all of them alike.

With --profile BATCHxCONTEXT each server also takes vLLM's torch-profiler flags, and after its grid
that cell runs once more with PROFILE_S of its decode profiled: servers/<config>/profile.json holds
the step's kernels (benchlib/served_profile.py) and served.md lists them side by side.

A run takes longer than one 10-minute call to the GPU machine: `--detach` starts it in its own
session (it outlives the call while the machine is held) and returns; `wait` polls it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "ci" / "gpu"))  # e2e_serve: overlay, apply_mod, Server
sys.path.insert(0, str(REPO / "tests"))  # ckptfactory: the checkpoint's tensor specs
sys.path.insert(0, str(REPO / "tools"))  # sparkmods.checkpoint.header: the safetensors header writer

from benchlib.qwen35_shapes import FIRST_SPECIAL_ID, MODELS, Model, config_json  # noqa: E402
from benchlib.served_archive import ArchiveError, pack, unpack  # noqa: E402
from benchlib.served_cells import CELL_TIMEOUT_S, SERVED_NAME, Cell, close_streams, interleaved_cell, open_streams  # noqa: E402
from benchlib.served_merge import MergeError, merge  # noqa: E402
from benchlib.served_profile import PROFILE_S, ProfileError, clear_traces, profiler_flags, write_profile  # noqa: E402
from benchlib.served_report import write_report  # noqa: E402
from ckptfactory import Spec, main_specs  # noqa: E402
from e2e_parallel import smi_fields, smi_numbers  # noqa: E402
from e2e_serve import Server, apply_mod, free_port, overlay, server_env  # noqa: E402
from sparkmods.checkpoint.header import HeaderEntry, encode_header  # noqa: E402

TQ_DTYPE = "turboquant_k3v4_nc"
# Qwen's special tokens in Qwen's order, placed where the real vocabulary has them.
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
SHARD_BYTES = 4 << 30
HEADROOM = 4096  # max-model-len beyond the longest prompt: decode room while the others prefill
BATCHED_TOKENS = 8192  # --max-num-batched-tokens, the public recipes' value
KV_FIT = 0.9  # share of the reported KV tokens a cell may plan to use (DeltaNet state pages share the pool)
PROFILE_TOKENS = 1024  # decode room for a profiled cell beyond its window's (start, PROFILE_S, the trace's export)
START_DEADLINE_S = 1200.0
KV_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
PREEMPTIONS = re.compile(r"^vllm:num_preemptions(?:_total)?(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


@dataclass(frozen=True)
class Config:
    """One served configuration: mods applied (in order), checkpoint folder, KV cache dtype."""

    name: str
    mods: tuple[str, ...] = ()
    checkpoint: str = "int4"
    kv_dtype: str | None = None


CONFIGS = {c.name: c for c in (
    Config("stock"),
    # stock again, by a server of its own (named after the mods, it brackets them): its ratio to
    # stock is the spread of the run itself, the yardstick for the mods' ratios at each cell
    Config("stock-again"),
    Config("hybrid-int4-fp8", ("hybrid-int4-fp8",), "hybrid"),
    Config("int8-lm-head", ("int8-lm-head",)),
    Config("turboquant", ("turboquant",), kv_dtype=TQ_DTYPE),
    Config("full-stack", ("hybrid-int4-fp8", "int8-lm-head", "turboquant"), "hybrid", TQ_DTYPE),
)}
DEFAULT_CONFIGS = [c for name, c in CONFIGS.items() if name != "stock-again"]


class BenchError(RuntimeError):
    """Bad input or a machine that cannot run the benchmark; one line for the user."""


# ---------------------------------------------------------------- model folders

def special_ids() -> dict[str, int]:
    return {name: FIRST_SPECIAL_ID + i for i, name in enumerate(SPECIAL)}


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer with one entry per model token id ("t<id>", specials at Qwen's ids),
    so every id a random model samples decodes (prompts are sent as ids). transformers 5 wraps it
    in its Qwen3.5 tokenizer class for this model type, which keeps the vocabulary."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    ids = special_ids()
    by_id = {i: name for name, i in ids.items()}
    tok = Tokenizer(models.WordLevel({by_id.get(i, f"t{i}"): i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in SPECIAL])
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 262144, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": "t0", "bos_token": None, "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_headers(folder: Path, specs: Sequence[Spec], shard_bytes: int = SHARD_BYTES) -> int:
    """Safetensors shards of `specs` with real headers and sparse zero data, plus the index.

    Each file has its full size (truncate past the header: no blocks written), so any reader
    that checks sizes or opens the file sees a valid checkpoint. Returns the bytes allocated on disk.
    """
    groups: list[list[Spec]] = [[]]
    size = 0
    for spec in specs:
        if groups[-1] and size + spec.nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(spec)
        size += spec.nbytes
    weight_map, total, allocated = {}, 0, 0
    for n, group in enumerate(groups, 1):
        name = f"model-{n:05d}-of-{len(groups):05d}.safetensors"
        header = encode_header([HeaderEntry(s.name, s.dtype, s.shape, s.nbytes) for s in group], {"format": "pt"})
        data = sum(s.nbytes for s in group)
        with open(folder / name, "wb") as fh:
            fh.write(header)
            fh.truncate(len(header) + data)
        allocated += os.stat(folder / name).st_blocks * 512
        weight_map.update({s.name: name for s in group})
        total += data
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index) + "\n")
    return allocated


def build_model(model: Model, root: Path, checkpoint: str) -> Path:
    """OUT/models/<model>-<checkpoint>/: config, tokenizer, headers of Intel's INT4 checkpoint
    ("int4") or of the hybrid one with block-FP8 shared experts ("hybrid"); reused when complete."""
    folder = root / f"{model.key}-{checkpoint}"
    if (folder / "complete").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config_json(model, special_ids()), indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": special_ids()["<|im_end|>"]}) + "\n")
    write_tokenizer(folder, model.shape.vocab)
    shared = "fp8" if checkpoint == "hybrid" else "bf16"
    allocated = write_headers(folder, main_specs(model.shape, attn="int4", experts="int4", shared=shared))
    (folder / "complete").write_text(f"{allocated} bytes allocated\n")
    return folder


# ---------------------------------------------------------------- planning and measuring

def max_tokens(batch: int, context: int, gen: int, max_model_len: int) -> int:
    """Tokens each request may decode: `gen` after every prompt is in, plus a step for each chunk
    of the other prompts' prefill it decodes through, within max-model-len."""
    chunks = -(-batch * context // BATCHED_TOKENS)
    return min(gen + chunks + 64, max_model_len - context)


def plan(contexts: Sequence[int], batches: Sequence[int], gen: int, kv_tokens: int | None,
         max_cell_tokens: int) -> list[Cell]:
    """The cells of one configuration: first requests at the shortest context, then the grid."""
    max_model_len = max(contexts) + HEADROOM
    cells = []
    for phase, grid in (("first", [(b, min(contexts)) for b in batches]),
                        ("steady", [(b, c) for c in contexts for b in batches])):
        for batch, context in grid:
            budget = max_tokens(batch, context, gen, max_model_len)
            need = batch * (context + budget)
            skip = None
            if batch * context > max_cell_tokens:
                skip = f"skipped: {batch} x {context} prompt tokens exceed --max-cell-tokens {max_cell_tokens} (prefill time)"
            elif kv_tokens is not None and need > KV_FIT * kv_tokens:
                skip = f"skipped: {need} tokens do not fit {KV_FIT:.0%} of the KV cache ({kv_tokens} tokens)"
            cells.append(Cell(phase, batch, context, budget, skip))
    return cells


def _post(port: int, path: str, timeout: float) -> None:
    """POST with no body (vLLM's /start_profile and /stop_profile answer 200 and nothing else)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=timeout):
        pass


def sample_clocks(seconds: float) -> dict[str, float] | None:
    """Median SM clock (MHz) and power draw (W) of this run's GPU over `seconds`, by nvidia-smi
    (what clock the GPU held while the profiled cell decoded); None where nvidia-smi gives none."""
    readings: list[list[float]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and (reading := smi_numbers("clocks.sm,power.draw")) is not None:
        readings.append(reading)
    if not readings:
        return None
    return {"sm_mhz": statistics.median(r[0] for r in readings), "power_w": round(statistics.median(r[1] for r in readings), 1),
            "samples": len(readings)}


def profile_cell(port: int, cell: Cell, trace_dir: Path, into: Path, seed: int) -> str | None:
    """Profile PROFILE_S of decode while every request of `cell` decodes, into `into`
    (served_profile.write_profile), with the GPU's clock over the PROFILE_S before it (the
    profiler's own work would change it); None, or why there is no profile."""
    streams, threads, stop = open_streams(port, cell.batch, cell.context, cell.max_tokens, seed)
    try:
        deadline = time.monotonic() + CELL_TIMEOUT_S
        while not all(s.samples for s in streams):
            if any(s.ended for s in streams) or time.monotonic() > deadline:
                return next((s.error for s in streams if s.error), None) or "a request ended before every one decoded"
            time.sleep(0.02)
        time.sleep(0.2)  # past the last prefill's step
        clocks = sample_clocks(PROFILE_S)
        clear_traces(trace_dir)
        try:
            _post(port, "/start_profile", 120)
            time.sleep(PROFILE_S)
            _post(port, "/stop_profile", 600)
        except (OSError, http.client.HTTPException) as exc:
            return f"profiler: {type(exc).__name__}: {exc}"
        if any(s.ended for s in streams):
            return "a request ended while it was profiled: the profile holds steps that were not decodes"
        try:
            write_profile(trace_dir, into, {"batch": cell.batch, "context": cell.context, **({"clocks": clocks} if clocks else {})})
        except ProfileError as exc:
            return str(exc)
        return None
    finally:
        close_streams(threads, stop)


# ---------------------------------------------------------------- servers

def serve_flags(cfg: Config, max_model_len: int, max_seqs: int, memory: float) -> list[str]:
    """Flags of every server: CUDA graphs (no --enforce-eager), dummy weights, no prefix caching."""
    flags = ["--dtype", "bfloat16", "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_seqs),
             "--max-num-batched-tokens", str(BATCHED_TOKENS), "--gpu-memory-utilization", str(memory),
             "--language-model-only", "--load-format", "dummy", "--no-enable-prefix-caching", "--seed", "0",
             "--additional-config", json.dumps({"gdn_prefill_backend": "triton"})]
    if cfg.kv_dtype:
        flags += ["--kv-cache-dtype", cfg.kv_dtype]
    return flags


def compile_env(out: Path) -> dict[str, str]:
    """One Triton cache for every configuration of a run. vLLM points Triton's cache into each
    configuration's own compile-cache folder (named by a hash every mod changes), so each server
    compiled every Triton kernel again while starting; with vLLM's compile cache off it leaves
    TRITON_CACHE_DIR as given. Triton keys its cache by kernel source and options, so sharing is
    safe; torch.compile still runs for each server, and nothing of what is served changes."""
    return {"VLLM_DISABLE_COMPILE_CACHE": "1", "TRITON_CACHE_DIR": str(out / "triton-cache")}


def _preemptions(server: Server) -> float:
    try:
        return sum(float(v) for v in PREEMPTIONS.findall(server.get("/metrics")))
    except OSError:
        return 0.0


def _gpu(query: str) -> str:
    """One nvidia-smi field of this run's (first) GPU; "" where there is none (or no nvidia-smi)."""
    return next(iter(smi_fields(query) or []), "")


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; another name -> its words joined."""
    found = re.search(r"\b([A-Z]{1,3}\d{2,4})\b", name)
    return found.group(1).lower() if found else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def vllm_version(site: Path) -> str:
    infos = sorted(site.glob("vllm-*.dist-info"))
    if not infos:
        raise BenchError(f"{site}: no vllm-*.dist-info here; pass the site-packages folder vLLM is installed in")
    return infos[-1].name[len("vllm-"):-len(".dist-info")]


@dataclass
class Bench:
    """One run: the model, the vLLM site, where things go, and the rows measured so far."""

    model: Model
    site: Path
    out: Path
    results: Path
    args: argparse.Namespace
    gpu: str
    vllm: str
    rows: list[dict] = field(default_factory=list)

    def row(self, cfg: str, cell: Cell, tok_s: float | None, kv: int | None, ttft: float | None, note: str | None,
            runs: Sequence[float] = (), host_busy: Sequence[float | None] = (), sharing: int = 1) -> None:
        self.rows.append({"model": self.model.key, "gpu": self.gpu, "vllm": self.vllm, "config": cfg,
                          "batch": cell.batch, "context": cell.context,
                          "tok_s": None if tok_s is None else round(tok_s, 1), "kv_tokens": kv,
                          "first_tok_s": None if ttft is None else round(ttft, 3), "phase": cell.phase, "note": note,
                          "gen": self.args.gen, **({"tok_s_runs": [round(r, 1) for r in runs]} if len(runs) > 1 else {}),
                          **({"host_busy_runs": [None if b is None else round(b, 3) for b in host_busy]}
                             if len(runs) > 1 and any(b is not None for b in host_busy) else {}),
                          **({"servers_on_gpu": sharing} if sharing > 1 else {})})
        tmp = self.results / "served.json.tmp"
        tmp.write_text(json.dumps(self.rows, indent=1) + "\n")
        os.replace(tmp, self.results / "served.json")
        print(f"{cfg} {cell.phase} batch {cell.batch} context {cell.context}: "
              f"{'-' if tok_s is None else f'{tok_s:.1f} tok/s'}{f' ({note})' if note else ''}", flush=True)

    def server(self, cfg: Config, memory: float) -> tuple[Server | None, str | None]:
        """Server of `cfg` started and healthy with `memory` as its --gpu-memory-utilization, or None
        and why not (its mods applied first)."""
        folder = self.results / "servers" / cfg.name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        log = folder / "server.log"
        paths = [self.site]
        if cfg.mods:
            patched = overlay(self.site, self.out / "overlays" / cfg.name)
            paths = [patched, self.site]
            for mod in cfg.mods:
                done = apply_mod(REPO / "mods" / mod, patched, self.out / "workspace" / cfg.name, sys.executable)
                with open(log, "a") as fh:
                    fh.write(done.stdout + done.stderr)
                if done.returncode:
                    said = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
                    return None, f"run.sh of {mod} failed: {said[-1]}"
        a = self.args
        model_dir = build_model(self.model, self.out / "models", cfg.checkpoint)
        port = free_port()
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                   "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
                   *serve_flags(cfg, max(a.contexts) + HEADROOM, max(a.batches), memory)]
        if a.profile:
            command += profiler_flags(self.trace_dir(cfg))
        server = Server(cfg.name, command, {**server_env(paths, os.environ), **compile_env(self.out)}, log, port)
        server.start()
        if not server.wait_healthy(START_DEADLINE_S):
            server.stop()
            tail = server.log_text().strip().splitlines() or ["no output"]
            return None, f"server did not start: {tail[-1][:200]}"
        return server, None

    def trace_dir(self, cfg: Config) -> Path:
        """Where cfg's server writes profiler traces: beside the results, never packed."""
        return self.out / "traces" / cfg.name

    def profile(self, cfg: Config, server: Server) -> None:
        """The --profile cell once more, its decode profiled into servers/<config>/profile.json."""
        a = self.args
        batch, context = a.profile
        max_model_len = max(a.contexts) + HEADROOM
        cell = Cell("profile", batch, context, min(max_tokens(batch, context, a.gen, max_model_len) + PROFILE_TOKENS,
                                                   max_model_len - context))
        why = profile_cell(server.port, cell, self.trace_dir(cfg), self.results / "servers" / cfg.name / "profile.json", seed=999)
        print(f"{cfg.name} profile batch {batch} context {context}: {why or 'servers/' + cfg.name + '/profile.json'}",
              flush=True)

    def serve(self, cfgs: Sequence[Config]) -> None:
        """Serve these configurations at once, each with its share of --gpu-memory-utilization (one:
        all of it), and measure every cell on each: a steady cell's windows in turn across the servers
        (interleaved_cell), so servers sharing the GPU meet the same stretches of the machine. The
        cells are planned for the smallest KV cache among them."""
        a = self.args
        up: list[tuple[Config, Server, int | None]] = []
        try:
            for cfg in cfgs:
                server, why = self.server(cfg, a.gpu_memory_utilization / len(cfgs))
                if server is None:
                    for cell in plan(a.contexts, a.batches, a.gen, None, a.max_cell_tokens):
                        self.row(cfg.name, cell, None, None, None, why, sharing=len(cfgs))
                    continue
                found = KV_LINE.search(server.log_text())
                up.append((cfg, server, int(found.group(1).replace(",", "")) if found else None))
            known = [kv for _, _, kv in up if kv is not None]
            for n, cell in enumerate(plan(a.contexts, a.batches, a.gen, min(known, default=None), a.max_cell_tokens)
                                     if up else []):
                if cell.skip:
                    for cfg, _, kv in up:
                        self.row(cfg.name, cell, None, kv, None, cell.skip, sharing=len(cfgs))
                    continue
                before = [_preemptions(server) for _, server, _ in up]
                got = interleaved_cell([server.port for _, server, _ in up], cell, a.gen, n,
                                       a.repeats if cell.phase == "steady" else 1)
                for (cfg, server, kv), windows, was in zip(up, got, before):
                    note = windows.note
                    preempted = _preemptions(server) - was
                    if preempted and note is None:
                        note = f"{preempted:.0f} preemptions: the cell did not fit"
                    self.row(cfg.name, cell, windows.rate, kv, windows.ttft, note, windows.rates, windows.host_busy,
                             sharing=len(cfgs))
            if a.profile:
                for cfg, server, _ in up:
                    self.profile(cfg, server)
        finally:
            for cfg, server, _ in up:
                server.stop()
                shutil.rmtree(self.out / "overlays" / cfg.name, ignore_errors=True)
            _wait_gpu_free()
            write_report(self.results)


def _wait_gpu_free(limit_s: float = 120.0) -> None:
    """Until the stopped server's memory is back (the next server sizes its cache from free memory)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        used = _gpu("memory.used")
        if not used or float(used) < 2048:
            return
        time.sleep(2)


# ---------------------------------------------------------------- command line

def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive whole numbers separated by commas")
    return values


def _cell_arg(text: str) -> tuple[int, int]:
    batch, sep, context = text.partition("x")
    if not sep or not batch.isdigit() or not context.isdigit() or int(batch) < 1 or int(context) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give BATCHxCONTEXT, e.g. 8x32768")
    return int(batch), int(context)


def _configs(text: str) -> list[Config]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        named = ", ".join(unknown) or repr(text)
        raise argparse.ArgumentTypeError(f"unknown config {named}; known: {', '.join(CONFIGS)}")
    return [CONFIGS[n] for n in names]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every command here."""

    def error(self, message: str) -> None:
        print(f"bench_served.py: {message}", file=sys.stderr)
        raise SystemExit(2)


def detach(argv: Sequence[str], out: Path) -> int:
    """Start this run again in its own session, logging to OUT/bench.log; OUT/exit-code when it ends."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "exit-code").unlink(missing_ok=True)
    rest = [a for a in argv if a != "--detach"]
    command = " ".join(map(shlex.quote, [sys.executable, str(Path(__file__).resolve()), *rest]))
    wrapper = f"{command} > {shlex.quote(str(out / 'bench.log'))} 2>&1; echo $? > {shlex.quote(str(out / 'exit-code'))}"
    proc = subprocess.Popen(["bash", "-c", wrapper], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    (out / "pid").write_text(f"{proc.pid}\n")
    print(f"bench_served.py: started in the background (pid {proc.pid}); log {out / 'bench.log'}")
    return 0


def wait(out: Path, seconds: float) -> int:
    """Until OUT/exit-code exists or `seconds` passed; prints the log's last line; 0 ended, 3 running."""
    end = time.monotonic() + seconds
    code = out / "exit-code"
    while time.monotonic() < end and not code.is_file():
        time.sleep(5)
    log = out / "bench.log"
    last = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
    state = f"exit {code.read_text().strip()}" if code.is_file() else "running"
    print(f"bench_served.py: {state}; {last[0][:200] if last else 'no output yet'}")
    return 0 if code.is_file() else 3


def archive_command(args: argparse.Namespace) -> int:
    """pack or unpack: one line per archive; exit 2 with one line for an archive refused."""
    try:
        if args.cmd == "pack":
            for archive in pack(args.out, args.to):
                print(f"bench_served.py: packed {archive} ({archive.stat().st_size >> 10} KiB)")
        else:
            print(f"bench_served.py: unpacked into {unpack(args.archive, args.results)}")
    except ArchiveError as exc:
        print(f"bench_served.py: {exc}", file=sys.stderr)
        return 2
    return 0


def merge_command(args: argparse.Namespace) -> int:
    """merge: one line per FROM merged; exit 2 with one line, INTO unchanged, for a merge refused."""
    try:
        for done in merge(args.into, args.sources):
            print(f"bench_served.py: merged {done.rows} rows ({', '.join(done.configs)}) from {done.source} "
                  f"into {args.into}")
    except MergeError as exc:
        print(f"bench_served.py: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="serve every configuration and measure the grid")
    r.add_argument("--model", required=True, choices=sorted(MODELS))
    r.add_argument("--vllm-site", type=Path, required=True, help="site-packages holding vLLM and its requirements")
    r.add_argument("--out", type=Path, required=True, help="work folder: models, overlays, results")
    r.add_argument("--configs", type=_configs, default=DEFAULT_CONFIGS,
                   help=f"comma-separated, of {', '.join(CONFIGS)} (default: all but stock-again)")
    r.add_argument("--contexts", type=_ints, default=[1024, 32768, 131072], help="prompt tokens (default 1024,32768,131072)")
    r.add_argument("--batches", type=_ints, default=[1, 8, 32], help="concurrent requests (default 1,8,32)")
    r.add_argument("--gen", type=int, default=128, help="tokens every request decodes inside the window (default 128)")
    r.add_argument("--repeats", type=int, default=3, choices=range(1, 10), metavar="N",
                   help="windows per steady cell, the median reported (default 3)")
    r.add_argument("--max-cell-tokens", type=int, default=1_100_000, help="skip cells with more prompt tokens (default 1100000)")
    r.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    r.add_argument("--profile", type=_cell_arg, metavar="BATCHxCONTEXT",
                   help="after each configuration's grid, profile this cell's decode steps (servers/<config>/profile.json)")
    r.add_argument("--together", action="store_true",
                   help="serve the configurations at once on the GPU, each with its share of --gpu-memory-utilization, "
                        "and take each cell's windows in turn (the same prompts for each); where they fit (three 35B-A3B "
                        "servers fit an H200 at 0.9)")
    r.add_argument("--detach", action="store_true", help="run in the background; poll with `wait`")
    w = sub.add_parser("wait", help="wait for a detached run")
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--seconds", type=float, default=0)
    p = sub.add_parser("pack", help="each results folder of a run, with its log, as one archive (device calls "
                                    "return few files, two folders deep)")
    p.add_argument("--out", type=Path, required=True, help="the run's --out")
    p.add_argument("--to", type=Path, required=True, help="where the archives go ($OUT in a device call)")
    u = sub.add_parser("unpack", help="an archive of pack into the results folder")
    u.add_argument("archive", type=Path)
    u.add_argument("--results", type=Path, default=REPO / "ci" / "bench" / "results")
    m = sub.add_parser("merge", help="results folders of one model, vLLM and GPU (a run split over two leases) "
                                     "into the first: rows, server logs, bench.log, table and plot")
    m.add_argument("into", type=Path, metavar="INTO", help="the results folder that receives the others")
    m.add_argument("sources", type=Path, nargs="+", metavar="FROM", help="results folders merged into it, left as they are")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.cmd == "wait":
        return wait(args.out, args.seconds)
    if args.cmd in ("pack", "unpack"):
        return archive_command(args)
    if args.cmd == "merge":
        return merge_command(args)
    if args.profile and (args.profile[0] > max(args.batches) or args.profile[1] > max(args.contexts)):
        print(f"bench_served.py: --profile {args.profile[0]}x{args.profile[1]} exceeds the largest batch or context "
              f"({max(args.batches)}x{max(args.contexts)}: what the server is started for); profile a cell within them",
              file=sys.stderr)
        return 2
    if args.detach:
        return detach(argv[argv.index("run"):], args.out)
    try:
        site = args.vllm_site.resolve()
        version = vllm_version(site)
        name = _gpu("name")
        if not name:
            raise BenchError("nvidia-smi names no GPU here; run this on the GPU machine")
        model = MODELS[args.model]
        results = args.out / f"served-{model.key}-{version}-{gpu_slug(name)}"
        results.mkdir(parents=True, exist_ok=True)
        sys.path.append(str(site))  # tokenizers for the model folder, after the machine's own packages
        bench = Bench(model, site, args.out.resolve(), results, args, name, version)
        for group in ([args.configs] if args.together else [[cfg] for cfg in args.configs]):
            bench.serve(group)
    except BenchError as exc:
        print(f"bench_served.py: {exc}", file=sys.stderr)
        return 2
    print(f"bench_served.py: {len(bench.rows)} rows in {results / 'served.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
