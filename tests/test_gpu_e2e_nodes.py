"""ci/gpu/e2e_nodes.py without a GPU: two Sparks as two nodes on one host, with Ray and without.

The command lines and environments of both nodes for both executors; that their words are the
ones the generated standalone script runs in its containers (the script itself, run with a
recording docker stand-in); the refusals; a real Ray head and worker from PyPI formed on two
loopback addresses and stopped by their process groups; a headless rank that dies ends the wait.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci" / "gpu"))

import e2e  # noqa: E402
import e2e_nodes as nodes  # noqa: E402
import e2e_parallel as parallel  # noqa: E402
import e2e_serve as serve  # noqa: E402
from extras import need  # noqa: E402
from modfactory import make_site  # noqa: E402
from procgroup import ProcessGroup  # noqa: E402
from sparkmods.launch.nodewords import RANK_FLAGS, RAY_HEAD, RAY_WORKER, fill  # noqa: E402
from sparkmods.launch.plan import STANDALONE, LaunchOptions, build_plan  # noqa: E402
from sparkmods.launch.recipe import load_recipe  # noqa: E402
from sparkmods.launch.standalone import MASTER_PORT, RAY_PORT, render_standalone, serve_argv  # noqa: E402
from vllmenv import ray_site  # noqa: E402

PY = "/usr/bin/python3"
VLLM_SERVE = [PY, "-c", "from vllm.entrypoints.cli.main import main; main()", "serve"]
RAY = [PY, "-c", "from ray.scripts.scripts import main; main()"]


def _server(tmp_path: Path, executor: str) -> nodes.NodeServer:
    run = e2e.Run(tmp_path / "site", tmp_path / "out", PY, parallel.Parallel(2, executor, 2))
    node_paths = [[tmp_path / f"overlay{rank}", tmp_path / "site"] for rank in (0, 1)]
    server = run.server("int8-mod", "bf16", node_paths[0], ["--kv-cache-dtype", "fp8"],
                        tmp_path / "out" / "servers" / "int8-mod" / "server.log", node_paths[1:])
    assert isinstance(server, nodes.NodeServer)
    return server


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _check_node_env(env: dict, tmp_path: Path, rank: int) -> None:
    assert env["CUDA_VISIBLE_DEVICES"] == str(rank) and env["VLLM_HOST_IP"] == nodes.NODE_IPS[rank]
    assert env["PYTHONPATH"] == os.pathsep.join([str(tmp_path / f"overlay{rank}"), str(tmp_path / "site")])
    for name, value in serve.NVLS_OFF.items():  # NVLink multicast off on every node
        assert env[name] == value, (rank, name)
    assert env["VLLM_USE_DEEP_GEMM"] == "0" and env["HF_HUB_OFFLINE"] == "1"


def test_no_ray_nodes_are_two_ranks_of_vllm_serve_the_second_headless(tmp_path):
    server = _server(tmp_path, "mp")
    head, (follower,) = server.command, server.nodes
    model = str(tmp_path / "out" / "models" / "bf16")
    assert head[:5] == VLLM_SERVE + [model] and follower.command[:5] == VLLM_SERVE + [model]
    master_port = int(_option(head, "--master-port"))
    tails = [fill(RANK_FLAGS, nnodes=2, rank=rank, head="127.0.0.2", master_port=master_port) for rank in (0, 1)]
    tails[1].append("--headless")
    for argv, tail in zip((head, follower.command), tails):
        assert argv[-len(tail):] == tail, argv[-12:]
        assert _option(argv, "--tensor-parallel-size") == "2" and _option(argv, "--kv-cache-dtype") == "fp8"
        assert "--distributed-executor-backend" not in argv  # vLLM's default with --nnodes, as the script leaves it
        assert _option(argv, "--port") == str(server.port) and "--model" not in argv
    assert head[:-len(tails[0])] == follower.command[:-len(tails[1])]  # the same serve argv on both nodes
    _check_node_env(server.env, tmp_path, 0)
    _check_node_env(follower.env, tmp_path, 1)
    assert "RAY_ADDRESS" not in server.env and follower.log_path.name == "node1.log"


def test_ray_nodes_are_a_head_and_a_worker_and_vllm_serve_names_the_ray_executor(tmp_path):
    server = _server(tmp_path, "ray")
    head, worker = server.nodes
    ray_port = int(head.command[-2].split("=")[1])
    assert head.command == RAY + fill(RAY_HEAD, head="127.0.0.2", ray_port=ray_port)[1:]  # `ray` is the module call
    assert worker.command == RAY + fill(RAY_WORKER, head="127.0.0.2", ray_port=ray_port, node="127.0.0.3")[1:]
    assert server.command[:4] == VLLM_SERVE
    assert server.command[-4:] == ["--distributed-executor-backend", "ray", "--kv-cache-dtype", "fp8"]
    assert "--nnodes" not in server.command and "--headless" not in server.command
    _check_node_env(head.env, tmp_path, 0)
    _check_node_env(worker.env, tmp_path, 1)  # Ray's workers on node 1 inherit this
    assert server.env == head.env  # vllm serve runs on node 0, as the script runs it in the head container
    assert {head.env["RAY_ADDRESS"], worker.env["RAY_ADDRESS"]} == {f"127.0.0.2:{ray_port}"}


def _plan(tmp_path: Path, ray: bool, node_ips: tuple[str, str]):
    recipe = tmp_path / "two.yaml"
    recipe.write_text(yaml.safe_dump({"recipe_version": "1", "name": "two", "container": "img",
                                      "command": "vllm serve /models/m --tensor-parallel-size 2"}))
    return build_plan(load_recipe(recipe), LaunchOptions(nodes=node_ips, ray=ray, form=STANDALONE), root=tmp_path)


DOCKER = r'''#!/bin/sh
# Records each call's argv (NUL-separated); Ray's alive-node count answers 2.
n=$(cat "$RECORD/n" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" >"$RECORD/n"
printf '%s\0' "$@" >"$RECORD/call-$n"
case "$*" in
    run\ *) cat >/dev/null; echo 0123456789ab ;;
    *python3\ -c*) echo 2 ;;
esac
exit 0
'''


@pytest.mark.parametrize("ray", [True, False], ids=["ray", "no-ray"])
def test_the_nodes_words_are_those_the_generated_two_node_script_runs(tmp_path, ray):
    """The standalone script for two nodes, run against a recording docker: what it execs in the
    containers is the nodewords templates filled with its addresses, as e2e_nodes fills them."""

    ips = ("10.9.0.1", "10.9.0.2")
    plan = _plan(tmp_path, ray, ips)
    script = tmp_path / "launch.sh"
    script.write_text(render_standalone(plan, ["two nodes"]))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    record = tmp_path / "record"
    record.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record),
           "SPARKMODS_DOCKER_NETWORK": "testnet", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    count = int((record / "n").read_text())
    calls = [(record / f"call-{i}").read_bytes().decode().split("\0")[:-1] for i in range(1, count + 1)]
    execs = [c[2:] if c[1] != "-d" else c[3:] for c in calls if c[0] == "exec"]
    runs = [c for c in calls if c[0] == "run"]
    for rank, ip in enumerate(ips):
        assert f"VLLM_HOST_IP={ip}" in runs[rank]  # what node_env sets per node
    argv = serve_argv(plan)
    if ray:
        assert fill(RAY_HEAD, head=ips[0], ray_port=RAY_PORT) in execs
        assert fill(RAY_WORKER, head=ips[0], ray_port=RAY_PORT, node=ips[1]) in execs
        assert argv[-2:] == ["--distributed-executor-backend", "ray"] and argv in execs
    else:
        for rank in (0, 1):
            words = fill(RANK_FLAGS, nnodes=2, rank=rank, head=ips[0], master_port=MASTER_PORT)
            assert [*argv, *words, *(["--headless"] if rank else [])] in execs
        assert "--distributed-executor-backend" not in argv


def test_two_nodes_refusals(tmp_path, capsys):
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    base = ["--vllm-site", str(site), "--out", str(tmp_path / "o")]
    for extra, said in ((["--nodes", "2"], "--nodes must be 1 or --tp (1: one GPU per node), not 2"),
                        (["--tp", "2", "--nodes", "3"], "--nodes must be 1 or --tp (2: one GPU per node), not 3"),
                        (["--tp", "2", "--nodes", "2", "--executor", "ray"], "--executor ray needs Ray"),
                        (["--tp", "2", "--nodes", "2"], f"--tp 2 needs 2 GPUs; {sys.executable} sees 0")):
        assert e2e.main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("e2e.py: ") and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
    assert parallel.Parallel(2, "ray", 2).label == "TP 2, 2 nodes (ray)"
    assert parallel.Parallel(2, "mp", 2).flags() == ["--tensor-parallel-size", "2"]


def test_a_headless_rank_that_dies_ends_the_wait_and_stop_leaves_nothing(tmp_path):
    """Rank 0 would wait for its peer for many minutes: the wait ends when node 1's process does."""
    log = tmp_path / "server.log"
    follower = ProcessGroup("node 1", [sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ),
                           tmp_path / "node1.log")
    server = nodes.NodeServer("s", [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), log,
                              serve.free_port(), executor="mp", nodes=[follower])
    server.start()
    started = time.monotonic()
    try:
        assert server.wait_healthy(deadline_s=30) is False
        assert time.monotonic() - started < 15 and server.gone() == 3
    finally:
        server.stop()
    assert not follower.alive() and server.proc.poll() is not None


