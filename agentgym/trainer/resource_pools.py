"""The two resource pools of asynchronous training on Ray, and the policy servers on the rollout pool.

The trainer pool is ``trainer.nnodes * trainer.n_gpus_per_node`` bundles, the rollout pool
``rollout.nnodes * rollout.n_gpus_per_node``; each is a Ray placement group, and a bundle reserves
its device (``{"GPU": 1}``, or ``{"CPU": 1}`` on CPU) so the two pools never share one. One node's
bundles are packed together (``STRICT_PACK``) when a pool has one node, spread over nodes
(``PACK``) otherwise. To pin a pool to particular nodes, give those nodes the custom resource
``agentgym_trainer_pool`` / ``agentgym_rollout_pool`` (at least ``n_gpus_per_node`` of it,
``ray start --resources '{"agentgym_rollout_pool": 4}'``): once the cluster has that resource,
every bundle of the pool asks for one unit of it.

The policy servers run inside Ray actors placed on the rollout pool's bundles (``PolicyServerActor``:
the embedded server in the actor's own process, or a vLLM/SGLang child process on that node), one
per ``rollout.num_servers``, each on ``tensor_model_parallel_size`` bundles; they listen on their
node's address. ``RayRolloutServers`` is ``RolloutServers``' counterpart for them: a weight push
sends the state dict through Ray's object store in buckets of at most
``async_training.checkpoint_engine.device_buffer_size_M`` MB (so it reaches servers on other nodes,
one bucket in memory at a time per hop), and each server loads the whole set at once as the new
version (optionally aborting its running generations first: partial rollout).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from agentgym.model.weights import buckets

POOL_RESOURCE = {"trainer": "agentgym_trainer_pool", "rollout": "agentgym_rollout_pool"}


def pool_strategy(nnodes: int, per_node: int, configured: str = "auto") -> str:
    """The placement group strategy: ``configured``, or for ``auto`` one node's bundles packed together
    (``STRICT_PACK``), one bundle per node on that many nodes (``STRICT_SPREAD``), else ``PACK``."""
    if configured != "auto":
        return configured
    if int(nnodes) == 1:
        return "STRICT_PACK"
    return "STRICT_SPREAD" if int(per_node) == 1 else "PACK"


def pool_placement_group(
    kind: str, nnodes: int, per_node: int, gpu: bool, timeout: float = 120.0, strategy: str = "auto"
) -> Any:
    """A placement group of ``nnodes * per_node`` device bundles for pool ``kind`` (see the module docstring)."""
    import ray
    from ray.util.placement_group import placement_group

    bundle: dict[str, float] = {"GPU": 1.0} if gpu else {"CPU": 1.0}
    label = POOL_RESOURCE[kind]
    if ray.cluster_resources().get(label):
        bundle[label] = 1.0
    count = int(nnodes) * int(per_node)
    group = placement_group(
        [dict(bundle) for _ in range(count)],
        strategy=pool_strategy(nnodes, per_node, strategy),
        name=f"agentgym-{kind}-pool-{os.getpid()}",
    )
    try:
        ray.get(group.ready(), timeout=timeout)
    except Exception:
        ray.util.remove_placement_group(group)
        raise RuntimeError(
            f"the {kind} pool ({count} bundles of {bundle}, {pool_strategy(nnodes, per_node, strategy)}) cannot be "
            "placed on this Ray cluster "
            f"(resources: {ray.available_resources()}); lower {kind}.nnodes/n_gpus_per_node, or add nodes"
            + (f" offering {label}" if label in bundle else "")
        ) from None
    return group


def trainer_pool(cfg: Any, world_size: int, num_gpus: float) -> Any:
    """The trainer pool's placement group (rank r in bundle r)."""
    from agentgym.trainer.worker_group import init_ray

    init_ray(cfg)
    trainer = cfg.trainer
    return pool_placement_group(
        "trainer", trainer.nnodes, trainer.n_gpus_per_node, num_gpus > 0, strategy=trainer.placement_strategy
    )


def cluster_offers(resource: str) -> bool:
    import ray

    return bool(ray.cluster_resources().get(resource))


