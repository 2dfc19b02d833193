"""benchlib/served_profile: a served decode step's kernels from a torch-profiler trace."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci" / "bench"))

from benchlib import served_profile as sp

FA = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cute::tuple<int>>>>(...)"


def _trace(launches: list[float], kernels: list[tuple[str, float, float]]) -> list[dict]:
    events: list[dict] = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 4.0} for t in launches]
    events += [{"ph": "X", "cat": "kernel", "name": n, "ts": t, "dur": d} for n, t, d in kernels]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": launches[0] + 1, "dur": 500.0},
               {"ph": "i", "cat": "kernel", "name": "instant", "ts": launches[0] + 2}, "not an event"]
    return events


def test_a_step_is_the_time_between_graph_launches_and_kernels_are_summed_per_step():
    launches = [1000.0, 2000.0, 3000.0, 4000.0]
    kernels = [("void _decode_split_kernel", t + 10, 40.0) for t in launches]  # the last one is after the span
    kernels += [(FA, t + 60, 30.0) for t in launches[:3]] + [(FA, t + 95, 6.0) for t in launches[:3]]
    kernels += [("void early_kernel", 500.0, 999.0)]  # before the first launch: not a profiled step
    step = sp.step_kernels(_trace(launches, kernels))
    assert step["steps"] == 3 and step["step_us"] == 1000.0
    assert step["kernel_us"] == 76.0
    assert [k["kernel"] for k in step["kernels"]] == ["_decode_split_kernel", FA.removeprefix("void ")[:sp.KERNEL_CHARS]]
    assert step["kernels"][0] == {"kernel": "_decode_split_kernel", "calls": 1.0, "us": 40.0}
    assert step["kernels"][1]["calls"] == 2.0 and step["kernels"][1]["us"] == 36.0
    assert len(step["kernels"][1]["kernel"]) == sp.KERNEL_CHARS


def test_top_keeps_the_longest_kernels():
    launches = [0.0, 100.0]
    kernels = [(f"k{i}", 1.0 + i, float(i)) for i in range(1, 6)]
    assert [k["kernel"] for k in sp.step_kernels(_trace(launches, kernels), top=2)["kernels"]] == ["k5", "k4"]


@pytest.mark.parametrize("launches", [[], [5.0]])
def test_a_trace_without_two_graph_launches_is_refused(launches):
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 1.0} for t in launches]
    with pytest.raises(sp.ProfileError, match=rf"^t.json: {len(launches)} CUDA graph launches; no decode step"):
        sp.step_kernels(events, "t.json")


def test_traces_are_read_plain_or_gzipped_and_bad_ones_refused_naming_the_file(tmp_path):
    events = _trace([0.0, 10.0], [])
    (tmp_path / "a.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    with gzip.open(tmp_path / "b.pt.trace.json.gz", "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    assert sp.read_trace(tmp_path / "a.pt.trace.json") == sp.read_trace(tmp_path / "b.pt.trace.json.gz") == events[:-1]
    (tmp_path / "c.json").write_text("{not json")
    (tmp_path / "d.json").write_text(json.dumps({"traceEvents": 3}))
    (tmp_path / "e.json.gz").write_bytes(b"\x1f\x8b broken")
    for name, says in (("c.json", "not a readable trace"), ("d.json", "no traceEvents list"), ("e.json.gz", "not a readable trace")):
        with pytest.raises(sp.ProfileError, match=f"^{tmp_path / name}: {says}"):
            sp.read_trace(tmp_path / name)


def test_a_trace_that_inflates_past_the_bound_is_refused(tmp_path, monkeypatch):
    with gzip.open(tmp_path / "big.json.gz", "wt") as fh:
        json.dump({"traceEvents": _trace([0.0, 10.0], [("k", 1.0, 2.0)] * 200)}, fh)
    monkeypatch.setattr(sp, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(sp.ProfileError, match="over 1000 bytes once inflated; profile a shorter span"):
        sp.read_trace(tmp_path / "big.json.gz")
    monkeypatch.setattr(sp, "MAX_TRACE_BYTES", 1 << 20)
    assert len(sp.read_trace(tmp_path / "big.json.gz")) == 204


def test_the_newest_trace_is_read_and_an_empty_folder_refused(tmp_path):
    with pytest.raises(sp.ProfileError, match=f"^{tmp_path / 'none'}: no trace file"):
        sp.newest_trace(tmp_path / "none")
    (tmp_path / "profiler_out_0.txt").write_text("table")
    with pytest.raises(sp.ProfileError, match="no trace file"):
        sp.newest_trace(tmp_path)
    for n, name in enumerate(("w.1.pt.trace.json.gz", "w.2.pt.trace.json", "w.3.pt.trace.json.gz")):
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, (1000 + (n * 7) % 3, 1000 + (n * 7) % 3))  # mtimes 1000, 1001, 1002
    assert sp.newest_trace(tmp_path).name == "w.3.pt.trace.json.gz"


def test_write_profile_keeps_the_step_and_removes_the_traces(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "w.pt.trace.json").write_text(json.dumps({"traceEvents": _trace([0.0, 50.0, 100.0], [("k", 5.0, 20.0), ("k", 55.0, 20.0)])}))
    into = tmp_path / "profile.json"
    profile = sp.write_profile(traces, into, {"batch": 8, "context": 32768})
    assert json.loads(into.read_text()) == profile
    assert profile["batch"] == 8 and profile["steps"] == 2 and profile["kernels"] == [{"kernel": "k", "calls": 1.0, "us": 20.0}]
    assert list(traces.iterdir()) == [] and not (tmp_path / "profile.tmp").exists()
    with pytest.raises(sp.ProfileError):  # nothing left to read: no stale trace is read twice
        sp.write_profile(traces, into, {"batch": 8, "context": 32768})
    (traces / "stale.pt.trace.json").write_text("{}")
    (traces / "sub").mkdir()
    sp.clear_traces(traces)
    assert [p.name for p in traces.iterdir()] == ["sub"]  # files only
    sp.clear_traces(tmp_path / "absent")  # nothing to clear: no error


def test_profiles_side_by_side():
    stock = {"batch": 8, "context": 32768, "steps": 90, "step_us": 5761.0, "kernel_us": 5500.0,
             "clocks": {"sm_mhz": 1755.0, "power_w": 612.5, "samples": 9},
             "kernels": [{"kernel": "flash|fwd", "calls": 10.0, "us": 960.0}, {"kernel": "moe", "calls": 40.0, "us": 2000.0}]}
    ours = {"batch": 8, "context": 32768, "steps": 85, "step_us": 6155.0, "kernel_us": 5900.0,
            "kernels": [{"kernel": "_decode_split_kernel", "calls": 10.0, "us": 1240.0}, {"kernel": "moe", "calls": 40.0, "us": 2010.0}]}
    lines = sp.markdown({"stock": stock, "turboquant": ours}, rows=2)
    assert "| stock | 8 | 32768 | 90 | 5761.0 | 5500.0 | 1755.0 | 612.5 |" in lines
    assert "| turboquant | 8 | 32768 | 85 | 6155.0 | 5900.0 |  |  |" in lines  # not sampled: blank
    assert "| `moe` | 2000.0 (40) | 2010.0 (40) |" in lines
    assert "| `_decode_split_kernel` |  | 1240.0 (10) |" in lines
    assert not any("flash" in line for line in lines)  # the third longest, past rows=2
    assert sp.markdown({}) == []
    assert any("`flash/fwd`" in line for line in sp.markdown({"stock": stock}))


def test_a_real_torch_profiler_export_is_read():
    """torch.profiler's own export (CPU here: no kernel, no graph) has the format read_trace expects."""
    torch = pytest.importorskip("torch")
    import tempfile

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(4) @ torch.ones(4)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.pt.trace.json"
        prof.export_chrome_trace(str(path))
        events = sp.read_trace(sp.newest_trace(Path(tmp)))
    assert any(e.get("ph") == "X" and str(e.get("name", "")).startswith("aten::") for e in events)
    with pytest.raises(sp.ProfileError, match="0 CUDA graph launches"):
        sp.step_kernels(events)


def test_profiler_flags_are_vllms_profiler_config(tmp_path):
    flag, value = sp.profiler_flags(tmp_path)
    config = json.loads(value)
    assert flag == "--profiler-config" and config["profiler"] == "torch" and config["torch_profiler_dir"] == str(tmp_path)
    assert config["torch_profiler_with_stack"] is False and config["torch_profiler_dump_cuda_time_total"] is False
