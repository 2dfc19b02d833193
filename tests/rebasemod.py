"""A demo mod and the releases `sparkmods rebase` moves it across, served as real wheels by the
loopback index: 0.19.1 (the mod's base), 0.20.0 (the line after the patched one changed), 0.20.1
(the patched lines gone) and 0.22.0 (the change already upstream). The fixtures `index` and `mod`
are registered in conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from modfactory import ORIGINAL, PATCHED, TARGET, unified
from sparkmods.cli import main
from sparkmods.sync import sync
from wheelindex import make_wheel

# 0.20.0 changed the line after the patched one: the exact engine refuses the old patch there.
ONTO = ORIGINAL.replace("        return y\n", "        return y.float()\n")
BROKEN = ORIGINAL.replace("        y = x * 2\n", "        z = x.relu()\n").replace("        return y\n", "        return z\n")
MANIFEST = '''\
schema = 1
name = "demo"
summary = "a demo mod"   # keep this comment

# the first variant, written for 0.19
[[variant]]
label = "v1"
vllm = ">=0.19.0,<0.21"   # inline comment stays
patches = ["patches/v1/demo.patch"]
verified = ["0.19.1"]
notes = "Add --demo to vllm serve"

# upstream took it over
[upstream]
since = "0.30.0"
evidence = "vLLM PR #1"
detect = [{ file = "vllm/model_executor/layers/demo.py", contains = "demo mod" }]
'''


@pytest.fixture
def index(loopback_index, tmp_path) -> str:
    """The index URL, serving the four releases."""
    def publish(version: str, text: str) -> None:
        wheel = make_wheel(tmp_path / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl", version,
                           extra={TARGET: text.encode()})
        loopback_index.add(wheel)

    publish("0.19.1", ORIGINAL)
    publish("0.20.0", ONTO)
    publish("0.20.1", BROKEN)
    publish("0.22.0", PATCHED)
    return f"{loopback_index.url}/simple"


@pytest.fixture
def mod(tmp_path) -> Path:
    """The demo mod, variant v1 for 0.19-0.20, synced."""
    folder = tmp_path / "mods" / "demo"
    (folder / "patches" / "v1").mkdir(parents=True)
    (folder / "patches" / "v1" / "demo.patch").write_text(unified(TARGET, ORIGINAL, PATCHED))
    (folder / "mod.toml").write_text(MANIFEST)
    sync(folder)
    return folder


def run(capsys, *argv: str) -> "tuple[int, str, str]":
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
