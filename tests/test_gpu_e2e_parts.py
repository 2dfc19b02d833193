"""ci/gpu/e2e*.py without a GPU: judging logic, command lines, the server process handling,
and (vllm_runtime) overlays patched by the mods' own run.sh on a real vLLM 0.21.0."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from extras import need
from vllmenv import ray_site

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci" / "gpu"))

import e2e  # noqa: E402
import e2e_checks as checks  # noqa: E402
import e2e_parallel as parallel  # noqa: E402
import e2e_serve as serve  # noqa: E402


def test_chain_and_follows():
    f = [2, 0, 3, 1]
    assert checks.chain(f, 1, 5) == [0, 2, 3, 1, 0]
    assert checks.follows([[1, 2, 3]], [[1, 2, 3]])[0]
    ok, detail = checks.follows([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 9]])
    assert not ok and detail.startswith("prompt 1: token 1")
    assert checks.first_mismatch([1, 2], [1, 2, 3]) == 2
    assert checks.prompts(range(100), 3, 4, seed=5) == checks.prompts(range(100), 3, 4, seed=5)


def test_completion_parsing_and_logprob_gap():
    choice = {"logprobs": {"tokens": ["token_id:7", "token_id:9"],
                           "top_logprobs": [{"token_id:7": -0.01, "token_id:3": -5.0}, {"token_id:9": 0.0}]}}
    assert checks.completion_tokens(choice) == [7, 9]
    top = checks.completion_top(choice)
    assert top == [{7: -0.01, 3: -5.0}, {9: 0.0}]
    other = [{7: -0.02, 3: -4.5, 4: -6.0}, {9: 0.0}]
    assert checks.max_logprob_gap(top, other) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="return-tokens-as-token-ids"):
        checks.completion_tokens({"logprobs": {"tokens": ["hello"]}})


def test_triton_kernels_are_the_launched_jit_functions_of_turboquant():
    found = checks.triton_kernels((REPO / "mods" / "turboquant" / "files" / "tq_triton.py").read_text())
    assert {"_store_kernel", "_rotate_kernel", "_decode_split_kernel", "_decode_merge_kernel", "_dequant_kernel"} <= found
    assert "_split_range" not in found and "rotate" not in found  # helpers and Python wrappers are not launched


def test_turboquant_checks_its_own_kernels_where_its_variant_installs_them(tmp_path):
    """The checks of the mod's kernels (their log line, the warm-up line, no late compile) run where
    run.sh installed the backend file: every variant but 0.20's, which keeps upstream's kernels."""
    import e2e_scenarios as scenarios
    from sparkmods.runtime.manifest import load_manifest

    common = (REPO / "mods" / "turboquant" / "patches" / "common" / "turboquant_files.patch").read_text()
    assert f"+++ b/{scenarios.TQ_BACKEND}\n" in common
    manifest = load_manifest(REPO / "mods" / "turboquant")
    ours = {v.label for v in manifest.variants if "patches/common/turboquant_files.patch" in v.patches}
    assert ours == {v.label for v in manifest.variants} - {"v0.20.0"}
    run = e2e.Run(tmp_path, tmp_path / "out", sys.executable)
    assert not run.installed("turboquant", scenarios.TQ_BACKEND)
    (tmp_path / "out" / "overlays" / "turboquant" / scenarios.TQ_BACKEND).parent.mkdir(parents=True)
    (tmp_path / "out" / "overlays" / "turboquant" / scenarios.TQ_BACKEND).write_text("")
    assert run.installed("turboquant", scenarios.TQ_BACKEND)


def test_late_compiles_reads_the_jit_monitor_of_a_real_served_log():
    log = (REPO / "ci" / "bench" / "results" / "served-35b-a3b-0.26.0-h200" / "servers" / "turboquant"
           / "server.log").read_text()
    late = checks.late_compiles(log, {"_rotate_kernel", "_dequant_kernel", "_store_kernel"})
    assert late is not None and [checks.LATE_COMPILE.search(x).group(1) for x in late] == ["_rotate_kernel", "_dequant_kernel"]
    assert checks.late_compiles(log, {"_store_kernel"}) == []
    before_monitor = "\n".join(line for line in log.splitlines() if checks.JIT_MONITOR_ON not in line)
    assert checks.late_compiles(before_monitor, {"_rotate_kernel"}) is None  # a release without the monitor cannot tell


def test_kv_cache_tokens_reads_the_last_line():
    log = ("(EngineCore pid=1) INFO 11-23 10:00:00 [kv_cache_utils.py:1710] GPU KV cache size: 11,060,224 tokens\n"
           "INFO 11-23 10:05:00 [kv_cache_utils.py:1710] GPU KV cache size: 45,350,912 tokens\n")
    assert checks.kv_cache_tokens(log) == 45_350_912
    assert checks.kv_cache_tokens("nothing") is None


def test_int8_bound_holds_for_the_real_head_and_is_not_vacuous(tmp_path):
    """The bound e2e asserts, against the INT8 error of the peaked model's own head on CPU."""
    torch = need("torch")
    import tiny_qwen35
    from tiny_weights import TOP_LOGIT

    manifest = tiny_qwen35.build(tmp_path / "m", "bf16", "none", peaked=True)
    from safetensors import safe_open

    where = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())["weight_map"]

    def tensor(name: str) -> torch.Tensor:
        with safe_open(str(tmp_path / "m" / where[name]), "pt") as f:
            return f.get_tensor(name).float()

    head, embed = tensor("lm_head.weight"), tensor("model.language_model.embed_tokens.weight")
    x = embed[: manifest["tokenizer_size"]]
    x = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))).to(torch.bfloat16)
    from int8_lm_head_interp import bench_module

    mod = bench_module("benchlib.int8_lm_head_kernel").load_kernel_module(tmp_path)  # the module the patch installs
    int8 = mod.quantize_head(head.to(torch.bfloat16))
    assert int8.rotation is not None  # hidden 512: one rotation block
    quant = torch.log_softmax(mod.int8_matmul(x, int8).float(), -1)  # the torch path: the kernels' arithmetic
    exact = torch.log_softmax(x.float() @ head.T, -1)
    bound = checks.int8_logprob_bound(checks.rotated_absmax(head), manifest["shape"]["hidden"], 1.1 * TOP_LOGIT)
    error = float((exact - quant).abs().max())
    assert 0 < error <= bound < 2.0


