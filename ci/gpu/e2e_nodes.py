"""Two Sparks on one two-GPU host: every server is one node per rank, each its own process tree.

Two DGX Sparks are two machines, one GPU each, each running our generated launch script's
container: the mods applied by their run.sh in that container's vLLM, then the nodes joined
with the words of tools/sparkmods/launch/nodewords.py. Here each node is a process tree that
sees one GPU (CUDA_VISIBLE_DEVICES=rank), imports its own hardlink overlay of vLLM (patched by
run.sh for that node), and has its own loopback address (VLLM_HOST_IP, as the script sets it
per container):

- Ray: `ray start --head` for node 0, then `ray start --address` for node 1 joining it, each
  in a process group of its own with that node's environment (Ray's workers, which are vLLM's
  ranks, inherit their node's: overlay, GPU, address, NVLink multicast off); once Ray counts
  both nodes alive, `vllm serve ... --distributed-executor-backend ray` on node 0. A fresh pair
  per server, as every launch starts fresh containers: a node's vLLM is fixed when it starts.
- no Ray: `vllm serve ... --nnodes 2 --node-rank 1 ... --headless` for node 1, then rank 0,
  the one that serves the API.

Node addresses are 127.0.0.2 and 127.0.0.3, not 127.0.0.1: Ray replaces a node address of
127.0.0.1 with the host's own, and vLLM's first Ray executor (the only one in 0.19.1, still
there behind VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 in 0.26.0) refuses two nodes with one
VLLM_HOST_IP and pins the first bundle to `node:<VLLM_HOST_IP>`, which a renamed head lacks.
Stopping a server ends the head's process group, then each node's (Ray's daemons ignore
SIGTERM for a while: SIGKILL after a grace period), never Ray's host-wide `ray stop`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from e2e_parallel import RAY_START_TIMEOUT_S, Parallel, alive_nodes, console
from e2e_serve import START_DEADLINE_S, ServeMode, Server, free_port, server_command, server_env
from procgroup import ProcessGroup
from sparkmods.launch.nodewords import FOLLOWER, NODE_ENV, RANK_FLAGS, RAY_HEAD, RAY_WORKER, fill

NODE_IPS = ("127.0.0.2", "127.0.0.3")


def node_env(rank: int, paths: Sequence[Path], base: Mapping[str, str]) -> dict[str, str]:
    """The environment of node `rank`'s processes: a server's (overlay first on PYTHONPATH,
    NVLink multicast off), one GPU, the node's address as the launch script sets it."""
    env = server_env(paths, base)
    env["CUDA_VISIBLE_DEVICES"] = str(rank)
    env.update(kv.split("=", 1) for kv in fill(NODE_ENV, node=NODE_IPS[rank]))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def serve_argv(python: str, model: Path, port: int, flags: Sequence[str], mode: ServeMode) -> list[str]:
    """`vllm serve MODEL ...` as the launch script runs it (the model positional), through the
    wheel's entry point; the OpenAI server's flags are e2e_serve's."""
    argv = server_command(python, model, port, flags, mode)
    at = argv.index("--model")
    return console(python, ["vllm", "serve", argv[at + 1], *argv[at + 2:]])


@dataclass
class NodeServer(Server):
    """A server over two nodes: `nodes` (ray: both Ray nodes; mp: the headless rank) start
    before the serving process on node 0 and stop after it."""

    executor: str = "mp"
    nodes: list[ProcessGroup] = field(default_factory=list)
    failure: str | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if self.executor == "ray":
                self._form_ray()
            else:
                self.nodes[0].start()
        except RuntimeError as exc:
            self.failure = str(exc)
            with open(self.log_path, "a") as log:
                log.write(f"e2e_nodes: {exc}\n")
            return
        super().start()

    def _form_ray(self) -> None:
        """Head, then worker, each `ray start` run to its end; then until Ray counts both alive."""
        for node in self.nodes:
            node.start_daemons("ray start", RAY_START_TIMEOUT_S)
        deadline = time.monotonic() + RAY_START_TIMEOUT_S
        while (count := alive_nodes(self.command[0], self.env)) != "2":
            if time.monotonic() >= deadline:
                raise RuntimeError(f"Ray shows {count or 'no'} of 2 nodes alive after {RAY_START_TIMEOUT_S:.0f} s")
            time.sleep(2)

    def node_records(self, root: Path) -> list[dict]:
        """What the result files say of each other process group: command, environment that
        makes it a node, log (relative to root)."""
        keys = ("CUDA_VISIBLE_DEVICES", "VLLM_HOST_IP", "PYTHONPATH", "RAY_ADDRESS")
        return [{"name": node.name, "command": node.command, "env": {k: node.env[k] for k in keys if k in node.env},
                 "log": str(node.log_path.relative_to(root))} for node in self.nodes]

    def gone(self) -> int | None:
        if self.failure is not None:
            return -1
        code = super().gone()
        if code is None and self.executor == "mp" and self.nodes[0].ended() is not None:
            code = self.nodes[0].ended()  # the headless rank died: rank 0 would wait for it
        return code

    def wait_healthy(self, deadline_s: float = START_DEADLINE_S) -> bool:
        if self.failure is not None:
            self.exit_code = -1
            return False
        return super().wait_healthy(deadline_s)

    def stop(self) -> None:
        super().stop()
        for node in reversed(self.nodes):
            node.stop()


def node_server(name: str, python: str, model: Path, parallel: Parallel, extra: Sequence[str],
                node_paths: Sequence[Sequence[Path]], base: Mapping[str, str], log_path: Path,
                mode: ServeMode) -> NodeServer:
    """Server `name` over len(node_paths) == 2 nodes (not started): node r imports node_paths[r]."""
    port = free_port()
    flags = [*parallel.flags(), *extra]
    folder = log_path.parent
    envs = [node_env(rank, paths, base) for rank, paths in enumerate(node_paths)]
    if parallel.executor == "ray":
        ray_port = free_port()
        head = NODE_IPS[0]
        for env in envs:
            env["RAY_ADDRESS"] = f"{head}:{ray_port}"
        starts = [fill(RAY_HEAD, head=head, ray_port=ray_port),
                  fill(RAY_WORKER, head=head, ray_port=ray_port, node=NODE_IPS[1])]
        nodes = [ProcessGroup(f"node {rank}", console(python, words), envs[rank], folder / f"ray-node{rank}.log")
                 for rank, words in enumerate(starts)]
        command = serve_argv(python, model, port, flags, mode)
    else:
        master_port = free_port()

        def ranked(rank: int) -> list[str]:
            words = fill(RANK_FLAGS, nnodes=len(node_paths), rank=rank, head=NODE_IPS[0], master_port=master_port)
            return serve_argv(python, model, port, [*flags, *words, *(FOLLOWER if rank else ())], mode)

        nodes = [ProcessGroup("node 1", ranked(1), envs[1], folder / "node1.log")]
        command = ranked(0)
    return NodeServer(name, command, envs[0], log_path, port, executor=parallel.executor, nodes=nodes)
