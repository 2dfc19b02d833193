"""`sparkmods rebase MOD --onto SPEC [--write]` end to end: releases served as real wheels by
a package index on loopback (the base release is fetched the way PyPI would serve it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import pytest

from modfactory import TARGET
from rebasemod import MANIFEST, run
from sparkmods.runtime.manifest import load_manifest
from sparkmods.runtime.modcheck import check_mod
from sparkmods.sources import open_targets
from sparkmods.sync import stale_files, sync

pytestmark = pytest.mark.usefixtures("fresh_cache")


def snapshot(folder: Path) -> Dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_plan_only_changes_nothing(index, mod, capsys):
    before = snapshot(mod)
    code, out, _ = run(capsys, "rebase", str(mod), "--onto", "0.20.0", "--index-url", index)
    assert code == 0, out
    assert "conflict on 0.20.0; rebasing variant 'v1' from vLLM 0.19.1" in out
    assert "variant 'v1-0.20.0': vllm = \">=0.20.0, <0.21\"" in out
    assert "variant 'v1': vllm = \">=0.19.0,<0.21\" -> \">=0.19.0, <0.20.0\"" in out
    assert "run with --write" in out
    assert snapshot(mod) == before


def test_write_adds_a_valid_disjoint_variant_and_keeps_the_manifest_hand_written(index, mod, capsys):
    code, out, _ = run(capsys, "rebase", str(mod), "--onto", "0.20.0", "--index-url", index, "--write", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["written"] is True, out
    text = (mod / "mod.toml").read_text()
    for line in MANIFEST.splitlines():  # every original line survives, but the one range
        if not line.startswith("vllm = "):
            assert line in text.splitlines(), line
    assert 'vllm = ">=0.19.0, <0.20.0"   # inline comment stays' in text
    manifest = load_manifest(mod)
    assert [(v.label, str(v.vllm)) for v in manifest.variants] == [("v1", ">=0.19.0, <0.20.0"),
                                                                   ("v1-0.20.0", ">=0.20.0, <0.21")]
    new = manifest.variants[1]
    assert new.patches == ["patches/v1-0.20.0/demo.patch"] and new.verified == [] and new.notes == "Add --demo to vllm serve"
    assert not manifest.variants[0].vllm.overlaps(new.vllm)
    assert stale_files(mod) == []  # run.sh, _sparkmods.py and manifest.json were regenerated
    for version, label in (("0.19.1", "v1"), ("0.20.0", "v1-0.20.0")):
        (source,) = open_targets(version, index_url=index)
        result = check_mod(manifest, mod, version, source.read)
        assert (result.status, result.variant) == ("ok", label), result.to_dict()


def test_unsafe_rebase_exits_1_and_writes_nothing(index, mod, capsys, tmp_path):
    before = snapshot(mod)
    conflicts = tmp_path / "conflicts"
    code, out, _ = run(capsys, "rebase", str(mod), "--onto", "0.20.1", "--index-url", index, "--write",
                       "--conflicts", str(conflicts))
    assert code == 1 and "NOT SAFE" in out and "hunk 1, base line 10" in out and "nothing written" in out
    assert snapshot(mod) == before
    assert "<<<<<<< onto" in (conflicts / TARGET).read_text()


def test_a_release_the_mod_already_works_on_needs_nothing(index, mod, capsys):
    before = snapshot(mod)
    code, out, _ = run(capsys, "rebase", str(mod), "--onto", "0.19.1", "--index-url", index, "--write")
    assert code == 0 and "already works on" in out and snapshot(mod) == before


def test_a_release_that_already_has_the_change_needs_no_variant(index, mod, capsys):
    before = snapshot(mod)
    code, out, _ = run(capsys, "rebase", str(mod), "--onto", "0.22.0", "--index-url", index, "--write")
    assert code == 0 and "already has every change" in out and snapshot(mod) == before


def test_verified_above_onto_is_an_input_error(index, mod, capsys):
    text = (mod / "mod.toml").read_text().replace('verified = ["0.19.1"]', 'verified = ["0.19.1", "0.20.1"]')
    (mod / "mod.toml").write_text(text)
    sync(mod)
    code, _out, err = run(capsys, "rebase", str(mod), "--onto", "0.20.0", "--index-url", index)
    assert code == 2 and "verified on 0.20.1" in err


def test_an_existing_label_is_an_input_error(index, mod, capsys):
    code, _, err = run(capsys, "rebase", str(mod), "--onto", "0.20.0", "--index-url", index, "--label", "v1")
    assert code == 2 and "already labelled 'v1'" in err


def test_a_patch_that_carries_unchanged_stays_shared(index, mod, capsys):
    """A patch whose rebased text is byte-identical (a new module, say) is reused, not copied."""
    new = "vllm/model_executor/layers/sparkmods_demo.py"
    common = mod / "patches" / "common" / "module.patch"
    common.parent.mkdir()
    common.write_text(f"--- /dev/null\n+++ b/{new}\n@@ -0,0 +1,2 @@\n+def hello():\n+    return 1\n")
    text = (mod / "mod.toml").read_text().replace('patches = ["patches/v1/demo.patch"]',
                                                  'patches = ["patches/common/module.patch", "patches/v1/demo.patch"]')
    (mod / "mod.toml").write_text(text)
    sync(mod)
    code, out, _ = run(capsys, "rebase", str(mod), "--onto", "0.20.0", "--index-url", index, "--write")
    assert code == 0 and "patches/common/module.patch unchanged, reused" in out, out
    new_variant = load_manifest(mod).variants[1]
    assert new_variant.patches == ["patches/common/module.patch", "patches/v1-0.20.0/demo.patch"]
    assert sorted(p.name for p in (mod / "patches" / "v1-0.20.0").iterdir()) == ["demo.patch"]
