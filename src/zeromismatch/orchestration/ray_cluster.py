"""The Ray cluster of an rl.backend=ray run: a local one on this machine, or an existing one (ray.address).

    started = connect(cfg.ray)               # True when this call started a local cluster (then shutdown() it)
    opts = actor_options(cfg.ray.generator_resources, max_restarts=3, max_concurrency=4)

A local cluster binds 127.0.0.1 only, has no dashboard and sends no usage statistics; it advertises
ray.num_cpus / ray.num_gpus (what actors reserve, not a thread limit: every actor runs one intra-op thread)
and an object store of ray.object_store_mb. Attaching (ray.address=host:port or auto) uses the cluster as it
is: the nodes must have this package installed (docs/distributed.md).
"""

from __future__ import annotations

import logging
import os

import ray
from ray._private import ray_constants

__all__ = ["actor_options", "connect", "shutdown"]


def connect(rcfg) -> bool:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # read by the processes ray.init starts
    if ray.is_initialized():
        return False
    common = dict(logging_level=logging.WARNING, log_to_driver=True, configure_logging=True)
    if rcfg.address:
        ray.init(address=str(rcfg.address), **common)
        return False
    # Ray turns 127.0.0.1 into the machine's outward address, and its servers then listen on every interface,
    # unless multi-node support is off; a local cluster has one node, so it stays on the loopback (the flag
    # is read by this process now and by the processes ray.init starts from the environment)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(
        address="local",
        num_cpus=int(rcfg.num_cpus),
        num_gpus=int(rcfg.num_gpus),
        object_store_memory=int(rcfg.object_store_mb) * 1024 * 1024,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        **common,
    )
    return True


def shutdown(started: bool) -> None:
    if started and ray.is_initialized():
        ray.shutdown()


def actor_options(resources, *, max_restarts: int = 0, max_concurrency: int = 1) -> dict:
    """Options for ``ActorClass.options(...)``: the role's num_cpus / num_gpus (fractional GPUs let two roles
    share one device), restarts after a crash, and concurrent method threads."""
    return {
        "num_cpus": float(resources.num_cpus),
        "num_gpus": float(resources.num_gpus),
        "max_restarts": int(max_restarts),
        "max_concurrency": int(max_concurrency),
    }
