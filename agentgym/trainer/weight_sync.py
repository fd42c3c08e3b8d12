"""Trainer -> servers: pushing the trained weights to the rollout's policy servers.

(The servers themselves are started in ``agentgym.trainer.rollout_servers``; the server side of a
push is ``agentgym.server.weight_transfer`` and ``agentgym.server.lora_adapters``; the formats both
sides share are ``agentgym.model.weights``.)

``WeightSync.push(version)`` runs after every update; every server loads the weights and
reports ``version`` from then on. How they travel depends on where actor and servers are:

* actor and embedded servers in this process: with the synchronous trainer (which never
  trains while the servers generate) the servers' weights *are* the actor's tensors, bound
  once (``Engine.share_weights``, no copy; later pushes only move the version); otherwise the
  actor's tensors are copied straight into the servers' weights;
* actor in this process, embedded servers in other processes on this host: the servers map the
  actor's own memory (shared memory / CUDA IPC handles, ``agentgym.model.weights``) and copy once;
* embedded servers given by URL on other machines: safetensors buckets of at most
  ``async_training.checkpoint_engine.device_buffer_size_M`` MB over HTTP;
* Ray workers on this host and embedded servers we started: the rank-0 worker hands out handles of
  its memory (``PolicyWorker.weight_handles``: shared memory on CPU, CUDA IPC on a GPU) and every
  server copies from there once;
* otherwise (vLLM, SGLang, servers given by URL): the actor's rank 0 writes the whole policy as one
  safetensors file in a model directory under ``/dev/shm`` (RAM; the temp directory where
  there is no ``/dev/shm``), every server loads it, and the file is deleted;
* rank 0 on another node than this driver (a Ray cluster): its memory and its ``/dev/shm`` are not
  here, so the weights come through Ray's object store in buckets of at most
  ``async_training.checkpoint_engine.device_buffer_size_M`` MB (``PolicyWorker.weight_buckets``),
  then go on as weights given here (state dicts to embedded servers, a file on this host for
  vLLM/SGLang servers on this host). vLLM/SGLang servers given by URL on another host read weights
  from a path on their own host: refused before training (``refuse_unreachable``).

Both halves are timed (``weight_sync/save_s``, ``weight_sync/load_s``).

The push directory (``agentgym-policy-<pid>-<id>``, memory while it exists) is removed on every way
out: ``cleanup()`` at shutdown, an ``atexit`` hook (``agentgym train`` turns SIGTERM/SIGHUP into a
normal exit, so they pass through it too), and for a process killed outright (``kill -9``) by the
next ``WeightSync``, which removes the directories of processes that no longer exist. A signal can
end the run while a thread still writes weights there: ``cleanup()`` waits for that write to end
(writes and removal share one lock), and no write starts after it.

Asynchronous training adds two options to a push: ``state`` (weights copied earlier, the checkpoint
engine's buffer, pushed instead of the actor's current ones) and ``abort`` (partial rollout: every
server aborts its running generations, whose callers continue them, loads, and resumes).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from agentgym.config import ConfigError
from agentgym.trainer.rollout_servers import RolloutServers

log = logging.getLogger("agentgym.trainer")


class WeightSync:
    """Pushes the actor's weights to every rollout server with a version number."""

    def __init__(
        self, servers: RolloutServers, actor: Any, model_path: str, directory: str | os.PathLike[str] | None = None
    ) -> None:
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
        self.version = 0  # the version the servers were last sent (what they should all report)
        self._writing = threading.Lock()  # held by whoever writes into the push directory, and by cleanup()
        self.closed = False
        remove_orphans(base)
        atexit.register(self.cleanup)
        # the synchronous trainer never trains while its servers generate: they may share its tensors
        self.share = self.direct and actor.workers[0].config.actor_rollout_ref.hybrid_engine
        self.shared = False  # the servers' weights are the actor's tensors
        loads = getattr(servers, "loads_state_dicts", None)
        self.state_dicts = not actor.use_ray and loads is not None and loads()
        # Ray workers on this host and embedded servers we started: the servers map the workers' memory
        self.handles = actor.use_ray and bool(servers.handles) and loads is not None and loads()
        self._mapped: dict[tuple, Any] = {}
        # rank 0 on another node: neither its memory nor its /dev/shm is here; the weights come through
        # Ray's object store in buckets, and servers that read files read one written on this host
        self.remote_rank0 = actor.use_ray and rank0_elsewhere(actor)
        if self.remote_rank0:  # embedded servers we started take the fetched state dict
            self.handles = False
            self.state_dicts = loads is not None and loads()
            if getattr(servers, "lora_name", None):
                raise ConfigError(
                    "LoRA on vLLM servers loads the adapter from a directory the actor's rank 0 writes, and rank 0 "
                    "runs on another node than this driver: keep the trainer pool on this node (ray start here "
                    "with --resources '{\"agentgym_trainer_pool\": N}'), or train the whole model (lora_rank=0)"
                )
        self.bucket_mb = float(getattr(servers, "bucket_mb", 256) or 256)
        refuse_unreachable(servers)

    async def push(self, version: int, abort: bool = False, state: dict[str, Any] | None = None) -> dict[str, float]:
        """Every server loads the weights as ``version``: the actor's current ones, or ``state``."""
        started = time.perf_counter()
        if getattr(self.servers, "lora_name", None):
            return await self._push_adapter(version, started)
        takes_state = self.direct or self.state_dicts or getattr(self.servers, "takes_state_dict", False)
        remote = getattr(self.servers, "remote_urls", list)()
        if state is None and self.remote_rank0:  # through the object store, then as weights given here
            state = await asyncio.to_thread(self._fetch_buckets)
        if self.share and state is None and not abort:
            size = await self._push_shared(version)
            saved = started
        elif self.handles and state is None and (size := await self._push_handles(version, abort)) is not None:
            saved = started
        elif takes_state or (remote and getattr(self.servers, "backend", "embedded") == "embedded"):
            if state is None:
                state = await asyncio.to_thread(self.actor.call_rank0, "full_state_dict")
            saved = time.perf_counter()
            await self.servers.update(state, version, abort=abort)
            size = float(sum(t.numel() * t.element_size() for t in state.values()))
        else:
            self._while_open(self._prepare_directory)
            if state is None:
                results = await asyncio.to_thread(self._while_open, self.actor.call, "push_weights", str(self.path))
                size = float(results[0]["bytes"])
            else:
                from agentgym.model.weights import save_for_push

                written = await asyncio.to_thread(self._while_open, save_for_push, state, self.path)
                size = float(written.stat().st_size)
            saved = time.perf_counter()
            try:
                await self.servers.update(str(self.directory), version, abort=abort)
            finally:
                self.path.unlink(missing_ok=True)  # /dev/shm is memory: free it once the servers have read it
        done = time.perf_counter()
        self.version = version
        if hasattr(self.servers, "last_buckets"):  # servers on the rollout pool: the push went in buckets
            return {
                "weight_sync/save_s": saved - started,
                "weight_sync/load_s": done - saved,
                "weight_sync/mb": size / 2**20,
                "weight_sync/version": float(version),
                "weight_sync/buckets": float(self.servers.last_buckets),
            }
        out = {
            "weight_sync/save_s": saved - started,
            "weight_sync/load_s": done - saved,
            "weight_sync/mb": size / 2**20,
            "weight_sync/version": float(version),
        }
        if self.remote_rank0:  # the weights came from rank 0 on another node, through the object store
            out["weight_sync/object_store"] = 1.0
        return out

    async def _push_handles(self, version: int, abort: bool) -> float | None:
        """Every server maps the rank-0 worker's memory and copies once; None (nothing pushed) when it
        cannot (a worker on another node), and from then on the file path."""
        from agentgym.model.weights import open_handles
        from agentgym.server.handles import EmbeddedServerHandle

        handles = await asyncio.to_thread(self.actor.call_rank0, "weight_handles")
        try:
            local = [h for h in self.servers.handles if isinstance(h, EmbeddedServerHandle)]
            state = open_handles(handles, self._mapped) if local else {}
        except (OSError, RuntimeError) as exc:
            log.warning("the servers cannot map the trainer's memory (%s); pushing through files from now on", exc)
            self.handles = False
            return None
        if abort:
            await self.servers.pause_abort()
        try:
            await asyncio.gather(
                *(
                    asyncio.to_thread(h.update_weights, state, version)
                    if h in local
                    else asyncio.to_thread(h.weights.update_from_shared, h.url, handles, version)
                    for h in self.servers.handles
                )
            )
        finally:
            if abort:
                await self.servers.resume()
        for h in self.servers.handles:
            if h not in local:
                h.weight_version = version
        self._record(version)
        return float(sum(t.numel() * t.element_size() for t in state.values())) if state else 0.0

    def _fetch_buckets(self) -> dict[str, Any]:
        """The actor's weights from rank 0 on another node, bucket by bucket through Ray's object store."""
        import ray

        refs = next(r for r in self.actor.call("weight_buckets", self.bucket_mb) if r is not None)
        state: dict[str, Any] = {}
        for ref in refs:
            state.update(ray.get(ref))
            del ref
        return state

    def _record(self, version: int) -> None:
        """What ``RolloutServers.update`` records, for pushes that go around it."""
        self.version = version
        for server in getattr(getattr(self.servers, "client", None), "servers", []):
            server.version = version

    async def _push_shared(self, version: int) -> float:
        """Bind the actor's tensors into every in-process server once; afterwards a push is a version.
        Servers whose weights cannot be the actor's (another dtype or device) get a copy."""
        self._record(version)
        if self.shared:
            await asyncio.gather(*(asyncio.wrap_future(h.engine.new_version(version)) for h in self.servers.handles))
            return self.shared_bytes
        state = await asyncio.to_thread(self.actor.call_rank0, "full_state_dict")
        size = self.shared_bytes = float(sum(t.numel() * t.element_size() for t in state.values()))
        bound = await asyncio.gather(
            *(asyncio.wrap_future(h.engine.share_weights(state, version)) for h in self.servers.handles)
        )
        if all(b is not False for b in bound):
            self.shared = True
        else:  # a server that could not bind: copy, and stop trying to share
            self.share = False
            await self.servers.update(state, version)
        return size

    async def _push_adapter(self, version: int, started: float) -> dict[str, float]:
        """LoRA on vLLM servers: peft's adapter directory, loaded by each server under one name."""
        from agentgym.client.weights import VLLMWeights

        directory = self._adapter_directory(version)
        await asyncio.to_thread(self._while_open, self.actor.call, "save_adapter", str(directory))
        saved = time.perf_counter()
        adapter = VLLMWeights()
        try:
            await asyncio.gather(
                *(
                    asyncio.to_thread(adapter.load_lora_adapter, url, self.servers.lora_name, str(directory), version)
                    for url in self.servers.urls
                )
            )
        finally:
            shutil.rmtree(self._adapter_directory(version - 1), ignore_errors=True)
        size = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
        self._record(version)
        return {
            "weight_sync/save_s": saved - started,
            "weight_sync/load_s": time.perf_counter() - saved,
            "weight_sync/mb": size / 2**20,
            "weight_sync/version": float(version),
        }

    def _adapter_directory(self, version: int | str) -> Path:
        """Where the LoRA adapter of ``version`` is written, beside the push directory (``"*"``: a glob
        of them all)."""
        return self.directory.with_name(f"{self.directory.name}-lora-{version}")

    def _prepare_directory(self) -> None:
        if self.directory.is_dir():
            return
        from agentgym.model import resolve_model_path

        self.directory.mkdir(parents=True)
        source = Path(resolve_model_path(self.model_path))
        for f in source.glob("*.json"):  # config, generation config, tokenizer files
            if not f.name.endswith(".index.json"):  # a shard index would point at files not here
                shutil.copy(f, self.directory / f.name)

    def _while_open(self, write: Any, *args: Any) -> Any:
        """``write(*args)``, which writes into the push directory, unless ``cleanup()`` has run."""
        with self._writing:
            if self.closed:
                raise RuntimeError(f"the weight push directory {self.directory} was removed at shutdown")
            return write(*args)

    def cleanup(self, wait_s: float = 60.0) -> None:
        """Remove the push directory and LoRA adapter directories, once a write in flight (a thread
        the run's end did not stop) has ended; at most ``wait_s`` seconds are waited for it."""
        locked = self._writing.acquire(timeout=wait_s)
        try:
            self.closed = True
            for path in [self.directory, *self.directory.parent.glob(self._adapter_directory("*").name)]:
                shutil.rmtree(path, ignore_errors=True)
        finally:
            if locked:
                self._writing.release()
        atexit.unregister(self.cleanup)


