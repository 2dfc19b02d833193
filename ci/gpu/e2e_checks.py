"""The judging half of the GPU end-to-end run: pure functions over what the servers returned.

Nothing here starts a process or needs a GPU, so tests/test_gpu_e2e_parts.py runs all of it on
recorded inputs. The peaked model (tiny_weights.py) makes greedy decoding follow a permutation
f, so the expected tokens are known without any server: after prompt tokens p, greedy output is
f(p[-1]), f(f(p[-1])), ...
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

TOKEN_ID = re.compile(r"^token_id:(\d+)$")
KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


@dataclass
class Report:
    """One scenario's assertions (name, passed, detail) and the figures it recorded."""

    scenario: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, passed: bool, detail: str) -> bool:
        self.checks.append({"name": name, "passed": bool(passed), "detail": detail})
        return bool(passed)

    @property
    def failures(self) -> list[str]:
        return [f"{self.scenario}: {c['name']}: {c['detail']}" for c in self.checks if not c["passed"]]


def chain(f: Sequence[int], start: int, n: int) -> list[int]:
    """The n tokens greedy decoding of the peaked model produces after token `start`."""
    out, token = [], start
    for _ in range(n):
        token = f[token]
        out.append(token)
    return out


def prompts(ordinary: Sequence[int], count: int, length: int, seed: int = 0) -> list[list[int]]:
    """count prompts of `length` ordinary token ids, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.sample(list(ordinary), length) for _ in range(count)]


def completion_tokens(choice: Mapping[str, Any]) -> list[int]:
    """Token ids of a completion choice served with --return-tokens-as-token-ids and logprobs."""
    ids = []
    for token in choice["logprobs"]["tokens"]:
        match = TOKEN_ID.match(token)
        if match is None:
            raise ValueError(f"logprob token {token!r} is not token_id:N (serve with --return-tokens-as-token-ids)")
        ids.append(int(match.group(1)))
    return ids


def completion_top(choice: Mapping[str, Any]) -> list[dict[int, float]]:
    """Per generated position, {token id: logprob} of the top candidates."""
    return [{int(TOKEN_ID.match(k).group(1)): v for k, v in (pos or {}).items()}
            for pos in choice["logprobs"]["top_logprobs"]]


def max_logprob_gap(a: Sequence[Mapping[int, float]], b: Sequence[Mapping[int, float]]) -> float:
    """Largest |logprob difference| over the tokens both top lists hold, position by position."""
    gaps = [abs(x[t] - y[t]) for x, y in zip(a, b) for t in x.keys() & y.keys()]
    return max(gaps) if gaps else math.inf


def first_mismatch(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """Index of the first differing token (or of the shorter end), None when equal."""
    for i, (x, y) in enumerate(zip(expected, got)):
        if x != y:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


def follows(expected: Sequence[Sequence[int]], got: Sequence[Sequence[int]]) -> tuple[bool, str]:
    """Whether every sequence equals its expected one; the detail names the first difference."""
    for n, (want, have) in enumerate(zip(expected, got)):
        at = first_mismatch(want, have)
        if at is not None:
            return False, f"prompt {n}: token {at} is {list(have[at:at + 3])}, expected {list(want[at:at + 3])}"
    if len(expected) != len(got):
        return False, f"{len(got)} outputs for {len(expected)} prompts"
    return True, f"{len(got)} prompts x {len(got[0]) if got else 0} tokens equal"


def kv_cache_tokens(log_text: str) -> int | None:
    """vLLM's `GPU KV cache size: N tokens` (the last one in the log)."""
    found = KV_TOKENS.findall(log_text)
    return int(found[-1].replace(",", "")) if found else None


def rotated_absmax(weight: Any) -> float:
    """max |(W R)[n, k]| for a head weight W, R the rotation of the int8-lm-head module its patch installs."""
    import sys
    import tempfile
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from benchlib.int8_lm_head_kernel import load_kernel_module

    with tempfile.TemporaryDirectory() as tmp:
        mod = load_kernel_module(Path(tmp))
    rotation = mod.make_rotation(weight.shape[1], weight.dtype, weight.device)
    rotated = weight.float() if rotation is None else rotation.apply_fp32(weight)
    return float(rotated.abs().max())


def int8_logprob_bound(head_absmax: float, hidden: int, top_logit: float) -> float:
    """Largest logprob change an INT8 per-row head may cause for a normalised hidden state.

    The head multiplies x R (rounded to bf16) by W R quantized per row, R its orthogonal
    rotation; head_absmax is max |(W R)[n, k]|. Per logit: |W_n . x - s_n q_n . (x R)| <=
    max|W R| * ||x R||_1 / 254 (the weight's rounding) + 2^-8 ||x R||_1 max|W R| (x R's rounding),
    and ||x R||_1 <= hidden for a hidden state of RMS 1 (the final RMSNorm's output, weight 1;
    R keeps the norm); bf16 rounding of both logit vectors adds 2^-8 of the largest logit each.
    A logprob moves by at most twice the largest logit change (its own plus the log-sum-exp's).
    """
    per_logit = head_absmax * hidden * (1 / 254 + 2.0 ** -8) + 2 * 2.0 ** -8 * top_logit
    return 2 * per_logit


def acceptance(draft_tokens: int, accepted: int) -> float | None:
    return accepted / draft_tokens if draft_tokens else None


def tokens_per_second(tokens: int, seconds: float) -> float | None:
    return round(tokens / seconds, 1) if seconds > 0 else None


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


JIT_MONITOR_ON = "Kernel JIT monitor activated"  # vLLM 0.26+, once the start-up warm-up is over
LATE_COMPILE = re.compile(r"Triton kernel JIT compilation during inference: (\w+)")


def triton_kernels(source: str) -> set[str]:
    """Names of the @triton.jit functions of a module's source that are launched (``*_kernel``)."""
    return set(re.findall(r"^@triton\.jit[^\n]*\ndef (\w+_kernel)\(", source, re.M))


def late_compiles(log_text: str, kernels: set[str]) -> list[str] | None:
    """The JIT monitor's lines that name one of kernels (compiled while serving), or None when
    the log has no JIT monitor (before vLLM 0.26) and so cannot tell."""
    if JIT_MONITOR_ON not in log_text:
        return None
    return [line for line in log_text.splitlines()
            if (found := LATE_COMPILE.search(line)) and found.group(1) in kernels]


def summary_lines(reports: Iterable[Report]) -> list[str]:
    """Markdown: one table row per check, for out/summary.md."""
    rows = ["| scenario | check | result | detail |", "|---|---|---|---|"]
    for report in reports:
        for c in report.checks:
            detail = c["detail"].replace("|", "\\|").replace("\n", " ")
            rows.append(f"| {report.scenario} | {c['name']} | {'pass' if c['passed'] else 'FAIL'} | {detail} |")
    return rows
