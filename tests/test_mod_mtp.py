"""mtp-weights: which un-indexed files the module the mod adds to vLLM keeps (fast tier).

The module is taken from the mod's own new-file patch and imported without vLLM, then run
on real ckptfactory checkpoints. What it does inside vLLM is test_mod_mtp_runtime.py's job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import List, Tuple

import pytest

import ckptfactory as cf
from realmods import assert_all_exact, load_patched_module

MOD = Path(__file__).resolve().parents[1] / "mods" / "mtp-weights"
PATCH = MOD / "patches" / "common" / "sparkmods_mtp.patch"
EXTRA = "model_extra_tensors.safetensors"


@pytest.fixture(scope="module")
def mtp(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return load_patched_module(PATCH, tmp_path_factory.mktemp("module"), "sparkmods_mtp")


def select(mtp: ModuleType, root: Path) -> List[str]:
    """What the patched filter_duplicate_safetensors_files adds, called as it calls it."""
    weight_map = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    indexed = {os.path.join(str(root), name) for name in weight_map.values()}
    candidates = sorted(str(p) for p in root.glob("*.safetensors"))
    return [os.path.basename(p) for p in mtp.unindexed_mtp_files(candidates, indexed, weight_map)]


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, ...]:
    base = tmp_path_factory.mktemp("ckpt")
    return tuple(cf.write_int4_autoround(base / m, mtp=m) for m in ("indexed", "unindexed", "absent"))


def test_unindexed_mtp_file_is_kept(mtp: ModuleType, roots: Tuple[Path, ...]) -> None:
    assert select(mtp, roots[1]) == [EXTRA]


def test_indexed_or_absent_adds_nothing(mtp: ModuleType, roots: Tuple[Path, ...]) -> None:
    assert select(mtp, roots[0]) == []  # already selected through the index
    assert select(mtp, roots[2]) == []


def test_other_unindexed_files_stay_ignored(mtp: ModuleType, tmp_path: Path) -> None:
    root = cf.write_int4_autoround(tmp_path / "ck", mtp="absent")
    # a copy of indexed tensors (the duplicate the index filter exists for)
    cf.write_safetensors(root / "consolidated-copy.safetensors", [cf.Spec("lm_head.weight", "BF16", (320, 256))])
    # MTP tensors mixed with anything else
    cf.write_safetensors(root / "mixed.safetensors", [cf.Spec("mtp.fc.weight", "BF16", (256, 512)),
                                                      cf.Spec("other.weight", "BF16", (4, 4))])
    # MTP tensors the index already places in another file
    cf.write_safetensors(root / "dup.safetensors", cf.mtp_specs(cf.Shape())[:2])
    cf.edit_index(root, lambda doc: doc["weight_map"].update(
        {s.name: "model-00001-of-00004.safetensors" for s in cf.mtp_specs(cf.Shape())[:1]}))
    assert select(mtp, root) == []


@pytest.mark.network
def test_every_release_gets_an_exact_variant() -> None:
    """sparkmods check over every release >= 0.18.0: each hunk applies at its stated line."""
    assert_all_exact(MOD)
