"""Fixtures shared by several test modules. Helpers that are not fixtures live beside the tests in
modules of their own (wheelindex, modfactory, ckptfactory, vllmenv, dockerimg, ...): no test module
imports another test module."""

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Fixtures defined beside the helpers they serve, registered here for every module.
from dockerimg import base_image, docker_engine, ray_image, sandbox_image  # noqa: F401
from launchdocker import launch, launch_image, vllm_py_files  # noqa: F401
from rebasemod import index, mod  # noqa: F401
from sparkrunenv import sparkrun  # noqa: F401
from wheelindex import LoopbackIndex, serving


@pytest.fixture
def loopback_index() -> Iterator[LoopbackIndex]:
    """A package index on 127.0.0.1 (tests/wheelindex.py) for one test."""
    with serving(LoopbackIndex()) as served:
        yield served


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache of the test's own and zeroed fetch statistics (the sources tests use it
    for every test: `pytestmark = pytest.mark.usefixtures("fresh_cache")`)."""
    from sparkmods.sources import stats

    cache = tmp_path / "cache"
    monkeypatch.setenv("SPARKMODS_CACHE_DIR", str(cache))
    monkeypatch.delenv("SPARKMODS_INDEX_URL", raising=False)
    stats.reset()
    return cache
