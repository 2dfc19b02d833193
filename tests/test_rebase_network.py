"""rebase-patch on real vLLM releases from PyPI: a module that became a package between
0.23.0 and 0.24.0, and an insertion whose surroundings upstream rewrote (0.20.0 -> 0.20.1)."""

from __future__ import annotations

import json

import pytest

from modfactory import unified
from sparkmods.cli import main
from sparkmods.runtime.engine import plan
from sparkmods.runtime.udiff import parse_patch
from sparkmods.sources import open_targets

pytestmark = pytest.mark.network

INC = "vllm/model_executor/layers/quantization/inc.py"
INC_NEW = "vllm/model_executor/layers/quantization/inc/inc.py"
KV = "vllm/v1/core/kv_cache_utils.py"


def release_file(version: str, path: str) -> str:
    (source,) = open_targets(f"pypi:{version}")
    data = source.read(path)
    assert data is not None, f"{path} missing in {version}"
    return data.decode()


def patch_file(tmp_path, path: str, old: str, anchor: str, insert: str):
    assert old.count(anchor) == 1
    patch = tmp_path / "mod.patch"
    patch.write_text(unified(path, old, old.replace(anchor, anchor + insert)))
    return patch


def test_a_patch_follows_inc_into_its_package(tmp_path, capsys):
    old = release_file("0.23.0", INC)
    top = "    def get_quant_method(self, layer: torch.nn.Module, prefix: str):\n"
    body = "        fp8 = self.sparkmods_fp8_method(layer, prefix)\n        if fp8 is not None:\n            return fp8\n"
    patch = patch_file(tmp_path, INC, old, top, body)
    out = tmp_path / "rebased.patch"
    assert main(["rebase-patch", str(patch), "--base", "0.23.0", "--onto", "0.24.0", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith(f"--- a/{INC_NEW}\n+++ b/{INC_NEW}\n")
    new = release_file("0.24.0", INC_NEW)
    (res,) = plan(parse_patch(text), lambda p: new.encode() if p == INC_NEW else None)
    assert res.after.decode() == new.replace(top, top + body)  # the function's top, in its new home
    capsys.readouterr()
    assert main(["check-patch", str(out), "--vllm", "0.24.0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["status"] == "ok"


def test_an_insertion_upstream_surrounded_with_new_code_is_flagged(tmp_path, capsys):
    old = release_file("0.20.0", KV)
    anchor = "    max_concurrency = get_max_concurrency_for_kv_cache_config(\n        vllm_config, kv_cache_config\n    )\n"
    patch = patch_file(tmp_path, KV, old, anchor, "    sparkmods_record(max_concurrency)\n")
    conflicts = tmp_path / "conflicts"
    code = main(["rebase-patch", str(patch), "--base", "0.20.0", "--onto", "0.20.1", "-o", str(tmp_path / "out"),
                 "--conflicts", str(conflicts)])
    out = capsys.readouterr().out
    assert code == 1 and not (tmp_path / "out").exists()
    assert f"{KV}: conflict" in out and "changed beyond recognition" in out
    marked = (conflicts / KV).read_text()
    start = marked.index("<<<<<<< onto (pypi:0.20.1)")
    block = marked[start:marked.index(">>>>>>> patch", start)]
    assert "num_tokens = int(max_concurrency * max_model_len)" in block and "sparkmods_record(max_concurrency)" in block
