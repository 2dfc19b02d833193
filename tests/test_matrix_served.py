"""The served layer: a matrix cell is marked served only from a committed, passing GPU run of
the same mod, release and variant (matrix/served.py), never by hand."""

from __future__ import annotations

import json
from copy import deepcopy
from pathlib import Path

import pytest

from sparkmods.checking.report import detail
from sparkmods.checking.rows import CheckRow
from sparkmods.matrix import render, served
from sparkmods.matrix.compare import stale_served
from sparkmods.modsdir import load, resolve_mods
from sparkmods.runtime.modcheck import ModResult

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = {d.name: load(d) for d in resolve_mods([], None)}
FINGERPRINTS = served.current_fingerprints(resolve_mods([], None))


def _run(results: Path, folder: str, scenario: str, vllm: str, passed: bool = True, said: str = "Check the log",
         **header) -> Path:
    """A scenario result as e2e.py writes it (today's fingerprint of the variant unless given); `said`:
    the last line of the mod's run.sh (None: not run)."""
    out = results / folder
    out.mkdir(parents=True, exist_ok=True)
    ran = [] if said is None else [{"name": f"mod: run.sh of {scenario} succeeds", "passed": True,
                                    "detail": f"[{scenario}] {said}"}]
    variant = (header.get("variants") or {}).get(scenario)
    if "fingerprints" not in header and (scenario, variant) in FINGERPRINTS:  # as e2e.py records them
        header["fingerprints"] = {scenario: FINGERPRINTS[(scenario, variant)]}
    doc = {"scenario": scenario, "vllm": vllm, "device": "NVIDIA H100 80GB HBM3", **header,
           "checks": ran + [{"name": "a", "passed": True, "detail": ""}, {"name": "b", "passed": passed, "detail": ""}]}
    path = out / f"{scenario}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    return tmp_path / "repo" / "ci" / "bench" / "results"


def test_a_passing_run_is_evidence_with_its_variant_gpu_date_and_path(results):
    _run(results, "gpu-e2e-0.33.0-h100/mtp-weights", "mtp-weights", "0.33.0", date="2026-11-27",
         variants={"mtp-weights": "v0.33.0"})
    found = served.index(results, MANIFESTS, FINGERPRINTS)
    [hit] = found[("mtp-weights", "0.33.0")]
    assert (hit.variant, hit.gpu, hit.date) == ("v0.33.0", "NVIDIA H100 80GB HBM3", "2026-11-27")
    assert hit.path == "ci/bench/results/gpu-e2e-0.33.0-h100/mtp-weights/mtp-weights.json"


def test_a_run_with_one_failed_check_or_an_unknown_scenario_is_no_evidence(results):
    _run(results, "gpu-e2e-0.33.0-h100", "mtp-weights", "0.33.0", passed=False, date="2026-11-27")
    _run(results, "gpu-e2e-0.33.0-h100", "baseline", "0.33.0", date="2026-11-27")
    (results / "gpu-e2e-0.33.0-h100" / "broken.json").write_text("{not json")
    _run(results, "elsewhere-0.33.0", "turboquant", "0.33.0", date="2026-11-27")  # not a gpu-e2e-* run
    assert served.index(results, MANIFESTS, FINGERPRINTS) == {}


def test_a_run_names_its_variant_and_older_runs_get_the_date_from_summary_md(results):
    path = _run(results, "gpu-e2e-0.23.0-h100", "hybrid-int4-fp8", "0.23.0")
    (path.parent / "summary.md").write_text("## 2026-11-24 10:00:00 vLLM 0.23.0 on NVIDIA H100 80GB HBM3\n\n"
                                            "## 2026-11-25 09:00:00 vLLM 0.23.0 on NVIDIA H100 80GB HBM3, TP 2 (mp)\n")
    # no `variants`: today's manifest would name v0.22.0, but what ran then is not known
    assert served.index(results, MANIFESTS, FINGERPRINTS) == {}
    _run(results, "gpu-e2e-0.23.0-h100", "hybrid-int4-fp8", "0.23.0", variants={"hybrid-int4-fp8": "v0.22.0"})
    [hit] = served.index(results, MANIFESTS, FINGERPRINTS)[("hybrid-int4-fp8", "0.23.0")]
    assert (hit.variant, hit.date) == ("v0.22.0", "2026-11-25")
    (path.parent / "summary.md").unlink()
    assert served.index(results, MANIFESTS, FINGERPRINTS) == {}  # no date anywhere: not evidence


