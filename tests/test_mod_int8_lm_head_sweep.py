"""int8-lm-head sweep tooling on CPU: the CLI end to end under TRITON_INTERPRET=1, its input
errors, the report writers (Markdown, SVG, README block) and the final-norm-like hidden states.

The sweep runs as the lead runs it on the GPU, in a subprocess, on tiny heads; its times are
meaningless here, everything else (rows, limits, tuning, accuracy, the files) is real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from extras import need

torch = need("torch")

from int8_lm_head_interp import BENCH, bench_module  # noqa: E402

SWEEP = BENCH / "sweep_int8_lm_head.py"
SHIPPED_PATCH = BENCH.parents[1] / "mods" / "int8-lm-head" / "patches" / "common" / "int8_lm_head.patch"


def _sweep(out: Path, *extra: str, interpret: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1" if interpret else "0"}
    return subprocess.run([sys.executable, str(SWEEP), "--out", str(out), *extra], cwd=BENCH, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    run = _sweep(out, "--device", "cpu", "--dtype", "float16", "--heads", "160x48,70x40",
                 "--batches", "1,17,40,70", "--states", "24", "--quick")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "wrote sweep.json, sweep.md, speedup.svg" in run.stdout
    return out


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return bench_module("benchlib.int8_lm_head_report")


@pytest.mark.slow  # the swept fixture: a whole sweep under Triton's interpreter
def test_sweep_rows_limits_and_tuning(swept: Path, report: ModuleType) -> None:
    data = json.loads((swept / "sweep.json").read_text())
    sweep = bench_module("sweep_int8_lm_head")
    assert "for the pipeline only" in data["limits"]["hbm_source"]  # no GPU: figures named as such
    assert [(r["head"], r["batch"]) for r in data["rows"]] == [(h, b) for h in ("160x48", "70x40") for b in (1, 17, 40, 70)]
    for r in data["rows"]:
        assert r["speedup"] == pytest.approx(r["bf16_us"] / r["int8_us"])
        n, k = map(int, r["head"].split("x"))
        m = r["batch"]
        # memory-bound limits at these sizes: bytes over 3.35 TB/s
        act = m * k * 2 + m * n * 2
        assert r["bf16_limit_us"] == pytest.approx(1e6 * (2 * n * k + act) / 3.35e12)
        assert r["int8_limit_us"] == pytest.approx(1e6 * (n * k + 4 * n + act) / 3.35e12)
        module = bench_module("benchlib.int8_lm_head_kernel").load_kernel_module(swept)  # the module the patch installs
        assert r["int8_config"] == sweep.describe(module.table_config(m))  # timed as DISPATCH routes it
        timed = data["tuning_times"][r["head"]][str(m)]
        assert r["int8_config"] in timed and r["best_us"] == min(t for t in timed.values() if t is not None)
        assert {name.split()[0] for name in timed} >= {spec[0] for spec in sweep.CANDIDATE_BANDS[sweep.band_of(m)][1]}
        assert ("triton_bf16_us" in r) == (m >= sweep.YARDSTICK_FROM)
    bands = data["tuning"]["bands"]
    assert [b["limit"] for b in bands] == [limit for limit, _ in sweep.CANDIDATE_BANDS]
    assert all(b["ratio"] is None or b["ratio"] >= 1.0 - 1e-9 for b in bands)  # the shipped tile is a candidate
    namespace = dict(vars(module))
    exec(data["tuning"]["dispatch_python"], namespace)
    suggested = namespace["DISPATCH"]
    assert suggested[-1][0] is None and {limit for limit, _ in suggested} <= {b["limit"] for b in bands}
    for b in bands:  # each band's best tile serves that band in the suggested table
        cfg = next(c for limit, c in suggested if limit is None or (b["limit"] or 10**9) <= limit)
        assert sweep.describe(cfg) == b["suggested"]
    assert set(data["accuracy"]) == {f"{h} {kind}" for h in ("160x48", "70x40") for kind in sweep.KINDS}
    for _name, a in data["accuracy"].items():
        assert a["states"] == 24 and 0.0 <= a["top1_int8_vs_bf16"] <= 1.0
        assert a["max_abs_int8_vs_bf16"] >= a["mean_abs_int8_vs_bf16"] > 0.0
    acc = data["accuracy"]
    for h in ("160x48", "70x40"):  # x rounded to int8 costs more than weight rounding alone
        assert acc[f"{h} w8a8"]["mean_abs_int8_vs_bf16"] > acc[f"{h} split"]["mean_abs_int8_vs_bf16"]
    drops = data["tuning"]["top1_drops_pp"]
    assert drops == pytest.approx({kind: max(100 * (acc[f"{h} gemv"]["top1_int8_vs_bf16"] - acc[f"{h} {kind}"]["top1_int8_vs_bf16"])
                                             for h in ("160x48", "70x40")) for kind in sweep.KINDS})
    for b in bands:
        assert b["top1_drop_pp"] == drops[b["suggested"].split()[0]]
        assert b["top1_drop_pp"] <= sweep.TOP1_TOLERANCE_PP or b["suggested"] == b["shipped"]


def _tuned(times: dict) -> dict:
    """tuning_times for one head: every batch of the 256-row band timed at these candidates."""
    return {"1x1": {m: dict(times) for m in (192, 256)}}


def _accuracy(w8a8_top1: float) -> dict:
    return {f"1x1 {kind}": {"top1_int8_vs_bf16": w8a8_top1 if kind == "w8a8" else 0.978}
            for kind in ("gemv", "mma", "split", "w8a8")}


@pytest.mark.slow  # the swept fixture: a whole sweep under Triton's interpreter
@pytest.mark.parametrize("w8a8_top1,chosen", [(0.966, "split"), (0.972, "w8a8")])
def test_the_band_table_keeps_w8a8_only_within_one_point_of_gemv(w8a8_top1: float, chosen: str, swept: Path) -> None:
    """1.2 points below gemv: the faster w8a8 tile is reported, not suggested; 0.6 points: suggested."""
    sweep = bench_module("sweep_int8_lm_head")
    module = bench_module("benchlib.int8_lm_head_kernel").load_kernel_module(swept)
    times = {"split 64x256x128 w8 s3": 700.0, "w8a8 128x256x128 w8 s3": 500.0, "gemv 128x128x64 w4 s3": 900.0}
    summary = sweep.tuning_summary(module, _tuned(times), torch.device("cpu"), _accuracy(w8a8_top1))
    band = next(b for b in summary["bands"] if b["limit"] == 256)
    assert band["suggested"].split()[0] == chosen and band["fastest"] == "w8a8 128x256x128 w8 s3"
    assert band["fastest_top1_drop_pp"] == pytest.approx(100 * (0.978 - w8a8_top1))
    assert band["fastest_gain"] == pytest.approx(1.4 if chosen == "split" else 1.0)
    namespace = dict(vars(module))
    exec(summary["dispatch_python"], namespace)
    assert next(c for limit, c in namespace["DISPATCH"] if limit is None or limit >= 256).kernel == chosen
    data = {"tuning": summary, "rows": [], "accuracy": {}, "heads": [], "limits": {}}
    rendered = bench_module("benchlib.int8_lm_head_report").tuning_table(data)
    assert "1.0 percentage points below the gemv" in rendered and f"w8a8 {-100 * (0.978 - w8a8_top1):+.2f} pp" in rendered


@pytest.mark.slow  # the swept fixture: a whole sweep under Triton's interpreter
def test_set_dispatch_writes_the_suggested_table_into_the_patch(swept: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    loader = bench_module("benchlib.int8_lm_head_kernel")
    patch = tmp_path / "int8_lm_head.patch"
    patch.write_text(loader.PATCH.read_text())
    monkeypatch.setattr(loader, "PATCH", patch)  # the repository's patch stays as it is
    table = ("DISPATCH = (\n    (64, KernelConfig(GEMV, block_m=16, block_n=32, block_k=256, num_warps=4, num_stages=4)),\n"
             "    (None, KernelConfig(W8A8, block_m=128, block_n=256, block_k=128, num_warps=8, num_stages=3)),\n)")
    result = tmp_path / "sweep.json"
    result.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "tuning": {"dispatch_python": table}}))
    assert loader.main(["--set-dispatch", str(result)]) == 0
    module = loader.load_kernel_module(tmp_path, loader.patch_source(patch.read_text()))
    assert [(limit, cfg.kernel, cfg.block_n) for limit, cfg in module.DISPATCH] == [(64, "gemv", 32), (None, "w8a8", 256)]
    new, old = loader.patch_source(patch.read_text()), loader.patch_source(SHIPPED_PATCH.read_text())
    start = old.index(loader.DISPATCH_OPEN)
    assert new[:start] == old[:start] and new[start:].startswith(loader.DISPATCH_OPEN + "    (64, KernelConfig(GEMV")
    assert new[new.index(loader.DISPATCH_CLOSE, start):] == old[old.index(loader.DISPATCH_CLOSE, start):]  # the rest as it was
    assert capsys.readouterr().out.startswith("wrote ")


@pytest.mark.parametrize("content,needle", [
    ("{", "cannot read the sweep results"),
    (json.dumps({"device": "NVIDIA H100", "tuning": None}), "no suggested DISPATCH"),
    (json.dumps({"device": "cpu (Triton interpreter)", "tuning": {"dispatch_python": "DISPATCH = (\n)"}}), "interpreter"),
    (json.dumps({"device": "NVIDIA H100", "tuning": {"dispatch_python": "DISPATCH = (\n    (None, KernelConfig(FOO, 1, 1, 1, 1, 1)),\n)"}}),
     "does not import"),
    (json.dumps({"device": "NVIDIA H100", "tuning": {"dispatch_python": "DISPATCH = (\n    (64, KernelConfig(GEMV, 16, 32, 256, 4, 4)),\n)"}}),
     "end with None"),
])
def test_set_dispatch_refuses_unusable_results_in_one_line(tmp_path: Path, monkeypatch, capsys, content: str, needle: str) -> None:
    loader = bench_module("benchlib.int8_lm_head_kernel")
    patch = tmp_path / "int8_lm_head.patch"
    patch.write_text(loader.PATCH.read_text())
    monkeypatch.setattr(loader, "PATCH", patch)
    result = tmp_path / "sweep.json"
    result.write_text(content)
    assert loader.main(["--set-dispatch", str(result)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert patch.read_text() == SHIPPED_PATCH.read_text()  # nothing written


@pytest.mark.slow  # the swept fixture: a whole sweep under Triton's interpreter
def test_sweep_markdown_and_plot(swept: Path) -> None:
    md = (swept / "sweep.md").read_text()
    assert "INT8 >= 1.0x BF16 at every batch:" in md and "| 160x48 | 40 |" in md
    assert "Suggested `DISPATCH`" in md and "top-1 INT8 = BF16" in md and "| 70x40 w8a8 |" in md
    svg = ET.parse(swept / "speedup.svg").getroot()
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert sorted(line.find("{http://www.w3.org/2000/svg}title").text for line in lines) == ["160x48", "70x40"]
    assert all(len(line.get("points").split()) == 4 for line in lines)


@pytest.mark.slow  # the swept fixture: a whole sweep under Triton's interpreter
def test_readme_block_comes_from_the_results(swept: Path, report: ModuleType, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# mod\n\nbefore\n\n{report.BEGIN}\nplaceholder\n{report.END}\n\nafter\n")
    assert report.main([str(swept), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "placeholder" not in text and text.startswith("# mod\n\nbefore") and text.endswith("after\n")
    assert "| 70x40 | 70 |" in text and "speedup.svg)" in text
    first = text
    assert report.main([str(swept), "--readme", str(readme)]) == 0
    assert readme.read_text() == first  # re-rendering is stable


@pytest.mark.slow  # the swept fixture: a whole sweep under Triton's interpreter
def test_report_input_errors_are_one_line(report: ModuleType, swept: Path, tmp_path: Path, capsys) -> None:
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep.json" in err and "run sweep_int8_lm_head.py" in err
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert report.main([str(swept), "--readme", str(readme)]) == 2
    assert "SWEEP:BEGIN" in capsys.readouterr().err and readme.read_text() == "no markers\n"


@pytest.mark.parametrize("args,needle", [
    (("--heads", "12y3"), "expected VOCABxHIDDEN"),
    (("--batches", "0,4"), "expected positive integers"),
    (("--device", "cpu"), "TRITON_INTERPRET=1"),
    (("--states", "0"), "--states 0"),
])
def test_sweep_input_errors_exit_2_with_one_line(tmp_path: Path, args: tuple, needle: str) -> None:
    run = _sweep(tmp_path / "o", "--device", "cpu", *args, interpret=args != ("--device", "cpu"))
    assert run.returncode == 2 and needle in run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


def test_sweep_without_cuda_says_what_to_do(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run = _sweep(tmp_path / "o", interpret=False)
    assert run.returncode == 2 and "no CUDA device" in run.stderr and "--device cpu" in run.stderr


@pytest.mark.parametrize("name,copy,expected", [
    ("NVIDIA H200", 4.2, (4.8, 989.4)),
    ("NVIDIA H100 80GB HBM3", 3.0, (3.35, 989.4)),
    ("NVIDIA H100 PCIe", 1.8, (2.0, 756.0)),
    ("NVIDIA A100-SXM4-80GB", 1.734, (1.73, 989.4)),  # not listed: the measured copy, and said so
])
def test_limits_follow_the_device(name: str, copy: float, expected: tuple) -> None:
    sweep = bench_module("sweep_int8_lm_head")
    hbm, hbm_source, tc, tc_source = sweep.device_limits(name, copy)
    assert (hbm, tc) == expected
    listed = any(part in name for part, *_ in sweep.DEVICE_LIMITS)
    assert ("measured device copy" in hbm_source) == (not listed) and ("assumed" in tc_source) == (not listed)


# ---- hidden states shaped like a final-norm output ----


def test_hidden_states_have_the_outlier_channels_and_unit_rms() -> None:
    hidden = bench_module("benchlib.int8_lm_head_hidden")
    gen = torch.Generator().manual_seed(5)
    k = 512
    model = hidden.norm_model(k, gen)
    outliers = set(torch.nonzero(model.outlier_value).flatten().tolist())
    assert len(outliers) == hidden.OUTLIER_CHANNELS
    weight = torch.randn(300, k, generator=gen) * 0.02
    x = hidden.hidden_states(model, weight, 256, gen, torch.float32)
    normalized = x / model.gain
    assert torch.allclose(normalized.pow(2).mean(dim=1), torch.ones(256), rtol=1e-3)  # RMSNorm before the gain
    top = x.abs().mean(dim=0).topk(hidden.OUTLIER_CHANNELS).indices.tolist()
    assert set(top) == outliers  # the large channels are the outlier channels
    signs = torch.sign(x[:, sorted(outliers)])
    assert bool((signs == signs[0]).float().mean(dim=0).ge(0.95).all())  # each keeps its sign
    again = hidden.hidden_states(model, weight, 256, torch.Generator().manual_seed(9), torch.float32)
    assert not torch.equal(again, x)


def test_agreement_counts_and_errors_by_hand() -> None:
    hidden = bench_module("benchlib.int8_lm_head_hidden")
    ref = torch.tensor([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0]])
    bf16 = torch.tensor([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0]])
    int8 = torch.tensor([[0.0, 0.4, 0.5], [2.0, 0.0, 1.25]])  # row 0 flips to index 2
    agreement = hidden.Agreement()
    agreement.add(int8, bf16, ref)
    got = agreement.result()
    assert got["states"] == 2 and got["top1_int8_vs_bf16"] == 0.5 and got["top1_bf16_vs_ref"] == 1.0
    assert got["max_abs_int8_vs_bf16"] == pytest.approx(0.6)
    assert got["mean_abs_int8_vs_bf16"] == pytest.approx(0.85 / 6)
    assert got["median_top2_gap_bf16"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no logits"):
        hidden.Agreement().result()
