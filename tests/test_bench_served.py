"""The served benchmark's parts that need no GPU: model folders, planning, the streaming client
against a stand-in server, the decode-window arithmetic, and the table and plot writer."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from extras import need
from modfactory import make_site
from realmods import load_patched_module

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci" / "bench"))

import bench_served as bs  # noqa: E402
from benchlib import served_cells as cells, served_report as sr  # noqa: E402
from benchlib.qwen35_shapes import MODELS  # noqa: E402

CONFIG_NAMES = list(bs.CONFIGS)
HYBRID_PATCH = REPO / "mods" / "hybrid-int4-fp8" / "patches" / "common" / "sparkmods_hybrid_fp8.patch"


def _rows() -> list[dict]:
    """Synthetic rows as bench_served writes them: every config, 2 contexts x 3 batches, a skip."""
    rows = []
    speed = {"stock": 100.0, "stock-again": 101.0, "hybrid-int4-fp8": 104.0, "int8-lm-head": 103.0, "turboquant": 92.0,
             "full-stack": 99.0}
    for config in CONFIG_NAMES:
        kv = 5_370_000 if "turbo" in config or config == "full-stack" else 1_960_000
        for phase, grid in (("first", [(b, 1024) for b in (1, 8, 32)]),
                            ("steady", [(b, c) for c in (1024, 131072) for b in (1, 8, 32)])):
            for batch, context in grid:
                skipped = context == 131072 and batch == 32
                tok_s = None if skipped else speed[config] * batch ** 0.8 * (0.5 if phase == "first" else 1.0)
                rows.append({"model": "35b-a3b", "gpu": "NVIDIA H100 80GB HBM3", "vllm": "0.26.0", "config": config,
                             "batch": batch, "context": context, "tok_s": tok_s, "kv_tokens": kv,
                             "first_tok_s": None if skipped else 0.05 * (1 + context / 1024),
                             "phase": phase, "note": "skipped: does not fit" if skipped else None})
    return rows


def test_table_shows_ratios_to_stock_skips_kv_and_first_requests(tmp_path):
    (tmp_path / "served.json").write_text(json.dumps(_rows()))
    written = sr.write_report(tmp_path)
    md = (tmp_path / "served.md").read_text()
    assert [p.name for p in written] == ["served.md", "served.svg"]
    assert "| 1k | 1 | 100.0 | 101.0 (1.01x) | 104.0 (1.04x) | 103.0 (1.03x) | 92.0 (0.92x) | 99.0 (0.99x) |" in md
    assert "| 128k | 32 | - (skipped) |" in md
    assert "\n- skipped: does not fit\n" in md  # each distinct reason once, under the table
    assert "| turboquant | 5370000 |" in md and "| stock | 1960000 |" in md
    assert "| stock | 8 | 1k | 263.9 | 527.8 | 0.50 |" in md  # first request at half the steady rate
    assert "| int8-lm-head | none logged |" in md  # no server logs here
    assert "every request of the batch decodes (ratio" in md  # rows that do not record their window


def test_the_report_says_how_many_tokens_a_window_decodes(tmp_path):
    rows = _rows()
    for r in rows:
        r["gen"] = 256
    (tmp_path / "served.json").write_text(json.dumps(rows))
    sr.write_report(tmp_path)
    assert "every request of the batch decodes 256 tokens (`--gen`) (ratio to stock)" in (tmp_path / "served.md").read_text()
    rows[0]["gen"] = 128  # merged from a run with other windows
    (tmp_path / "served.json").write_text(json.dumps(rows))
    sr.write_report(tmp_path)
    assert "decodes 128 or 256 tokens (`--gen`)" in (tmp_path / "served.md").read_text()


def test_report_states_each_servers_warm_up_lines(tmp_path):
    (tmp_path / "served.json").write_text(json.dumps(_rows()))
    int8 = "sparkmods int8-lm-head: warm-up ran 11 kernel configs (row counts 1,2,16,17,32,33,48,65,80,129,144) in 9.1 s"
    failed = "sparkmods int8-lm-head: warm-up failed (RuntimeError: boom); kernels compile on first use"
    for config, lines in (("int8-lm-head", [int8]), ("full-stack", ["noise", failed])):
        (tmp_path / "servers" / config).mkdir(parents=True)
        prefix = "(EngineCore_DP0 pid=7) INFO 11-29 01:02:03 [int8_lm_head.py:640] "
        (tmp_path / "servers" / config / "server.log").write_text("".join(prefix + line + "\n" for line in lines))
    sr.write_report(tmp_path)
    md = (tmp_path / "served.md").read_text()
    assert f"| int8-lm-head | `{int8}` |" in md
    assert f"| full-stack | `{failed}` |" in md
    assert "| stock | none logged |" in md and "noise" not in md


def test_plot_has_a_line_per_config_per_context_and_a_legend(tmp_path):
    doc = ET.fromstring(sr.svg(_rows()))
    ns = "{http://www.w3.org/2000/svg}"
    lines = doc.findall(f"{ns}polyline")
    assert len(lines) == 2 * len(CONFIG_NAMES)
    by_config = [line.get("data-config") for line in lines]
    assert sorted(set(by_config)) == sorted(CONFIG_NAMES)
    # the skipped 128k x 32 cell leaves two points in that panel's lines, three in the 1k panel's
    assert sorted(len(line.get("points").split()) for line in lines) == [2] * len(CONFIG_NAMES) + [3] * len(CONFIG_NAMES)
    texts = [t.text for t in doc.iter(f"{ns}text")]
    assert "context 1k" in texts and "context 128k" in texts and all(c in texts for c in CONFIG_NAMES)
    ys = [float(p.split(",")[1]) for line in lines for p in line.get("points").split()]
    assert all(40 <= y <= 260 for y in ys)  # inside the panel


@pytest.mark.parametrize("content, says", [
    (None, "cannot read the rows"),
    ("{}", "not a list of bench_served.py rows"),
    ('[{"model": "x"}]', "not a list of bench_served.py rows"),
    ("[]", "no rows yet"),
])
def test_report_refuses_bad_results_in_one_line(tmp_path, capsys, content, says):
    if content is not None:
        (tmp_path / "served.json").write_text(content)
    assert sr.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def _stream(sent: float, *samples: tuple[float, int]) -> cells.Stream:
    return cells.Stream(sent=sent, samples=list(samples), ended=True)


def test_window_counts_only_while_every_request_decodes():
    early = _stream(0.0, (1.0, 1), (2.0, 11), (3.0, 21), (4.0, 31), (5.0, 41))  # decodes through the other's prefill
    late = _stream(0.0, (3.0, 1), (4.0, 11), (5.0, 21), (6.0, 31))
    rate, ttft = cells.window_rate([early, late])
    assert ttft == pytest.approx(2.0)
    assert rate == pytest.approx((41 - 21 + 21 - 1) / 2.0)  # window [3, 5]
    assert cells.window_rate([_stream(0.0, (1.0, 1), (2.0, 5)), _stream(0.0, (3.0, 1))])[0] is None
    assert cells.window_rate([_stream(0.0)]) == (None, None)


def test_plan_first_requests_then_grid_and_says_why_a_cell_is_skipped():
    cells = bs.plan([1024, 32768, 131072], [1, 8, 32], gen=128, kv_tokens=1_960_000, max_cell_tokens=1_100_000)
    firsts = [c for c in cells if c.phase == "first"]
    assert [(c.batch, c.context) for c in firsts] == [(1, 1024), (8, 1024), (32, 1024)]
    steady = {(c.batch, c.context): c for c in cells if c.phase == "steady"}
    assert len(steady) == 9
    assert "exceed --max-cell-tokens" in steady[(32, 131072)].skip
    assert steady[(8, 131072)].skip is None
    small_kv = bs.plan([1024, 131072], [1, 8], gen=128, kv_tokens=500_000, max_cell_tokens=10**7)
    assert "do not fit" in next(c.skip for c in small_kv if (c.batch, c.context) == (8, 131072))
    # every request may decode gen tokens plus one per prefill chunk of the others, inside max-model-len
    cell = steady[(8, 131072)]
    assert cell.max_tokens == min(128 + math.ceil(8 * 131072 / bs.BATCHED_TOKENS) + 64, bs.HEADROOM)
    assert cell.context + cell.max_tokens <= 131072 + bs.HEADROOM


class _FakeVllm(BaseHTTPRequestHandler):
    """Streams completions like vLLM's server (HTTP/1.1, chunked server-sent events): a prefill
    delay per request (one at a time), then one token every STEP seconds with continuous usage,
    until max_tokens or the client goes away."""

    STEP = 0.01
    protocol_version = "HTTP/1.1"
    prefill_lock = threading.Lock()
    payloads: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.payloads.append(payload)
        with self.prefill_lock:
            time.sleep(len(payload["prompt"]) / 20000)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            for n in range(1, payload["max_tokens"] + 1):
                chunk = {"choices": [{"text": f" t{n}"}], "usage": {"completion_tokens": n}}
                send(f"data: {json.dumps(chunk)}\n\n".encode())
                time.sleep(self.STEP)
            send(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


def test_run_cell_against_a_streaming_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cell = cells.Cell("steady", batch=4, context=2000, max_tokens=400)
        started = time.monotonic()
        rate, ttft, note = cells.run_cell(server.server_address[1], cell, gen=40, seed=1)
        elapsed = time.monotonic() - started
    finally:
        server.shutdown()
    assert note is None
    assert 0.3 * 4 / _FakeVllm.STEP < rate < 1.5 * 4 / _FakeVllm.STEP
    assert 0.1 <= ttft < 2.0
    assert elapsed < 400 * _FakeVllm.STEP  # closed after the window, not at max_tokens
    sent = _FakeVllm.payloads[-4:]
    assert all(p["ignore_eos"] and p["stream_options"]["continuous_usage_stats"] for p in sent)
    prompts = [p["prompt"] for p in sent]
    assert all(len(p) == 2000 and max(p) < cells.FIRST_SPECIAL_ID for p in prompts)
    assert len({p[0] for p in prompts}) == 4  # no shared prefix


def test_run_cell_reports_a_refused_request():
    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"error": "too long"}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rate, _, note = cells.run_cell(server.server_address[1], cells.Cell("steady", 2, 10, 20), gen=5, seed=0)
    finally:
        server.shutdown()
    assert rate is None and note.startswith("HTTP 400")


def test_a_steady_cell_is_the_median_of_its_windows_and_keeps_each(monkeypatch):
    """One stalled window (the first) moves the median by nothing; its rate is kept beside the others."""
    calls = []

    def run_cell(port, cell, gen, seed):
        calls.append(seed)
        return {0: (60.0, 0.2, None), 1: (100.0, 0.1, None), 2: (98.0, 0.3, None)}[len(calls) - 1]

    monkeypatch.setattr(cells, "run_cell", run_cell)
    ticks = iter([(10, 100), (40, 200), (40, 200), (45, 300), (45, 300), (145, 400)])
    monkeypatch.setattr(cells, "cpu_ticks", lambda: next(ticks))
    [got] = cells.interleaved_cell([8000], cells.Cell("steady", 1, 1024, 200), 128, index=4, repeats=3)
    assert (got.rate, got.ttft, got.note, got.rates) == (98.0, 0.2, None, [60.0, 100.0, 98.0])
    assert got.host_busy == [0.3, 0.05, 1.0]  # each window's own share of busy CPU time
    assert calls == [4000, 4001, 4002]  # fresh prompts each window, none shared with another cell's


def test_a_failed_window_ends_the_cell_with_its_note(monkeypatch):
    answers = iter([(90.0, 0.1, None), (None, None, "HTTP 400: too long")])
    monkeypatch.setattr(cells, "run_cell", lambda *a, **k: next(answers))
    [got] = cells.interleaved_cell([8000], cells.Cell("steady", 1, 1024, 200), 128, index=0, repeats=3)
    assert got.rate is None and got.note == "HTTP 400: too long" and got.rates == [90.0]


def test_servers_sharing_a_gpu_take_each_round_in_turn_with_the_same_prompts(monkeypatch):
    """Windows alternate between the servers (round k: every server with seed index*1000 + k); a
    server whose window fails ends its own series there, the others keep theirs."""
    calls = []
    answers = {(1, 0): (50.0, 0.1, None), (2, 0): (55.0, 0.2, None), (1, 1): (52.0, 0.1, None),
               (2, 1): (None, None, "HTTP 500"), (1, 2): (51.0, 0.3, None)}

    def run_cell(port, cell, gen, seed):
        calls.append((port, seed))
        return answers[(port, seed - 7000)]

    monkeypatch.setattr(cells, "run_cell", run_cell)
    one, two = cells.interleaved_cell([1, 2], cells.Cell("steady", 1, 1024, 200), 128, index=7, repeats=3)
    assert calls == [(1, 7000), (2, 7000), (1, 7001), (2, 7001), (1, 7002)]
    assert (one.rate, one.ttft, one.note, one.rates) == (51.0, 0.1, None, [50.0, 52.0, 51.0])
    assert (two.rate, two.note, two.rates) == (None, "HTTP 500", [55.0])


def test_repeated_windows_against_a_streaming_server_with_one_stall():
    """Real HTTP: three windows of one cell, the first with a stall; the median is a stall-free window."""
    class Stall(_FakeVllm):
        count: ClassVar[list[int]] = []

        def do_POST(self) -> None:
            self.count.append(1)
            if len(self.count) == 1:
                self.STEP = 0.03  # the first window decodes at a third of the rate
            super().do_POST()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stall)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        [got] = cells.interleaved_cell([server.server_address[1]], cells.Cell("steady", 1, 100, 200), 30, 0, 3)
    finally:
        server.shutdown()
    runs = got.rates
    assert got.note is None and len(runs) == 3
    assert runs[0] < 0.6 * min(runs[1:]) and got.rate == sorted(runs)[1] > 0.6 / _FakeVllm.STEP
    assert all(b is not None and 0 <= b <= 1 for b in got.host_busy)  # this machine's real /proc/stat


def test_the_table_lists_cells_whose_windows_differ(tmp_path):
    rows = _rows()
    for r in rows:
        if r["phase"] == "steady" and r["tok_s"]:
            r["tok_s_runs"] = [r["tok_s"]] * 3
    cell = next(r for r in rows if (r["config"], r["phase"], r["batch"], r["context"]) == ("int8-lm-head", "steady", 1, 1024))
    cell["tok_s_runs"] = [91.0, 103.0, 103.2]
    (tmp_path / "served.json").write_text(json.dumps(rows))
    sr.write_report(tmp_path)
    md = (tmp_path / "served.md").read_text()
    assert "Each cell is the median of 3 windows; cells whose windows differ by more than 5%:\n- int8-lm-head 1k x 1: 91.0, 103.0, 103.2 tok/s\n" in md
    cell["host_busy_runs"] = [0.312, 0.04, None]  # recorded since hostload; older rows have none
    (tmp_path / "served.json").write_text(json.dumps(rows))
    sr.write_report(tmp_path)
    assert "- int8-lm-head 1k x 1: 91.0, 103.0, 103.2 tok/s (host CPUs busy 31, 4, ? %)\n" in (tmp_path / "served.md").read_text()
    cell["tok_s_runs"] = [102.0, 103.0, 103.2]
    (tmp_path / "served.json").write_text(json.dumps(rows))
    sr.write_report(tmp_path)
    assert "Each cell is the median of 3 windows; in none do they differ by more than 5%." in (tmp_path / "served.md").read_text()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    need("tokenizers")  # the folders' tokenizer is written with it (transformers brings it)
    root = tmp_path_factory.mktemp("models")
    model = MODELS["35b-a3b"]
    return model, bs.build_model(model, root, "int4"), bs.build_model(model, root, "hybrid")


def test_model_folders_hold_real_headers_and_sparse_data(folders):
    from sparkmods.checkpoint.header import read_header

    _model, int4, hybrid = folders
    index = json.loads((hybrid / "model.safetensors.index.json").read_text())
    files = sorted(hybrid.glob("*.safetensors"))
    assert {Path(f).name for f in index["weight_map"].values()} == {f.name for f in files}
    infos = {name: t for f in files for name, t in read_header(f).tensors.items()}
    assert len(infos) == len(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in infos.values())
    assert abs(index["metadata"]["total_size"] / 19.6e9 - 1) < 0.01  # the 35B-A3B hybrid's real size
    assert sum(f.stat().st_blocks * 512 for f in files) < 64 << 20  # headers only on disk
    config = json.loads((int4 / "config.json").read_text())
    assert config["text_config"]["num_experts_per_tok"] == 8 and config["quantization_config"]["bits"] == 4
    assert config == json.loads((hybrid / "config.json").read_text())


def test_hybrid_mod_finds_exactly_the_shared_experts(folders, tmp_path):
    """The mod's own header scan (taken from its patch) on the folders' files."""
    hyb = load_patched_module(HYBRID_PATCH, tmp_path, "sparkmods_hybrid_fp8")
    model, int4, hybrid = folders

    def metadata(folder: Path) -> dict:
        """What vLLM's get_safetensors_params_metadata returns for a local folder: every header."""
        out = {}
        for f in folder.glob("*.safetensors"):
            with open(f, "rb") as fh:
                out.update(json.loads(fh.read(int.from_bytes(fh.read(8), "little"))))
        return out

    layers = hyb.find_fp8_layers(metadata(hybrid))
    assert len(layers) == 3 * model.shape.num_layers
    assert all(".mlp.shared_expert." in name for name in layers)
    assert hyb.block_size(layers) == (128, 128)
    assert hyb.find_fp8_layers(metadata(int4)) == {}


