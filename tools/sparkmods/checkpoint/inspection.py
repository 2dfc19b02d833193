"""`sparkmods checkpoint inspect`: what vLLM will load from a checkpoint, from headers only.

Each check turns a fact about the files into a finding that says what it means for the
mods and serving flags. Errors are checkpoints that load wrong; warnings are things that
silently cost speed or correctness (an unindexed MTP head); infos are what to do next.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

from sparkmods.checkpoint import quantcfg
from sparkmods.checkpoint.fp8 import Fp8Layer, common_block, declared_block, fp8_layers, scale_problem
from sparkmods.checkpoint.header import FLOAT16_DTYPES, TensorInfo
from sparkmods.checkpoint.layout import INDEX_NAME, Checkpoint
from sparkmods.checkpoint.names import MTP_FILE, MTP_PREFIX, SHARED_EXPERT_WEIGHT
from sparkmods.checkpoint.units import human_bytes

Level = Literal["error", "warning", "info"]
EXAMPLES = 3


@dataclass(frozen=True)
class CheckpointIssue:
    level: Level
    code: str
    message: str
    hint: str | None = None


@dataclass
class Report:
    root: str
    summary: dict[str, Any]
    findings: list[CheckpointIssue] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """1 when something needs fixing (an error or warning), else 0."""
        return 1 if any(f.level != "info" for f in self.findings) else 0

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "summary": self.summary, "findings": [asdict(f) for f in self.findings]}

    def add(self, level: Level, code: str, message: str, hint: str | None = None) -> None:
        self.findings.append(CheckpointIssue(level, code, message, hint))


def _examples(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(names[:EXAMPLES])
    return shown + (f" and {len(names) - EXAMPLES} more" if len(names) > EXAMPLES else "")


def inspect_checkpoint(root: Path) -> Report:
    """Read every header of the checkpoint at `root` and report findings."""
    ck = Checkpoint.open(root)
    tensors = _first_owner(ck)
    report = Report(str(ck.root), _summary(ck))
    _check_files(ck, report)
    _check_index(ck, report)
    _check_fp8(ck, tensors, report)
    _check_mtp(ck, report)
    return report


def _first_owner(ck: Checkpoint) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for _, info in ck.tensors():
        tensors.setdefault(info.name, info)
    return tensors


def _summary(ck: Checkpoint) -> dict[str, Any]:
    read = ck.indexed_files()
    files = [
        {
            "name": name,
            "tensors": len(shard.tensors),
            "bytes": shard.file_size,
            "indexed": name in read,
        }
        for name, shard in ck.shards.items()
    ]
    return {
        "index": ck.index is not None,
        "files": files,
        "tensors": sum(f["tensors"] for f in files),
        "bytes": sum(f["bytes"] for f in files),
        "quantization": quantcfg.describe(ck.quantization_config()),
    }


def _check_files(ck: Checkpoint, report: Report) -> None:
    for why in ck.broken.values():
        report.add("error", "invalid-header", why, "re-download the file")
    for name in ck.missing_files:
        lost = [t for t, f in (ck.index.weight_map.items() if ck.index else ()) if f == name]
        report.add(
            "error", "index-missing-file",
            f"the index names {name} ({len(lost)} tensors), which does not exist: vLLM fails to load",
            "download the missing file or rebuild the index",
        )
    if ck.config is None:
        report.add("info", "no-config", "no config.json: quantization and MTP settings unknown")


def _check_index(ck: Checkpoint, report: Report) -> None:
    owners = ck.owners()
    dups = {name: files for name, files in owners.items() if len(files) > 1}
    if dups:
        report.add(
            "error", "duplicate-tensor",
            f"{len(dups)} tensors are stored in more than one file ({_examples(dups)}): "
            "which copy vLLM loads depends on file order",
            "remove the stale file",
        )
    if ck.index is None:
        if len(ck.shards) > 1:
            report.add("info", "no-index", f"no {INDEX_NAME}: vLLM reads all {len(ck.shards)} .safetensors files")
        return
    weight_map = ck.index.weight_map
    absent = [n for n, f in weight_map.items() if f in ck.shards and n not in ck.shards[f].tensors]
    if absent:
        report.add(
            "error", "index-tensor-missing",
            f"{len(absent)} indexed tensors are not in the file the index names ({_examples(absent)})",
            "rebuild the index from the shard headers",
        )
    read = ck.indexed_files()
    unindexed = [
        info.name for file_name, info in ck.tensors()
        if file_name in read and weight_map.get(info.name) != file_name
    ]
    if unindexed:
        report.add(
            "warning", "unindexed-tensor",
            f"{len(unindexed)} tensors in indexed files are missing from the index ({_examples(unindexed)})",
            "vLLM still loads them (it reads whole files); other loaders will not: rebuild the index",
        )
    for name, shard in ck.shards.items():
        if name not in read and not all(t.startswith(MTP_PREFIX) for t in shard.tensors):
            report.add(
                "warning", "unindexed-file",
                f"{name} ({len(shard.tensors)} tensors) is not named by the index: vLLM will not read it",
            )
    expected = sum(
        ck.shards[f].tensors[n].nbytes for n, f in weight_map.items()
        if f in ck.shards and n in ck.shards[f].tensors
    )
    total = ck.index.total_size
    if total != expected:
        report.add(
            "warning", "total-size",
            f"index total_size is {total}, the indexed tensors hold {expected} bytes",
            "harmless for vLLM; `sparkmods checkpoint add-mtp` and `build-hybrid` write it right",
        )


def _check_fp8(ck: Checkpoint, tensors: dict[str, TensorInfo], report: Report) -> None:
    qc = ck.quantization_config()
    layers = fp8_layers(tensors)
    report.summary["fp8"] = {"layers": len(layers), "block": None}
    if not layers:
        shared = [n for n, t in tensors.items() if SHARED_EXPERT_WEIGHT.match(n) and t.dtype in FLOAT16_DTYPES]
        if quantcfg.is_autoround(qc) and shared:
            report.add(
                "info", "hybrid-candidate",
                f"{len(shared)} shared-expert projections are 16-bit in this AutoRound checkpoint",
                "`sparkmods checkpoint build-hybrid --int4 THIS --fp8 QWEN_FP8` swaps in Qwen's FP8 weights "
                "(then apply the hybrid-int4-fp8 mod)",
            )
        return
    no_scale = [layer.module for layer in layers if layer.scale is None]
    if no_scale:
        report.add(
            "error", "fp8-no-scale",
            f"{len(no_scale)} FP8 weights have no weight_scale_inv ({_examples(no_scale)}): they will load as garbage",
            "take each FP8 weight together with its weight_scale_inv from the FP8 checkpoint",
        )
    bad = sorted((layer.module, scale_problem(layer)) for layer in layers if layer.scale is not None)
    for module, why in [(m, w) for m, w in bad if w][:EXAMPLES]:
        report.add("error", "fp8-bad-scale", f"{module}: {why}")
    declared = declared_block(qc) if quantcfg.method(qc) == "fp8" else None
    verdict = common_block(layers, declared)
    report.summary["fp8"]["block"] = list(verdict.block) if verdict.block else None
    if verdict.outliers:
        report.add(
            "error", "fp8-block-mismatch",
            f"{len(verdict.outliers)} FP8 layers do not use block size {verdict.block} "
            f"({_examples(verdict.outliers)}): one block size per checkpoint is all vLLM supports",
        )
    if qc is not None and quantcfg.is_autoround(qc):
        _check_hybrid(qc, layers, report)
    elif qc is None and ck.config is not None:
        report.add(
            "error", "fp8-no-config",
            f"{len(layers)} FP8 layers but config.json has no quantization_config: vLLM loads the bytes as 16-bit",
        )


def _check_hybrid(qc: dict[str, Any], layers: list[Fp8Layer], report: Report) -> None:
    int4 = [layer.module for layer in layers if quantcfg.autoround_bits(qc, layer.module) < 16]
    if int4:
        report.add(
            "error", "fp8-in-int4-layer",
            f"{len(int4)} FP8 layers are INT4 per quantization_config ({_examples(int4)}): "
            "vLLM will look for qweight/scales and fail",
            "only layers marked bits: 16 in extra_config may be FP8",
        )
    report.add(
        "info", "hybrid",
        f"hybrid INT4+FP8 checkpoint: {len(layers) - len(int4)} FP8 layers in 16-bit AutoRound layers",
        "apply the hybrid-int4-fp8 mod: stock vLLM gives these layers the unquantized method and "
        "mis-loads the FP8 bytes",
    )


def _check_mtp(ck: Checkpoint, report: Report) -> None:
    found = [(f, info.name) for f, info in ck.tensors() if info.name.startswith(MTP_PREFIX)]
    files = sorted({f for f, _ in found})
    weight_map = ck.index.weight_map if ck.index else None
    unindexed = [n for f, n in found if weight_map is not None and weight_map.get(n) != f]
    declared = ck.text_config_value("mtp_num_hidden_layers") or 0
    report.summary["mtp"] = {
        "tensors": len(found), "files": files, "unindexed": len(unindexed), "config_layers": declared,
    }
    if found and unindexed:
        report.add(
            "warning", "mtp-unindexed",
            f"MTP head present but not indexed ({len(unindexed)} of {len(found)} tensors in "
            f"{', '.join(files)}): vLLM will not load it, and --speculative-config method mtp "
            "drafts with untrained weights (no error, near-zero acceptance)",
            f"run `sparkmods checkpoint add-mtp --source {ck.root}` or apply the mtp-weights mod",
        )
    elif found:
        report.add(
            "info", "mtp",
            f"MTP head: {len(found)} tensors in {', '.join(files)}, indexed",
            "serve with --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'",
        )
    elif declared:
        report.add(
            "warning", "mtp-absent",
            f"config declares {declared} MTP layer(s) but the checkpoint has no mtp.* tensors: "
            "do not use --speculative-config method mtp",
            f"take {MTP_FILE} from the original checkpoint: "
            f"`sparkmods checkpoint add-mtp --source ORIGINAL --target {ck.root}`",
        )


def format_report(report: Report) -> str:
    """The human-readable form: summary lines, then findings with their hints."""
    s = report.summary
    read = sum(1 for f in s["files"] if f["indexed"])
    lines = [
        f"checkpoint {report.root}: {len(s['files'])} files ({read} read by vLLM), "
        f"{s['tensors']} tensors, {human_bytes(s['bytes'])}",
    ]
    q = s["quantization"]
    if q:
        lines.append("quantization: " + ", ".join(f"{k}={v}" for k, v in q.items() if v is not None))
    if s["fp8"]["layers"]:
        block = s["fp8"]["block"]
        lines.append(f"fp8: {s['fp8']['layers']} layers, block {'x'.join(map(str, block)) if block else '?'}")
    mtp = s["mtp"]
    lines.append(
        f"mtp: {mtp['tensors']} tensors" + (f" in {', '.join(mtp['files'])}" if mtp["files"] else "")
        + (f", {mtp['unindexed']} not indexed" if mtp["unindexed"] else "")
    )
    for f in report.findings:
        lines.append(f"{f.level:<7} {f.message}")
        if f.hint:
            lines.append(f"        -> {f.hint}")
    if report.exit_code == 0:
        lines.append("ok: nothing to fix")
    return "\n".join(lines)
