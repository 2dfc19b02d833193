"""`sparkmods verify` against a loopback server replaying recorded vLLM answers.

Each folder under tests/fixtures/verify/ is a scenario (layout: sparkmods/verify/capture.py):
what a server answered to verify, its log, and the verdicts and exit code verify must give.
The synthetic ones were written by vLLM 0.21.0's own code (fixtures/verify/generate.py);
scenarios captured from real servers with `sparkmods verify --record DIR` go beside them and
are picked up with no change here.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from sparkmods.cli import main
from sparkmods.errors import SparkmodsError
from sparkmods.verify import judges, metrics, serverlog
from sparkmods.verify.capture import Scenario, load_scenario
from sparkmods.verify.facts import Evidence, TemplateCheck
from sparkmods.verify.judges import JUDGES
from verifyreplay import Replay

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "verify"
SCENARIOS = sorted(p.parent for p in FIXTURES.glob("*/expect.json"))


def closed_port_url() -> str:
    """A loopback URL where nothing listens (the port was just released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(params=SCENARIOS, ids=[p.name for p in SCENARIOS])
def scenario(request: pytest.FixtureRequest) -> Scenario:
    return load_scenario(request.param)


def verify_json(capsys: pytest.CaptureFixture, args: List[str]) -> Tuple[int, dict]:
    code = main(["verify", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_scenarios_exist() -> None:
    names = {p.name for p in SCENARIOS}
    assert {"all-in-effect", "mtp-untrained-drafter", "turboquant-kv-auto", "int8-head-line-missing",
            "server-unreachable", "chat-template-not-ours"} <= names


def test_scenario(scenario: Scenario, capsys: pytest.CaptureFixture) -> None:
    expect = scenario.expect
    log = ["--log", str(scenario.log_path)] if scenario.log_path else []
    if expect.get("unreachable"):
        code = main(["verify", "--url", closed_port_url(), *log, *expect["args"]])
        captured = capsys.readouterr()
        assert code == expect["exit"] == 2
        assert captured.out == ""
        assert captured.err.count("\n") == 1 and "cannot reach" in captured.err
        return
    with Replay(scenario) as server:
        code, doc = verify_json(capsys, ["--url", server.url, *log, *expect["args"]])
    assert {m["mod"]: m["verdict"] for m in doc["mods"]} == expect["mods"], json.dumps(doc["mods"], indent=1)
    assert code == doc["exit"] == expect["exit"]


def test_text_output_one_line_per_mod(capsys: pytest.CaptureFixture) -> None:
    sc = load_scenario(FIXTURES / "mtp-untrained-drafter")
    with Replay(sc) as server:
        code = main(["verify", "--url", server.url, "--log", str(sc.log_path)])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    rows = {line.split()[0]: line for line in out if line.split()[0] in JUDGES}
    assert set(rows) == set(JUDGES)
    assert "not in effect  untrained-drafter symptom: acceptance 0.2% (1 of 600 draft tokens)" in rows["mtp-weights"]
    assert out[-1] == "5 mods: 4 not requested, 1 not in effect"
    assert all(line == line.rstrip() for line in out)


def test_untrained_drafter_needs_no_probe(capsys: pytest.CaptureFixture) -> None:
    """600 draft tokens are enough to judge: verify sends no completion."""
    sc = load_scenario(FIXTURES / "mtp-untrained-drafter")
    with Replay(sc) as server:
        verify_json(capsys, ["--url", server.url])
    assert ("POST", "/v1/completions") not in server.requests


def test_too_few_drafts_sends_probe_requests(capsys: pytest.CaptureFixture) -> None:
    sc = load_scenario(FIXTURES / "mtp-no-traffic")
    with Replay(sc) as server:
        _, doc = verify_json(capsys, ["--url", server.url, "--log", str(sc.log_path)])
    sent = server.requests.count(("POST", "/v1/completions"))
    assert sent == doc["probes_sent"] == 4
    assert server.requests.count(("GET", "/metrics")) == 2  # read again after the probe
    mtp = next(m for m in doc["mods"] if m["mod"] == "mtp-weights")
    assert "not enough traffic" in mtp["detail"] and "send a few requests" in mtp["detail"]
    with Replay(sc) as server:
        verify_json(capsys, ["--url", server.url, "--no-probe"])
    assert ("POST", "/v1/completions") not in server.requests


def test_expect_fails_on_a_mod_that_is_not_proven(capsys: pytest.CaptureFixture) -> None:
    """Without a log the int8 head cannot be proven: fine unless --expect names it."""
    sc = load_scenario(FIXTURES / "all-in-effect")
    with Replay(sc) as server:
        code, doc = verify_json(capsys, ["--url", server.url])
        verdicts = {m["mod"]: m for m in doc["mods"]}
        assert code == 0
        assert verdicts["int8-lm-head"]["verdict"] == "unknown" and "--log" in verdicts["int8-lm-head"]["detail"]
        # /metrics alone proves the KV cache dtype and the drafter's acceptance.
        assert verdicts["turboquant"]["verdict"] == "in effect"
        assert verdicts["mtp-weights"]["verdict"] == "in effect"
        code, _ = verify_json(capsys, ["--url", server.url, "--expect", "int8-lm-head"])
        assert code == 1


def test_record_then_replay_gives_the_same_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sc = load_scenario(FIXTURES / "mtp-no-traffic")
    out = tmp_path / "captured"
    with Replay(sc) as server:
        code, doc = verify_json(capsys, ["--url", server.url, "--log", str(sc.log_path), "--record", str(out)])
    captured = load_scenario(out)
    assert captured.expect["mods"] == {m["mod"]: m["verdict"] for m in doc["mods"]}
    assert captured.expect["exit"] == code
    assert (out / "server.log").read_bytes() == sc.log_path.read_bytes()
    assert (out / "metrics.txt").read_bytes() == (sc.folder / "metrics.txt").read_bytes()
    with Replay(captured) as server:
        again_code, again = verify_json(capsys, ["--url", server.url, "--log", str(out / "server.log"),
                                                 *captured.expect["args"]])
    assert again["mods"] == doc["mods"] and again_code == code


def test_container_without_docker_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    code = main(["verify", "--url", closed_port_url(), "--container", "vllm_node"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "docker command is not on PATH" in err


def test_cli_unreachable_in_a_subprocess() -> None:
    done = subprocess.run([sys.executable, "-m", "sparkmods", "verify", "--url", closed_port_url()],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("sparkmods: error: cannot reach") and done.stderr.count("\n") == 1


def test_metrics_labels_unescaped_and_engines_summed() -> None:
    text = "\n".join([
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        'vllm:cache_config_info{cache_dtype="fp8",note="a \\"quoted\\" \\\\ value\\n",engine="0"} 1.0',
        'vllm:spec_decode_num_drafts_total{engine="0"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1"} 30.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 20.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="1"} 60.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 5.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="1"} 15.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 4.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 12.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="1"} 4.0',
    ])
    got = metrics.facts(metrics.parse(text))
    assert got.cache == {"cache_dtype": "fp8", "note": 'a "quoted" \\ value\n', "engine": "0"}
    assert got.spec == metrics.SpecCounts(40, 80, 20, (16, 4))
    assert got.spec.acceptance_rate == 0.25 and got.spec.mean_acceptance_length == 1.5


def test_metrics_garbage_is_an_input_error() -> None:
    with pytest.raises(SparkmodsError, match="/metrics line 2: no numeric value"):
        metrics.parse("# ok\nvllm:x{a=\"b\"} many\n")


def test_log_colours_restarts_and_odd_args() -> None:
    text = "\n".join([
        "\x1b[36m(APIServer pid=1)\x1b[0m INFO 11-24 10:00:00 [utils.py:240] non-default args: "
        "{'kv_cache_dtype': 'fp8'}",
        "(EngineCore_DP0 pid=2) INFO 11-24 10:00:01 [x.py:1] sparkmods int8-lm-head: active (torch path) on ...",
        "[int8-lm-head] already applied (variant get-logits) to vLLM 0.21.0",
        # A second start in the same container: its facts replace the first's.
        "(APIServer pid=3) INFO 11-24 11:00:00 [utils.py:240] non-default args: {'kv_cache_dtype': "
        "'turboquant_k3v4_nc', 'compilation_config': <CompilationConfig level=3>}",
        "(EngineCore_DP0 pid=4) INFO 11-24 11:00:01 [cuda.py:312] Using AttentionBackendEnum.TURBOQUANT backend.",
    ])
    facts = serverlog.parse(text, "x.log", JUDGES)
    assert facts.serve_args == {"kv_cache_dtype": "turboquant_k3v4_nc"}
    assert facts.backends == ["TURBOQUANT"]
    assert facts.said("int8-lm-head") == []
    assert facts.runsh("int8-lm-head") == ["already applied (variant get-logits) to vLLM 0.21.0"]


def test_turboquant_startup_line_without_metrics() -> None:
    """The 0.18-0.20 variants' start-up line (mods/turboquant, `startup_line`) proves the mod when /metrics is off."""
    log = serverlog.parse(
        "(APIServer pid=1) INFO 11-24 10:00:00 [utils.py:233] non-default args: {'kv_cache_dtype': 'turboquant_k3v4_nc'}\n"
        "(EngineCore_DP0 pid=2) INFO 11-24 10:00:02 [arg_utils.py:1] [turboquant] KV cache turboquant_k3v4_nc on 10 "
        "of 12 attention layers (boundary: 3, 47); K 3 bit, V 4 bit, 400 bytes/token/layer (2048 in bf16)\n",
        "x.log", JUDGES)
    ev = Evidence("http://x", "m", None, None, "GET /metrics answered HTTP 404", log, TemplateCheck(None, "-"))
    got = judges.turboquant(judges.Context(ev, set()))
    assert got.verdict == "in effect" and got.detail.startswith("KV cache turboquant_k3v4_nc on 10 of 12")
    no_line = serverlog.parse("[turboquant] applied variant v0.18.0 to vLLM 0.19.1 in /x\n", "y.log", JUDGES)
    ev = Evidence("http://x", "m", None, None, "GET /metrics answered HTTP 404", no_line, TemplateCheck(None, "-"))
    assert judges.turboquant(judges.Context(ev, set())).verdict == "unknown"
