"""verify's output: a few lines about the server, one line per mod, a summary; or one JSON document."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Dict, List, TextIO

from sparkmods.verify.facts import Evidence
from sparkmods.verify.judges import Verdict


def _server_lines(ev: Evidence) -> List[str]:
    length = f", max_model_len {ev.max_model_len}" if ev.max_model_len is not None else ""
    lines = [f"server  {ev.url}: model {ev.model}{length}"]
    cache = ev.metrics.cache if ev.metrics else None
    if cache:
        lines.append(f"kv      cache dtype {cache.get('cache_dtype', '?')}, block size {cache.get('block_size', '?')}")
    elif ev.metrics_problem:
        lines.append(f"metrics {ev.metrics_problem}")
    spec = ev.spec_counts()
    if spec is not None:
        probes = f" (after {ev.probes_sent} probe requests)" if ev.probes_sent else ""
        lines.append(f"spec    {spec.describe()}{probes}")
    if ev.log is not None:
        said = sum(len(v) for v in ev.log.mod_lines.values())
        runsh = sum(len(v) for v in ev.log.runsh_lines.values())
        lines.append(f"log     {ev.log.source}: {said} mod lines, {runsh} run.sh lines")
    else:
        lines.append("log     none (pass --log FILE or --container NAME)")
    return lines


def write_text(out: TextIO, ev: Evidence, verdicts: List[Verdict]) -> None:
    for line in _server_lines(ev):
        out.write(line + "\n")
    mod_w = max(len("mod"), *(len(v.mod) for v in verdicts))
    verdict_w = max(len("verdict"), *(len(v.verdict) for v in verdicts))
    out.write(f"{'mod':<{mod_w}}  {'verdict':<{verdict_w}}  evidence\n")
    for v in verdicts:
        out.write(f"{v.mod:<{mod_w}}  {v.verdict:<{verdict_w}}  {v.detail}".rstrip() + "\n")
    counts = Counter(v.verdict for v in verdicts)
    out.write(f"{len(verdicts)} mods: " + ", ".join(f"{n} {name}" for name, n in counts.items()) + "\n")


def document(ev: Evidence, verdicts: List[Verdict], exit_code: int) -> Dict[str, Any]:
    """The --json document; `capture` stores the verdict part as a scenario's expect.json."""
    spec = ev.spec_counts()
    return {
        "server": {"url": ev.url, "model": ev.model, "max_model_len": ev.max_model_len},
        "kv_cache": ev.metrics.cache if ev.metrics else None,
        "metrics_problem": ev.metrics_problem,
        "spec_decode": None if spec is None else {
            "drafts": spec.drafts, "draft_tokens": spec.draft_tokens, "accepted": spec.accepted,
            "accepted_per_pos": list(spec.accepted_per_pos), "acceptance_rate": spec.acceptance_rate,
            "mean_acceptance_length": spec.mean_acceptance_length},
        "probes_sent": ev.probes_sent,
        "probe_problem": ev.probe_problem,
        "log": None if ev.log is None else {"source": ev.log.source, "serve_args": ev.log.serve_args,
                                             "attention_backends": ev.log.backends,
                                             "mod_lines": ev.log.mod_lines, "runsh_lines": ev.log.runsh_lines},
        "chat_template": {"same": ev.template.same, "detail": ev.template.detail},
        "mods": [v.to_dict() for v in verdicts],
        "exit": exit_code,
    }


def write_json(out: TextIO, ev: Evidence, verdicts: List[Verdict], exit_code: int) -> None:
    json.dump(document(ev, verdicts, exit_code), out, indent=2, default=str)
    out.write("\n")