def test_server_command_and_environment():
    cmd = serve.server_command("/usr/bin/python3", Path("/m"), 8123, ["--kv-cache-dtype", "fp8"])
    assert cmd[:3] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for flag in ("--enforce-eager", "--language-model-only", "--return-tokens-as-token-ids", "--port 8123",
                 '{"gdn_prefill_backend": "triton"}', "--kv-cache-dtype fp8"):
        assert flag in joined, flag
    env = serve.server_env([Path("/overlay"), Path("/site")], {"PYTHONPATH": "/old", "HOME": "/root"})
    assert env["PYTHONPATH"] == os.pathsep.join(["/overlay", "/site"])
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and env["HF_HUB_OFFLINE"] == "1" and env["HOME"] == "/root"


def test_server_health_wait_and_group_stop(tmp_path):
    """A real child process group: healthy once /health answers, stopped with its children."""
    (tmp_path / "health").write_text("ok")
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""
        import http.server, subprocess, sys, functools
        subprocess.Popen([sys.executable, "-c", "import time; open({str(tmp_path / 'grandchild.pid')!r}, 'w').write(str(__import__('os').getpid())); time.sleep(600)"])
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory={str(tmp_path)!r})
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
    """))
    port = serve.free_port()
    server = serve.Server("t", [sys.executable, str(child), str(port)], dict(os.environ), tmp_path / "log", port)
    server.start()
    try:
        assert server.wait_healthy(deadline_s=30)
        assert server.get("/health") == "ok"
    finally:
        server.stop()
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        import time
        time.sleep(0.1)
    else:
        pytest.fail("the server's child outlived stop()")


def test_server_that_exits_is_reported(tmp_path):
    port = serve.free_port()
    server = serve.Server("t", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], dict(os.environ),
                          tmp_path / "log", port)
    server.start()
    assert not server.wait_healthy(deadline_s=30)
    assert server.exit_code == 3 and "boom" in server.log_text()


def test_results_files_and_exit_lines(tmp_path):
    report = checks.Report("int8-lm-head")
    report.check("tokens equal", True, "8 prompts")
    report.check("bound", False, "largest difference 3.0")
    e2e.write_results(tmp_path, [report], {"vllm": "0.21.0", "device": "H100"})
    doc = json.loads((tmp_path / "int8-lm-head.json").read_text())
    assert doc["vllm"] == "0.21.0" and [c["passed"] for c in doc["checks"]] == [True, False]
    summary = (tmp_path / "summary.md").read_text()
    assert "| int8-lm-head | bound | FAIL | largest difference 3.0 |" in summary
    assert report.failures == ["int8-lm-head: bound: largest difference 3.0"]
    assert "vLLM 0.21.0 on H100\n" in summary  # eager servers, the default, unsaid
    e2e.write_results(tmp_path, [report], {"vllm": "0.26.0", "device": "H200", "parallel": "one GPU",
                                           "servers": "CUDA graphs"})
    assert "vLLM 0.26.0 on H200, one GPU, CUDA graphs\n" in (tmp_path / "summary.md").read_text()
    assert json.loads((tmp_path / "int8-lm-head.json").read_text())["servers"] == "CUDA graphs"


def test_a_run_records_each_applied_variant_and_its_fingerprint():
    """What the served layer of the matrix reads back: the label run.sh picks on the release and
    the fingerprint of that variant's patches; none for a mod the release does not need."""
    from sparkmods.checking.fingerprints import variant_fingerprints

    variants = e2e._variants("0.26.0", ["turboquant", "int8-lm-head", "baseline"])
    assert variants == {"turboquant": "v0.21.0-kernels", "int8-lm-head": "apply-head"}
    prints = e2e._fingerprints({**variants, "mtp-weights": "upstream", "chat-template": None})
    assert prints == {"turboquant": variant_fingerprints(e2e.REPO / "mods" / "turboquant")["v0.21.0-kernels"],
                      "int8-lm-head": variant_fingerprints(e2e.REPO / "mods" / "int8-lm-head")["apply-head"]}