def test_a_start_that_does_not_end_is_stopped_with_what_it_started(tmp_path):
    """A `ray start` that hangs: after the timeout the group (the command and its child) is gone."""
    group = ProcessGroup("node 0", [sys.executable, "-c", "import subprocess, time; "
                                    "subprocess.Popen(['sleep', '60']); time.sleep(60)"], dict(os.environ),
                         tmp_path / "node0.log")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^node 0: ray start did not end within 1 s; stopped$"):
        group.start_daemons("ray start", 1.0)
    assert not group.alive() and time.monotonic() - started < 10


def test_ray_that_cannot_start_is_one_line_in_the_log_and_no_server(tmp_path):
    server = nodes.node_server("b", sys.executable, tmp_path / "m", parallel.Parallel(2, "ray", 2), [],
                               [[tmp_path], [tmp_path]], os.environ, tmp_path / "s" / "server.log", serve.ServeMode())
    server.start()
    try:
        assert server.proc is None and server.wait_healthy() is False and server.exit_code == -1
        assert "node 0: ray start failed (exit 1): ModuleNotFoundError: No module named 'ray'" in server.failure
        assert server.log_text() == f"e2e_nodes: {server.failure}\n"
    finally:
        server.stop()


@pytest.mark.network
def test_a_real_ray_head_and_worker_form_two_nodes_on_loopback_and_stop(tmp_path):
    """Ray from PyPI, started with the nodes' words and environments as a Ray server would be:
    two alive nodes at 127.0.0.2 and .3 (a 127.0.0.1 head would be renamed to the host's
    address), each told one GPU; stopping the groups leaves no Ray process of theirs."""
    site = ray_site()
    server = nodes.node_server("b", sys.executable, tmp_path / "m", parallel.Parallel(2, "ray", 2), [],
                               [[site], [site]], os.environ, tmp_path / "s" / "server.log", serve.ServeMode())
    server.log_path.parent.mkdir(parents=True)
    try:
        server._form_ray()
        ask = ("import ray; ray.init(address='auto', logging_level='ERROR'); "
               "print(sorted((n['NodeManagerAddress'], n['Resources'].get('CPU', 0) > 0) for n in ray.nodes() "
               "if n['Alive']))")
        said = subprocess.run([sys.executable, "-c", ask], env=server.env, capture_output=True, text=True,
                              timeout=120).stdout.strip().splitlines()
        assert said[-1] == "[('127.0.0.2', True), ('127.0.0.3', True)]"
        assert all(node.alive() for node in server.nodes)
    finally:
        server.stop()
    assert not any(node.alive() for node in server.nodes)  # no process of either node's group is left