def test_tokenizer_covers_every_model_id(folders):
    transformers = need("transformers")
    _, int4, _ = folders
    tok = transformers.AutoTokenizer.from_pretrained(str(int4))
    assert len(tok) == 248320
    text = tok.decode([5, 248319, 248046])
    assert "t5" in text and "t248319" in text and text.endswith("<|im_end|>")
    assert tok.convert_tokens_to_ids("<|im_end|>") == json.loads((int4 / "config.json").read_text())["text_config"]["eos_token_id"]


def test_server_flags_use_cuda_graphs_dummy_weights_and_the_cache_dtype():
    flags = bs.serve_flags(bs.CONFIGS["full-stack"], 135168, 32, 0.9)
    assert "--enforce-eager" not in flags
    assert flags[flags.index("--load-format") + 1] == "dummy"
    assert flags[flags.index("--kv-cache-dtype") + 1] == "turboquant_k3v4_nc"
    assert "--kv-cache-dtype" not in bs.serve_flags(bs.CONFIGS["int8-lm-head"], 135168, 32, 0.9)
    assert bs.CONFIGS["full-stack"].mods == ("hybrid-int4-fp8", "int8-lm-head", "turboquant")
    assert all((REPO / "mods" / m / "run.sh").is_file() for c in bs.CONFIGS.values() for m in c.mods)
    # stock-again is stock by another server (the run's own spread), only when asked for
    again = bs.CONFIGS["stock-again"]
    assert (again.mods, again.checkpoint, again.kv_dtype) == ((), "int4", None)
    assert bs.serve_flags(again, 135168, 32, 0.9) == bs.serve_flags(bs.CONFIGS["stock"], 135168, 32, 0.9)
    assert [c.name for c in bs.DEFAULT_CONFIGS] == ["stock", "hybrid-int4-fp8", "int8-lm-head", "turboquant", "full-stack"]
    assert [c.name for c in bs._configs("stock,hybrid-int4-fp8,stock-again")] == ["stock", "hybrid-int4-fp8", "stock-again"]


