"""A real mod through the launch-cluster.sh --apply-mod flow, on a real Docker engine.

The image holds the real vLLM 0.19.1 Python file the mod patches (read from the release wheel
over HTTP range requests) and presents itself as a community dev build. `image:` must read it
without starting vLLM; run.sh must apply, then say already applied, and refuse (changing
nothing) on an image whose vLLM no variant covers.
"""

from __future__ import annotations

import difflib

import pytest

from dockerimg import build_vllm_image, default_build_metadata, run_mod_like_launch_cluster, running_container
from modfactory import make_mod
from sparkmods.checking.batch import check_mods
from sparkmods.sources import open_targets

pytestmark = [pytest.mark.docker, pytest.mark.network]

TARGET = "vllm/model_executor/layers/logits_processor.py"
DEV = "0.19.1.dev0+g2a69949bd.d20260404"


@pytest.fixture(scope="module")
def real_file() -> bytes:
    source = open_targets("pypi:0.19.1")[0]
    data = source.read(TARGET)
    assert data and b"class LogitsProcessor" in data
    return data


def _mod(tmp_path, original: bytes):
    old = original.decode().splitlines(True)
    at = next(i for i, line in enumerate(old) if line.startswith("class LogitsProcessor"))
    new = old[:at] + ["# patched by the flow test\n"] + old[at:]
    patch = "".join(difflib.unified_diff(old, new, f"a/{TARGET}", f"b/{TARGET}"))
    return make_mod(tmp_path / "mods", name="flow-test", vllm=">=0.19.0,<0.19.1", verified='["0.19.0"]', patch=patch)


def _file_in(container) -> bytes:
    code, out = container.exec_run(["cat", f"/usr/local/lib/python3.12/dist-packages/{TARGET}"])
    assert code == 0
    return out


def test_mod_flow_in_container(tmp_path, docker_engine, base_image, real_file):
    image = build_vllm_image("sparkmods-test-vllm:flow", {TARGET: real_file, "vllm/__init__.py": b""}, DEV,
                             default_build_metadata(DEV), client=docker_engine)
    (source,) = open_targets(f"image:{image}")
    assert source.version == DEV and source.commit == "2a69949bd"
    assert source.read(TARGET) == real_file
    mod = _mod(tmp_path, real_file)
    (row,) = check_mods([mod], [source])
    assert (row.result.status, row.result.variant) == ("ok", "v1")  # same decision as run.sh below
    assert row.result.how == f"by content: the v1 patches apply exactly; vLLM reports {DEV}"

    with running_container(docker_engine, image) as container:
        first = run_mod_like_launch_cluster(container, mod)
        assert first.exit_code == 0, first.output
        assert f"[flow-test] chose variant v1 by content: the v1 patches apply exactly; vLLM reports {DEV}" in first.output
        assert f"[flow-test] applied variant v1 to vLLM {DEV}" in first.output
        patched = _file_in(container)
        assert b"# patched by the flow test\nclass LogitsProcessor" in patched
        second = run_mod_like_launch_cluster(container, mod)
        assert second.exit_code == 0 and "[flow-test] already applied" in second.output
        assert _file_in(container) == patched


def test_mod_flow_refuses_uncovered_version(tmp_path, docker_engine, base_image, real_file):
    image = build_vllm_image("sparkmods-test-vllm:flow-new", {TARGET: real_file, "vllm/__init__.py": b""},
                             "0.22.0", client=docker_engine)
    mod = _mod(tmp_path, real_file)
    with running_container(docker_engine, image) as container:
        result = run_mod_like_launch_cluster(container, mod)
        assert result.exit_code == 1
        assert "cannot apply to vLLM 0.22.0: no-variant" in result.output
        assert "v1 (>=0.19.0,<0.19.1; verified on 0.19.0)" in result.output
        assert "nothing was changed" in result.output
        assert _file_in(container) == real_file
