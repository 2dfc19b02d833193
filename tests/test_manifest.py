"""Manifest validation: every error names the file, the key and the problem."""

from __future__ import annotations

import copy

import pytest

from sparkmods.runtime.manifest import Manifest, ManifestError, Upstream, Variant, load_manifest

GOOD = {
    "schema": 1,
    "name": "demo",
    "summary": "demo mod",
    "variant": [
        {"label": "old", "vllm": ">=0.18.0,<0.24.0", "patches": ["patches/old/x.patch"], "verified": ["0.18.0", "0.23.0"]},
        {"label": "new", "vllm": ">=0.24.0,<0.30.0", "patches": ["patches/new/x.patch"], "verified": ["0.24.0"]},
    ],
    "upstream": {"since": "0.30.0", "evidence": "vLLM does it", "detect": [{"file": "vllm/a.py", "contains": "X"}]},
}


def mutate(path, value):
    data = copy.deepcopy(GOOD)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


def test_good_manifest_selects_by_version():
    m = Manifest.from_dict(GOOD, "mods/demo/mod.toml")
    assert isinstance(m.select("0.23.0"), Variant) and m.select("0.23.0").label == "old"
    assert m.select("0.24.0rc1.dev3+gabc1234").label == "old"
    assert m.select("0.24.0").label == "new"
    assert isinstance(m.select("0.31.0"), Upstream)
    assert m.select("0.17.1") is None
    assert "old (>=0.18.0,<0.24.0; verified on 0.18.0, 0.23.0)" in m.describe_variants()


@pytest.mark.parametrize("path, value, key, problem", [
    (("schema",), 2, "schema", "unsupported schema"),
    (("name",), KeyError, "name", "missing"),
    (("name",), "Bad Name", "name", "does not match"),
    (("extra",), 1, "extra", "unknown key"),
    (("variant",), [], "variant", "non-empty array"),
    (("variant", 1, "label"), "old", "variant[1].label", "duplicate label"),
    (("variant", 1, "vllm"), ">=0.20,<0.26", "variant[1].vllm", "overlaps variant 'old'"),
    (("variant", 0, "vllm"), "!=0.19", "variant[0].vllm", "bad clause"),
    (("variant", 0, "verified"), ["0.24.0"], "variant[0].verified[0]", "outside the variant's range"),
    (("variant", 0, "verified"), ["zero"], "variant[0].verified[0]", "not a PEP 440 version"),
    (("variant", 0, "patches"), ["../escape.patch"], "variant[0].patches[0]", "'..'"),
    (("variant", 0, "patches"), [], "variant[0].patches", "needs patches or install"),
    (("variant", 0, "patches"), "patches/a.patch", "variant[0].patches", "must be an array, got str"),
    (("variant", 0, "install"), [{"src": "f", "dest": "/etc/x"}], "variant[0].install[0].dest", "must start with"),
    (("variant", 0, "install"), [{"src": "f", "dest": "workspace:a/b"}], "variant[0].install[0].dest", "one file"),
    (("variant", 0, "colour"), "red", "variant[0].colour", "unknown key"),
    (("variant", 1, "vllm"), ">=0.24.0", "variant[1].vllm", "reaches into upstream.since"),
    (("upstream", "detect"), [], "upstream.detect", "at least one"),
    (("upstream", "since"), "soon", "upstream.since", "not a PEP 440"),
])
def test_each_validation_error(path, value, key, problem):
    with pytest.raises(ManifestError) as err:
        Manifest.from_dict(mutate(path, value), "mods/demo/mod.toml")
    message = str(err.value)
    assert message.startswith(f"mods/demo/mod.toml: {key}: "), message
    assert problem in message and "\n" not in message


def test_toml_syntax_and_folder_name(tmp_path):
    mod = tmp_path / "demo"
    mod.mkdir()
    (mod / "mod.toml").write_text("schema = 1\nname = [\n")
    with pytest.raises(ManifestError, match=r"mod.toml: \(syntax\)"):
        load_manifest(mod)
    (mod / "mod.toml").write_text('schema = 1\nname = "other"\nsummary = "s"\n[[variant]]\nlabel = "a"\n'
                                  'vllm = ">=0.18"\npatches = ["p.patch"]\nverified = []\n')
    with pytest.raises(ManifestError, match="differs from the folder name 'demo'"):
        load_manifest(mod)
    with pytest.raises(ManifestError, match="not a mod folder"):
        load_manifest(tmp_path)