ORPHANS = {"agentgym-policy-*-*": ("-", 2), "agentgym-weights-*-*": ("-", 2), "torch_*_*": ("_", 1)}
"""What ``remove_orphans`` looks for, and where the PID is in each name (separator, field)."""


def rank0_elsewhere(actor: Any) -> bool:
    """Whether the actor's rank 0 (a Ray worker) runs on another node than this process."""
    import ray

    if not ray.is_initialized():
        return False
    here = ray.get_runtime_context().get_node_id()
    return actor.call_rank0("node_id") not in (None, here)


def refuse_unreachable(servers: Any) -> None:
    """vLLM/SGLang servers given by URL on another host load new weights from a file path on their own
    host (``/update_weights_from_disk``, ``/v1/load_lora_adapter``), which agentgym cannot write there:
    refused before any work, with the ways that work."""
    _refuse_remote(getattr(servers, "backend", "embedded"), getattr(servers, "remote_urls", list)())


def refuse_unreachable_urls(cfg: Any) -> None:
    """``refuse_unreachable`` from the config alone (``actor_rollout_ref.rollout.name`` and ``server_urls``), so
    ``agentgym train`` refuses before its first stage (the warm start's demos and SFT come before RL's servers)."""
    from agentgym.trainer.rollout_servers import is_local_url

    rollout = cfg.actor_rollout_ref.rollout
    _refuse_remote(str(rollout.name), [str(u) for u in rollout.server_urls if not is_local_url(str(u))])


