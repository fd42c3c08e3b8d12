"""The rollout side's servers, and pushing the trained weights back to them.

``RolloutServers`` starts the policy servers the rollout samples from (``rollout.name``:
embedded | vllm | sglang; ``rollout.num_servers`` of them), or talks to running ones
(``rollout.server_urls``), and holds the ``PolicyClient`` over all of them.

``WeightSync.push(version)`` runs after every update: the actor's rank 0 writes the whole
policy as one safetensors file in a model directory under ``/dev/shm`` (RAM; the temp
directory where there is no ``/dev/shm``; the servers must be on the same host), every
server loads it and reports ``version`` from then on, and the file is deleted. When
the actor lives in this process and a server is an embedded one in this process too, the
weights are copied straight from the actor's tensors, with no file at all. Both halves
are timed (``weight_sync/save_s``, ``weight_sync/load_s``).

Asynchronous training adds two options to a push: ``state`` (weights copied earlier, the checkpoint
engine's buffer, pushed instead of the actor's current ones) and ``abort`` (partial rollout: every
server aborts its running generations, whose callers continue them, loads, and resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any


class RolloutServers:
    """Policy servers for the rollout: ``handles`` we started, ``urls`` of all, one ``client``."""

    def __init__(self, cfg: Any) -> None:
        from agentgym.client import PolicyClient

        rollout = cfg.actor_rollout_ref.rollout
        self.backend = str(rollout.name)
        self.handles: list[Any] = []
        urls = [str(u) for u in rollout.server_urls]
        model = str(cfg.actor_rollout_ref.model.path)
        if not urls:
            from agentgym.server.launch import start_policy_server

            kwargs: dict[str, Any] = {}
            if self.backend == "embedded":
                if rollout.device:
                    kwargs["device"] = str(rollout.device)
                kwargs["max_model_len"] = int(cfg.data.max_prompt_length + cfg.data.max_response_length)
                kwargs["max_batch_size"] = max(1, int(rollout.concurrency))
            else:
                from agentgym.trainer.engine_args import engine_server_kwargs

                kwargs.update(gpu_memory_utilization=float(rollout.gpu_memory_utilization),
                              tensor_parallel_size=int(rollout.tensor_model_parallel_size),
                              max_model_len=int(cfg.data.max_prompt_length + cfg.data.max_response_length),
                              **engine_server_kwargs(cfg))
            try:
                for _ in range(int(rollout.num_servers)):
                    self.handles.append(start_policy_server(self.backend, model, port=0, **kwargs))
            except BaseException:
                self.stop()
                raise
            urls = [h.url for h in self.handles]
        self.urls = urls
        self.client = PolicyClient(urls, backend=self.backend,
                                   model=self.handles[0].model if self.handles else None)

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
        if not self.handles:  # servers someone else runs, known by URL only
            if isinstance(weights, dict):
                raise ValueError("servers given by URL load weights from a path, not a state dict")
            if self.backend == "vllm":
                from agentgym.client.weights import VLLMWeights

                adapter = VLLMWeights()
                jobs += [asyncio.to_thread(adapter.update_from_disk, url, str(weights), version) for url in self.urls]
            else:  # the embedded server and SGLang share SGLang's /update_weights_from_disk
                jobs.append(self.client.update_weights_from_disk(str(weights), version))
        await asyncio.gather(*jobs)

    async def pause_abort(self) -> None:
        """Every server stops admitting and ends its running generations (``finish_reason="abort"``)."""
        await self._control("pause", "/pause_generation", {"mode": "abort"})

    async def resume(self) -> None:
        await self._control("resume", "/resume_generation", None)

    async def _control(self, method: str, path: str, body: Any) -> None:
        from agentgym.server.handles import EmbeddedServerHandle

        jobs = []
        for handle in self.handles:
            if isinstance(handle, EmbeddedServerHandle):
                engine = handle.engine
                jobs.append(asyncio.wrap_future(engine.pause("abort")) if method == "pause"
                            else asyncio.to_thread(engine.resume))
            elif hasattr(handle, method):  # e.g. a server on the rollout pool (resource_pools.ServerActorHandle)
                jobs.append(asyncio.to_thread(getattr(handle, method)))
            else:
                jobs.append(self._post_control(handle.url, path, body))
        if not self.handles:
            jobs += [self._post_control(url, path, body) for url in self.urls]
        await asyncio.gather(*jobs)

    async def _post_control(self, url: str, path: str, body: Any) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=600.0) as http:
            response = await http.post(url + path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"{url}{path} answered {response.status_code}: {response.text[:300]}; partial rollout "
                               f"needs servers that abort generations ({self.backend} may not)")

    async def aclose(self) -> None:
        await self.client.aclose()

    def stop(self) -> None:
        for handle in self.handles:
            with contextlib.suppress(Exception):  # stop the others anyway
                handle.stop()
        self.handles = []


class WeightSync:
    """Pushes the actor's weights to every rollout server with a version number."""

    def __init__(self, servers: RolloutServers, actor: Any, model_path: str,
                 directory: str | os.PathLike[str] | None = None) -> None:
        from agentgym.model.weights import push_dir

        self.servers = servers
        self.model_path = model_path
        self.actor = actor  # a WorkerGroup of PolicyWorker
        base = Path(directory) if directory is not None else push_dir()
        # A model directory (config files + model.safetensors), which every engine can load
        self.directory = base / f"agentgym-policy-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = self.directory / "model.safetensors"
        in_process = servers.in_process_handles()
        self.direct = not actor.use_ray and len(in_process) == len(servers.handles) and bool(in_process)

    async def push(self, version: int, abort: bool = False, state: dict[str, Any] | None = None) -> dict[str, float]:
        """Every server loads the weights as ``version``: the actor's current ones, or ``state``."""
        started = time.perf_counter()
        takes_state = self.direct or getattr(self.servers, "takes_state_dict", False)
        if takes_state:
            if state is None:
                state = await asyncio.to_thread(self.actor.call_rank0, "full_state_dict")
            saved = time.perf_counter()
            await self.servers.update(state, version, abort=abort)
            size = float(sum(t.numel() * t.element_size() for t in state.values()))
        else:
            self._prepare_directory()
            if state is None:
                results = await asyncio.to_thread(self.actor.call, "push_weights", str(self.path))
                size = float(results[0]["bytes"])
            else:
                from agentgym.model.weights import save_for_push

                size = float((await asyncio.to_thread(save_for_push, state, self.path)).stat().st_size)
            saved = time.perf_counter()
            try:
                await self.servers.update(str(self.directory), version, abort=abort)
            finally:
                self.path.unlink(missing_ok=True)  # /dev/shm is memory: free it once the servers have read it
        done = time.perf_counter()
        if hasattr(self.servers, "last_buckets"):  # servers on the rollout pool: the push went in buckets
            return {"weight_sync/save_s": saved - started, "weight_sync/load_s": done - saved,
                    "weight_sync/mb": size / 2**20, "weight_sync/version": float(version),
                    "weight_sync/buckets": float(self.servers.last_buckets)}
        return {
            "weight_sync/save_s": saved - started,
            "weight_sync/load_s": done - saved,
            "weight_sync/mb": size / 2**20,
            "weight_sync/version": float(version),
        }

    def _prepare_directory(self) -> None:
        if self.directory.is_dir():
            return
        from agentgym.model import resolve_model_path

        self.directory.mkdir(parents=True)
        source = Path(resolve_model_path(self.model_path))
        for f in source.glob("*.json"):  # config, generation config, tokenizer files
            if not f.name.endswith(".index.json"):  # a shard index would point at files not here
                shutil.copy(f, self.directory / f.name)

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
