"""The chat template against real vLLM releases: their transformers renderer, their content-format
detection, their `qwen3` reasoning parser and their `qwen3_coder` / `qwen3_xml` tool parsers.

vLLM lives in its own virtual environment: each test here runs chat_template_probe.py with that
venv's python on the cases of test_chat_template.py and asserts on what the probe reports.

Targets: every release in the mod's `verified` list, from the shared cached venvs of vllmenv.py
(installed on first use), so the manifest's claim is what gets tested. SPARKMODS_VLLM_PYTHON (one or
more interpreter paths joined by os.pathsep) replaces them, e.g. for a dev build's venv.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from chat_template_probe import MARK, TOOL_PARSERS
from chatcases import CASES, MOD_DIR, TEMPLATE_PATH
from sparkmods.runtime.manifest import load_manifest
from sparkmods.runtime.pep440 import Range, Version
from vllmenv import vllm_env

pytestmark = pytest.mark.vllm_runtime
PROBE = Path(__file__).resolve().parent / "chat_template_probe.py"
# vLLM's own limit, not the template's: the first engine-based Qwen3 parser strips every parameter
# value (`params[name] = value.strip()` in vllm/parser/qwen3.py, 0.24.0 and 0.25.x); from 0.26.0
# `_trim_wrapping_newlines` drops only the newline the template writes on each side.
STRIPS_VALUES = Range(">=0.24.0,<0.26.0")


def targets() -> List[str]:
    """vLLM releases (or interpreter paths) to check the template against."""
    configured = os.environ.get("SPARKMODS_VLLM_PYTHON", "")
    if configured:
        return [p for p in configured.split(os.pathsep) if p]
    return [v for variant in load_manifest(MOD_DIR).variants for v in variant.verified]


def run_probe(target: str, job: Path) -> Dict[str, Any]:
    """Run the probe under the target's python; its last report line is the result."""
    if os.sep in target:
        proc = subprocess.run([target, str(PROBE), str(job)], capture_output=True, text=True, timeout=600)
    else:
        proc = vllm_env(target).run([str(PROBE), str(job)], timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert proc.returncode == 0 and lines, f"probe failed under {target}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len(MARK):])


def _stripped(text: Any) -> Any:
    """Parsers keep the newlines around </think> and before <tool_call>; compare without them."""
    return (text.strip() or None) if isinstance(text, str) else text


@pytest.fixture(scope="module", params=targets())
def report(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """One probe run per target, shared by the tests below."""
    job = tmp_path_factory.mktemp("chat-template") / "job.json"
    job.write_text(json.dumps({"template": str(TEMPLATE_PATH), "cases": CASES}), encoding="utf-8")
    return run_probe(request.param, job)


def test_transformers_renders_like_the_test_environment(report: Dict[str, Any]) -> None:
    for c in CASES:
        got = report["cases"][c["name"]]
        assert got["rendered_prompt"] == c["prompt"], c["name"]
        assert got["rendered_full"] == c["prompt"] + c["output"] + "<|im_end|>\n", c["name"]


def test_vllm_passes_content_as_parts(report: Dict[str, Any]) -> None:
    """The template loops over message.content, so vLLM hands it text/image parts, not flattened text."""
    assert report["content_format"] == "openai"


def test_reasoning_parser_reads_back_the_reasoning(report: Dict[str, Any]) -> None:
    for c in CASES:
        got, expect = report["cases"][c["name"]], c["expect"]
        assert got["prompt_ends_reasoning"] is (not c["enable_thinking"]), c["name"]
        assert _stripped(got["reasoning"]) == expect["reasoning"], c["name"]
        if not expect["tool_calls"]:
            assert _stripped(got["content"]) == expect["content"], c["name"]


def _as_parsed(calls: List[Dict[str, Any]], vllm: str) -> List[Dict[str, Any]]:
    """The calls a release can give back: whole values, or stripped ones where vLLM strips them."""
    if not STRIPS_VALUES.contains(Version(vllm)):
        return calls
    return [{"name": c["name"], "arguments": {k: v.strip() if isinstance(v, str) else v
                                              for k, v in c["arguments"].items()}} for c in calls]


@pytest.mark.parametrize("parser", TOOL_PARSERS)
def test_tool_parser_reads_back_the_calls(report: Dict[str, Any], parser: str) -> None:
    for c in CASES:
        got, expect = report["cases"][c["name"]]["tools"][parser], c["expect"]
        assert got["calls"] == _as_parsed(expect["tool_calls"], report["vllm"]), (c["name"], parser)
        assert got["called"] is bool(expect["tool_calls"]), (c["name"], parser)
        assert _stripped(got["content"]) == expect["content"], (c["name"], parser)
