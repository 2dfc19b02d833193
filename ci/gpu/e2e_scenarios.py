"""The scenarios of the GPU end-to-end run: which servers each one starts and what it asserts.

Every scenario compares against an unmodified server started in the same call (`Run.baseline`
or its own stock server), on the peaked tiny model whose greedy output is known (e2e_checks).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Callable, Optional

from e2e_checks import (
    Report,
    acceptance,
    chain,
    completion_tokens,
    completion_top,
    follows,
    int8_logprob_bound,
    kv_cache_tokens,
    late_compiles,
    lines_with,
    max_logprob_gap,
    prompts,
    tokens_per_second,
    triton_kernels,
)
from e2e_serve import SERVED_NAME, Server

PROMPTS, PROMPT_LEN, NEW_TOKENS, TOP = 8, 6, 16, 5
SPEED_TOKENS = 256
SPEC_CONFIG = json.dumps({"method": "mtp", "num_speculative_tokens": 2})
MTP_ERROR = "sparkmods mtp-weights: MTP speculative decoding was requested"
TQ_DTYPE = "turboquant_k3v4_nc"
HYBRID_COMPUTE_ENV = "SPARKMODS_HYBRID_FP8_COMPUTE"
HYBRID_SAYS = {"fp8": "use vLLM's FP8 linear method", "bf16": "compute in bf16, dequantised at load"}
LOGPROB_TOLERANCE = 1.0  # quantised paths (FP8 activations, TurboQuant KV): see README
MTP_ACCEPT_MIN, STOCK_ACCEPT_MAX = 0.9, 0.2
UNLOADED = re.compile(r"were not initialized from checkpoint")  # strict loading (0.21.0)
NO_FP8_PARAM = re.compile(r"no module or parameter named '[\w.]+weight_scale_inv'")  # 0.26.0
KV_RATIO_MIN = 2.0
TQ_KERNELS = Path(__file__).resolve().parents[2] / "mods" / "turboquant" / "files" / "tq_triton.py"
TQ_BACKEND = "vllm/v1/attention/backends/sparkmods_turboquant.py"  # installed where the mod runs its kernels
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"}]


def greedy(server: Server, manifest: dict[str, Any]) -> dict[str, Any]:
    """The fixed prompt set, greedy, with top logprobs; plus one long request for tokens/s."""
    batch = prompts(manifest["ordinary"], PROMPTS, PROMPT_LEN)
    answer = server.post("/v1/completions", {
        "model": SERVED_NAME, "prompt": batch, "max_tokens": NEW_TOKENS, "temperature": 0,
        "logprobs": TOP, "ignore_eos": True})
    choices = sorted(answer["choices"], key=lambda c: c["index"])
    start = time.monotonic()
    long = server.post("/v1/completions", {"model": SERVED_NAME, "prompt": batch[0], "max_tokens": SPEED_TOKENS,
                                           "temperature": 0, "ignore_eos": True})
    seconds = time.monotonic() - start
    return {
        "prompts": batch,
        "expected": [chain(manifest["f"], p[-1], NEW_TOKENS) for p in batch],
        "tokens": [completion_tokens(c) for c in choices],
        "top": [completion_top(c) for c in choices],
        "tokens_per_s": tokens_per_second(long["usage"]["completion_tokens"], seconds),
    }


def _compare(report: Report, label: str, out: dict, ref: dict, ref_label: str, tolerance: float | None) -> float:
    same, detail = follows(ref["tokens"], out["tokens"])
    report.check(f"{label} greedy tokens equal {ref_label}", same, detail)
    gap = max(max_logprob_gap(a, b) for a, b in zip(out["top"], ref["top"]))
    if tolerance is not None:
        report.check(f"{label} top-{TOP} logprobs within {tolerance:.3g} of {ref_label}", gap <= tolerance,
                     f"largest difference {gap:.4f}")
    return gap


def _said(report: Report, server: Server, label: str, needle: str, present: bool = True) -> None:
    found = lines_with(server.log_text(), needle)
    detail = found[-1].strip()[-200:] if found else f"no log line with {needle!r}"
    report.check(f"{label} log {'has' if present else 'lacks'} {needle!r}", bool(found) == present, detail)


def baseline_checks(report: Report, run) -> dict[str, Any]:
    base = run.baseline()
    report.check("baseline follows the peaked map", *follows(base["expected"], base["tokens"]))
    return base


def hybrid(run) -> Report:
    report = Report("hybrid-int4-fp8")
    ref_m, hyb_m = run.model("dequant"), run.model("hybrid")
    ref = run.serve("hybrid-reference", "dequant", [], [], lambda s: greedy(s, ref_m), report)
    mod = run.serve("hybrid-mod", "hybrid", ["hybrid-int4-fp8"], [], lambda s: greedy(s, hyb_m), report,
                    expect=["hybrid-int4-fp8"])
    layers = 3 * hyb_m["shape"]["num_layers"]  # gate, up and down of every shared expert
    started = run.servers.get("hybrid-mod")  # absent when the mod's run.sh failed
    said = lines_with(started.log_text(), f"{layers} block-FP8 layers") if started else []
    auto = "bf16" if said and HYBRID_SAYS["bf16"] in said[-1] else "fp8"
    other = "fp8" if auto == "bf16" else "bf16"  # the compute path this GPU's automatic choice skips
    forced = run.serve(f"hybrid-mod-{other}", "hybrid", ["hybrid-int4-fp8"], [], lambda s: greedy(s, hyb_m),
                       report, expect=["hybrid-int4-fp8"], env={HYBRID_COMPUTE_ENV: other})
    stock = run.serve("hybrid-stock", "hybrid", [], [], lambda s: greedy(s, hyb_m), report, must_start=False)
    if ref is None or mod is None:
        return report
    report.check("reference (dequantised bf16) follows the peaked map", *follows(ref["expected"], ref["tokens"]))
    _said(report, run.servers["hybrid-mod"], "mod", f"sparkmods hybrid-int4-fp8: {layers} block-FP8 layers")
    report.data["auto_compute"] = auto
    report.data["logprob_gap"] = _compare(report, f"hybrid + mod ({auto})", mod, ref, "dequantised reference",
                                          LOGPROB_TOLERANCE)
    if forced is not None:
        _said(report, run.servers[f"hybrid-mod-{other}"], f"mod, {HYBRID_COMPUTE_ENV}={other}", HYBRID_SAYS[other])
        report.data[f"logprob_gap_{other}"] = _compare(report, f"hybrid + mod ({other})", forced, ref,
                                                       "dequantised reference", LOGPROB_TOLERANCE)
    if stock is None:
        _stock_refused(report, run, "hybrid-stock", NO_FP8_PARAM, "stock vLLM cannot serve the hybrid checkpoint")
    else:
        same, detail = follows(ref["tokens"], stock["tokens"])
        report.data["stock_matches_reference"] = same
        report.check("stock vLLM on the hybrid checkpoint (FP8 bytes read as bf16) diverges", not same, detail)
    report.data["tokens_per_s"] = {"reference": ref["tokens_per_s"], "hybrid+mod": mod["tokens_per_s"],
                                   f"hybrid+mod {other}": forced and forced["tokens_per_s"],
                                   "hybrid stock": stock and stock["tokens_per_s"]}
    return report


def _spec_run(server: Server, manifest: dict[str, Any]) -> dict[str, Any]:
    out = greedy(server, manifest)
    out["metrics"] = server.get("/metrics")
    return out


def mtp(run) -> Report:
    report = Report("mtp-weights")
    base = baseline_checks(report, run)
    m = run.model("bf16")
    spec = ["--speculative-config", SPEC_CONFIG]
    stock = run.serve("mtp-stock", "bf16", [], spec, lambda s: _spec_run(s, m), report, must_start=False)
    _stock_has_no_drafter(report, run, stock)
    mod = run.serve("mtp-mod", "bf16", ["mtp-weights"], spec, lambda s: _spec_run(s, m), report, expect=["mtp-weights"])
    run.serve("mtp-missing", "bf16-nomtp", ["mtp-weights"], spec, lambda s: None, report, must_start=False)
    missing = run.servers["mtp-missing"]
    report.check("no MTP head + mod: the server refuses to start", missing.start_seconds is None,
                 f"exit code {missing.exit_code}")
    _said(report, missing, "no MTP head", MTP_ERROR)
    rates = {}
    for label, out, server_name in (("stock", stock, "mtp-stock"), ("mod", mod, "mtp-mod")):
        if out is None:
            continue
        counts = run.spec_counts(out["metrics"])
        rate = acceptance(counts.draft_tokens, counts.accepted) if counts else None
        rates[label] = rate
        _compare(report, f"MTP {label}", out, base, "the non-speculative baseline", None)
        if label == "stock":
            _said(report, run.servers[server_name], "stock", "sparkmods mtp-weights", present=False)
        else:
            report.check(f"with the mod the MTP head is loaded: acceptance >= {MTP_ACCEPT_MIN}",
                         rate is not None and rate >= MTP_ACCEPT_MIN, counts.describe() if counts else "no spec metrics")
            _said(report, run.servers[server_name], "mod", "sparkmods mtp-weights: loading")
    report.data["acceptance"] = rates
    report.data["tokens_per_s"] = {"no spec": base["tokens_per_s"], "stock": stock and stock["tokens_per_s"],
                                   "mod": mod and mod["tokens_per_s"]}
    return report


def _stock_refused(report: Report, run, name: str, refusal: "re.Pattern[str]", what: str) -> None:
    """Stock server `name` did not start: that passes only when vLLM's log says `refusal`.

    Releases differ in how stock vLLM fails without a mod: some start and compute the wrong
    thing (the silent case the forum threads describe), newer ones refuse at load time with a
    message that does not name the cause (0.21.0 for the un-indexed MTP head, 0.26.0 for the
    FP8 shared experts). Either way the mod is what makes it work; which one happened is recorded.
    """
    server = run.servers[name]
    lines = server.log_text().splitlines()
    said = next((ln for ln in lines if refusal.search(ln)), None)
    refused = server.start_seconds is None and said is not None
    report.data["stock_outcome"] = "refused to start" if refused else "did not start"
    report.check(f"{what} (refuses to start)", refused, (said or f"exit code {server.exit_code}")[-300:])


def _stock_has_no_drafter(report: Report, run, stock: Optional[dict[str, Any]]) -> None:
    """Stock vLLM never gets a working drafter from the un-indexed head: near-zero acceptance,
    or (0.21.0) the strict-loading refusal."""
    what = "stock vLLM without the mod: no working drafter"
    if stock is None:
        _stock_refused(report, run, "mtp-stock", UNLOADED, what)
        return
    counts = run.spec_counts(stock["metrics"])
    rate = acceptance(counts.draft_tokens, counts.accepted) if counts else None
    report.data["stock_outcome"] = f"started, acceptance {rate}"
    report.check(f"{what} (acceptance near zero)", rate is not None and rate <= STOCK_ACCEPT_MAX,
                 counts.describe() if counts else "no spec metrics")


def int8_head(run) -> Report:
    report = Report("int8-lm-head")
    base = baseline_checks(report, run)
    m = run.model("bf16")
    mod = run.serve("int8-mod", "bf16", ["int8-lm-head"], [], lambda s: greedy(s, m), report, expect=["int8-lm-head"])
    if mod is None:
        return report
    _said(report, run.servers["int8-mod"], "mod", "sparkmods int8-lm-head: active")
    bound = int8_logprob_bound(run.head_absmax("bf16"), m["shape"]["hidden"], 1.1 * run.top_logit())
    gap = _compare(report, "INT8 head", mod, base, "the bf16 head", bound)
    report.check("INT8 head changed the logits (the INT8 path computed them)", gap > 0, f"largest difference {gap:.4f}")
    report.data.update(logprob_gap=gap, bound=bound,
                       tokens_per_s={"bf16 head": base["tokens_per_s"], "int8 head": mod["tokens_per_s"]})
    return report


def chat(server: Server, tools_reply: bool = True) -> dict[str, Any]:
    """The prompt the server renders for CHAT with TOOLS, and its reply (with tools only when the
    server has a tool parser: without --enable-auto-tool-choice vLLM refuses tool_choice auto)."""
    rendered = server.post("/tokenize", {"model": SERVED_NAME, "messages": CHAT, "tools": TOOLS,
                                         "add_generation_prompt": True})
    text = server.post("/detokenize", {"model": SERVED_NAME, "tokens": rendered["tokens"]})["prompt"]
    request = {"model": SERVED_NAME, "messages": CHAT, "temperature": 0, "max_tokens": 32}
    reply = server.post("/v1/chat/completions", {**request, "tools": TOOLS} if tools_reply else request)
    return {"prompt": text, "reply": reply["choices"][0]}


def chat_template(run) -> Report:
    report = Report("chat-template")
    base = run.baseline().get("chat")
    flags = ["--chat-template", str(run.workspace("chat-mod") / "qwen3.5-sparkmods.jinja"), "--reasoning-parser",
             "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]
    mod = run.serve("chat-mod", "bf16", ["chat-template"], flags, chat, report, expect=["chat-template"])
    if base is not None:
        report.check("baseline renders with the stock template (no tools block)", "<tools>" not in base["prompt"],
                     repr(base["prompt"][-60:]))
        raw = base["reply"]["message"].get("content") or ""
        report.check("baseline (no parsers) returns the scripted reply as raw text", "<tool_call>" in raw, repr(raw[:80]))
    if mod is None:
        return report
    prompt, reply = mod["prompt"], mod["reply"]
    report.check("our template rendered the tools", prompt.startswith("<|im_start|>system\n# Tools") and
                 '"name": "get_weather"' in prompt, repr(prompt[:80]))
    report.check("generation prompt opens the thinking block", prompt.endswith("<|im_start|>assistant\n<think>\n"),
                 repr(prompt[-40:]))
    message = reply["message"]
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    report.check("qwen3 reasoning parser read the reasoning", (reasoning or "").strip() ==
                 "The user asks for the weather in Paris.", repr(reasoning))
    calls = message.get("tool_calls") or []
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    report.check("qwen3_coder parser read the tool call", got == [("get_weather", {"city": "Paris"})], repr(got))
    report.check("finish_reason is tool_calls", reply.get("finish_reason") == "tool_calls", repr(reply.get("finish_reason")))
    report.check("no tool-call markup left in content", "<tool_call>" not in (message.get("content") or ""),
                 repr(message.get("content")))
    report.data.update(prompt=prompt, message=message, baseline=base)
    return report


def turboquant(run) -> Report:
    report = Report("turboquant")
    base = baseline_checks(report, run)
    m = run.model("bf16")
    mods = ["turboquant"] if run.has_mod("turboquant") else []
    tq = run.serve("turboquant", "bf16", mods, ["--kv-cache-dtype", TQ_DTYPE], lambda s: greedy(s, m), report,
                   expect=mods)
    if tq is None:
        return report
    _said(report, run.servers["turboquant"], "TurboQuant", "TURBOQUANT")
    if run.installed("turboquant", TQ_BACKEND):  # the mod's own kernels (every variant but 0.20's)
        _said(report, run.servers["turboquant"], "TurboQuant", "TurboQuant attention on sparkmods kernels")
        _said(report, run.servers["turboquant"], "TurboQuant", "sparkmods turboquant: warm-up ran")
        late = late_compiles(run.servers["turboquant"].log_text(), triton_kernels(TQ_KERNELS.read_text()))
        if late is not None:  # the release's JIT monitor watches the requests
            report.check("TurboQuant kernels all compiled while starting", not late,
                         late[0].strip()[-200:] if late else "the JIT monitor named none of them")
    _compare(report, "TurboQuant", tq, base, "the bf16 KV cache", LOGPROB_TOLERANCE)
    ratio_of = [kv_cache_tokens(run.servers[n].log_text()) for n in ("turboquant", "baseline")]
    ratio = ratio_of[0] / ratio_of[1] if all(ratio_of) else None
    report.check(f"KV capacity >= {KV_RATIO_MIN}x bf16", ratio is not None and ratio >= KV_RATIO_MIN,
                 f"{ratio_of[0]} vs {ratio_of[1]} tokens" + (f" ({ratio:.2f}x)" if ratio else ""))
    report.data.update(kv_tokens=dict(zip(("turboquant", "bf16"), ratio_of)), kv_ratio=ratio,
                       tokens_per_s={"bf16 KV": base["tokens_per_s"], TQ_DTYPE: tq["tokens_per_s"]})
    return report


SCENARIOS: dict[str, Callable[[Any], Report]] = {
    "hybrid-int4-fp8": hybrid, "mtp-weights": mtp, "int8-lm-head": int8_head,
    "chat-template": chat_template, "turboquant": turboquant,
}
