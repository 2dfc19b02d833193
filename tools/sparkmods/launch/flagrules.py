"""Rules about the serve command and the node layout: known-bad combinations, flags the target
vLLM does not know (read from its own source), and what the launcher would mangle.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Iterator, Optional

from sparkmods.launch.plan import CLUSTER, LaunchPlan
from sparkmods.launch.problem import WARNING, Context, Problem

__all__ = ["RULES", "LAUNCHER_FLAGS"]

# The launcher adds these itself (launch-cluster.sh's usage says not to pass them; ours too).
LAUNCHER_FLAGS = ("--distributed-executor-backend", "--nnodes", "--node-rank", "--master-addr",
                  "--master-port", "--headless")
_HYBRID_QWEN = re.compile(r"qwen3[._-]?(5|next)", re.IGNORECASE)
# Whole name parts only: HF_TOKEN and OPENAI_API_KEY are secrets, TOKENIZERS_PARALLELISM is not.
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|(API|ACCESS|SECRET)_?KEY)(_|$)", re.IGNORECASE)
_SPLIT_UNSAFE = re.compile(r"[\s\"'\\*?\[\]$`]")
# The mod that gives vLLM < 0.21 the turboquant_* KV-cache dtypes on hybrid models (mods/turboquant).
TURBOQUANT_MOD = "turboquant"


def _spec_config(plan: LaunchPlan) -> Optional[dict]:
    raw = plan.serve.get("--speculative-config")
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None  # reported by json_values
    return value if isinstance(value, dict) else None


def _spec_method(plan: LaunchPlan) -> Optional[str]:
    cfg = _spec_config(plan)
    method = cfg.get("method") if cfg else None
    return method if isinstance(method, str) else None


def _is_mtp(method: Optional[str]) -> bool:
    return method is not None and (method == "mtp" or method.endswith("_mtp"))


def _attention_backend(plan: LaunchPlan) -> Optional[str]:
    return plan.serve.get("--attention-backend") or plan.env.get("VLLM_ATTENTION_BACKEND")


def _is_hybrid_qwen(plan: LaunchPlan) -> bool:
    return any(_HYBRID_QWEN.search(name or "") for name in (plan.serve.model, plan.recipe.model, plan.recipe.name))


def placement(ctx: Context) -> Iterator[Problem]:
    recipe = ctx.plan.recipe
    if recipe.cluster_only and ctx.plan.solo:
        yield Problem("placement", f"recipe {recipe.name!r} is cluster_only: launch it with --nodes")
    if recipe.solo_only and not ctx.plan.solo:
        yield Problem("placement", f"recipe {recipe.name!r} is solo_only: launch it with --solo")


def _int_option(plan: LaunchPlan, option: str) -> int:
    """The option's integer value, 1 when absent, 0 when not an integer (reported by the caller)."""
    raw = plan.serve.get(option)
    if raw is None:
        return 1
    try:
        return int(raw)
    except ValueError:
        return 0


def parallelism(ctx: Context) -> Iterator[Problem]:
    plan = ctx.plan
    tp, pp = _int_option(plan, "--tensor-parallel-size"), _int_option(plan, "--pipeline-parallel-size")
    if tp < 1 or pp < 1:
        yield Problem("parallelism", "--tensor-parallel-size and --pipeline-parallel-size must be positive integers")
        return
    gpus = plan.node_count * plan.gpus_per_node
    have = f"{plan.node_count} node(s) x {plan.gpus_per_node} GPU"
    if tp * pp > gpus:
        yield Problem("parallelism", f"TP {tp} x PP {pp} needs {tp * pp} GPUs but {have} give {gpus}: "
                                     f"lower tensor_parallel or add nodes")
    elif tp * pp < gpus and not plan.solo:
        yield Problem("parallelism", f"TP {tp} x PP {pp} uses {tp * pp} of the {gpus} GPUs of {have}: "
                                     f"set tensor_parallel={gpus} (or drop the hard-coded -tp)")


def launcher_flags(ctx: Context) -> Iterator[Problem]:
    for flag in LAUNCHER_FLAGS:
        if ctx.plan.serve.has(flag):
            yield Problem("launcher-flags", f"{flag} is set by the launcher for the node layout: remove it from the command")


def json_values(ctx: Context) -> Iterator[Problem]:
    for name, value in ctx.plan.serve.options():
        if value is not None and value.lstrip()[:1] in ("{", "["):
            try:
                json.loads(value)
            except ValueError as exc:  # a JSONDecodeError, or e.g. an integer too long to read
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                yield Problem("json", f"{name} value {value!r} is not valid JSON ({reason}); in a recipe "
                                      "literal braces are written {{ }}")


def turboquant_flashinfer(ctx: Context) -> Iterator[Problem]:
    dtype = ctx.plan.serve.get("--kv-cache-dtype") or ""
    backend = (_attention_backend(ctx.plan) or "").upper()
    if dtype.startswith("turboquant_") and backend == "FLASHINFER":
        yield Problem("turboquant-flashinfer", f"--kv-cache-dtype {dtype} needs vLLM's TurboQuant attention "
                                               "backend; FLASHINFER does not support TurboQuant caches: drop "
                                               "--attention-backend FLASHINFER")


