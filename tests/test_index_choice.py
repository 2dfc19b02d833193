"""The wheel chosen per version on a large index page (a per-commit nightly index lists
thousands of builds): for every version, the preferred one (non-yanked, manylinux x86_64,
then aarch64, highest build tag, then name), the same whichever order the page lists them in."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from sparkmods.sources.index import ProjectPage, parse_page
from sparkmods.sources.spec import open_targets
from test_sources_kit import JSON_TYPE, fresh_cache  # noqa: F401

PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_28_aarch64", "linux_x86_64", "macosx_14_0_arm64"]


def page(builds: int, seed: int) -> bytes:
    rng = random.Random(seed)
    files = []
    for i in range(builds):
        version = f"0.30.0.dev{i}+g{i:09x}"
        for platform in rng.sample(PLATFORMS, rng.randint(1, len(PLATFORMS))):
            build = rng.choice(["", "-1", "-2"])
            name = f"vllm-{version}{build}-cp38-abi3-{platform}.whl"
            files.append({"filename": name, "url": f"https://files.example/{i}/{name}", "size": 10,
                          "hashes": {"sha256": hashlib.sha256(name.encode()).hexdigest()},
                          "yanked": rng.random() < 0.1})
    rng.shuffle(files)
    return json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode()


def test_the_preferred_wheel_of_every_version() -> None:
    files = parse_page(page(2_000, seed=1), JSON_TYPE, "https://index.example/simple/vllm/")
    chosen = ProjectPage("https://index.example/simple/vllm/", files)
    for version in chosen.versions(include_yanked=True):
        candidates = [f for f in files if f.version == version]
        best = max(candidates, key=lambda f: (not f.yanked, f.rank))
        assert chosen.wheel(version) == best
        if any(not f.yanked for f in candidates):
            assert not best.yanked
        linux = [f for f in candidates if not f.yanked and "manylinux_2_28_x86_64" in f.filename]
        if linux:
            assert "manylinux_2_28_x86_64" in best.filename


def test_a_range_over_thousands_of_builds_opens_the_preferred_wheel_of_each(fresh_cache: Path) -> None:
    url = "https://nightly.example/simple/vllm/"
    body = page(3_000, seed=2)
    entry = {"url": url, "final_url": url, "content_type": JSON_TYPE, "fetched": 0, "max_age": 0,
             "body": body.decode()}
    (fresh_cache / "index").mkdir(parents=True)
    (fresh_cache / "index" / f"{hashlib.sha256(url.encode()).hexdigest()}.json").write_text(json.dumps(entry))
    sources = open_targets("index:https://nightly.example/simple#>=0.30.0.dev2000", offline=True, prereleases=True)
    by_version: dict = {}
    for f in parse_page(body, JSON_TYPE, url):
        by_version.setdefault(f.version, []).append(f)
    listed = sorted(v for v, fs in by_version.items() if v.dev >= 2000 and any(not f.yanked for f in fs))
    assert [s.version for s in sources] == [str(v) for v in listed] and len(listed) > 800
    for source, version in zip(sources, listed):
        best = max(by_version[version], key=lambda f: (not f.yanked, f.rank))
        assert (source.url, source.sha256, source.label) == (best.url, best.sha256, f"index:https://nightly.example/simple#{version}")
