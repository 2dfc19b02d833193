"""One judge per mod: did it take effect on this server, and what shows it?

Verdicts:
- `in effect`: positive evidence (the mod's own start-up line, the KV cache dtype in /metrics,
  a drafter that accepts tokens, the served template rendering like ours);
- `not in effect`: the mod was requested (run.sh applied it, a serve flag asks for it, or
  `--expect` names it) and the evidence shows it is not working;
- `not requested`: no sign anyone asked for it (or it was switched off on purpose);
- `unknown`: the evidence that would decide is not available; the detail says what to pass.

A mod counts as requested from any of: run.sh's `[mod]` lines in the log, our patched code's
`sparkmods <mod>:` lines, the serve flag the mod serves (`--speculative-config` with an MTP
method, `--kv-cache-dtype turboquant_*`, `--chat-template ...sparkmods.jinja`), or --expect.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Set

from sparkmods.verify.facts import MIN_DRAFT_TOKENS, Evidence
from sparkmods.verify.template import TEMPLATE_FILE

IN_EFFECT, NOT_IN_EFFECT, NOT_REQUESTED, UNKNOWN = "in effect", "not in effect", "not requested", "unknown"
# Below this acceptance rate (after MIN_DRAFT_TOKENS) the drafter guesses: an untrained MTP head
# accepts about 1 in vocabulary-size tokens, a trained Qwen3.5 head most of them.
UNTRAINED_ACCEPTANCE = 0.05
MTP_METHODS = ("mtp", "qwen3_5_mtp", "qwen3_next_mtp")
NEED_LOG = "pass --log FILE or --container NAME (the server log holds the mod's start-up line)"
# run.sh lines (tools/sparkmods/runtime/applier.py) that say the mod is in place.
_RUNSH_IN_PLACE = re.compile(r"^(applied variant|already applied|installed |\S+ already installed|not needed)")


@dataclass(frozen=True)
class Verdict:
    mod: str
    verdict: str
    detail: str

    def to_dict(self) -> Dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Context:
    """The evidence plus what the user said to expect."""

    ev: Evidence
    expected: Set[str]

    def arg(self, key: str) -> Any:
        return (self.ev.log.serve_args or {}).get(key) if self.ev.log else None

    def runsh_failure(self, mod: str) -> Optional[str]:
        lines = self.ev.log.runsh(mod) if self.ev.log else []
        return next((f"run.sh: {line}" for line in lines if line.startswith("ERROR")), None)

    def runsh_applied(self, mod: str) -> bool:
        return self.ev.log is not None and any(_RUNSH_IN_PLACE.match(line) for line in self.ev.log.runsh(mod))

    def said(self, mod: str) -> List[str]:
        return self.ev.log.said(mod) if self.ev.log else []

    def requested(self, mod: str) -> bool:
        return mod in self.expected or self.runsh_applied(mod) or bool(self.said(mod))


def _lines_judge(ctx: Context, mod: str, active: str, why_missing: str) -> Verdict:
    """For mods whose proof is their own start-up line: `sparkmods MOD: ACTIVE...` or `not used: ...`."""
    failure = ctx.runsh_failure(mod)
    if failure:
        return Verdict(mod, NOT_IN_EFFECT, failure)
    if ctx.ev.log is None:
        return Verdict(mod, UNKNOWN, NEED_LOG)
    said = ctx.said(mod)
    good = [line for line in said if re.match(active, line)]
    if good:
        more = f" (and {len(good) - 1} more such lines)" if len(good) > 1 else ""
        return Verdict(mod, IN_EFFECT, good[-1] + more)
    unused = [line for line in said if line.startswith("not used: ")]
    if unused:
        reason = unused[-1][len("not used: "):]
        if reason.startswith("switched off by ") and mod not in ctx.expected:
            return Verdict(mod, NOT_REQUESTED, reason)
        return Verdict(mod, NOT_IN_EFFECT, unused[-1])
    if said:
        return Verdict(mod, NOT_IN_EFFECT, said[-1])
    if ctx.requested(mod):
        return Verdict(mod, NOT_IN_EFFECT, why_missing)
    return Verdict(mod, NOT_REQUESTED, f"no `sparkmods {mod}:` or `[{mod}]` line in the log")


def hybrid(ctx: Context) -> Verdict:
    mod = "hybrid-int4-fp8"
    verdict = _lines_judge(
        ctx, mod, r"\d+ block-FP8 layers in ",
        "no `sparkmods hybrid-int4-fp8: N block-FP8 layers` line although the mod was applied: the server "
        "runs unpatched vLLM (a container from before the mod?) or the checkpoint is not an AutoRound (INC) one")
    if verdict.verdict == NOT_IN_EFFECT and verdict.detail.startswith("no block-FP8 layers in "):
        return Verdict(mod, NOT_IN_EFFECT, verdict.detail + ": serve the hybrid checkpoint "
                       "(sparkmods checkpoint build-hybrid --int4 ... --fp8 ... --out ...)")
    return verdict


def int8_head(ctx: Context) -> Verdict:
    return _lines_judge(
        ctx, "int8-lm-head", r"active \(",
        "no `sparkmods int8-lm-head: active` line although the mod was applied; vLLM logs it when the "
        "head first runs (the start-up profile run): the server runs unpatched vLLM (a container from "
        "before the mod?)")


def _spec_method(ctx: Context) -> Optional[str]:
    config = ctx.arg("speculative_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    return config.get("method") if isinstance(config, dict) else None


def mtp(ctx: Context) -> Verdict:
    mod = "mtp-weights"
    failure = ctx.runsh_failure(mod)
    if failure:
        return Verdict(mod, NOT_IN_EFFECT, failure)
    method = _spec_method(ctx)
    counts = ctx.ev.spec_counts()
    spec_on = method is not None or counts is not None
    if method is not None and method not in MTP_METHODS:
        return Verdict(mod, NOT_REQUESTED, f"speculative method {method!r} drafts without an MTP head")
    if not spec_on:
        if ctx.ev.log is None and ctx.ev.metrics is None:
            return Verdict(mod, UNKNOWN, "no /metrics and no log: " + NEED_LOG)
        if mod in ctx.expected:
            return Verdict(mod, NOT_IN_EFFECT, "the server runs without speculative decoding "
                                               "(--speculative-config '{\"method\":\"mtp\",...}')")
        return Verdict(mod, NOT_REQUESTED, "no speculative decoding on this server")
    # `loading N MTP tensors from FILE ...` (the mod added an unindexed file); `MTP head loaded: ...` is
    # the line proposed for check_mtp_head_loaded when the index already lists the head.
    loaded = [line for line in ctx.said(mod) if line.startswith(("loading ", "MTP head loaded"))]
    head = f"; {loaded[-1]}" if loaded else ""
    if counts is None or counts.draft_tokens < MIN_DRAFT_TOKENS:
        seen = counts.draft_tokens if counts else 0
        traffic = (f"not enough traffic to judge acceptance ({seen} draft tokens, {MIN_DRAFT_TOKENS} needed): "
                   "send a few requests")
        if ctx.ev.probes_sent:
            traffic += f" (verify sent {ctx.ev.probes_sent} itself)"
        if ctx.ev.probe_problem:
            traffic += f" (probe failed: {ctx.ev.probe_problem})"
        if loaded:
            return Verdict(mod, IN_EFFECT, loaded[-1] + "; " + traffic)
        return Verdict(mod, UNKNOWN, traffic)
    rate = counts.acceptance_rate or 0.0
    if rate < UNTRAINED_ACCEPTANCE:
        return Verdict(mod, NOT_IN_EFFECT, f"untrained-drafter symptom: {counts.describe()}; the MTP head was not "
                                           "loaded: apply the mtp-weights mod or run `sparkmods checkpoint add-mtp`"
                                           + head)
    source = head[2:] if loaded else "the checkpoint index lists the MTP head, nothing for the mod to add"
    return Verdict(mod, IN_EFFECT, f"{counts.describe()}; {source}")


def chat_template(ctx: Context) -> Verdict:
    mod = "chat-template"
    failure = ctx.runsh_failure(mod)
    if failure:
        return Verdict(mod, NOT_IN_EFFECT, failure)
    flag = ctx.arg("chat_template")
    ours_flag = isinstance(flag, str) and flag.endswith(TEMPLATE_FILE)
    flag_note = f" (serve flag --chat-template {flag})" if flag else ""
    check = ctx.ev.template
    if check.same:
        return Verdict(mod, IN_EFFECT, check.detail + flag_note)
    requested = ctx.requested(mod) or ours_flag
    if check.same is None:
        return Verdict(mod, UNKNOWN, check.detail + flag_note)
    if requested:
        return Verdict(mod, NOT_IN_EFFECT, check.detail + flag_note)
    return Verdict(mod, NOT_REQUESTED, "the server renders chats with another template" + flag_note)


def turboquant(ctx: Context) -> Verdict:
    mod = "turboquant"
    failure = ctx.runsh_failure(mod)
    if failure:
        return Verdict(mod, NOT_IN_EFFECT, failure)
    flag = ctx.arg("kv_cache_dtype")
    asked = isinstance(flag, str) and flag.startswith("turboquant_")
    # The mod's start-up line (0.18-0.20 variants): `[turboquant] KV cache DTYPE on N of M attention layers ...`.
    active = [line for line in ctx.said(mod) + (ctx.ev.log.runsh(mod) if ctx.ev.log else [])
              if line.startswith("KV cache turboquant_")]
    requested = ctx.requested(mod) or asked or bool(active)
    backends = ctx.ev.log.backends if ctx.ev.log else []
    cache = (ctx.ev.metrics.cache if ctx.ev.metrics else None) or {}
    dtype = cache.get("cache_dtype")
    if dtype is None:
        if active or (asked and "TURBOQUANT" in backends):
            return Verdict(mod, IN_EFFECT, (active[-1] if active else f"--kv-cache-dtype {flag}, attention backend "
                                            "TURBOQUANT") + " (log; /metrics has no vllm:cache_config_info)")
        if not requested and (ctx.ev.metrics or ctx.ev.log):
            return Verdict(mod, NOT_REQUESTED, "no TurboQuant KV cache asked for")
        return Verdict(mod, UNKNOWN, "the KV cache dtype is not known: /metrics has no vllm:cache_config_info"
                       + ("" if ctx.ev.log else "; " + NEED_LOG))
    where = (f"KV cache dtype {dtype}, block size {cache.get('block_size', '?')} (vllm:cache_config_info)"
             + (f", attention backend {backends[-1]}" if backends else ""))
    unused = [line for line in ctx.said(mod) if line.startswith("not used: ")]
    if unused:
        return Verdict(mod, NOT_IN_EFFECT, f"{unused[-1]}; {where}")
    if dtype.startswith("turboquant_"):
        return Verdict(mod, IN_EFFECT, where + (f"; {active[-1]}" if active else ""))
    if requested:
        return Verdict(mod, NOT_IN_EFFECT, where + (f" although --kv-cache-dtype {flag}" if flag else ""))
    return Verdict(mod, NOT_REQUESTED, where)


JUDGES: Dict[str, Callable[[Context], Verdict]] = {
    "hybrid-int4-fp8": hybrid,
    "mtp-weights": mtp,
    "int8-lm-head": int8_head,
    "chat-template": chat_template,
    "turboquant": turboquant,
}


def judge_all(ev: Evidence, expected: Set[str]) -> List[Verdict]:
    ctx = Context(ev, expected)
    return [judge(ctx) for judge in JUDGES.values()]


def exit_code(verdicts: List[Verdict], expected: Set[str]) -> int:
    """1 when a mod is not in effect, or an --expect mod is not proven in effect; else 0."""
    failed = any(v.verdict == NOT_IN_EFFECT or (v.mod in expected and v.verdict != IN_EFFECT) for v in verdicts)
    return 1 if failed else 0
