"""image: targets on a real Docker engine: vLLM read out of images that are never started.

The images come from tests/dockerimg.py (a debootstrap Debian base; vLLM files under
/usr/local/lib/python3.12/dist-packages as in the community image, with Debian's own python3).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict

import docker.errors
import pytest

from dockerimg import SITE_DIR, build_vllm_image, default_build_metadata
from sparkmods.errors import SparkmodsError
from sparkmods.sources import open_targets

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("fresh_cache")]

RELEASE = "0.19.1"
DEV = "0.19.1.dev0+g2a69949bd.d20260404"
LOGITS = "vllm/model_executor/layers/logits_processor.py"
FILES = ["vllm/__init__.py", LOGITS, "vllm/model_executor/layers/quantization/inc.py"]
READER_LABEL = "org.sparkmods.reader"


@pytest.fixture(scope="module")
def real_files() -> Dict[str, bytes]:
    """Real files of vLLM 0.19.1: from the shared /tmp/wheels copy, else over range requests."""
    local = sorted(Path("/tmp/wheels", RELEASE).glob(f"vllm-{RELEASE}-*.whl"))
    [source] = open_targets(f"wheel:{local[0]}" if local else f"pypi:{RELEASE}")
    source.prefetch(FILES + ["vllm/_version.py"])
    return {path: source.read(path) for path in FILES + ["vllm/_version.py"]}


def _removed(engine, source) -> bool:
    """The source's helper container is gone (other tests may hold readers of their own)."""
    try:
        engine.containers.get(source._container.id)
    except docker.errors.NotFound:
        return True
    return False


def test_image_with_build_metadata(docker_engine, real_files):
    files = {p: real_files[p] for p in FILES}
    tag = build_vllm_image("sparkmods-test-vllm:sources-meta", files, DEV, default_build_metadata(DEV),
                           client=docker_engine)
    [source] = open_targets(f"image:{tag}")
    try:
        assert (source.label, source.version, source.commit, source.sha256) == (f"image:{tag}", DEV, "2a69949bd", None)
        assert source.site == SITE_DIR  # found by probing, not assumed
        source.prefetch(FILES + ["vllm/absent.py"])
        assert {p: source.read(p) for p in FILES} == files
        assert source.read("vllm/absent.py") is None and source.read("vllm/model_executor") is None
        assert source.list_files() == sorted(FILES)
        with pytest.raises(SparkmodsError, match=r"refusing path"):
            source.read("../../../etc/passwd")
        # never started: the helper container was only created
        container = docker_engine.containers.get(source._container.id)
        assert container.status == "created"
    finally:
        source.close()
    assert _removed(docker_engine, source)


def test_image_version_from_version_file_then_dist_info(docker_engine, real_files, caplog):
    with_version_file = build_vllm_image("sparkmods-test-vllm:sources-versionfile", real_files, RELEASE,
                                         client=docker_engine)
    [source] = open_targets(f"image:{with_version_file}")
    assert (source.version, source.commit) == (RELEASE, None)  # from vllm/_version.py
    assert docker_engine.containers.get(source._container.id).labels[READER_LABEL] == "1"
    source.close()
    assert _removed(docker_engine, source)

    bare = build_vllm_image("sparkmods-test-vllm:sources-distinfo", {p: real_files[p] for p in FILES}, DEV,
                            client=docker_engine)
    with caplog.at_level(logging.WARNING, logger="sparkmods.sources"):
        [source] = open_targets(f"image:{bare}")
    assert (source.version, source.commit) == (DEV, "2a69949bd")  # from vllm-<DEV>.dist-info/METADATA
    assert "listing" in caplog.text
    assert source.read(LOGITS) == real_files[LOGITS]
    source.close()


def test_image_errors(docker_engine, real_files):
    with pytest.raises(SparkmodsError, match=r"image:sparkmods-no-such-image:1: no image .* \(the community image "
                       r"is built, not pulled: \./build-and-copy\.sh -t sparkmods-no-such-image:1 in your "):
        open_targets("image:sparkmods-no-such-image:1")  # a local name, as eugr's build script gives
    with pytest.raises(SparkmodsError, match=r"no image 'sparkmods/no-such-image:1' .* \(docker pull sparkmods/no-such"):
        open_targets("image:sparkmods/no-such-image:1")  # a registry's
    from dockerimg import ensure_base_image
    base = ensure_base_image(docker_engine)  # Debian + python3, no vLLM anywhere
    before = {c.id for c in docker_engine.containers.list(all=True, filters={"ancestor": base, "label": READER_LABEL})}
    with pytest.raises(SparkmodsError, match=r"no vllm/__init__.py in any site-packages of"):
        open_targets(f"image:{base}")
    after = {c.id for c in docker_engine.containers.list(all=True, filters={"ancestor": base, "label": READER_LABEL})}
    assert after <= before  # the probe container was removed on the error path too
