# SPDX-License-Identifier: Apache-2.0
"""What the int8-lm-head and turboquant kernels share (sparkmods): one shared-memory fitting rule
and the local tune table that `sparkmods tune` writes on the owner's own GPU.

Both mods install this file verbatim next to their kernels (its one source is turboquant's
files/; both mods' patches embed it, a test keeps them equal). Stdlib only: it imports without torch.

Fitting. A config chosen on an H100 (227 KiB of shared memory per block) can need more than a
DGX Spark's GB10 has (99 KiB); launched there it fails with OutOfResources in the middle of
serving. Each kernel family gives a byte model of its shared memory (counted from its tiles,
never timed) and an order in which its config may be lowered; `fit` lowers it one notch at a
time until the model fits the device, the same rule for every kernel. The GB10 readiness check
(ci/gb10_readiness.py) compiles every config the mods can pick for sm_121a and proves the models
cover what Triton allocates.

Tune table. JSON at `table_path()`: the GPU it was measured on (name and compute capability)
and, per mod, the sha256 of the kernel module it timed and that mod's entries. A mod uses its
section only on the same GPU with the same kernel source; otherwise it logs one line saying why
and keeps its shipped table. The file must be a regular file not writable by group or others,
and owned by the reader or root unless $SPARKMODS_TUNE_TABLE names it explicitly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, TypeVar

# GB10 (sm_121) and the other sm_12x parts: the opt-in shared memory per block, in bytes.
SM12X_SHARED_MEMORY = 101376
# Room left under the device's limit for what a byte model does not count (barriers,
# layout-conversion scratch the compiler adds).
SCRATCH_RESERVE = 8 * 1024
TABLE_ENV = "SPARKMODS_TUNE_TABLE"
TABLE_NAME = "kernel-tune.json"
SCHEMA = 1
MAX_TABLE_BYTES = 1 << 20

Config = TypeVar("Config")


def budget(shared_memory_per_block: int) -> int:
    """The bytes a byte model may fill on a device with this opt-in shared memory per block."""
    return shared_memory_per_block - SCRATCH_RESERVE


def fit(cfg: Config, estimate: Callable[[Config], int], limit: int,
        steps: Sequence[Tuple[str, int]]) -> Optional[Config]:
    """cfg lowered until estimate(cfg) <= limit, or None if every step reached its floor first.

    steps, in order: (field, floor). Each step lowers its field one notch while the config is
    over the limit: num_stages by one stage (the pipeline gets shallower, the tile stays), any
    other field (a tile side) by half. A config that fits is returned unchanged.
    """
    for field, floor in steps:
        while estimate(cfg) > limit and getattr(cfg, field) > floor:
            value = getattr(cfg, field)
            lowered = value - 1 if field == "num_stages" else value // 2
            cfg = dataclasses.replace(cfg, **{field: max(lowered, floor)})  # type: ignore[type-var]
    return cfg if estimate(cfg) <= limit else None


def table_path() -> Path:
    """$SPARKMODS_TUNE_TABLE, else ${XDG_CACHE_HOME:-~/.cache}/sparkmods/kernel-tune.json."""
    named = os.environ.get(TABLE_ENV)
    if named:
        return Path(named)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "sparkmods" / TABLE_NAME


def gpu_identity(name: str, capability: Tuple[int, int]) -> Dict[str, Any]:
    """How a table names the GPU it was measured on."""
    return {"name": name, "capability": [int(capability[0]), int(capability[1])]}


def source_digest(path: str) -> str:
    """sha256 of a kernel module's text: a table made with other kernels is not used."""
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


class TableRefused(Exception):
    """Why a tune table is not used, as one line that names the file and what to do."""


def _trusted(path: Path) -> None:
    named = bool(os.environ.get(TABLE_ENV))
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise TableRefused(f"{path} is not a regular file")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TableRefused(f"{path} is writable by group or others: chmod go-w it")
    if not named and info.st_uid not in (os.getuid(), 0):
        raise TableRefused(f"{path} belongs to uid {info.st_uid}, not to you: "
                           f"remove it, or name it in ${TABLE_ENV} if you trust it")
    if info.st_size > MAX_TABLE_BYTES:
        raise TableRefused(f"{path} is {info.st_size} bytes, more than a tune table can be")


def read_section(mod: str, kernels_sha256: str, gpu: Dict[str, Any], path: Optional[Path] = None) -> Optional[Any]:
    """mod's entries in the tune table, or None when there is no table (or no section for mod).

    TableRefused when the table exists but must not be used: untrusted, unreadable, made on
    another GPU or with other kernels than this module's (kernels_sha256).
    """
    path = path or table_path()
    if not path.exists():
        return None
    rerun = "run `sparkmods tune` on this GPU again"
    try:
        _trusted(path)
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, ValueError) as exc:
        raise TableRefused(f"{path} cannot be read ({exc}); {rerun}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("mods"), dict):
        raise TableRefused(f"{path} is not a schema {SCHEMA} tune table; {rerun}")
    if doc.get("gpu") != gpu:
        made = doc.get("gpu") if isinstance(doc.get("gpu"), dict) else {}
        raise TableRefused(f"{path} was made on {made.get('name')} (sm {made.get('capability')}), this is "
                           f"{gpu['name']} (sm {gpu['capability']}); {rerun}")
    section = doc["mods"].get(mod)
    if section is None:
        return None
    if not isinstance(section, dict) or section.get("kernels_sha256") != kernels_sha256:
        raise TableRefused(f"{path} was made for another version of {mod} (its kernels changed); {rerun}")
    return section.get("entries")


def write_table(path: Path, gpu: Dict[str, Any], sections: Dict[str, Dict[str, Any]]) -> None:
    """Write a table for gpu with sections (mod -> {kernels_sha256, entries, ...}), atomically,
    readable by all and writable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": SCHEMA, "gpu": gpu, "mods": sections}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