def mtp_without_ray(ctx: Context) -> Iterator[Problem]:
    method = _spec_method(ctx.plan)
    if _is_mtp(method) and ctx.plan.mode == "no-ray":
        yield Problem("mtp-no-ray", f"speculative method {method!r} across {ctx.plan.node_count} nodes without "
                                    "Ray is reported not to work: use --ray")


def prefix_caching(ctx: Context) -> Iterator[Problem]:
    if not _is_hybrid_qwen(ctx.plan):
        return
    switches = [n for n in ctx.plan.serve.names() if n in ("--enable-prefix-caching", "--no-enable-prefix-caching")]
    if switches and switches[-1] == "--no-enable-prefix-caching":
        return
    how = "--enable-prefix-caching is set" if switches else "vLLM enables it by default"
    yield Problem("prefix-caching", f"prefix caching is unreliable on the hybrid Qwen3.5 architecture and {how}: "
                                    "pass --no-enable-prefix-caching")


def speculative_method(ctx: Context) -> Iterator[Problem]:
    method = _spec_method(ctx.plan)
    if method is None:
        if ctx.plan.serve.get("--speculative-config") is not None and _spec_config(ctx.plan) is not None:
            yield Problem("speculative-method", "--speculative-config has no \"method\"")
        return
    if ctx.facts is None:
        return
    accepted = ctx.facts.speculative_methods()
    if accepted is None:
        yield Problem("speculative-method", f"cannot read the accepted methods from {ctx.where}: "
                                            f"{method!r} not checked", WARNING)
    elif method not in accepted:
        close = difflib.get_close_matches(method, sorted(accepted), n=3)
        hint = f" (close: {', '.join(close)})" if close else ""
        yield Problem("speculative-method", f"{ctx.where} does not accept speculative method {method!r}{hint}")


def _turboquant_mod_applies(ctx: Context) -> bool:
    """The recipe applies the turboquant mod and it is green on the target: it brings the
    turboquant_* dtypes to vLLM 0.18-0.19, lifts 0.20's refusal of hybrid models and lets
    0.25-0.26 start a TurboQuant cache at all."""
    return any(r.mod == TURBOQUANT_MOD and r.green for r in ctx.mod_results)


def kv_cache_dtype(ctx: Context) -> Iterator[Problem]:
    dtype = ctx.plan.serve.get("--kv-cache-dtype")
    if dtype is None or ctx.facts is None:
        return
    known = ctx.facts.cache_dtypes()
    turboquant = dtype.startswith("turboquant_")
    if known is None:
        yield Problem("kv-cache-dtype", f"cannot read the cache dtypes of {ctx.where}: {dtype!r} not checked", WARNING)
    elif turboquant and _turboquant_mod_applies(ctx):
        return
    elif dtype not in known:
        hint = f": add mods/{TURBOQUANT_MOD} to the recipe's mods" if turboquant else ""
        yield Problem("kv-cache-dtype", f"{ctx.where} has no KV-cache dtype {dtype!r}{hint}")
    elif turboquant and _is_hybrid_qwen(ctx.plan) and ctx.facts.refuses_turboquant_on_hybrid():
        yield Problem("kv-cache-dtype", f"{ctx.where} refuses TurboQuant KV caches on hybrid models like Qwen3.5 "
                                        f"(lifted in vLLM 0.21.0): add mods/{TURBOQUANT_MOD} to the recipe's mods "
                                        "or use a newer image")
    elif turboquant and ctx.facts.shapes_turboquant_as_auto():
        yield Problem("kv-cache-dtype", f"{ctx.where} cannot start a {dtype} cache (its model runner shapes "
                                        "TurboQuant layers as 'auto': \"Unknown TurboQuant cache dtype\", fixed "
                                        f"in vLLM 0.27.0): add mods/{TURBOQUANT_MOD} to the recipe's mods or use "
                                        "another image")


def secrets(ctx: Context) -> Iterator[Problem]:
    for key in ctx.plan.env:
        if _SECRET_NAME.search(key):
            yield Problem("secrets", f"env.{key} looks like a secret written into the recipe: remove it and pass "
                                     f"it by name (--pass-env {key})")


def env_values(ctx: Context) -> Iterator[Problem]:
    for key, value in ctx.plan.env.items():
        if "\n" in value or "\r" in value or "\0" in value:
            yield Problem("env", f"env.{key}: a value cannot hold line breaks (docker env files are line-based)")
        elif ctx.plan.form == CLUSTER and (_SPLIT_UNSAFE.search(value) or not value):
            # The standalone script hands env to docker through --env-file: no splitting there.
            yield Problem("env", f"env.{key}={value!r}: launch-cluster.sh passes -e values unquoted, so spaces, "
                                 "quotes and glob characters break; use a plain value or --standalone")


RULES = (placement, parallelism, launcher_flags, json_values, turboquant_flashinfer, mtp_without_ray,
         prefix_caching, speculative_method, kv_cache_dtype, secrets, env_values)