class PolicyServerActor:
    """One policy server in a Ray actor on the rollout pool (see the module docstring)."""

    def __init__(self, backend: str, model: str, kwargs: dict[str, Any]) -> None:
        import ray

        from agentgym.server.launch import start_policy_server

        # every backend listens on its node's address: reachable from a driver on another node
        kwargs = {**kwargs, "host": ray.util.get_node_ip_address()}
        self.handle = start_policy_server(backend, model, port=0, **kwargs)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.received: dict[str, Any] = {}

    def info(self) -> dict[str, Any]:
        return {"url": self.handle.url, "model": self.handle.model, "node_id": self.node_id}

    def weight_version(self) -> int:
        return int(getattr(self.handle, "weight_version", 0))

    def receive(self, bucket: dict[str, Any]) -> int:
        self.received.update(bucket)
        return len(bucket)

    def commit(self, version: int, abort: bool = False) -> int:
        """Load every bucket received since the last commit as ``version`` (all at once)."""
        state, self.received = self.received, {}
        if abort:
            self.pause()
        try:
            return int(self.handle.update_weights(state, version))
        finally:
            if abort:
                self.resume()

    def pause(self) -> None:
        self.handle.pause_generation()

    def resume(self) -> None:
        self.handle.resume_generation()

    def stop(self) -> None:
        self.handle.stop()


class RayRolloutServers:
    """``RolloutServers`` on the rollout pool (see the module docstring)."""

    takes_state_dict = True

    def __init__(self, cfg: Any) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from agentgym.client import PolicyClient
        from agentgym.trainer.worker_group import init_ray

        init_ray(cfg)
        rollout = cfg.actor_rollout_ref.rollout
        self.backend = str(rollout.name)
        self.bucket_mb = cfg.async_training.checkpoint_engine.device_buffer_size_M
        model = str(cfg.actor_rollout_ref.model.path)
        gpu = str(rollout.device or "") == "cuda" or (not rollout.device and _cluster_has_gpus())
        tp = rollout.tensor_model_parallel_size
        self.group = pool_placement_group("rollout", cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node, gpu)
        kwargs: dict[str, Any] = {
            "max_model_len": cfg.data.max_prompt_length + cfg.data.max_response_length,
            "kv_cache_memory_bytes": rollout.kv_cache_memory_bytes,
        }
        if self.backend == "embedded":
            kwargs["max_batch_size"] = max(1, rollout.concurrency)
            if rollout.device:
                kwargs["device"] = str(rollout.device)
        else:
            kwargs.update(gpu_memory_utilization=rollout.gpu_memory_utilization, tensor_parallel_size=tp)
        remote = ray.remote(PolicyServerActor)
        self.actors: list[Any] = []
        try:
            for i in range(rollout.num_servers):
                strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i * tp)
                self.actors.append(
                    remote.options(
                        num_cpus=0 if gpu else 1, num_gpus=tp if gpu else 0, scheduling_strategy=strategy
                    ).remote(self.backend, model, kwargs)
                )
            self.infos = ray.get([a.info.remote() for a in self.actors])
        except BaseException:
            self.stop()
            raise
        self.urls = [i["url"] for i in self.infos]
        self.handles: list[Any] = []  # nothing started in this process
        self.client = PolicyClient(self.urls, backend=self.backend, model=self.infos[0]["model"])
        self.last_buckets = 0

    def in_process_handles(self) -> list[Any]:
        return []

    async def update(self, weights: Any, version: int, abort: bool = False) -> None:
        """Every server loads ``weights`` (a state dict) as ``version``, sent in buckets."""
        import ray

        if not isinstance(weights, dict):
            from agentgym.model.weights import load_weights

            weights = load_weights(weights)
        parts = buckets(weights, self.bucket_mb)
        for part in parts:
            ref = ray.put(part)
            await asyncio.gather(*(actor.receive.remote(ref) for actor in self.actors))
        await asyncio.gather(*(actor.commit.remote(version, abort) for actor in self.actors))
        self.last_buckets = len(parts)
        for server in self.client.servers:
            server.version = version

    async def pause_abort(self) -> None:
        await asyncio.gather(*(actor.pause.remote() for actor in self.actors))

    async def resume(self) -> None:
        await asyncio.gather(*(actor.resume.remote() for actor in self.actors))

    async def aclose(self) -> None:
        await self.client.aclose()

    def stop(self) -> None:
        import ray

        for actor in getattr(self, "actors", []):
            with contextlib.suppress(Exception):
                ray.get(actor.stop.remote(), timeout=30)
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self.actors = []
        group = getattr(self, "group", None)
        if group is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(group)
            self.group = None


def _cluster_has_gpus() -> bool:
    import ray

    return bool(ray.cluster_resources().get("GPU"))
