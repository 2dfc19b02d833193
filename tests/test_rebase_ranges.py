"""The mod-level bookkeeping of a rebase: which variant and release to start from, the new
variant's range (disjoint from every other one), and the minimal mod.toml edit."""

from __future__ import annotations

import itertools
from typing import Optional

import pytest

from sparkmods.errors import SparkmodsError
from sparkmods.rebase.modrebase import base_candidates, nearest_variant, plan_ranges
from sparkmods.rebase.tomledit import TomlEditError, edit_manifest, render_variant
from sparkmods.runtime.manifest import Manifest
from sparkmods.runtime.pep440 import Range, Version


def manifest(*variants: "tuple[str, str, list]", since: Optional[str] = None) -> Manifest:
    data = {"schema": 1, "name": "demo", "summary": "s",
            "variant": [{"label": label, "vllm": rng, "patches": [f"patches/{label}/x.patch"], "verified": ver}
                        for label, rng, ver in variants]}
    if since:
        data["upstream"] = {"since": since, "evidence": "e", "detect": [{"file": "vllm/x.py", "contains": "x"}]}
    return Manifest.from_dict(data, "mod.toml")


def applied(m: Manifest, onto: str) -> Manifest:
    """The manifest after the planned rebase: validated like any mod.toml (ranges disjoint)."""
    new, cuts = plan_ranges(m, Version(onto))
    data = dict(m.raw)
    data["variant"] = [dict(v, vllm=cuts.get(v["label"], (None, v["vllm"]))[1]) for v in m.raw["variant"]]
    data["variant"].append({"label": "new", "vllm": new, "patches": ["patches/new/x.patch"], "verified": []})
    out = Manifest.from_dict(data, "mod.toml")
    for a, b in itertools.combinations(out.variants, 2):
        assert not a.vllm.overlaps(b.vllm)
    return out


@pytest.mark.parametrize("variants, since, onto, new, cut", [
    ([("v1", ">=0.18.0, <0.21", ["0.18.0"])], None, "0.22.0", ">=0.22.0", {}),
    ([("v1", ">=0.18.0, <0.24", ["0.18.0"]), ("v2", ">=0.25", ["0.25.0"])], None, "0.22.0",
     ">=0.22.0, <0.24", {"v1": ">=0.18.0, <0.22.0"}),
    ([("v1", ">=0.18.0, <0.21", ["0.18.0"]), ("v2", ">=0.25", ["0.25.0"])], None, "0.22.0", ">=0.22.0, <0.25", {}),
    ([("v1", ">=0.18.0, <0.21", ["0.18.0"]), ("v2", ">0.24", ["0.25.0"])], None, "0.22.0", ">=0.22.0, <=0.24", {}),
    ([("v1", ">=0.18.0, <0.29", ["0.18.0"])], "0.30.0", "0.22.1", ">=0.22.1, <0.29", {"v1": ">=0.18.0, <0.22.1"}),
    ([("v1", "<0.21", ["0.19.1"])], "0.30.0", "0.20.0", ">=0.20.0, <0.21", {"v1": "<0.20.0"}),
    ([("v1", ">=0.18.0, <0.21", ["0.18.0"])], "0.30.0", "0.22.0", ">=0.22.0, <0.30.0", {}),
])
def test_new_range_starts_at_onto_and_neighbours_are_cut(variants, since, onto, new, cut):
    m = manifest(*variants, since=since)
    got_new, got_cuts = plan_ranges(m, Version(onto))
    assert got_new == new
    assert {k: b for k, (_, b) in got_cuts.items()} == cut
    after = applied(m, onto)
    assert after.select(onto).label == "new"
    for v in m.variants:  # every release a variant was verified on still selects it
        for x in v.verified:
            assert after.select(x).label == v.label


@pytest.mark.parametrize("variants, since, onto, problem", [
    ([("v1", ">=0.22.0", ["0.22.0"])], None, "0.22.0", "starts at 0.22.0"),
    ([("v1", ">=0.18.0", ["0.18.0", "0.23.0"])], None, "0.22.0", "verified on 0.23.0"),
    ([("v1", ">=0.18.0, <0.21", ["0.18.0"])], "0.30.0", "0.31.0", "past upstream.since"),
])
def test_ranges_that_cannot_be_cut_are_input_errors(variants, since, onto, problem):
    with pytest.raises(SparkmodsError, match=problem):
        plan_ranges(manifest(*variants, since=since), Version(onto))


def test_nearest_variant_and_base_release():
    m = manifest(("old", ">=0.18.0, <0.20", ["0.18.0", "0.19.1"]), ("mid", ">=0.20, <0.24", ["0.20.0", "0.23.0"]),
                 ("new", ">=0.26", ["0.27.0"]))
    assert nearest_variant(m, Version("0.21.0")).label == "mid"  # holds it
    assert nearest_variant(m, Version("0.25.0")).label == "mid"  # nearest verified below
    assert nearest_variant(m, Version("0.17.0")).label == "old"  # nothing below: nearest above
    assert base_candidates(m.variants[1], Version("0.25.0")) == ["0.23.0", "0.20.0"]
    assert base_candidates(m.variants[1], Version("0.21.0")) == ["0.20.0", "0.23.0"]


TOML = '''\
schema = 1
name = "demo"
summary = "s"

# variant one
[[variant]]
label = "one"   # the first
vllm = '>=0.18.0'  # open ended for now
patches = ["patches/one/x.patch"]
verified = ["0.18.0"]
# a comment that belongs to the next table
[upstream]
since = "0.30.0"
'''


def test_edit_changes_one_line_and_inserts_one_table():
    block = render_variant({"label": "two", "vllm": ">=0.22.0, <0.30.0", "patches": ["patches/two/x.patch"],
                            "verified": [], "notes": 'say "hi"'}, "rebased")
    out = edit_manifest(TOML, {"one": ">=0.18.0, <0.22.0"}, "one", block)
    lines = out.splitlines(keepends=True)
    assert "vllm = '>=0.18.0, <0.22.0'  # open ended for now\n" in lines
    at = lines.index("# rebased\n")
    assert lines[at - 2] == 'verified = ["0.18.0"]\n' and lines[at - 1] == "\n"
    assert lines[at + 1:at + 7] == ["[[variant]]\n", 'label = "two"\n', 'vllm = ">=0.22.0, <0.30.0"\n',
                                    'patches = ["patches/two/x.patch"]\n', "verified = []\n", 'notes = "say \\"hi\\""\n']
    assert lines[at + 7:at + 10] == ["\n", "# a comment that belongs to the next table\n", "[upstream]\n"]
    untouched = [x for x in TOML.splitlines(keepends=True) if not x.startswith("vllm")]
    assert all(x in lines for x in untouched)


@pytest.mark.parametrize("text, problem", [
    (TOML.replace('label = "one"   # the first', 'label = """one"""'), "label"),
    (TOML.replace("vllm = '>=0.18.0'  # open ended for now", "vllm = '''\n>=0.18.0'''"), "one-line"),
])
def test_layouts_the_edit_does_not_understand_are_refused(text, problem):
    with pytest.raises(TomlEditError, match=problem):
        edit_manifest(text, {"one": ">=0.18.0, <0.22.0"}, "one", ["[[variant]]\n"])


def test_range_text_round_trips():
    assert str(Range(">=0.18.0, <0.22.0")) == ">=0.18.0, <0.22.0"
