"""ci/bench/bench_decode_step.py's CPU-runnable parts: arguments, block tables, kernel times, report."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from scriptload import load_script

REPO = Path(__file__).resolve().parents[1]


STEP = load_script(REPO / "ci" / "bench" / "bench_decode_step.py")


def test_defaults_are_the_served_cells() -> None:
    args = STEP.parse_args(["--out", "x"])
    assert (args.models, args.contexts, args.batches, args.table_tokens) == (
        ["35b-a3b", "122b-a10b"], [1024, 32768, 131072], [1, 8, 32], 135168)


@pytest.mark.parametrize("argv,message", [
    (["--out", "x", "--models", "70b"], "--models 70b: not one of 35b-a3b, 122b-a10b"),
    (["--out", "x", "--models", ","], "--models (none)"),
    (["--out", "x", "--contexts", "200000"], "--contexts 200000 exceeds --table-tokens 135168"),
    (["--out", "x", "--batches", "0"], "positive integers"),
    (["--models", "35b-a3b"], "--out"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv: list, message: str, capsys: pytest.CaptureFixture) -> None:
    assert STEP.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_block_table_gives_each_request_its_own_pages_and_page_0_past_the_context() -> None:
    table = STEP.block_table(3, 40, 100, 16, torch.Generator().manual_seed(0))
    assert table.shape == (3, 7) and table.dtype == torch.int32
    used = table[:, :3]
    assert sorted(used.flatten().tolist()) == list(range(1, 10))  # distinct, never page 0
    assert table[:, 3:].eq(0).all()


def test_kernel_times_are_per_step_device_kernels_largest_first() -> None:
    events = [SimpleNamespace(key="_decode_split_kernel", device_time_total=400.0, device_type="DeviceType.CUDA", count=20),
              SimpleNamespace(key="cudaLaunchKernel", device_time_total=0.0, device_type="DeviceType.CPU", count=60),
              SimpleNamespace(key="_rotate_kernel" + "x" * 80, device_time_total=900.0, device_type="DeviceType.CUDA", count=40)]
    rows = STEP.kernel_times(events, steps=20)
    assert rows == [{"kernel": ("_rotate_kernel" + "x" * 80)[:60], "us": 45.0, "calls": 2},
                    {"kernel": "_decode_split_kernel", "us": 20.0, "calls": 1}]


def test_report_gives_the_ratio_of_the_steps_and_lists_failures() -> None:
    results = {"gpu": "NVIDIA H200", "vllm": "0.26.0", "fa_version": 3, "table_tokens": 135168, "profiles": [],
               "steps": [{"model": "35b-a3b", "batch": 1, "context": 1024, "stock_step": 12.0, "ours_step": 15.0,
                          "fa_decode": 8.0, "ours_decode": 11.0, "stock_write": 3.0, "ours_store": 4.0, "fa2_decode": 9.5},
                         {"model": "35b-a3b", "batch": 8, "context": 1024, "stock_step": 20.0}],
               "failures": ["35b-a3b ours batch 8 context 1024: RuntimeError: boom"]}
    md = STEP.render(results)
    assert "| 1 | 1024 | 12 | 15 | 0.8 | 8 | 11 | 3 | 4 | 9.5 |" in md
    assert "| 8 | 1024 | 20 | - | - | - | - | - | - | - |" in md
    assert "## 35b-a3b (16 query heads)" in md
    assert md.rstrip().endswith("- 35b-a3b ours batch 8 context 1024: RuntimeError: boom")
    assert "SM clock" not in md  # no clock read
    clocked = STEP.render({**results, "sm_mhz": 1755.0})
    assert "); SM clock after the timings: median 1755 MHz." in clocked


def test_the_script_runs_from_any_folder_where_sparkmods_is_not_installed() -> None:
    """As on a GPU machine: no sparkmods among the installed packages (here the venv's .pth
    puts tools/ on the path; the child drops it)."""
    import subprocess

    script = str(REPO / "ci" / "bench" / "bench_decode_step.py")
    run = ("import runpy, sys; sys.path[:] = [p for p in sys.path if not p.rstrip('/').endswith('tools')]; "
           f"sys.argv = [{script!r}, '--help']; runpy.run_path({script!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, cwd="/", timeout=120)
    assert done.returncode == 0 and "--table-tokens" in done.stdout
