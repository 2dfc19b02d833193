"""Everything a running server shows about itself, gathered into one `Evidence`.

Sources, cheapest first: GET /v1/models (the served model, max_model_len), GET /metrics (KV cache
config, speculative decoding counters), POST /tokenize (the chat template as the server renders
it) and the server log. When speculative decoding is on but has drafted too few tokens to judge,
a few short greedy completions are sent (`probe`) and /metrics is read again: acceptance is only
meaningful over traffic, and a freshly started server has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from sparkmods.errors import SparkmodsError
from sparkmods.verify import metrics, template
from sparkmods.verify.client import Exchange, Server
from sparkmods.verify.metrics import MetricsFacts, SpecCounts
from sparkmods.verify.serverlog import LogFacts

# Below this many draft tokens the acceptance rate says nothing yet.
MIN_DRAFT_TOKENS = 200
PROBE_REQUESTS = 4
PROBE_MAX_TOKENS = 64
PROBE_PROMPT = ("The three primary colours of light are red, green and blue. Mixing red and green light "
                "gives yellow, green and blue give cyan, and red and blue give")


@dataclass(frozen=True)
class TemplateCheck:
    """The probe conversation as the server rendered it, against our template's rendering."""

    same: Optional[bool]  # None: could not be compared (detail says why)
    detail: str


@dataclass
class Evidence:
    url: str
    model: str
    max_model_len: Optional[int]
    metrics: Optional[MetricsFacts]
    metrics_problem: Optional[str]
    log: Optional[LogFacts]
    template: TemplateCheck
    probes_sent: int = 0
    probe_problem: Optional[str] = None

    def spec_counts(self) -> Optional[SpecCounts]:
        """Speculative decoding totals: /metrics, else the log's SpecDecoding lines."""
        if self.metrics and self.metrics.spec:
            return self.metrics.spec
        return self.log.spec if self.log else None


def _served_model(server: Server) -> tuple:
    answer = server.get("/v1/models")
    if not answer.ok:
        raise SparkmodsError(f"{server.url}/v1/models answered HTTP {answer.status}: {answer.body[:120]!r}"
                             + ("; pass --api-key" if answer.status == 401 else ""))
    data = answer.json().get("data") if isinstance(answer.json(), dict) else None
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise SparkmodsError(f"{server.url}/v1/models lists no model: {answer.body[:120]!r}")
    return data[0]["id"], data[0].get("max_model_len")


def _read_metrics(server: Server) -> tuple:
    answer = server.get("/metrics")
    if not answer.ok:
        return None, f"GET /metrics answered HTTP {answer.status}"
    return metrics.facts(metrics.parse(answer.body)), None


def _probe(server: Server, model: str, evidence: Evidence) -> None:
    """Send the probe completions; stop at the first failure and note it."""
    payload = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": PROBE_MAX_TOKENS, "temperature": 0}
    for _ in range(PROBE_REQUESTS):
        answer = server.post("/v1/completions", payload)
        if not answer.ok:
            evidence.probe_problem = f"POST /v1/completions answered HTTP {answer.status}: {answer.body[:120]!r}"
            return
        evidence.probes_sent += 1


def _tokens(answer: Exchange) -> List[int]:
    doc = answer.json()
    if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), list):
        raise SparkmodsError(f"POST /tokenize: no token list in the answer: {answer.body[:120]!r}")
    return doc["tokens"]


def _first_difference(a: List[Any], b: List[Any]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_template(server: Server, model: str, template_path: Path) -> TemplateCheck:
    """Ask the server to render PROBE_MESSAGES and to tokenize our rendering; compare the tokens.

    Both token lists come from the server's own tokenizer, so equal lists mean equal prompts
    whatever the tokenizer is (vLLM renders to text, then tokenizes without extra special tokens).
    """
    try:
        ours = template.render(template_path, template.messages_as_rendered(template.PROBE_MESSAGES),
                               add_generation_prompt=True)
    except SparkmodsError as exc:
        return TemplateCheck(None, str(exc))
    served = server.post("/tokenize", {"model": model, "messages": template.PROBE_MESSAGES,
                                       "add_generation_prompt": True, "return_token_strs": True})
    if not served.ok:
        return TemplateCheck(None, f"the server could not render a chat (POST /tokenize answered HTTP "
                                   f"{served.status}: {served.body[:120]!r})")
    expected = server.post("/tokenize", {"model": model, "prompt": ours, "add_special_tokens": False,
                                         "return_token_strs": True})
    if not expected.ok:
        return TemplateCheck(None, f"POST /tokenize of our rendering answered HTTP {expected.status}")
    got, want = _tokens(served), _tokens(expected)
    if got == want:
        return TemplateCheck(True, f"the probe conversation renders to the same {len(got)} tokens as {template_path.name}")
    at = _first_difference(got, want)
    strs = (served.json().get("token_strs") or [], expected.json().get("token_strs") or [])
    return TemplateCheck(False, f"the probe conversation renders differently from {template_path.name} from token {at} "
                                f"on: served {strs[0][at:at + 6]!r}, ours {strs[1][at:at + 6]!r}")


def gather(server: Server, log: Optional[LogFacts], template_path: Path, probe: bool = True) -> Evidence:
    """Read every source; probe traffic only when speculative decoding has too few drafts."""
    model, max_len = _served_model(server)
    facts, problem = _read_metrics(server)
    evidence = Evidence(server.url, model, max_len, facts, problem, log,
                        check_template(server, model, template_path))
    spec = facts.spec if facts else None
    if probe and spec is not None and spec.draft_tokens < MIN_DRAFT_TOKENS:
        _probe(server, model, evidence)
        evidence.metrics, evidence.metrics_problem = _read_metrics(server)
    return evidence