FAKE_E2E = r'''#!/bin/bash
# Stands in for `python3 e2e.py ...`: records when it ran and with which arguments.
shift
out=$(python3 -c 'import sys; a = sys.argv[1:]; print(a[a.index("--out") + 1])' "$@")
printf '%s\n' "$(date +%s.%N)" "$*" > "$out/ran"
sleep 1
date +%s.%N >> "$out/ran"
'''


@pytest.mark.parametrize("serial", [True, False], ids=["serial", "together"])
def test_lease_passes_the_two_node_arguments_and_runs_ray_groups_one_after_another(tmp_path, serial):
    import lease

    fake = tmp_path / "python"
    fake.write_text(FAKE_E2E)
    fake.chmod(0o755)
    root = tmp_path / "lease"
    jobs = lease.start("tp2-ray-0.26.0", tmp_path / "site", ["mtp-weights,int8-lm-head", "hybrid-int4-fp8"], root,
                       str(fake), ["--tp", "2", "--nodes", "2", "--executor", "ray"], serial=serial)
    assert (len({j["pid"] for j in jobs}) == 1) == serial
    assert lease.wait(30, root) == 0
    first, second = [(Path(j["out"]) / "ran").read_text().splitlines() for j in jobs]  # start, argv, end
    assert first[1].endswith("--only mtp-weights,int8-lm-head --share-gpu --tp 2 --nodes 2 --executor ray")
    assert (float(second[0]) >= float(first[2])) == serial
    assert [code for _, code in lease.status(root)] == [0, 0]


