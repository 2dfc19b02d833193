"""Real vLLM releases on PyPI, read over HTTP range requests (network-marked)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import List

import pytest

from sparkmods.sources import open_targets, stats

pytestmark = [pytest.mark.network, pytest.mark.usefixtures("fresh_cache")]

LOGITS = "vllm/model_executor/layers/logits_processor.py"
INC = "vllm/model_executor/layers/quantization/inc.py"  # a module up to 0.23 ...
INC_PKG = "vllm/model_executor/layers/quantization/inc/__init__.py"  # ... a package from 0.24
PATHS = [LOGITS, INC, INC_PKG]


def _local_copy(filename: str) -> "Path | None":
    """The same wheel when a helper already downloaded it (/tmp/wheels/<version>/), to compare bytes."""
    found = list(Path("/tmp/wheels").glob(f"*/{filename}"))
    return found[0] if found else None


def test_three_releases_over_ranges_then_cache_then_offline():
    latest = open_targets("latest")[0].version
    specs = ["pypi:0.18.0", "pypi:0.24.0", f"pypi:{latest}"]
    sources = [s for spec in specs for s in open_targets(spec)]
    assert [s.version for s in sources] == ["0.18.0", "0.24.0", latest]
    assert all(s.sha256 and len(s.sha256) == 64 and s.commit is None for s in sources)

    stats.reset()
    for source in sources:
        source.prefetch(PATHS)
    cold = stats.snapshot()
    wheel_bytes = sum(s.size for s in sources)
    # never the whole wheel: the tail (with the central directory), the members and the read-ahead
    # around them (remote.READ_AHEAD), about 1.3 % of these three wheels
    assert cold["full_downloads"] == 0 and cold["bytes"] < wheel_bytes / 50
    assert cold["requests"] <= 2 * len(sources)  # the tail with the whole central directory, then the members

    first: List[dict] = []
    for source in sources:
        files = {p: source.read(p) for p in PATHS}
        assert b"class LogitsProcessor" in files[LOGITS]
        first.append(files)
        local = _local_copy(source.filename)
        if local is not None:
            with zipfile.ZipFile(local) as zf:
                names = set(zf.namelist())
                assert files == {p: zf.read(p) if p in names else None for p in PATHS}
    assert first[0][INC] is not None and first[0][INC_PKG] is None
    assert first[1][INC] is None and first[1][INC_PKG] is not None  # the module became a package

    stats.reset()
    again = [s for spec in specs for s in open_targets(spec)]  # pinned: the cached page lists them
    assert [{p: s.read(p) for p in PATHS} for s in again] == first
    assert stats.snapshot()["requests"] == 0 and stats.snapshot()["cache_hits"] >= len(PATHS) * len(specs)

    offline = [s for spec in specs for s in open_targets(spec, offline=True)]
    assert [{p: s.read(p) for p in PATHS} for s in offline] == first
    assert "vllm/__init__.py" in offline[0].list_files()  # the central directory is cached too
    assert stats.snapshot()["requests"] == 0


def test_release_range_expands_to_every_release_oldest_first():
    sources = open_targets(">=0.18.0,<0.20")
    assert [s.version for s in sources] == ["0.18.0", "0.18.1", "0.19.0", "0.19.1"]
    assert all("manylinux" in s.filename and s.filename.endswith("x86_64.whl") for s in sources)
