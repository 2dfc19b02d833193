"""`sparkmods checkpoint add-mtp`: make vLLM load the MTP head of model_extra_tensors.

vLLM reads only the files the index names, so an MTP file the index forgot is dead
weight and MTP speculative decoding silently drafts with untrained weights. This indexes
every tensor in that file's header (never a guess from a name substring), puts the file
in the target without re-copying gigabytes (same file, identical copy, or hardlink first),
and rewrites the index atomically as a real file, keeping a backup of the old one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from sparkmods.checkpoint.fileops import atomic_write_text, backup_file, place_file, remove_stale_temps
from sparkmods.checkpoint.header import read_header
from sparkmods.checkpoint.layout import INDEX_NAME, Index
from sparkmods.checkpoint.names import MTP_FILE
from sparkmods.checkpoint.progress import byte_progress
from sparkmods.errors import SparkmodsError


@dataclass
class AddMtpResult:
    file: str
    placed: str  # same | identical | hardlinked | copied
    tensors: int
    added: int
    total_size: int | None
    backup: str | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def add_mtp(
    source: Path, target: Path | None = None, file_name: str = MTP_FILE, *, progress: bool = True
) -> AddMtpResult:
    """Index the tensors of `source/file_name` in `target`'s index (target defaults to source).

    A progress bar shows only when the file has to be copied (another filesystem).
    """
    source = Path(source)
    target = Path(target) if target is not None else source
    src_file = source / file_name
    if not src_file.is_file():
        raise SparkmodsError(f"{src_file} does not exist: no MTP head to add (is --source the original checkpoint?)")
    header = read_header(src_file)
    if not header.tensors:
        raise SparkmodsError(f"{src_file} holds no tensors")
    index_path = target / INDEX_NAME
    if not index_path.is_file():
        raise SparkmodsError(f"{index_path} does not exist: --target must be a sharded checkpoint with an index")
    index = Index.load(index_path)
    for written in (index_path, target / file_name):  # what a killed earlier run may have left
        remove_stale_temps(written)
    clash = sorted(n for n in header.tensors if index.weight_map.get(n, file_name) != file_name)
    if clash:
        raise SparkmodsError(
            f"{len(clash)} tensors of {file_name} are already indexed to other files "
            f"(first: {clash[0]} -> {index.weight_map[clash[0]]}): fix the index by hand"
        )
    copying = src_file.stat().st_dev != target.stat().st_dev  # else: nothing to copy or a hardlink
    with byte_progress(src_file.stat().st_size, f"add-mtp {file_name}", enabled=progress and copying) as advance:
        placed = place_file(src_file, target / file_name, advance)
    if read_header(target / file_name).tensors.keys() != header.tensors.keys():
        raise SparkmodsError(f"{target / file_name} does not hold the tensors of {src_file} (changed meanwhile?)")
    new = [n for n in header.tensors if n not in index.weight_map]
    result = AddMtpResult(file_name, placed, len(header.tensors), len(new), index.total_size, None)
    if not new:
        return result
    index.weight_map.update({n: file_name for n in new})
    if index.total_size is not None:
        index.metadata["total_size"] = index.total_size + sum(header.tensors[n].nbytes for n in new)
        result.total_size = index.metadata["total_size"]
    result.backup = backup_file(index_path).name
    atomic_write_text(index_path, index.dumps())
    return result