STUB_CLI = r'''
"""Stands in for vLLM's CLI: records what each node's process sees; rank 0 answers HTTP."""
import http.server, json, os, sys, time
from pathlib import Path
import vllm

argv = sys.argv[1:]
seen = {"argv": argv, "pid": os.getpid(), "vllm": vllm.__file__,
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "VLLM_HOST_IP", "NCCL_NVLS_ENABLE")}}
mark = Path(vllm.__file__).parent / "patched-by"
seen["patched"] = mark.read_text() if mark.is_file() else None


def main():
    rank = argv[argv.index("--node-rank") + 1]
    Path(os.environ["STUB_RECORD"], f"node{rank}.json").write_text(json.dumps(seen))
    if "--headless" in argv:
        while True:
            time.sleep(1)

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

    http.server.HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Answer).serve_forever()
'''


def test_a_two_node_server_serves_from_two_process_trees_each_with_its_own_patched_overlay(tmp_path, monkeypatch):
    """Run.serve over two nodes with a stand-in vLLM: one overlay per node, each patched by the
    mod step for that node alone; each node's process sees its GPU, address and overlay; after
    the work both process trees are gone."""
    import json

    need("torch")  # e2e reads the model manifest through tiny_qwen35, which imports torch

    site = make_site(tmp_path / "site", files={"vllm/entrypoints/__init__.py": "", "vllm/entrypoints/cli/__init__.py": "",
                                               "vllm/entrypoints/cli/main.py": STUB_CLI})
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv("STUB_RECORD", str(record))

    def apply_mod(mod_dir, patched, workspace, python):  # the mod's run.sh: writes into this overlay only
        (patched / "vllm" / "patched-by").write_text(f"{mod_dir.name} in {patched.name}")
        return subprocess.CompletedProcess([], 0, "applied\n", "")

    monkeypatch.setattr(e2e, "apply_mod", apply_mod)
    run = e2e.Run(site, tmp_path / "out", sys.executable, parallel.Parallel(2, "mp", 2))
    manifest = run.model_dir("bf16") / "tiny_qwen35.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"variant": "bf16", "mtp": "extra", "peaked": True}))
    report = e2e.Report("int8-lm-head")
    answer = run.serve("int8-mod", "bf16", ["int8-lm-head"], [], lambda s: s.get("/health"), report)
    assert answer == "{}" and report.checks[:2] == [
        {"name": "int8-mod: run.sh of int8-lm-head succeeds", "passed": True, "detail": "applied"},
        {"name": "int8-mod: run.sh of int8-lm-head succeeds on node 1", "passed": True, "detail": "applied"}]
    assert any(c["name"] == "int8-mod: server starts" and c["passed"] for c in report.checks)
    seen = [json.loads((record / f"node{rank}.json").read_text()) for rank in (0, 1)]
    for rank, overlay in enumerate(("int8-mod", "int8-mod.node1")):
        assert seen[rank]["vllm"].startswith(str(run.out / "overlays" / overlay / "vllm"))
        assert seen[rank]["patched"] == f"int8-lm-head in {overlay}"
        assert seen[rank]["env"] == {"CUDA_VISIBLE_DEVICES": str(rank), "VLLM_HOST_IP": nodes.NODE_IPS[rank],
                                     "NCCL_NVLS_ENABLE": "0"}
        assert not Path(f"/proc/{seen[rank]['pid']}").exists(), f"node {rank} still runs"
    assert not (site / "vllm" / "patched-by").exists()  # the site itself untouched
    (node1,) = report.data["servers"]["int8-mod"]["nodes"]
    assert node1["command"][-1] == "--headless" and node1["log"] == "servers/int8-mod/node1.log"
    assert node1["env"]["CUDA_VISIBLE_DEVICES"] == "1" and node1["env"]["PYTHONPATH"].startswith(
        str(run.out / "overlays" / "int8-mod.node1"))
    assert ("--headless" in seen[1]["argv"]) and ("--headless" not in seen[0]["argv"])


