"""What GET /metrics (Prometheus text format 0.0.4) says about the KV cache and speculative decoding.

Names, as vLLM 0.19.1 through 0.26.0 emit them (vllm/v1/metrics/loggers.py,
vllm/v1/spec_decode/metrics.py; prometheus_client appends `_total` to counters):
- `vllm:cache_config_info`: a gauge fixed at 1 whose labels are the CacheConfig fields as
  strings (`cache_dtype`, `block_size`, ...), one series per engine;
- `vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
  `vllm:spec_decode_num_accepted_tokens_total`, and
  `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`: created only when a
  speculative config is set, one series per engine (summed here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from sparkmods.errors import SparkmodsError

CACHE_INFO = "vllm:cache_config_info"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Dict[str, str]
    value: float


def _unescape(text: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], text)


def _parse_line(line: str, lineno: int) -> Sample:
    name = _NAME.match(line)
    if name is None:
        raise SparkmodsError(f"/metrics line {lineno}: not a Prometheus sample: {line[:80]!r}")
    pos, labels = name.end(), {}
    if line[pos:pos + 1] == "{":
        pos += 1
        if line[pos:pos + 1] == "}":
            pos += 1
        while line[pos - 1] != "}":
            label = _LABEL.match(line, pos)
            if label is None:
                raise SparkmodsError(f"/metrics line {lineno}: bad label set: {line[:80]!r}")
            labels[label.group(1)] = _unescape(label.group(2))
            pos = label.end()
    fields = line[pos:].split()
    try:
        value = float(fields[0])
    except (IndexError, ValueError):
        raise SparkmodsError(f"/metrics line {lineno}: no numeric value: {line[:80]!r}") from None
    return Sample(name.group(0), labels, value)


def parse(text: str) -> List[Sample]:
    """Every sample line; comments and blank lines skipped."""
    return [_parse_line(line, n) for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]


@dataclass(frozen=True)
class SpecCounts:
    """Speculative decoding totals since the server started."""

    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_pos: Tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> Optional[float]:
        """Accepted / drafted tokens; None before any draft."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> Optional[float]:
        """Tokens per verification step, the bonus token included (vLLM's convention)."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    def describe(self) -> str:
        if not self.draft_tokens:
            return "no draft tokens yet"
        text = f"acceptance {self.acceptance_rate:.1%} ({self.accepted} of {self.draft_tokens} draft tokens)"
        if self.drafts:
            text += f", mean acceptance length {self.mean_acceptance_length:.2f}"
        if self.accepted_per_pos and self.drafts:
            text += ", per position " + " ".join(f"{n / self.drafts:.2f}" for n in self.accepted_per_pos)
        return text


@dataclass(frozen=True)
class MetricsFacts:
    cache: Optional[Dict[str, str]]
    spec: Optional[SpecCounts]


def _total(samples: List[Sample], name: str) -> Optional[int]:
    values = [s.value for s in samples if s.name == name]
    return int(sum(values)) if values else None


def facts(samples: List[Sample]) -> MetricsFacts:
    """The cache config of the first engine, and the spec decode totals over all engines."""
    cache = next((s.labels for s in samples if s.name == CACHE_INFO), None)
    drafts = _total(samples, DRAFTS)
    spec = None
    if drafts is not None:
        per_pos: Dict[int, float] = {}
        for s in samples:
            if s.name == ACCEPTED_PER_POS and s.labels.get("position", "").isdigit():
                per_pos[int(s.labels["position"])] = per_pos.get(int(s.labels["position"]), 0) + s.value
        spec = SpecCounts(drafts, _total(samples, DRAFT_TOKENS) or 0, _total(samples, ACCEPTED) or 0,
                          tuple(int(per_pos[p]) for p in sorted(per_pos)))
    return MetricsFacts(cache, spec)