def test_what_run_sh_did_must_agree_with_the_variant(results):
    """A 0.21.0 run whose run.sh said turboquant was not needed proves the upstream claim of that
    time, not a variant; a run that never applied the mod proves nothing."""
    path = _run(results, "gpu-e2e-0.21.0-h200", "turboquant", "0.21.0", said="not needed: vLLM includes it since 0.21.0",
                variants={"turboquant": "v0.21.0-kernels"})
    (path.parent / "summary.md").write_text("## 2026-11-24 10:00:00 vLLM 0.21.0 on NVIDIA H200\n")
    path.write_text(path.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    assert served.index(results, MANIFESTS, FINGERPRINTS) == {}
    _run(results, "gpu-e2e-0.26.0-h100", "turboquant", "0.26.0", said=None, date="2026-11-25",
         variants={"turboquant": "v0.21.0-kernels"})
    assert served.index(results, MANIFESTS, FINGERPRINTS) == {}
    _run(results, "gpu-e2e-0.26.0-h100", "turboquant", "0.26.0", date="2026-11-25", variants={"turboquant": "v0.21.0-kernels"})
    [hit] = served.index(results, MANIFESTS, FINGERPRINTS)[("turboquant", "0.26.0")]
    assert hit.variant == "v0.21.0-kernels"


def test_a_run_of_a_variant_since_renamed_marks_no_cell(results):
    """vLLM 0.25.1 served turboquant's old v0.21.0 (vLLM's own kernels); the cell's variant is now
    v0.21.0-kernels (ours), which that run never served."""
    _run(results, "gpu-e2e-0.25.1-h100", "turboquant", "0.25.1", date="2026-11-25", variants={"turboquant": "v0.21.0"},
         fingerprints={"turboquant": "f" * 64})  # the bytes of then: no variant has them today
    found = served.index(results, MANIFESTS, FINGERPRINTS)
    assert found == {}
    doc = {"cells": [_cell("turboquant", "0.25.1", "ok-offset", "v0.21.0-kernels")]}
    assert served.attach(doc, found)["cells"][0].get("served") is None


def test_a_run_that_recorded_its_variant_fingerprint_stops_counting_once_the_patches_change(results):
    """A run records the fingerprint of the variant it carried (e2e.py); an edit to that variant's
    patches after the run, under the same label, takes the mark away."""
    today = FINGERPRINTS[("turboquant", "v0.21.0-kernels")]
    _run(results, "gpu-e2e-0.26.0-h200", "turboquant", "0.26.0", date="2026-11-29",
         variants={"turboquant": "v0.21.0-kernels"}, fingerprints={"turboquant": today})
    assert [s.variant for s in served.index(results, MANIFESTS, FINGERPRINTS)[("turboquant", "0.26.0")]] == [
        "v0.21.0-kernels"]
    edited = {**FINGERPRINTS, ("turboquant", "v0.21.0-kernels"): "0" * 64}
    assert served.index(results, MANIFESTS, edited) == {}


def test_a_run_that_recorded_no_fingerprint_is_no_evidence(results):
    """A label alone cannot say which bytes ran; the upstream claim needs none (nothing was applied)."""
    _run(results, "gpu-e2e-0.33.0-h100", "mtp-weights", "0.33.0", date="2026-11-27", variants={"mtp-weights": "v0.33.0"},
         fingerprints={})
    _run(results, "gpu-e2e-0.33.0-h100", "turboquant", "0.33.0", date="2026-11-27", variants={"turboquant": "upstream"},
         said="not needed: vLLM includes it since 0.27.0")
    assert list(served.index(results, MANIFESTS, FINGERPRINTS)) == [("turboquant", "0.33.0")]


def test_a_variant_fingerprint_covers_its_own_patches_only(tmp_path):
    from shutil import copytree

    from sparkmods.checking.fingerprints import variant_fingerprints

    mod = copytree(ROOT / "mods" / "turboquant", tmp_path / "turboquant")
    before = variant_fingerprints(mod)
    patch = mod / "patches" / "v0.27.0" / "turboquant_attn.patch"
    patch.write_text(patch.read_text().replace("keeps upstream's impl and builder", "keeps upstream's impl"))
    after = variant_fingerprints(mod)
    assert after["v0.27.0-kernels"] != before["v0.27.0-kernels"]
    assert {k: after[k] for k in ("v0.18.0", "v0.21.0-kernels")} == {k: before[k] for k in ("v0.18.0", "v0.21.0-kernels")}


def _cell(mod: str, vllm: str, status: str, variant) -> dict:
    return {"mod": mod, "vllm": vllm, "target": f"pypi:{vllm}", "status": status, "variant": variant}


def test_attach_marks_only_green_cells_whose_variant_was_served(results):
    _run(results, "gpu-e2e-0.33.0-h100", "mtp-weights", "0.33.0", date="2026-11-27", variants={"mtp-weights": "v0.33.0"})
    _run(results, "gpu-e2e-0.33.0-h100", "turboquant", "0.33.0", date="2026-11-27", variants={"turboquant": "upstream"},
         said="not needed: vLLM includes it since 0.27.0")
    found = served.index(results, MANIFESTS, FINGERPRINTS)
    doc = {"cells": [_cell("mtp-weights", "0.33.0", "ok", "v0.33.0"), _cell("mtp-weights", "0.33.0", "conflict", "v0.33.0"),
                     _cell("mtp-weights", "0.33.0", "ok", "v0.32.0"), _cell("turboquant", "0.33.0", "upstream", None),
                     {**_cell("mtp-weights", "0.32.0", "ok", "v0.32.0"), "served": {"gpu": "typed by hand"}}]}
    marks = [c.get("served") for c in served.attach(doc, found)["cells"]]
    assert marks[0]["date"] == "2026-11-27" and marks[0]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert marks[1:3] == [None, None]
    assert marks[3]["result"].endswith("turboquant.json")  # the upstream claim, served
    assert marks[4] is None  # a mark no run backs is removed


def test_the_committed_matrix_served_layer_matches_the_committed_results():
    doc = json.loads((ROOT / "matrix" / "matrix.json").read_text())
    assert stale_served(doc, resolve_mods([], None)) == []


def test_a_hand_typed_served_mark_is_stale(tmp_path):
    doc = json.loads((ROOT / "matrix" / "matrix.json").read_text())
    forged = deepcopy(doc)
    bare = next(c for c in forged["cells"] if not c.get("served"))
    bare["served"] = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-27", "result": "x", "parallel": "one GPU"}
    [line] = stale_served(forged, resolve_mods([], None))
    assert line == f"{bare['mod']} on {bare['target']}: the served mark differs from ci/bench/results"


def test_results_dir_is_found_beside_the_mods_folder_only(tmp_path):
    assert served.results_dir(resolve_mods([], None)) == ROOT / "ci" / "bench" / "results"
    lone = tmp_path / "mods" / "x"
    lone.mkdir(parents=True)
    assert served.results_dir([lone]) is None


def test_markdown_and_svg_show_the_mark_the_legend_and_the_counts():
    doc = {"generated_by": "t", "releases": [{"vllm": "0.33.0", "target": "pypi:0.33.0"}],
           "mods": [{"name": "m", "summary": "s", "variants": []}],
           "cells": [{**_cell("m", "0.33.0", "ok", "v1"), "served": {"gpu": "NVIDIA H100", "date": "2026-11-27",
                                                                    "result": "r", "parallel": "one GPU"}}]}
    md = render.to_markdown(doc)
    assert "| **m** | ✅ v1 ⚡ |" in md and render.SERVED_MEANING in md
    assert "1 of 1 green cells were served on a GPU; the other 0 are green from patch application alone." in md
    svg = render.to_svg(doc)
    assert svg.count("<circle") == 2 and "served on NVIDIA H100 (2026-11-27)" in svg  # the cell's and the legend's
    doc["cells"][0].pop("served")
    assert "| **m** | ✅ v1 |" in render.to_markdown(doc) and render.to_svg(doc).count("<circle") == 1


def test_a_check_row_says_where_it_was_served():
    result = ModResult(mod="mtp-weights", version="0.33.0", status="ok", variant="v0.33.0")
    row = CheckRow("pypi:0.33.0", None, "a" * 64, result,
                   served={"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-27", "result": "r", "parallel": "one GPU"})
    assert detail(row) == "served on H100 (2026-11-27)"
    row.served["parallel"] = "TP 2 (ray)"
    assert detail(row) == "served on H100, TP 2 (ray) (2026-11-27)"
    assert row.to_dict()["served"]["gpu"] == "NVIDIA H100 80GB HBM3"
    row.served = None
    assert detail(row) == "" and "served" not in row.to_dict()


def test_the_readme_says_how_many_cells_the_committed_matrix_served():
    markdown = (ROOT / "matrix" / "MATRIX.md").read_text()
    said = next(line for line in markdown.splitlines() if "green cells were served on a GPU" in line)
    served_count, green = said.split(" of ")[0], said.split(" of ")[1].split()[0]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"{served_count} of {green} green cells were served on a GPU" in readme


def test_every_committed_run_names_the_fingerprint_of_each_variant_it_applied():
    """A result without the fingerprint of a variant it applied would vouch for that label whatever
    its bytes become: e2e.py writes them; older runs carry the bytes at the last commit before them
    (`fingerprints_from`)."""
    docs = [json.loads(p.read_text()) for p in sorted((ROOT / served.RESULTS).glob(f"{served.RUN_GLOB}/**/*.json"))]
    runs = [d for d in docs if isinstance(d, dict) and "scenario" in d and "checks" in d]
    assert len(runs) >= 50
    for doc in runs:
        applied = {m for m, v in (doc.get("variants") or {}).items() if v not in (None, served.UPSTREAM)}
        assert applied <= set(doc.get("fingerprints") or {}), (doc["scenario"], doc["vllm"], doc.get("device"))

