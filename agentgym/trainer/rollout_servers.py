"""The rollout's policy servers, as the trainer holds them: started here or given by URL.

``RolloutServers`` starts the policy servers the rollout samples from (``rollout.name``:
embedded | vllm | sglang; ``rollout.num_servers`` of them), or talks to running ones
(``rollout.server_urls``), and holds the ``PolicyClient`` over all of them. ``update`` makes every
server load new weights; ``agentgym.trainer.weight_sync`` decides how they travel.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class RolloutServers:
    """Policy servers for the rollout: ``handles`` we started, ``urls`` of all, one ``client``."""

    def __init__(self, cfg: Any) -> None:
        from agentgym.client import PolicyClient
        from agentgym.server.limits import admin_key_from_env, new_admin_key

        rollout = cfg.actor_rollout_ref.rollout
        self.backend = str(rollout.name)
        self.handles: list[Any] = []
        lora_rank = cfg.actor_rollout_ref.model.lora_rank
        # vLLM serves LoRA adapters under a name of their own, which the rollout then asks for
        self.lora_name = "agentgym-lora" if lora_rank > 0 and self.backend == "vllm" else None
        urls = [str(u) for u in rollout.server_urls]
        model = str(cfg.actor_rollout_ref.model.path)
        # the key the servers' weight routes take: given, or from the environment; servers we start get a new one
        self.admin_key = rollout.server_admin_key or admin_key_from_env()
        if not urls:
            from agentgym.server.launch import start_policy_server

            kwargs: dict[str, Any] = {}
            if self.backend == "embedded":
                self.admin_key = self.admin_key or new_admin_key()
                kwargs["admin_key"] = self.admin_key
                if rollout.device:
                    kwargs["device"] = str(rollout.device)
                kwargs["max_model_len"] = cfg.data.max_prompt_length + cfg.data.max_response_length
                kwargs["max_batch_size"] = max(1, rollout.concurrency)
                kwargs["kv_cache_memory_bytes"] = rollout.kv_cache_memory_bytes
            else:
                from agentgym.compat.engine_args import engine_server_kwargs

                kwargs.update(
                    gpu_memory_utilization=rollout.gpu_memory_utilization,
                    tensor_parallel_size=rollout.tensor_model_parallel_size,
                    max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
                    kv_cache_memory_bytes=rollout.kv_cache_memory_bytes,
                    **engine_server_kwargs(cfg),
                )
                if self.lora_name:
                    from agentgym.client.weights import VLLMWeights

                    kwargs["extra_args"] = [*kwargs.get("extra_args", ()), *VLLMWeights.lora_args(lora_rank)]
                    kwargs["env"] = {**(kwargs.get("env") or {}), **VLLMWeights.LORA_ENV}
            try:
                for _ in range(rollout.num_servers):
                    self.handles.append(start_policy_server(self.backend, model, port=0, **kwargs))
            except BaseException:
                self.stop()
                raise
            urls = [h.url for h in self.handles]
        self.urls = urls
        self.client = PolicyClient(
            urls,
            backend=self.backend,
            admin_key=self.admin_key,
            model=self.lora_name or (self.handles[0].model if self.handles else None),
        )
        self.bucket_mb = cfg.async_training.checkpoint_engine.device_buffer_size_M

    def remote_urls(self) -> list[str]:
        """Servers given by URL that run on another machine."""
        return [] if self.handles else [u for u in self.urls if not is_local_url(u)]

    def loads_state_dicts(self) -> bool:
        """Whether every server loads a state dict from this process without a file in between: embedded
        servers we started (servers given by URL on this host read a file, ones elsewhere take buckets)."""
        from agentgym.server.handles import EmbeddedServerHandle

        if self.backend != "embedded" or not self.handles:
            return False
        return all(
            isinstance(h, EmbeddedServerHandle) or getattr(h, "backend", None) == "embedded" for h in self.handles
        )

    def in_process_handles(self) -> list[Any]:
        """Embedded servers running in this process (they take a state dict directly)."""
        from agentgym.server.handles import EmbeddedServerHandle

        return [h for h in self.handles if isinstance(h, EmbeddedServerHandle)]

    async def update(self, weights: str | dict[str, Any], version: int, abort: bool = False) -> None:
        """Every server loads ``weights`` (a model directory, or a state dict for in-process servers);
        ``abort``: running generations end first (their callers continue them on the new weights)."""
        if abort:
            await self.pause_abort()
            try:
                await self.update(weights, version)
            finally:
                await self.resume()
            return
        jobs = [asyncio.to_thread(h.update_weights, weights, version) for h in self.handles]
        if not self.handles and isinstance(weights, dict):  # embedded servers known by URL only
            if self.backend != "embedded":
                raise ValueError(f"{self.backend} servers given by URL load weights from a path, not a state dict")
            from agentgym.client.weights import EmbeddedWeights

            adapter = EmbeddedWeights(admin_key=self.admin_key)
            for url in self.urls:
                if is_local_url(url):
                    jobs.append(asyncio.to_thread(adapter.update_from_state_dict, url, weights, version))
                else:
                    jobs.append(asyncio.to_thread(adapter.update_in_buckets, url, weights, version, self.bucket_mb))
        elif not self.handles:  # servers someone else runs, known by URL only
            if self.backend == "vllm":
                from agentgym.client.weights import VLLMWeights

                adapter = VLLMWeights()
                jobs += [asyncio.to_thread(adapter.update_from_disk, url, str(weights), version) for url in self.urls]
            else:  # the embedded server and SGLang share SGLang's /update_weights_from_disk
                jobs.append(self.client.update_weights_from_disk(str(weights), version))
        await asyncio.gather(*jobs)
        for server in self.client.servers:  # what a server that reports no version with its samples (vLLM) holds
            server.version = version

    async def pause_abort(self) -> None:
        """Every server stops admitting and ends its running generations (``finish_reason="abort"``)."""
        await self._control("pause")

    async def resume(self) -> None:
        await self._control("resume")

    async def _control(self, what: str) -> None:
        """``what`` is "pause" or "resume": through each started server's handle, else each URL's
        backend route."""
        from agentgym.client.weights import WeightUpdateError, weights_adapter

        if self.handles:
            jobs = [asyncio.to_thread(getattr(handle, f"{what}_generation")) for handle in self.handles]
        else:  # servers known by URL only
            adapter = weights_adapter(self.backend, admin_key=self.admin_key)
            jobs = [asyncio.to_thread(getattr(adapter, what), url) for url in self.urls]
        try:
            await asyncio.gather(*jobs)
        except (WeightUpdateError, NotImplementedError) as exc:
            raise RuntimeError(
                f"{exc}; partial rollout needs servers that abort generations ({self.backend} "
                "servers: SGLang's /pause_generation, vLLM's /pause?mode=abort, or agentgym's)"
            ) from None

    async def aclose(self) -> None:
        await self.client.aclose()

    def stop(self) -> None:
        for handle in self.handles:
            with contextlib.suppress(Exception):  # stop the others anyway
                handle.stop()
        self.handles = []


def is_local_url(url: str) -> bool:
    """Whether ``url``'s host is this machine (an address one can bind to here)."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(url).hostname or "localhost"
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False
