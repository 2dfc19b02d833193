"""Plan a hybrid INT4+FP8 checkpoint from headers alone (what `--dry-run` prints).

The AutoRound INT4 checkpoint keeps its shared-expert MLPs at 16 bit; Qwen's FP8
checkpoint has the same projections as block FP8. The hybrid is the INT4 checkpoint with
exactly those 16-bit weights replaced by the FP8 weight plus its `weight_scale_inv`,
everything else (MTP head included) byte for byte as it was. Every swap is verified here
(dtype, shape, scale shape, one block size) before a single byte is written, and any
problem fails the whole plan: a half-FP8 shared expert (gate FP8, up 16-bit) would be
fused by vLLM into one layer that cannot be both.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkmods.checkpoint import quantcfg
from sparkmods.checkpoint.fp8 import (
    FP8_DTYPES,
    SCALE_SUFFIX,
    WEIGHT_SUFFIX,
    Block,
    Fp8Layer,
    common_block,
    declared_block,
    fp8_layers,
    scale_problem,
)
from sparkmods.checkpoint.header import FLOAT16_DTYPES, TensorInfo, itemsize
from sparkmods.checkpoint.layout import INDEX_NAME, Checkpoint, Index
from sparkmods.checkpoint.names import MTP_PREFIX, SHARED_EXPERT_WEIGHT, group
from sparkmods.checkpoint.shard_writer import Piece
from sparkmods.checkpoint.units import human_bytes

Located = tuple[Path, TensorInfo]


@dataclass(frozen=True)
class Swap:
    """One 16-bit weight of the INT4 checkpoint and the FP8 weight + scale replacing it."""

    old: TensorInfo
    weight: Located
    scale: Located

    @property
    def module(self) -> str:
        return self.old.name[: -len(WEIGHT_SUFFIX)]


@dataclass
class OutFile:
    """One output .safetensors file: rewritten from `pieces`, or the source as it is."""

    name: str
    source: Path
    metadata: dict[str, str]
    pieces: list[Piece]
    changed: bool

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)


@dataclass
class HybridPlan:
    int4_root: Path
    fp8_root: Path
    swaps: list[Swap] = field(default_factory=list)
    block: Block | None = None
    files: list[OutFile] = field(default_factory=list)
    other_files: list[str] = field(default_factory=list)
    index_extra: dict[str, Any] = field(default_factory=dict)
    unused_fp8: dict[tuple[str, str], int] = field(default_factory=dict)
    kept_16bit: dict[tuple[str, str], int] = field(default_factory=dict)
    mtp_tensors: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def bytes_replaced(self) -> int:
        return sum(s.old.nbytes for s in self.swaps)

    @property
    def bytes_added(self) -> int:
        return sum(s.weight[1].nbytes + s.scale[1].nbytes for s in self.swaps)

    def weight_map(self) -> dict[str, str]:
        return {p.name: f.name for f in self.files for p in f.pieces}

    def total_size(self) -> int:
        return sum(f.nbytes for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "int4": str(self.int4_root),
            "fp8": str(self.fp8_root),
            "errors": self.errors,
            "block": list(self.block) if self.block else None,
            "replaced": [s.old.name for s in self.swaps],
            "bytes_replaced": self.bytes_replaced,
            "bytes_added": self.bytes_added,
            "bytes_saved": self.bytes_replaced - self.bytes_added,
            "files_rewritten": [f.name for f in self.files if f.changed],
            "files_kept": [f.name for f in self.files if not f.changed] + self.other_files,
            "mtp_tensors": self.mtp_tensors,
            "unused_fp8": [{"group": g, "reason": r, "count": n} for (g, r), n in sorted(self.unused_fp8.items())],
            "kept_16bit": [{"group": g, "reason": r, "count": n} for (g, r), n in sorted(self.kept_16bit.items())],
        }


def needed_fp8_files(index: Index) -> list[str]:
    """Files of the FP8 checkpoint that hold shared-expert weights or their scales.

    Lets a Hugging Face download of the FP8 checkpoint skip every other shard.
    """
    modules = {n[: -len(WEIGHT_SUFFIX)] for n in index.weight_map if SHARED_EXPERT_WEIGHT.match(n)}
    return sorted({
        f for n, f in index.weight_map.items()
        if SHARED_EXPERT_WEIGHT.match(n) or (n.endswith(SCALE_SUFFIX) and n[: -len(SCALE_SUFFIX)] in modules)
    })


def _locate(ck: Checkpoint) -> dict[str, Located]:
    return {info.name: (ck.root / f, info) for f, info in ck.tensors()}


def plan_hybrid(int4: Checkpoint, fp8: Checkpoint) -> HybridPlan:
    """Match, verify and lay out the swap.

    Problems with the swap go to `plan.errors` (so --dry-run can list them all); only an
    unreadable --int4 checkpoint raises.
    """
    plan = HybridPlan(int4.root, fp8.root, index_extra=dict(int4.index.extra) if int4.index else {})
    int4.require_sound()
    dups = sorted(n for n, files in int4.owners().items() if len(files) > 1)
    if dups:
        plan.errors.append(f"{len(dups)} tensors of --int4 are in several files (first: {dups[0]})")
    old = {info.name: info for _, info in int4.tensors()}
    new = _locate(fp8)
    _match(plan, old, new, fp8)
    _check_block(plan, fp8)
    _layout(plan, int4)
    _explain(plan, old, new)
    return plan


def _match(plan: HybridPlan, old: dict[str, TensorInfo], new: dict[str, Located], fp8: Checkpoint) -> None:
    missing_hint = f" ({len(fp8.missing_files)} files the --fp8 index names are absent)" if fp8.missing_files else ""
    for name in sorted(n for n in old if SHARED_EXPERT_WEIGHT.match(n)):
        info = old[name]
        module = name[: -len(WEIGHT_SUFFIX)]
        if info.dtype in FP8_DTYPES:
            plan.errors.append(f"{name} is already FP8 in --int4: is it already a hybrid?")
            continue
        if info.dtype not in FLOAT16_DTYPES:
            plan.errors.append(f"{name} is {info.dtype} in --int4, expected a 16-bit weight")
            continue
        if module + SCALE_SUFFIX in old:
            plan.errors.append(f"--int4 already has {module}{SCALE_SUFFIX}")
            continue
        weight, scale = new.get(name), new.get(module + SCALE_SUFFIX)
        if weight is None:
            plan.errors.append(f"{name} is not in --fp8{missing_hint}")
            continue
        if weight[1].dtype not in FP8_DTYPES:
            plan.errors.append(f"{name} is {weight[1].dtype} in --fp8, expected FP8: is it Qwen's FP8 checkpoint?")
            continue
        if weight[1].shape != info.shape:
            plan.errors.append(
                f"{name}: shape {list(weight[1].shape)} in --fp8 but {list(info.shape)} in --int4: different models?"
            )
            continue
        problem = scale_problem(Fp8Layer(module, weight[1], scale[1] if scale else None))
        if problem or scale is None:
            plan.errors.append(f"{module} in --fp8: {problem}{missing_hint if scale is None else ''}")
            continue
        plan.swaps.append(Swap(info, weight, scale))
    if not plan.swaps and not plan.errors:
        plan.errors.append(
            f"no 16-bit shared-expert projections in {plan.int4_root}: "
            "is --int4 an AutoRound INT4 Qwen3.5-MoE checkpoint?"
        )


def _check_block(plan: HybridPlan, fp8: Checkpoint) -> None:
    layers = [Fp8Layer(s.module, s.weight[1], s.scale[1]) for s in plan.swaps]
    qc = fp8.quantization_config()
    verdict = common_block(layers, declared_block(qc) if quantcfg.method(qc) == "fp8" else None)
    plan.block = verdict.block
    if verdict.outliers:
        plan.errors.append(
            f"{len(verdict.outliers)} FP8 scales do not fit block size {verdict.block} "
            f"(first: {verdict.outliers[0]}): one block size per checkpoint is all vLLM supports"
        )


def _layout(plan: HybridPlan, int4: Checkpoint) -> None:
    """Output files mirror --int4 file by file; a swapped weight stays in its shard."""
    swaps = {s.old.name: s for s in plan.swaps}
    for file_name, shard in int4.shards.items():
        pieces: list[Piece] = []
        changed = False
        for info in shard.tensors.values():
            swap = swaps.get(info.name)
            if swap is None:
                pieces.append(Piece.of(info, shard.path))
                continue
            changed = True
            pieces.append(Piece.of(swap.weight[1], swap.weight[0]))
            pieces.append(Piece.of(swap.scale[1], swap.scale[0]))
        if changed:
            # Widest dtypes first, as the reference writer orders them: keeps every tensor
            # aligned to its element size (no padding is allowed between tensors).
            pieces.sort(key=lambda p: -itemsize(p.dtype))
        plan.files.append(OutFile(file_name, shard.path, dict(shard.metadata), pieces, changed))
        plan.mtp_tensors += sum(1 for n in shard.tensors if n.startswith(MTP_PREFIX))
    plan.other_files = sorted(
        p.name for p in int4.root.iterdir()
        if not p.name.startswith(".") and p.suffix != ".safetensors" and p.name != INDEX_NAME
    )


def _explain(plan: HybridPlan, old: dict[str, TensorInfo], new: dict[str, Located]) -> None:
    """Why each FP8 weight of --fp8 and each 16-bit weight of --int4 stays as it is."""
    swapped = {s.old.name for s in plan.swaps}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for layer in fp8_layers({n: info for n, (_, info) in new.items()}):
        name = layer.weight.name
        if name in swapped:
            continue
        if layer.module + ".qweight" in old:
            reason = "INT4 in --int4"
        elif name in old:
            reason = "16-bit in --int4, kept: only decoder shared-expert projections are swapped"
        else:
            reason = "not in --int4"
        counts[(group(name), reason)] += 1
    plan.unused_fp8 = dict(counts)
    counts = defaultdict(int)
    for name, info in old.items():
        if info.dtype not in FLOAT16_DTYPES or name in swapped:
            continue
        if name.rsplit(".", 1)[0] + ".qweight" in old:
            continue  # the F16 group scales of an INT4 layer
        other = new.get(name)
        if other is None:
            reason = "not in --fp8"
        elif other[1].dtype in FP8_DTYPES:
            reason = "FP8 in --fp8, kept: only decoder shared-expert projections are swapped"
        else:
            reason = "16-bit in --fp8 too"
        counts[(group(name), reason)] += 1
    plan.kept_16bit = dict(counts)


def format_plan(plan: HybridPlan) -> str:
    """The `--dry-run` text: swaps, bytes, output layout, and what is left and why."""
    lines = [f"build-hybrid: --int4 {plan.int4_root}  --fp8 {plan.fp8_root}"]
    if plan.swaps:
        layers = len({s.module.rsplit(".mlp.", 1)[0] for s in plan.swaps})
        block = "x".join(map(str, plan.block)) if plan.block else "?"
        lines += [
            f"replace {len(plan.swaps)} shared-expert projections ({layers} layers) with FP8 "
            f"(block {block}) + {len(plan.swaps)} weight_scale_inv",
            f"bytes: {human_bytes(plan.bytes_replaced)} 16-bit -> {human_bytes(plan.bytes_added)} FP8 + scales "
            f"(saves {human_bytes(plan.bytes_replaced - plan.bytes_added)})",
        ]
    rewritten = [f for f in plan.files if f.changed]
    kept = [f for f in plan.files if not f.changed]
    lines.append(
        f"output: {len(rewritten)} files rewritten, {len(kept)} kept (hardlinked, or copied across "
        f"filesystems), {len(plan.other_files)} other files copied; index: {len(plan.weight_map())} tensors, "
        f"{human_bytes(plan.total_size())}"
    )
    lines.append(f"MTP head: {plan.mtp_tensors} tensors kept and indexed" if plan.mtp_tensors else "MTP head: none in --int4")
    for title, table in (("FP8 weights of --fp8 left unused", plan.unused_fp8),
                         ("16-bit tensors of --int4 kept", plan.kept_16bit)):
        if table:
            lines.append(f"{title}:")
            lines += [f"  {n:>7}  {g}: {r}" for (g, r), n in sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))]
    for error in plan.errors:
        lines.append(f"error: {error}")
    return "\n".join(lines)