def _refuse_remote(backend: str, remote: list[str]) -> None:
    if backend == "embedded" or not remote:
        return
    raise ConfigError(
        f"{backend} servers given by URL on another host ({', '.join(remote)}) cannot load the trained "
        f"weights: {backend} takes new weights from a file path on its own host, and agentgym writes that "
        "file on this one. Run those servers on this host (or mount this host's /dev/shm there), let "
        "agentgym start them (leave actor_rollout_ref.rollout.server_urls empty; with --async and Ray they "
        "go on the rollout pool's nodes and receive the weights through Ray's object store), or use "
        "embedded servers, which take weights over HTTP; see docs/cluster.md"
    )


def remove_orphans(base: Path, min_age_s: float = 600.0) -> list[Path]:
    """Remove push files left under ``base`` by processes that are gone (killed with no chance to
    clean up): ``agentgym-policy-<pid>-*`` directories, ``agentgym-weights-<pid>-*`` files and torch's
    shared-memory files ``torch_<pid>_*`` (a Ray worker's weights, ``PolicyWorker.weight_handles``,
    left when Ray killed the worker together with torch's manager process), untouched for
    ``min_age_s`` (a process of another PID namespace sharing ``/dev/shm`` looks gone too; its files
    are left alone while it pushes)."""
    removed = []
    now = time.time()
    for pattern, (separator, field) in ORPHANS.items():
        for path in base.glob(pattern):
            parts = path.name.split(separator)
            pid = parts[field] if len(parts) > field else ""
            try:
                idle = now - path.stat().st_mtime
            except OSError:
                continue
            if not pid.isdigit() or _alive(int(pid)) or idle < min_age_s:
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
