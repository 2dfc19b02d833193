#!/usr/bin/env python3
"""GPU end-to-end proof: vLLM serves the tiny Qwen3.5-MoE with and without each mod.

    python3 ci/gpu/e2e.py --vllm-site SITE --out OUT [--only hybrid-int4-fp8,mtp-weights,...]
                          [--tp 2 --executor mp|ray [--nodes 2]] [--share-gpu]

SITE is a site-packages folder holding vllm/ (and its requirements, e.g. from
`pip install --target SITE`). For every scenario the run builds the models it needs
(tiny_qwen35.py, peaked), makes a hardlink overlay of SITE per patched server, applies the mods
with their own run.sh, serves with the OpenAI server, sends requests, runs `sparkmods verify`
against the live server (recording the exchange under OUT/fixtures/<server>/), stops the server
and asserts against an unmodified server of the same call. With --tp N every server, the
baseline included, is split over N GPUs (e2e_parallel.py: vLLM's own ranks, or a Ray head on
this host as our two-node script forms it); with --nodes 2 each rank is a node of its own
with one GPU, as on two Sparks (e2e_nodes.py). Writes OUT/<scenario>.json, appends
to OUT/summary.md, prints one line per failed assertion; exit 1 when any failed, 2 on bad input.
See ci/gpu/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tools"))  # sparkmods.verify: metrics and log parsing

from e2e_checks import Report, rotated_absmax, summary_lines  # noqa: E402
from e2e_nodes import NodeServer, node_server  # noqa: E402
from e2e_parallel import Parallel, RayHead, gpus_visible, importable, smi_fields  # noqa: E402
from e2e_scenarios import SCENARIOS, chat, greedy  # noqa: E402
from e2e_serve import ServeError, ServeMode, Server, apply_mod, free_port, overlay, server_command, server_env  # noqa: E402

# Model key -> builder arguments (variant, MTP head); every model is peaked, seed 0.
MODELS = {
    "bf16": ("bf16", "extra"),
    "bf16-nomtp": ("bf16", "none"),
    "hybrid": ("hybrid", "none"),
    "dequant": ("dequant", "none"),
}
VERIFY_TIMEOUT_S = 300


class Run:
    """One call of the script: its folders, the models built so far, the servers started."""

    def __init__(self, site: Path, out: Path, python: str, parallel: Parallel = Parallel(),
                 extra_env: dict[str, str] | None = None, mode: ServeMode = ServeMode()) -> None:
        self.site, self.out, self.python, self.mode = site, out, python, mode
        self.parallel, self.extra_env = parallel, dict(extra_env or {})
        self.servers: dict[str, Server] = {}
        self.manifests: dict[str, dict[str, Any]] = {}
        self.baseline_report = Report("baseline")
        self._baseline: dict[str, Any] | None = None

    def model_dir(self, key: str) -> Path:
        return self.out / "models" / key

    def model(self, key: str) -> dict[str, Any]:
        """The manifest of model `key`, building it first unless an identical build is there."""
        if key not in self.manifests:
            from tiny_qwen35 import MANIFEST, build

            variant, mtp = MODELS[key]
            path = self.model_dir(key)
            found = path / MANIFEST
            manifest = json.loads(found.read_text()) if found.is_file() else {}
            if (manifest.get("variant"), manifest.get("mtp"), manifest.get("peaked")) != (variant, mtp, True):
                path.parent.mkdir(parents=True, exist_ok=True)
                manifest = build(path, variant, mtp, peaked=True)
            self.manifests[key] = manifest
        return self.manifests[key]

    def workspace(self, name: str) -> Path:
        return self.out / "workspace" / name

    def has_mod(self, mod: str) -> bool:
        return (REPO / "mods" / mod / "run.sh").is_file()

    def installed(self, name: str, path: str) -> bool:
        """Whether the mods' run.sh put `path` (relative to site-packages) into server `name`'s overlay."""
        return (self.out / "overlays" / name / path).is_file()

    def serve(self, name: str, model_key: str, mods: Sequence[str], extra: Sequence[str],
              work: Callable[[Server], Any], report: Report, expect: Sequence[str] = (),
              must_start: bool = True, env: Mapping[str, str] | None = None) -> Any:
        """Start server `name` (env: over the run's environment), run `work` on it, capture and
        verify, stop; work's result or None."""
        self.model(model_key)
        folder = self.out / "servers" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        log_path = folder / "server.log"
        node_paths = []
        for node in range(self.parallel.nodes):  # each node patched by run.sh in its own overlay
            paths = self._patched(name, node, mods, log_path, report)
            if paths is None:
                return None
            node_paths.append(paths)
        server = self.server(name, model_key, node_paths[0], extra, log_path, node_paths[1:], env)
        self.servers[name] = server
        server.start()
        try:
            healthy = server.wait_healthy()
            tail = server.log_text().strip().splitlines()[-3:]
            if must_start:
                report.check(f"{name}: server starts", healthy,
                             f"healthy after {server.start_seconds} s" if healthy else f"exit {server.exit_code}: {tail}")
            if not healthy:
                return None
            try:
                result = work(server)
            except (ServeError, KeyError, ValueError, OSError) as exc:
                report.check(f"{name}: requests", False, str(exc)[:300])
                result = None
            self._capture(server, folder)
            self._verify(server, expect, report)
            return result
        finally:
            server.stop()
            report.data.setdefault("servers", {})[name] = {
                "command": server.command, "start_seconds": server.start_seconds, "exit_code": server.exit_code,
                "log": str(log_path.relative_to(self.out)),
                **({"nodes": server.node_records(self.out)} if isinstance(server, NodeServer) else {})}

    def _patched(self, name: str, node: int, mods: Sequence[str], log_path: Path, report: Report) -> list[Path] | None:
        """PYTHONPATH of node `node` of server `name`: SITE, or an overlay of it patched by each mod's
        run.sh first (None when a run.sh failed; the check says so)."""
        if not mods:
            return [self.site]
        suffix = f".node{node}" if node else ""
        patched = overlay(self.site, self.out / "overlays" / (name + suffix))
        with open(log_path, "a") as log:
            for mod in mods:
                done = apply_mod(REPO / "mods" / mod, patched, self.workspace(name + suffix), self.python)
                log.write(done.stdout + done.stderr)
                said = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
                where = f" on node {node}" if node else ""
                if not report.check(f"{name}: run.sh of {mod} succeeds{where}", done.returncode == 0, said[-1]):
                    return None
        return [patched, self.site]

    def server(self, name: str, model_key: str, paths: Sequence[Path], extra: Sequence[str], log_path: Path,
               other_nodes: Sequence[Sequence[Path]] = (), env: Mapping[str, str] | None = None) -> Server:
        """Server `name` (not started) on a free port: model, the run's parallel flags, then extra;
        PYTHONPATH = paths, then env over the run's extra environment (RAY_ADDRESS) over this
        process's. Over several nodes (e2e_nodes.py) node r > 0 imports other_nodes[r - 1]."""
        base = {**os.environ, **self.extra_env, **(env or {})}
        if self.parallel.nodes > 1:
            return node_server(name, self.python, self.model_dir(model_key), self.parallel, extra,
                               [paths, *other_nodes], base, log_path, self.mode)
        port = free_port()
        command = server_command(self.python, self.model_dir(model_key), port, [*self.parallel.flags(), *extra],
                                 self.mode)
        return Server(name, command, server_env(paths, base), log_path, port)

    def _capture(self, server: Server, folder: Path) -> None:
        for path, file in (("/v1/models", "models.json"), ("/metrics", "metrics.txt")):
            try:
                (folder / file).write_text(server.get(path))
            except OSError as exc:
                (folder / file).write_text(f"could not read {path}: {exc}\n")

    def _verify(self, server: Server, expect: Sequence[str], report: Report) -> None:
        """`sparkmods verify` against the live server; its JSON and a recorded fixture are kept."""
        fixture = self.out / "fixtures" / server.name
        shutil.rmtree(fixture, ignore_errors=True)
        cmd = [self.python, "-m", "sparkmods", "verify", "--url", server.url, "--log", str(server.log_path),
               "--json", "--record", str(fixture), "--mods-dir", str(REPO / "mods"), "--timeout", "60"]
        cmd += [a for mod in expect for a in ("--expect", mod)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tools"), str(self.site)])}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=VERIFY_TIMEOUT_S, check=False)
        (self.out / "servers" / server.name / "verify.json").write_text(done.stdout + done.stderr)
        try:
            verdicts = {v["mod"]: v for v in json.loads(done.stdout).get("verdicts", [])}
        except (ValueError, AttributeError):
            verdicts = {}
        report.data.setdefault("verify", {})[server.name] = {"exit": done.returncode, "verdicts": verdicts}
        if expect:
            said = "; ".join(f"{m}: {verdicts.get(m, {}).get('verdict', '?')}" for m in expect)
            report.check(f"{server.name}: sparkmods verify says {', '.join(expect)} in effect", done.returncode == 0,
                         said if verdicts else (done.stderr.strip().splitlines() or ["no output"])[-1])

    def baseline(self) -> dict[str, Any]:
        """The unmodified server on the bf16 model, started once per call."""
        if self._baseline is None:
            manifest = self.model("bf16")
            self._baseline = self.serve(
                "baseline", "bf16", [], [],
                lambda s: {**greedy(s, manifest), "chat": chat(s, tools_reply=False)}, self.baseline_report) or {}
        if not self._baseline:
            raise ServeError("the baseline server did not serve; see servers/baseline/server.log")
        return self._baseline

    def spec_counts(self, metrics_text: str):
        from sparkmods.verify import metrics

        return metrics.facts(metrics.parse(metrics_text)).spec

    def head_absmax(self, key: str) -> float:
        """max |(W R)[n, k]| of the model's LM head W, R the int8-lm-head's rotation: what it quantizes."""
        from safetensors import safe_open

        index = json.loads((self.model_dir(key) / "model.safetensors.index.json").read_text())
        with safe_open(str(self.model_dir(key) / index["weight_map"]["lm_head.weight"]), "pt") as f:
            return rotated_absmax(f.get_tensor("lm_head.weight"))

    def top_logit(self) -> float:
        from tiny_weights import TOP_LOGIT

        return TOP_LOGIT


def _device() -> str:
    """The GPUs this run may use (a run beside another on a two-GPU machine names its own), each
    distinct name once."""
    names = smi_fields("name")
    if names is None:
        return "unknown (no nvidia-smi)"
    return ", ".join(dict.fromkeys(names)) or "unknown"


def _vllm_version(site: Path) -> str:
    found = sorted(site.glob("vllm-*.dist-info"))
    return found[0].name[len("vllm-"):-len(".dist-info")] if found else "unknown"


def _variants(version: str, scenarios: Sequence[str]) -> dict[str, str | None]:
    """What each scenario's mod selects for this vLLM (a variant label, `upstream`, or None):
    the served layer of the matrix (sparkmods/matrix/served.py) reads it."""
    from sparkmods.matrix.served import variant_label
    from sparkmods.runtime.manifest import load_manifest

    return {name: variant_label(load_manifest(REPO / "mods" / name), version)
            for name in scenarios if (REPO / "mods" / name).is_dir()}


def _fingerprints(variants: dict[str, str | None]) -> dict[str, str]:
    """Each applied variant's patches and install sources, as this run carried them: the
    served layer drops the run as evidence once they change."""
    from sparkmods.checking.fingerprints import variant_fingerprints
    from sparkmods.matrix.served import UPSTREAM

    return {name: variant_fingerprints(REPO / "mods" / name)[label]
            for name, label in variants.items() if label not in (None, UPSTREAM)}


def write_results(out: Path, reports: list[Report], header: dict[str, Any]) -> None:
    for report in reports:
        doc = {"scenario": report.scenario, **header, "checks": report.checks, "data": report.data}
        (out / f"{report.scenario}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    graphs = "CUDA graphs" if header.get("servers") == "CUDA graphs" else None  # eager, the default, unsaid
    where = ", ".join(filter(None, [header["device"], header.get("parallel"), graphs]))  # e.g. "..., TP 2 (ray)"
    lines = [f"## {time.strftime('%Y-%m-%d %H:%M:%S')} vLLM {header['vllm']} on {where}", "",
             *summary_lines(reports), ""]
    with open(out / "summary.md", "a") as summary:
        summary.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-site", type=Path, required=True, help="site-packages folder holding vllm/")
    parser.add_argument("--out", type=Path, required=True, help="results folder (created)")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios: " + ", ".join(SCENARIOS))
    parser.add_argument("--python", default=sys.executable, help="interpreter for the servers (default: this one)")
    parser.add_argument("--share-gpu", action="store_true", help="other runs share this GPU: every server gets a "
                        "fixed 2 GiB KV cache instead of a profiled share of the memory")
    parser.add_argument("--cuda-graphs", action="store_true", help="servers without --enforce-eager: torch.compile "
                        "and CUDA graphs, so the mods' kernels run inside captured graphs as served (slower starts)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks of every server (default 1)")
    parser.add_argument("--executor", default="mp", help="with --tp > 1: mp (vLLM's own ranks) or ray (a Ray head "
                                                          "on this host, as the two-node script starts one)")
    parser.add_argument("--nodes", type=int, default=1, help="1, or --tp: every rank a node of its own with one GPU, "
                                                             "as on two Sparks (e2e_nodes.py)")
    args = parser.parse_args(argv)
    try:
        parallel = Parallel(args.tp, args.executor, args.nodes)
    except ValueError as exc:
        print(f"e2e.py: {exc}", file=sys.stderr)
        return 2
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        print(f"e2e.py: unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    site = args.vllm_site.resolve()
    if not (site / "vllm" / "__init__.py").is_file():
        print(f"e2e.py: {site} holds no vllm/ package; pass the site-packages folder vLLM is installed in",
              file=sys.stderr)
        return 2
    problem = _parallel_problem(parallel, site, args.python)
    if problem:
        print(f"e2e.py: {problem}", file=sys.stderr)
        return 2
    sys.path.append(str(site))  # the builder's torch/safetensors/tokenizers, after the machine's own
    mode = ServeMode(shared=args.share_gpu, eager=not args.cuda_graphs)
    args.out.mkdir(parents=True, exist_ok=True)
    if parallel.executor != "ray" or parallel.tp == 1 or parallel.nodes > 1:  # nodes: Ray per server
        return _run_all(Run(site, args.out.resolve(), args.python, parallel, mode=mode), only)
    ray = RayHead(args.python, site, free_port(), os.environ, args.out / "ray-head.log")
    try:
        ray.start()
    except RuntimeError as exc:
        print(f"e2e.py: {exc}", file=sys.stderr)
        return 1
    try:
        return _run_all(Run(site, args.out.resolve(), args.python, parallel, ray.server_env(), mode), only)
    finally:
        ray.stop()


def _parallel_problem(parallel: Parallel, site: Path, python: str) -> str | None:
    """Why this machine cannot run the servers split as asked (None: it can)."""
    if parallel.tp == 1:
        return None
    if parallel.executor == "ray" and not importable(python, site, "ray"):
        return f"--executor ray needs Ray, which {python} does not import with {site}: carry it with " \
               "`carry.py prepare --vllm X --extra ray`"
    gpus = gpus_visible(python)
    if gpus < parallel.tp:
        return f"--tp {parallel.tp} needs {parallel.tp} GPUs; {python} sees {gpus}"
    return None


def _run_all(run: Run, only: list[str]) -> int:
    """Every chosen scenario on this run; results written; the exit code."""
    site = run.site
    reports = []
    for name in only:
        started = time.monotonic()
        try:
            report = SCENARIOS[name](run)
        except ServeError as exc:
            report = Report(name)
            report.check("scenario ran", False, str(exc))
        report.data["seconds"] = round(time.monotonic() - started, 1)
        reports.append(report)
        print(f"e2e.py: {name}: {sum(c['passed'] for c in report.checks)}/{len(report.checks)} checks passed "
              f"in {report.data['seconds']} s", flush=True)
    if run.baseline_report.checks:
        reports.insert(0, run.baseline_report)
    version = _vllm_version(site)
    variants = _variants(version, only)
    write_results(run.out, reports, {"vllm": version, "device": _device(), "parallel": run.parallel.label,
                                     "servers": "eager" if run.mode.eager else "CUDA graphs",
                                     "date": time.strftime("%Y-%m-%d", time.gmtime()),
                                     "variants": variants, "fingerprints": _fingerprints(variants)})
    failures = [line for report in reports for line in report.failures]
    for line in failures:
        print(f"FAIL {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