RUNBOOK = REPO / "ci" / "gpu" / "tp2_lease.sh"


def _runbook(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(RUNBOOK), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, said", [
    ((), "usage: tp2_lease.sh prepare | receive | start [both|mp|ray] | wait [SECONDS] | pack | unpack FOLDER"),
    (("start", "nccl"), "start takes both, mp or ray, not 'nccl'"),
    (("unpack",), "unpack needs the folder the device call's files came back in"),
    (("pack",), "pack writes to $OUT, which the device call sets"),
])
def test_the_runbook_refuses_in_one_line(args, said):
    done = _runbook(*args, env={"OUT": ""})
    assert done.returncode == 2 and done.stderr == f"tp2_lease: {said}\n" and not done.stdout


def test_the_runbook_refuses_a_machine_without_two_gpus_before_receiving(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    done = _runbook("receive", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 2 and "shows 1 GPU(s) in nvidia-smi -L; the two-node runs need 2" in done.stderr
    assert "received" not in done.stdout


def test_the_runbook_unpacks_each_executor_into_its_results_folder_and_shows_the_mtp_evidence(tmp_path):
    """What pack returns (lease.py's archives and the device name) lands in
    gpu-e2e-tp2-<executor>-<vLLM>-<gpu>/<group>/, and the checks that decide mtp-no-ray are shown."""
    import json

    import lease

    root = tmp_path / "lease"
    checks = [{"name": "mtp-mod: server starts", "passed": True, "detail": "healthy after 70 s"},
              {"name": "with the mod the MTP head is loaded: acceptance >= 0.9", "passed": True, "detail": "0.95"},
              {"name": "MTP mod greedy tokens equal the non-speculative baseline", "passed": False, "detail": "p1"},
              {"name": "baseline follows the peaked map", "passed": True, "detail": "ok"}]
    jobs = []
    for executor in ("mp", "ray"):
        group = root / f"tp2-{executor}-0.26.0" / "mtp-weights"
        (group / "models").mkdir(parents=True)
        (group / "mtp-weights.json").write_text(json.dumps({"scenario": "mtp-weights", "checks": checks}))
        (group / "summary.md").write_text("| mtp-weights | MTP mod greedy tokens | FAIL | p1 |\n")
        jobs.append({"release": f"tp2-{executor}-0.26.0", "group": "mtp-weights", "out": str(group), "pid": 0})
    (root / "jobs.json").write_text(json.dumps(jobs))
    out = tmp_path / "OUT"
    lease.pack(out, root)
    (out / "device.txt").write_text("NVIDIA H100 80GB HBM3\n")
    results = tmp_path / "results"
    done = _runbook("unpack", str(out), env={"TP2_RESULTS": str(results)})
    assert done.returncode == 0, done.stderr
    for executor in ("mp", "ray"):
        folder = results / f"gpu-e2e-tp2-{executor}-0.26.0-h100" / "mtp-weights"
        assert (folder / "mtp-weights.json").is_file() and not (folder / "models").exists()
    lines = done.stdout.splitlines()
    at = lines.index(f"mtp-no-ray evidence ({results}/gpu-e2e-tp2-mp-0.26.0-h100/mtp-weights/mtp-weights.json):")
    assert lines[at + 1:] == ["  PASS mtp-mod: server starts: healthy after 70 s",
                              "  PASS with the mod the MTP head is loaded: acceptance >= 0.9: 0.95",
                              "  FAIL MTP mod greedy tokens equal the non-speculative baseline: p1"]
    assert "| mtp-weights | MTP mod greedy tokens | FAIL | p1 |" in lines
