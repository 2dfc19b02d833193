"""What the standalone launch script runs in each node's container to join the nodes, as word templates.

The script (standalone.py) is rendered from them with its shell variables in the placeholders;
ci/gpu/e2e_nodes.py fills them with loopback addresses, so the two-GPU end-to-end test forms its
nodes with these very words. Placeholders: {head} the head's address, {node} this node's,
{rank} its index, {nnodes} how many, {ray_port} the Ray head's port, {master_port} the no-Ray
ranks' rendezvous port. Standard library only: the GPU machine imports it without the CLI's needs.
"""

from __future__ import annotations

from typing import List, Sequence

__all__ = ["NODE_ENV", "RAY_HEAD", "RAY_WORKER", "RAY_ALIVE_NODES", "RAY_EXECUTOR", "RANK_FLAGS", "FOLLOWER", "fill"]

NODE_ENV = ("VLLM_HOST_IP={node}",)  # vLLM binds its distributed traffic here (Sparks have several interfaces)
RAY_HEAD = ("ray", "start", "--head", "--node-ip-address={head}", "--port={ray_port}", "--disable-usage-stats")
RAY_WORKER = ("ray", "start", "--address={head}:{ray_port}", "--node-ip-address={node}", "--disable-usage-stats")
# Run with `python3 -c` on the head: how many Ray nodes are alive.
RAY_ALIVE_NODES = ('import ray; ray.init(address="auto", logging_level="ERROR"); '
                   'print(sum(1 for n in ray.nodes() if n["Alive"]))')
RAY_EXECUTOR = ("--distributed-executor-backend", "ray")  # appended to the head's serve argv (Ray mode)
RANK_FLAGS = ("--nnodes", "{nnodes}", "--node-rank", "{rank}", "--master-addr", "{head}", "--master-port",
              "{master_port}")  # appended to every node's serve argv (no-Ray mode)
FOLLOWER = ("--headless",)  # appended after RANK_FLAGS on every node but the head


def fill(template: Sequence[str], **values: object) -> List[str]:
    """The words of `template` with its placeholders replaced by values."""
    return [word.format(**values) for word in template]