def test_names_and_bad_input(tmp_path, capsys):
    assert bs.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert bs.gpu_slug("NVIDIA H200") == "h200"
    assert bs.main(["run", "--model", "35b-a3b", "--vllm-site", str(tmp_path), "--out", str(tmp_path / "o"),
                    "--configs", "stock,warp-drive"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown config warp-drive" in err
    with pytest.raises(bs.BenchError, match="no vllm-"):
        bs.vllm_version(tmp_path)
    (tmp_path / "vllm-0.26.0.dist-info").mkdir()
    assert bs.vllm_version(tmp_path) == "0.26.0"
    if not bs._gpu("name"):  # this machine: the run is refused before anything is written
        assert bs.main(["run", "--model", "35b-a3b", "--vllm-site", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
        assert "names no GPU here" in capsys.readouterr().err
        assert not (tmp_path / "o").exists()


def test_clocks_are_sampled_from_nvidia_smi_and_none_without_it(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    count = tmp_path / "n"  # the first two samples a cold GPU, then a loaded one
    smi.write_text(f'#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}\n'
                   'if [ "$n" -lt 2 ]; then echo "1980, 300.0"; else echo "1500, 650.0"; fi\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    clocks = bs.sample_clocks(0.5)
    assert clocks is not None and clocks["samples"] >= 3
    assert clocks["sm_mhz"] == 1500.0 and clocks["power_w"] == 650.0  # the median, not the first samples
    smi.write_text("#!/bin/sh\necho '[N/A], [N/A]'\n")
    assert bs.sample_clocks(0.2) is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert bs.sample_clocks(0.2) is None


def test_gpu_fields_are_read_from_the_gpu_the_run_is_pinned_to(tmp_path, monkeypatch):
    """Two runs side by side on a two-GPU machine: each waits for its own GPU's memory to be free
    and names its own GPU (a stand-in nvidia-smi; none here)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in\n  *"-i 1"*) echo 3 ;;\n  *) printf "70000\\n3\\n" ;;\nesac\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert bs._gpu("memory.used") == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert bs._gpu("memory.used") == "70000"  # unpinned: the first GPU
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert bs._gpu("name") == ""


@pytest.mark.parametrize("value, says", [
    ("8", "'8': give BATCHxCONTEXT, e.g. 8x32768"), ("8x", "give BATCHxCONTEXT"), ("0x1024", "give BATCHxCONTEXT"),
    ("8x-3", "give BATCHxCONTEXT"), ("64x1024", "--profile 64x1024 exceeds the largest batch or context (32x131072"),
    ("8x200000", "--profile 8x200000 exceeds")])
def test_a_bad_profile_cell_is_refused_in_one_line_before_anything_runs(tmp_path, capsys, value, says):
    assert bs.main(["run", "--model", "35b-a3b", "--vllm-site", str(tmp_path), "--out", str(tmp_path / "o"),
                    "--profile", value, "--detach"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
    assert not (tmp_path / "o").exists()


def test_detached_run_outlives_its_caller_and_wait_reports_its_end(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["run", "--model", "35b-a3b", "--vllm-site", str(tmp_path), "--out", str(out), "--detach"]
    assert bs.main(argv) == 0
    assert (out / "pid").is_file()
    assert bs.wait(out, 120) == 0
    assert (out / "exit-code").read_text().strip() == "2"  # no vLLM in that site: refused in one line
    assert "no vllm-*.dist-info" in (out / "bench.log").read_text()
    assert "exit 2" in capsys.readouterr().out


# A stand-in for `python3 -m vllm.entrypoints.openai.api_server`: logs the KV line, answers /health,
# /metrics and streaming completions the way the real server does.
_FAKE_API_SERVER = '''
import argparse, json, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
parser.add_argument("--profiler-config")
parser.add_argument("--gpu-memory-utilization", type=float)
args, _ = parser.parse_known_args()
profiled = {}
print("memory", args.gpu_memory_utilization, flush=True)
print("INFO [kv_cache_utils.py] GPU KV cache size: {:,} tokens".format(round(2_000_000 * args.gpu_memory_utilization / 0.9)), flush=True)
import os
print("env", {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "VLLM_DISABLE_COMPILE_CACHE")}, flush=True)

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = b"vllm:num_preemptions_total{engine=\\"0\\"} 0.0\\n" if self.path == "/metrics" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path in ("/start_profile", "/stop_profile"):  # vLLM's routes exist only with --profiler-config
            if not args.profiler_config:
                self.send_response(404)
            elif self.path == "/start_profile":
                profiled["start"] = time.time() * 1e6
                self.send_response(200)
            else:  # a trace as torch.profiler writes it: a graph launch per decode step, its kernels
                import gzip, os
                folder = json.loads(args.profiler_config)["torch_profiler_dir"]
                os.makedirs(folder, exist_ok=True)
                ts = [profiled["start"] + 5000 * n for n in range(int((time.time() * 1e6 - profiled["start"]) // 5000))]
                events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 3} for t in ts]
                events += [{"ph": "X", "cat": "kernel", "name": "void stand_in_kernel", "ts": t + 100, "dur": 1000} for t in ts]
                with gzip.open(os.path.join(folder, "w.%d.pt.trace.json.gz" % len(ts)), "wt") as fh:
                    json.dump({"traceEvents": events}, fh)
                self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        payload = json.loads(body)
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for n in range(1, payload["max_tokens"] + 1):
                data = ("data: " + json.dumps({"usage": {"completion_tokens": n}}) + "\\n\\n").encode()
                self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.005)
            self.wfile.write(b"0\\r\\n\\r\\n")
        except OSError:
            pass
        self.close_connection = True

    def log_message(self, *a):
        pass

ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
'''


def test_a_whole_run_against_a_stand_in_server(tmp_path, monkeypatch):
    """Bench.config end to end on CPU: server start, KV line, first requests and grid, rows as they
    come, the report; a mod whose run.sh fails gives rows that say so, and no server is started."""
    import argparse

    site = make_site(tmp_path / "site", "0.26.0", {"vllm/entrypoints/__init__.py": "", "vllm/entrypoints/openai/__init__.py": "",
                                                   "vllm/entrypoints/openai/api_server.py": _FAKE_API_SERVER})
    monkeypatch.setattr(bs, "build_model", lambda model, root, checkpoint: tmp_path)  # folders: tested above
    args = argparse.Namespace(contexts=[64, 128], batches=[1, 2], gen=5, max_cell_tokens=200,
                              gpu_memory_utilization=0.9, repeats=2, profile=None)
    results = tmp_path / "results"
    results.mkdir()
    bench = bs.Bench(MODELS["35b-a3b"], site, tmp_path / "work", results, args, "Stand-in GPU", "0.26.0")
    bench.serve([bs.CONFIGS["stock"]])
    bench.serve([bs.CONFIGS["int8-lm-head"]])
    assert "int8-lm-head" in (results / "served.md").read_text()  # failed rows are in the table too
    rows = json.loads((results / "served.json").read_text())
    stock = [r for r in rows if r["config"] == "stock"]
    assert [(r["phase"], r["batch"], r["context"]) for r in stock] == [
        ("first", 1, 64), ("first", 2, 64), ("steady", 1, 64), ("steady", 2, 64), ("steady", 1, 128), ("steady", 2, 128)]
    measured = [r for r in stock if r["note"] is None]
    assert len(measured) == 5 and all(r["tok_s"] > 0 and r["kv_tokens"] == 2_000_000 for r in measured)
    assert {r["gen"] for r in rows} == {5} and "decodes 5 tokens (`--gen`)" in (results / "served.md").read_text()
    # a steady cell is measured --repeats times (its median reported), a first request once
    assert all(len(r["tok_s_runs"]) == 2 and abs(r["tok_s"] - sum(r["tok_s_runs"]) / 2) <= 0.1
               for r in measured if r["phase"] == "steady")
    assert not any("tok_s_runs" in r for r in stock if r["phase"] == "first")
    # and beside each window, how busy the host's CPUs were while it ran
    assert all(len(r["host_busy_runs"]) == 2 and all(0 <= b <= 1 for b in r["host_busy_runs"])
               for r in measured if r["phase"] == "steady")
    assert "exceed --max-cell-tokens 200" in stock[-1]["note"] and stock[-1]["tok_s"] is None
    failed = [r for r in rows if r["config"] == "int8-lm-head"]
    assert len(failed) == 6 and all(r["note"].startswith("run.sh of int8-lm-head failed") for r in failed)
    assert "| 64 | 1 |" in (results / "served.md").read_text()
    log = (results / "servers" / "stock" / "server.log").read_text()
    assert "GPU KV cache size" in log
    # every configuration's server shares the run's Triton cache (vLLM's own compile cache off)
    assert f"env {{'TRITON_CACHE_DIR': '{tmp_path / 'work' / 'triton-cache'}', 'VLLM_DISABLE_COMPILE_CACHE': '1'}}" in log


def test_configurations_served_together_share_the_gpu_and_every_cell(tmp_path, monkeypatch):
    """--together: both servers up at once, each with half of --gpu-memory-utilization (so half the
    KV cache), the same cells measured on each, the rows and the report saying so."""
    import argparse

    site = make_site(tmp_path / "site", "0.26.0", {"vllm/entrypoints/__init__.py": "", "vllm/entrypoints/openai/__init__.py": "",
                                                   "vllm/entrypoints/openai/api_server.py": _FAKE_API_SERVER})
    monkeypatch.setattr(bs, "build_model", lambda model, root, checkpoint: tmp_path)
    args = argparse.Namespace(contexts=[64], batches=[1, 2], gen=5, max_cell_tokens=200,
                              gpu_memory_utilization=0.9, repeats=2, profile=None)
    results = tmp_path / "results"
    results.mkdir()
    bench = bs.Bench(MODELS["35b-a3b"], site, tmp_path / "work", results, args, "Stand-in GPU", "0.26.0")
    bench.serve([bs.CONFIGS["stock"], bs.CONFIGS["stock-again"]])
    rows = json.loads((results / "served.json").read_text())
    assert [(r["config"], r["phase"], r["batch"]) for r in rows] == [
        (c, phase, b) for phase in ("first", "steady") for b in (1, 2) for c in ("stock", "stock-again")]
    assert all(r["servers_on_gpu"] == 2 and r["kv_tokens"] == 1_000_000 and r["tok_s"] > 0 for r in rows)
    assert all(len(r["tok_s_runs"]) == 2 for r in rows if r["phase"] == "steady")
    for name in ("stock", "stock-again"):
        assert "memory 0.45" in (results / "servers" / name / "server.log").read_text()
    md = (results / "served.md").read_text()
    assert "(2 servers on the GPU, each with its share of `--gpu-memory-utilization`" in md
    assert "| 64 | 1 |" in md and "x)" in md  # stock-again's ratio to stock


def test_a_profiled_run_keeps_each_servers_decode_step_and_reports_it(tmp_path, monkeypatch, capsys):
    """--profile: the server gets vLLM's profiler flags, the cell runs again after the grid with its
    decode profiled, the step lands in servers/<config>/profile.json (the trace removed) and in
    served.md; a server without the profiler routes leaves no profile and says why."""
    import argparse

    site = make_site(tmp_path / "site", "0.26.0", {"vllm/entrypoints/__init__.py": "", "vllm/entrypoints/openai/__init__.py": "",
                                                   "vllm/entrypoints/openai/api_server.py": _FAKE_API_SERVER})
    monkeypatch.setattr(bs, "build_model", lambda model, root, checkpoint: tmp_path)
    monkeypatch.setattr(bs, "PROFILE_TOKENS", 400)  # the stand-in decodes a token per 5 ms: room for the profile
    smi = tmp_path / "bin" / "nvidia-smi"  # a stand-in: a loaded GPU's clock and power, no memory in use
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\ncase "$*" in\n  *clocks.sm*) echo "1755, 612.54" ;;\n  *) echo 0 ;;\nesac\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    args = argparse.Namespace(contexts=[64], batches=[1, 2], gen=5, max_cell_tokens=1000, gpu_memory_utilization=0.9,
                              repeats=1, profile=(2, 64))
    results = tmp_path / "results"
    results.mkdir()
    bench = bs.Bench(MODELS["35b-a3b"], site, tmp_path / "work", results, args, "Stand-in GPU", "0.26.0")
    bench.serve([bs.CONFIGS["stock"]])
    profile = json.loads((results / "servers" / "stock" / "profile.json").read_text())
    assert profile["batch"] == 2 and profile["context"] == 64 and profile["steps"] >= 50
    assert profile["kernels"] == [{"kernel": "stand_in_kernel", "calls": 1.0, "us": 1000.0}]
    assert 4900 < profile["step_us"] < 5100
    assert profile["clocks"]["sm_mhz"] == 1755.0 and profile["clocks"]["power_w"] == 612.5 and profile["clocks"]["samples"] > 1
    assert list((tmp_path / "work" / "traces" / "stock").iterdir()) == []
    assert "| `stand_in_kernel` | 1000.0 (1) |" in (results / "served.md").read_text()
    assert "| 1755.0 | 612.5 |" in (results / "served.md").read_text()
    assert "stock profile batch 2 context 64: servers/stock/profile.json" in capsys.readouterr().out

    monkeypatch.setattr(bs, "profiler_flags", lambda trace_dir: [])  # a server started without them
    (results / "servers" / "stock" / "profile.json").unlink()
    bench.serve([bs.CONFIGS["stock"]])
    assert not (results / "servers" / "stock" / "profile.json").exists()
    assert "stock profile batch 2 context 64: profiler: HTTPError: HTTP Error 404" in capsys.readouterr().out


def _served_out(tmp_path: Path) -> Path:
    out = tmp_path / "served"
    results = out / "served-35b-a3b-0.26.0-h200"
    (results / "servers" / "turboquant").mkdir(parents=True)
    (results / "served.json").write_text(json.dumps(_rows()))
    (results / "servers" / "turboquant" / "server.log").write_text("sparkmods turboquant: warm-up ran ...\n")
    (out / "bench.log").write_text("bench_served.py: 3 rows\n")
    (out / "models").mkdir()  # beside the results: never packed
    (out / "models" / "weights.safetensors").write_bytes(b"\0" * 64)
    return out


def test_pack_brings_a_run_back_as_one_file_and_unpack_places_it(tmp_path, capsys):
    """One archive per results folder (device calls return few files, two folders deep), with the
    server logs and the run's log; unpack puts it under results/, once."""
    out = _served_out(tmp_path)
    assert bs.main(["pack", "--out", str(out), "--to", str(tmp_path / "OUT")]) == 0
    (archive,) = (tmp_path / "OUT").iterdir()
    assert archive.name == "served-35b-a3b-0.26.0-h200.tar.gz"
    assert capsys.readouterr().out.startswith(f"bench_served.py: packed {archive} (")
    results = tmp_path / "results"
    assert bs.main(["unpack", str(archive), "--results", str(results)]) == 0
    placed = results / "served-35b-a3b-0.26.0-h200"
    assert capsys.readouterr().out == f"bench_served.py: unpacked into {placed}\n"
    assert sorted(str(p.relative_to(placed)) for p in placed.rglob("*") if p.is_file()) == [
        "bench.log", "served.json", "servers/turboquant/server.log"]
    assert (placed / "servers" / "turboquant" / "server.log").read_text() == "sparkmods turboquant: warm-up ran ...\n"
    assert [p.name for p in results.iterdir()] == [placed.name]  # no scratch folder left
    assert bs.main(["unpack", str(archive), "--results", str(results)]) == 2
    assert "exists already; remove it" in capsys.readouterr().err


def _tar(path: Path, entries: list) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, kind in entries:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
    return path


@pytest.mark.parametrize("entries,says", [
    ([("served-x/ok", "file"), ("served-x/../../evil", "file")], "is not a plain file or folder"),
    ([("served-x/ok", "file"), ("/tmp/served-evil", "file")], "not one served-* folder"),
    ([("served-x/passwd", "link")], "is not a plain file or folder"),
    ([("served-x/a", "file"), ("served-y/b", "file")], "not one served-* folder"),
    ([("results/a", "file")], "not one served-* folder"),
])
def test_unpack_refuses_an_archive_that_escapes_or_is_not_a_run(tmp_path, capsys, entries, says):
    archive = _tar(tmp_path / "bad.tar.gz", entries)
    results = tmp_path / "results"
    assert bs.main(["unpack", str(archive), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bench_served.py: {archive}: ") and says in err and err.count("\n") == 1
    assert not results.exists() and not (tmp_path / "evil").exists()


def test_unpack_refuses_a_damaged_archive_and_pack_an_empty_run(tmp_path, capsys):
    good = _tar(tmp_path / "good.tar.gz", [("served-x/a", "file")])
    (tmp_path / "cut.tar.gz").write_bytes(good.read_bytes()[:-20])
    assert bs.main(["unpack", str(tmp_path / "cut.tar.gz"), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "could not extract it" in err and err.count("\n") == 1
    assert not (tmp_path / "r" / "served-x").exists() and not list((tmp_path / "r").glob(".unpack-*"))
    assert bs.main(["pack", "--out", str(tmp_path / "nothing"), "--to", str(tmp_path / "OUT")]) == 2
    assert "no served-* results folder to pack" in capsys.readouterr().err


# ---------------------------------------------------------------- merge: one run's configurations from two leases

RUN = "served-35b-a3b-0.26.0-h200"


def _results(folder: Path, configs: list[str], log: str | None = "bench_served.py: rows\n", rows: list | None = None) -> Path:
    """A results folder as unpack leaves it: `configs`' rows of _rows(), a server log each, bench.log."""
    folder.mkdir(parents=True)
    (folder / "served.json").write_text(json.dumps([r for r in _rows() if r["config"] in configs] if rows is None else rows))
    for config in configs:
        (folder / "servers" / config).mkdir(parents=True)
        (folder / "servers" / config / "server.log").write_text(f"sparkmods {config}: warm-up ran in {len(config)} s\n")
    if log is not None:
        (folder / "bench.log").write_text(log)
    return folder


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under folder with its bytes (None for a folder): what "unchanged" compares."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


def test_merge_joins_rows_server_logs_and_run_logs_and_writes_the_report_again(tmp_path, capsys):
    into = _results(tmp_path / RUN, ["stock", "hybrid-int4-fp8", "int8-lm-head"], log="first lease\nlast line")
    second = _results(tmp_path / "second" / RUN, ["turboquant", "full-stack"], log="second lease\n")
    sr.write_report(into)
    assert "turboquant" not in (into / "served.md").read_text()
    before = _snapshot(second)
    assert bs.main(["merge", str(into), str(second)]) == 0
    assert capsys.readouterr().out == (f"bench_served.py: merged 18 rows (turboquant, full-stack) from {second} "
                                       f"into {into}\n")
    rows = json.loads((into / "served.json").read_text())
    merged = ["stock", "hybrid-int4-fp8", "int8-lm-head", "turboquant", "full-stack"]
    assert rows == [r for r in _rows() if r["config"] in merged]  # INTO's rows, then FROM's, in their order
    assert sorted(p.name for p in (into / "servers").iterdir()) == sorted(merged)
    assert (into / "servers" / "full-stack" / "server.log").read_text() == "sparkmods full-stack: warm-up ran in 10 s\n"
    assert (into / "bench.log").read_text() == f"first lease\nlast line\n# merged from {RUN} (turboquant, full-stack)\nsecond lease\n"
    md = (into / "served.md").read_text()
    assert "| context | batch | stock | hybrid-int4-fp8 | int8-lm-head | turboquant | full-stack |" in md
    assert "| 1k | 1 | 100.0 | 104.0 (1.04x) | 103.0 (1.03x) | 92.0 (0.92x) | 99.0 (0.99x) |" in md
    assert "| turboquant | `sparkmods turboquant: warm-up ran in 10 s` |" in md  # the copied log, read by the report
    svg = (into / "served.svg").read_text()
    assert 'data-config="full-stack"' in svg and 'data-config="stock"' in svg
    assert _snapshot(second) == before  # FROM only read


def test_merge_takes_several_folders_in_order_and_folders_without_a_log(tmp_path, capsys):
    into = _results(tmp_path / "a" / RUN, ["stock"], log=None)
    one = _results(tmp_path / "b" / RUN, ["turboquant"], log=None)
    two = _results(tmp_path / "c" / RUN, ["int8-lm-head", "full-stack"], log="third\n")
    assert bs.main(["merge", str(into), str(one), str(two)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"bench_served.py: merged 9 rows (turboquant) from {one} into {into}",
        f"bench_served.py: merged 18 rows (int8-lm-head, full-stack) from {two} into {into}"]
    configs = [r["config"] for r in json.loads((into / "served.json").read_text())]
    assert list(dict.fromkeys(configs)) == ["stock", "turboquant", "int8-lm-head", "full-stack"]
    assert (into / "bench.log").read_text() == (f"# merged from {RUN} (turboquant)\n"
                                                f"# merged from {RUN} (int8-lm-head, full-stack)\nthird\n")
    assert "| config | KV cache tokens |" in (into / "served.md").read_text()


def _other_gpu() -> list[dict]:
    return [dict(r, gpu="NVIDIA H100 80GB HBM3 (other)") for r in _rows() if r["config"] == "turboquant"]


def _mixed() -> list[dict]:
    rows = [r for r in _rows() if r["config"] == "turboquant"]
    return rows[:-1] + [dict(rows[-1], vllm="0.25.1")]


@pytest.mark.parametrize("case, says", [
    ("from-no-json", "cannot read served.json"),
    ("from-not-list", "not a list of bench_served.py rows"),
    ("from-not-dicts", "not a list of bench_served.py rows"),
    ("into-no-json", "cannot read served.json"),
    ("from-empty", "holds no rows"),
    ("other-gpu", "merge only folders of one model, vLLM and GPU"),
    ("mixed-rows", "rows of more than one model, vLLM and GPU"),
    ("config-twice", "configuration stock is in"),
    ("config-in-two-froms", "configuration turboquant is in"),
    ("servers-twice", "servers/stock/ is in"),
    ("from-is-into", "is INTO itself"),
])
def test_merge_refuses_in_one_line_and_leaves_every_folder_as_it_was(tmp_path, capsys, case, says):
    into = _results(tmp_path / RUN, ["stock", "int8-lm-head"], log="first\n")
    sr.write_report(into)
    source = tmp_path / "second" / RUN
    sources = [source]
    if case == "from-no-json":
        _results(source, ["turboquant"]).joinpath("served.json").unlink()
    elif case == "from-not-list":
        _results(source, ["turboquant"]).joinpath("served.json").write_text("{}")
    elif case == "from-not-dicts":
        _results(source, ["turboquant"]).joinpath("served.json").write_text("[1, 2]")
    elif case == "into-no-json":
        (into / "served.json").unlink()
        _results(source, ["turboquant"])
    elif case == "from-empty":
        _results(source, [], rows=[])
    elif case == "other-gpu":
        _results(source, ["turboquant"], rows=_other_gpu())
    elif case == "mixed-rows":
        _results(source, ["turboquant"], rows=_mixed())
    elif case == "config-twice":
        _results(source, ["turboquant", "stock"]).joinpath("servers", "stock").rename(source / "stock-log")
    elif case == "config-in-two-froms":
        _results(source, ["turboquant"])
        sources.append(_results(tmp_path / "third" / RUN, ["full-stack", "turboquant"]))
    elif case == "servers-twice":
        _results(source, ["turboquant"])
        (source / "servers" / "stock").mkdir()  # a log of a configuration INTO has, rows only of another
    elif case == "from-is-into":
        sources = [into]
    wanted = sources[-1] if case != "into-no-json" else into
    before = {f: _snapshot(f) for f in [into, *sources]}
    assert bs.main(["merge", str(into), *map(str, sources)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"bench_served.py: {wanted}") and says in captured.err
    assert captured.err.count("\n") == 1
    assert {f: _snapshot(f) for f in [into, *sources]} == before


def test_a_merge_that_fails_while_writing_is_undone(tmp_path, capsys, monkeypatch):
    """served.json cannot be written (a full disk): the copied server logs go again and bench.log is
    put back, so the same merge can be run again once the cause is fixed."""
    from benchlib import served_merge as sm

    into = _results(tmp_path / RUN, ["stock"], log="first\n")
    source = _results(tmp_path / "second" / RUN, ["turboquant", "full-stack"])
    before = _snapshot(into)
    real = sm.write_atomic

    def full_disk(path: Path, data: bytes | str) -> None:
        if path.name == "served.json":
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(sm, "write_atomic", full_disk)
    assert bs.main(["merge", str(into), str(source)]) == 2
    err = capsys.readouterr().err
    assert "merge failed and was undone" in err and "No space left" in err and err.count("\n") == 1
    assert _snapshot(into) == before
    monkeypatch.setattr(sm, "write_atomic", real)
    assert bs.main(["merge", str(into), str(source)]) == 0
    assert len(json.loads((into / "served.json").read_text())) == 27


def test_host_load_from_proc_stat(tmp_path):
    """Busy ticks are all but idle and iowait; guest time is not counted twice."""
    from benchlib import hostload

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 40 3 2 0 7 1\ncpu0 50 2 25 400 20 1 1 0 0 0\n")
    assert hostload.cpu_ticks(stat) == (160, 1000)
    stat.write_text("cpu  160 5 90 1100 40 3 2 0 9 1\n")
    assert hostload.busy_share((160, 1000), hostload.cpu_ticks(stat)) == pytest.approx(100 / 400)
    assert hostload.cpu_ticks(tmp_path / "missing") is None
    stat.write_text("intr 1 2 3\n")
    assert hostload.cpu_ticks(stat) is None
    assert hostload.busy_share(None, (1, 2)) is None and hostload.busy_share((5, 10), (5, 10)) is None