def test_cli_input_errors(tmp_path, capsys):
    assert e2e.main(["--vllm-site", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "holds no vllm/ package" in capsys.readouterr().err
    assert e2e.main(["--vllm-site", str(tmp_path), "--out", str(tmp_path / "o"), "--only", "nope"]) == 2
    assert "unknown scenario nope" in capsys.readouterr().err


def test_parallel_flags_and_their_input_errors(tmp_path, capsys):
    assert parallel.Parallel().flags() == [] and parallel.Parallel().label == "one GPU"
    assert parallel.Parallel(2, "ray").flags() == ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
    assert parallel.Parallel(2).label == "TP 2 (mp)"
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    base = ["--vllm-site", str(site), "--out", str(tmp_path / "o")]
    for extra, said in ((["--tp", "0"], "--tp must be at least 1, not 0"),
                        (["--tp", "2", "--executor", "nccl"], "--executor must be one of mp, ray, not 'nccl'"),
                        (["--tp", "2", "--executor", "ray"], "--executor ray needs Ray"),
                        (["--tp", "2"], f"--tp 2 needs 2 GPUs; {sys.executable} sees 0")):
        assert e2e.main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("e2e.py: ") and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_servers_of_a_split_run_get_the_flags_and_the_ray_address(tmp_path):
    run = e2e.Run(tmp_path, tmp_path / "out", "/usr/bin/python3", parallel.Parallel(2, "ray"),
                  {"RAY_ADDRESS": "127.0.0.1:6390"})
    server = run.server("tq", "bf16", [tmp_path / "overlay", tmp_path], ["--kv-cache-dtype", "fp8"], tmp_path / "log")
    joined = " ".join(server.command)
    assert "--tensor-parallel-size 2 --distributed-executor-backend ray --kv-cache-dtype fp8" in joined
    assert f"--model {tmp_path / 'out' / 'models' / 'bf16'}" in joined and f"--port {server.port}" in joined
    assert server.env["RAY_ADDRESS"] == "127.0.0.1:6390"
    for name, value in serve.NVLS_OFF.items():  # NVLink multicast off in every server
        assert server.env[name] == value
    one = e2e.Run(tmp_path, tmp_path / "out", "/usr/bin/python3").server("b", "bf16", [tmp_path], [], tmp_path / "l")
    assert "--tensor-parallel-size" not in one.command and "--distributed-executor-backend" not in one.command


@pytest.mark.parametrize("mode", [serve.ServeMode(), serve.ServeMode(eager=False), serve.ServeMode(shared=True),
                                  serve.ServeMode(shared=True, eager=False)], ids=str)
def test_the_run_mode_sets_every_servers_graph_and_memory_flags(tmp_path, mode):
    """--cuda-graphs drops --enforce-eager (torch.compile and CUDA graphs, as served); --share-gpu
    swaps the memory share for a fixed KV cache; each alone or both, and nothing else moves."""
    server = e2e.Run(tmp_path, tmp_path / "out", "/usr/bin/python3", mode=mode).server(
        "tq", "bf16", [tmp_path], ["--kv-cache-dtype", "fp8"], tmp_path / "l")
    assert ("--enforce-eager" in server.command) is mode.eager
    memory = server.command[server.command.index("--gpu-memory-utilization") + 1]
    assert memory == ("0.10" if mode.shared else "0.30")
    assert ("--kv-cache-memory-bytes" in server.command) is mode.shared
    plain = serve.server_command("/usr/bin/python3", tmp_path / "out" / "models" / "bf16", server.port,
                                 ["--kv-cache-dtype", "fp8"])
    dropped = {"--enforce-eager"} if not mode.eager else set()
    moved = {"0.30", "0.10", "--kv-cache-memory-bytes", str(2 << 30)} if mode.shared else set()
    assert [w for w in plain if w not in dropped | moved] == [w for w in server.command if w not in moved]


def test_e2e_cuda_graphs_reaches_the_run(tmp_path, monkeypatch):
    """e2e.py --cuda-graphs --share-gpu: the run that starts the servers gets both."""
    seen = []
    monkeypatch.setattr(e2e, "_run_all", lambda run, only: seen.append(run.mode) or 0)
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    assert e2e.main(["--vllm-site", str(tmp_path / "site"), "--out", str(tmp_path / "o"), "--cuda-graphs",
                     "--share-gpu", "--only", "turboquant"]) == 0
    assert seen == [serve.ServeMode(shared=True, eager=False)]


def test_a_ray_head_that_cannot_start_is_one_error(tmp_path):
    head = parallel.RayHead(sys.executable, tmp_path, serve.free_port(), os.environ, tmp_path / "ray-head.log")
    with pytest.raises(RuntimeError, match=r"^Ray head: ray start --head failed \(exit 1\): .*No module named 'ray'$"):
        head.start()
    assert head.env["NCCL_NVLS_ENABLE"] == "0" and head.env["PYTHONPATH"] == str(tmp_path)
    assert not head.group.alive()


@pytest.mark.network
def test_a_real_ray_head_starts_for_the_servers_and_stops(tmp_path):
    """Ray from PyPI (what `carry.py prepare --extra ray` carries), started as the two-node
    script starts its head, on loopback: one alive node, then nothing of it left running, and
    nothing else touched: a process named like a Ray daemon (another user's, or one inside a
    container, which the host sees) outlives the stop, as Ray's host-wide `ray stop` would not let it."""
    site = ray_site()
    (tmp_path / "raylet").symlink_to(shutil.which("sleep"))
    bystander = subprocess.Popen([str(tmp_path / "raylet"), "120"])
    head = parallel.RayHead(sys.executable, site, serve.free_port(), os.environ, tmp_path / "ray-head.log")
    try:
        head.start()
        try:
            assert head.server_env() == {"RAY_ADDRESS": f"127.0.0.1:{head.port}"}
            assert _ray_processes(site), "no gcs_server / raylet from this site after start"
        finally:
            head.stop()
        assert not _ray_processes(site) and not head.group.alive()
        assert bystander.poll() is None, "stopping the head killed a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()


def _ray_processes(site: Path) -> list[str]:
    """Command lines of running Ray daemons started from site."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if args.startswith(str(site)) and ("gcs_server" in args or "raylet" in args):
            found.append(args)
    return found


@pytest.mark.vllm_runtime
@pytest.mark.parametrize("mod", ["hybrid-int4-fp8", "mtp-weights", "int8-lm-head"])
def test_overlay_patched_by_run_sh_leaves_the_site_alone(tmp_path, mod):
    from vllmenv import vllm_env

    env = vllm_env("0.21.0")
    target = {"hybrid-int4-fp8": "vllm/model_executor/layers/quantization/inc.py",
              "mtp-weights": "vllm/model_executor/model_loader/default_loader.py",
              "int8-lm-head": "vllm/model_executor/layers/logits_processor.py"}[mod]
    before = (env.site / target).read_bytes()
    patched = serve.overlay(env.site, tmp_path / "overlay")
    done = serve.apply_mod(REPO / "mods" / mod, patched, tmp_path / "ws", sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "applied variant" in done.stdout
    assert (patched / target).read_bytes() != before
    assert (env.site / target).read_bytes() == before
    probe = env.run(["-c", "import vllm, sys; print(vllm.__file__)"], pythonpath=patched)
    assert probe.stdout.strip().startswith(str(patched)), probe.stderr[-300:]


class _Run:
    """The part of e2e.Run the stock judgements read: the servers by name."""

    def __init__(self, name: str, server: "serve.Server") -> None:
        self.servers = {name: server}


RESULTS = REPO / "ci" / "bench" / "results"


@pytest.mark.parametrize("scenario, log, passed", [
    ("mtp", "gpu-e2e-0.21.0-h200/servers/mtp-stock/server.log", True),
    ("mtp", "gpu-e2e-0.21.0-h200/servers/mtp-missing/server.log", False),
    ("hybrid", "gpu-e2e-0.26.0-h200/servers/hybrid-stock/server.log", True),
    ("hybrid", "gpu-e2e-0.21.0-h200/servers/mtp-stock/server.log", False),
], ids=["mtp-real-0.21-refusal", "mtp-another-failure", "hybrid-real-0.26-refusal", "hybrid-another-failure"])
def test_a_stock_server_that_refused_counts_only_for_vllms_own_refusal(scenario, log, passed):
    """Logs committed from the GPU runs: 0.21.0 refused the un-indexed MTP head, 0.26.0 the FP8
    shared experts. A start failure for another reason (the mod's own refusal, the other
    scenario's error) must not pass."""
    import e2e_scenarios as scenarios

    name = f"{scenario}-stock"
    server = serve.Server(name, [], {}, RESULTS / log, 0, exit_code=1)
    report = checks.Report(scenario)
    if scenario == "mtp":
        scenarios._stock_has_no_drafter(report, _Run(name, server), None)
    else:
        scenarios._stock_refused(report, _Run(name, server), name, scenarios.NO_FP8_PARAM, "stock")
    assert [c["passed"] for c in report.checks] == [passed]
    assert report.data["stock_outcome"] == ("refused to start" if passed else "did not start")


def test_device_names_the_gpus_this_run_may_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in nvidia-smi (none here) listing an H100 and two H200s, or what -i selects: a run
    pinned to GPU 1 names that one; unpinned, each distinct name once."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(textwrap.dedent("""\
        #!/bin/sh
        case "$*" in
          *"-i 1"*) echo "NVIDIA H200" ;;
          *) printf 'NVIDIA H100 80GB HBM3\\nNVIDIA H200\\nNVIDIA H200\\n' ;;
        esac
        """))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert e2e._device() == "NVIDIA H200"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert e2e._device() == "NVIDIA H100 80GB HBM3, NVIDIA H200"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert e2e._device() == "unknown (no nvidia-smi)"


@pytest.mark.parametrize("answer, fields, read", [
    ("1755, 612.54", "clocks.sm,power.draw", [1755.0, 612.54]), ("1980", "clocks.sm", [1980.0]),
    ("[N/A], 612.5", "clocks.sm,power.draw", None), ("1755", "clocks.sm,power.draw", None), ("", "clocks.sm", None)])
def test_smi_numbers_are_the_first_gpus_numeric_fields_or_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               answer: str, fields: str, read: list | None) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{answer}\\n{answer}\\n'\n")  # two GPUs: the first one is read
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert parallel.smi_numbers(fields) == read


class _HybridRun:
    """A stand-in for e2e.Run in the hybrid scenario: each server's log says what the mod's
    `scan` logs for the compute path its environment (or `auto`, this GPU's choice) picks."""

    def __init__(self, tmp: Path, auto: str, forced_says: str | None = None) -> None:
        self.tmp, self.auto, self.forced_says = tmp, auto, forced_says
        self.servers: dict = {}
        self.envs: dict = {}

    def model(self, key: str) -> dict:
        return {"shape": {"num_layers": 4}}

    def serve(self, name, model_key, mods, extra, work, report, expect=(), must_start=True, env=None):
        import e2e_scenarios as scenarios

        self.envs[name] = dict(env or {})
        log = self.tmp / f"{name}.log"
        mode = (env or {}).get(scenarios.HYBRID_COMPUTE_ENV, self.auto)
        says = self.forced_says if env and self.forced_says is not None else scenarios.HYBRID_SAYS[mode]
        line = f"sparkmods hybrid-int4-fp8: 12 block-FP8 layers in /m {says} (weight_block_size [128, 128])"
        if name == "hybrid-stock":
            log.write_text("ValueError: There is no module or parameter named 'm.weight_scale_inv' in x\n")
            self.servers[name] = serve.Server(name, [], {}, log, 0, exit_code=1)
            return None
        log.write_text(line + "\n" if mods else "")
        self.servers[name] = serve.Server(name, [], {}, log, 0)
        return {"expected": [[1, 2]], "tokens": [[1, 2]], "top": [[{"a": -0.1}]], "tokens_per_s": 10.0}


@pytest.mark.parametrize("auto, forced", [("bf16", "fp8"), ("fp8", "bf16")])
def test_hybrid_scenario_serves_the_path_the_gpu_skips(tmp_path: Path, auto: str, forced: str) -> None:
    """Whichever path `auto` takes on the GPU, the other is served too, forced by the setting, and
    each is compared with the dequantised reference."""
    import e2e_scenarios as scenarios

    run = _HybridRun(tmp_path, auto)
    report = scenarios.hybrid(run)
    assert run.envs[f"hybrid-mod-{forced}"] == {scenarios.HYBRID_COMPUTE_ENV: forced}
    assert run.envs["hybrid-mod"] == {} and f"hybrid-mod-{auto}" not in run.envs
    assert report.data["auto_compute"] == auto
    names = [c["name"] for c in report.checks]
    assert f"hybrid + mod ({forced}) greedy tokens equal dequantised reference" in names
    assert all(c["passed"] for c in report.checks), report.checks


def test_hybrid_scenario_fails_a_forced_path_the_log_does_not_confirm(tmp_path: Path) -> None:
    import e2e_scenarios as scenarios

    run = _HybridRun(tmp_path, "bf16", forced_says=scenarios.HYBRID_SAYS["bf16"])  # fp8 asked, bf16 ran
    report = scenarios.hybrid(run)
    failed = [c["name"] for c in report.checks if not c["passed"]]
    assert failed == [f"mod, {scenarios.HYBRID_COMPUTE_ENV}=fp8 log has {scenarios.HYBRID_SAYS['fp8']!r}"]


def test_hybrid_scenario_without_a_patched_server_reports_instead_of_crashing(tmp_path: Path) -> None:
    """run.sh failed for every patched server (none started): the checks say so, no KeyError."""
    import e2e_scenarios as scenarios

    class NoPatch(_HybridRun):
        def serve(self, name, model_key, mods, extra, work, report, expect=(), must_start=True, env=None):
            if mods:
                report.check(f"{name}: run.sh of hybrid-int4-fp8 succeeds", False, "exit 1")
                return None
            return super().serve(name, model_key, mods, extra, work, report, expect, must_start, env)

    report = scenarios.hybrid(NoPatch(tmp_path, "bf16"))
    assert [c["name"] for c in report.checks if not c["passed"]] == [
        "hybrid-mod: run.sh of hybrid-int4-fp8 succeeds", "hybrid-mod-bf16: run.sh of hybrid-int4-fp8 succeeds"]


@pytest.mark.parametrize("setting, capability, mode", [(None, (9, 0), "bf16"), ("fp8", (9, 0), "fp8"),
                                                       (None, (12, 1), "fp8"), ("bf16", (12, 1), "bf16")])
def test_hybrid_scenario_expects_the_words_the_mods_scan_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture, setting, capability,
                                                              mode) -> None:
    """The mod's own `scan` (out of its patch), with vLLM's two helpers it calls standing in: the
    line it logs holds the words the GPU scenario looks for, for the path chosen."""
    import logging
    import types

    import e2e_scenarios as scenarios
    from realmods import load_patched_module

    mod = load_patched_module(REPO / "mods" / "hybrid-int4-fp8" / "patches" / "common" / "sparkmods_hybrid_fp8.patch",
                              tmp_path, "sparkmods_hybrid_fp8_scan")
    header = {"m.weight": {"dtype": "F8_E4M3", "shape": [256, 128]}, "m.weight_scale_inv": {"dtype": "F32", "shape": [2, 1]}}
    config_mod = types.ModuleType("vllm.transformers_utils.config")
    config_mod.get_safetensors_params_metadata = lambda model, revision=None: header  # type: ignore[attr-defined]
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(  # type: ignore[attr-defined]
        get_device_capability=lambda: types.SimpleNamespace(major=capability[0], minor=capability[1]))
    for name, module in (("vllm", types.ModuleType("vllm")), ("vllm.transformers_utils", types.ModuleType("t")),
                         ("vllm.transformers_utils.config", config_mod), ("vllm.platforms", platforms)):
        monkeypatch.setitem(sys.modules, name, module)
    if setting is None:
        monkeypatch.delenv(scenarios.HYBRID_COMPUTE_ENV, raising=False)
    else:
        monkeypatch.setenv(scenarios.HYBRID_COMPUTE_ENV, setting)
    config = types.SimpleNamespace()
    with caplog.at_level(logging.INFO, logger=mod.logger.name):
        mod.scan(config, "/m")
    (line,) = [r.getMessage() for r in caplog.records if r.name == mod.logger.name]
    assert config._sparkmods_hybrid_fp8.compute == mode
    assert line.startswith("sparkmods hybrid-int4-fp8: 1 block-FP8 layers in /m ")
    assert scenarios.HYBRID_SAYS[mode] in line
    assert scenarios.HYBRID_SAYS["bf16" if mode == "fp8" else "fp8"] not in line.split("(")[0]
