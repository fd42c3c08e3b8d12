"""Where env ``reset``/``step`` calls run, and where whole episodes run when one process is not enough.

``env_executor`` (``RolloutConfig``; ``env.executor`` in configs/train.yaml). The first four move
only the env calls; the runner's process still runs every episode loop (chat-template deltas,
HTTP to the policy servers, bookkeeping):

* ``thread`` (default): each call runs in a thread pool; ``env_timeout`` applies. A call that
  times out keeps its thread busy until it returns (Python cannot kill a thread); that env is
  then dropped, never reused.
* ``process``: each env lives in one of ``env_workers`` worker processes (started with
  ``forkserver``) for its whole episode, so CPU-heavy envs run in parallel. Calls run on
  threads inside the worker, so a hung call holds only its own thread: it times out after
  ``env_timeout`` (counted from the call, not from the worker's start-up), its env is dropped,
  and the other envs on that worker go on. A worker that dies fails exactly the episodes whose
  envs it held (each once) and is started again for the next episodes. The env must be
  buildable there: a registered name from an installed entry point, or an importable
  class/factory; as with any ``multiprocessing`` code, a script that uses it needs an
  ``if __name__ == "__main__":`` guard.
* ``inline``: calls run on the event loop itself — the fast path for cheap, pure-Python envs
  (Sokoban steps take microseconds). No timeout can interrupt an inline call.
* ``openenv``: env instances live in OpenEnv servers (``env_urls``; ``agentgym env-serve --env
  NAME`` serves any agentgym env), one WebSocket session per episode, messages as OpenEnv's
  ``/ws`` protocol has them. A call past ``env_timeout`` closes its session (the server then
  drops that env); a server that goes away fails only the episodes talking to it.

The last two run whole episodes elsewhere, for when the runner's own CPU is the ceiling (one
process reached 0.27x of the raw HTTP rate at 16 cores):

* ``workers``: ``env_workers`` worker processes (default: CPUs) each run a ``RolloutRunner`` of
  their own, with their own event loop, policy-client connections and envs (called as
  ``worker_env_executor`` says: ``thread`` by default, so ``env_timeout`` holds; ``inline`` for
  cheap envs). The runner hands each episode to the least busy worker and gets its trajectory
  back; trajectories are token-exact as before (each worker's client samples them). A worker
  that dies fails exactly the episodes it was running (each once) and is started again.
* ``ray``: the same on ``env_workers`` Ray actors (a Ray cluster's nodes, ``ray.init`` as
  configured); a dead actor fails exactly its episodes and is restarted by Ray.

Envs are reused across episodes (``reset`` starts each one); an env whose call raised or
timed out is closed and replaced.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from agentgym.rollout.env_handles import (
    CALL_EXECUTORS,
    EPISODE_EXECUTORS,
    EXECUTORS,
    EnvHandle,
    EnvTimeout,
    WorkerCrashed,
    close_quietly,
    describe_env,
)
from agentgym.rollout.env_processes import ProcessHandle, WorkerProcess, env_worker_main
from agentgym.rollout.episode_workers import EpisodePool
from agentgym.rollout.openenv_remote import OpenEnvHandle, OpenEnvSession

__all__ = [
    "CALL_EXECUTORS",
    "EPISODE_EXECUTORS",
    "EXECUTORS",
    "EnvBackend",
    "EnvHandle",
    "EnvTimeout",
    "EpisodePool",
    "WorkerCrashed",
]


class EnvBackend:
    """Runs env calls for a runner. ``open()`` gives a handle for one episode's env.

    For ``workers``/``ray`` (whole episodes run elsewhere, see ``EpisodePool``) the backend
    builds envs inline: the runner only asks it to ``describe`` the env.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        executor: str = "thread",
        workers: int | None = None,
        timeout: float | None = None,
        urls: list[str] | None = None,
    ) -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"env_executor must be one of {EXECUTORS}, got {executor!r}")
        if executor == "openenv" and not urls:
            raise ValueError(
                "env_executor='openenv' needs env_urls: the OpenEnv servers that hold the envs "
                "(start one with `agentgym env-serve --env NAME --port 8010`)"
            )
        self.factory = factory
        self.kind = "inline" if executor in EPISODE_EXECUTORS else executor
        self.timeout = timeout
        self.urls = [u.rstrip("/") for u in urls or ()]
        self._idle: list[Any] = []
        self._pool: Executor | None = None
        self._workers: list[WorkerProcess | None] = []
        self._keys = itertools.count()
        self._summary_env: Any = None  # built on the first summarizer() call
        if self.kind == "thread":
            self._pool = ThreadPoolExecutor(max_workers=workers or 64, thread_name_prefix="agentgym-env")
        elif self.kind == "process":
            self._workers = [None] * (workers or os.cpu_count() or 1)
        elif self.kind == "openenv":
            self._sessions: list[OpenEnvSession] = []

    # ---- calls -----------------------------------------------------------------------------
    async def _run(self, executor: Executor | None, fn: Callable[..., Any], *args: Any) -> Any:
        if executor is None:
            return fn(*args)
        future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        if self.timeout is None:
            return await future
        try:
            return await asyncio.wait_for(future, self.timeout)
        except asyncio.TimeoutError:
            raise EnvTimeout(
                f"env call {getattr(fn, '__name__', fn)} took longer than env_timeout={self.timeout}s"
            ) from None

    def _worker(self, index: int) -> WorkerProcess:
        """Worker ``index``, started (again) if it is not running."""
        worker = self._workers[index]
        if worker is None or not worker.alive:
            worker = self._workers[index] = WorkerProcess(env_worker_main, (self.factory,), name=f"env worker {index}")
        return worker

    async def describe(self) -> dict[str, Any]:
        """``num_tasks``, ``max_turns`` and ``agents`` of the env (builds one env, kept for reuse)."""
        if self.kind == "process":
            return await self._worker(0).call("describe", None, self.factory, timeout=None)
        if self.kind == "openenv":
            session = await self._session()
            try:
                return await session.describe(self.timeout)
            finally:
                self._sessions.append(session)
        env = self._idle.pop() if self._idle else self.factory()
        try:
            return describe_env(env)
        finally:
            self._idle.append(env)

    def summarizer(self) -> Any:
        """The env's rule for summarising dropped turns (``TextEnv.summarize``, a function of the messages
        only), from an env built in this process; None for remote envs (``openenv``) or an env without one."""
        if self.kind == "openenv":
            return None
        if self._summary_env is None:
            self._summary_env = self.factory()
        return getattr(self._summary_env, "summarize", None)

    def open(self) -> EnvHandle:
        key = next(self._keys)
        if self.kind == "process":
            return ProcessHandle(self, key, key % len(self._workers))
        if self.kind == "openenv":
            return OpenEnvHandle(self)
        return _LocalHandle(self, self._pool)

    async def _session(self) -> OpenEnvSession:
        if self._sessions:
            return self._sessions.pop()
        url = self.urls[next(self._keys) % len(self.urls)]
        return await OpenEnvSession.connect(url)

    def shutdown(self) -> None:
        for env in self._idle:
            close_quietly(env)
        self._idle.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for worker in self._workers:
            if worker is not None:
                worker.close()
        self._workers = [None] * len(self._workers)
        if self.kind == "openenv":
            for session in self._sessions:
                session.abort()
            self._sessions.clear()


class _LocalHandle(EnvHandle):
    def __init__(self, backend: EnvBackend, pool: Executor | None) -> None:
        self.backend = backend
        self.pool = pool
        self.env: Any = None

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list, dict]:
        if self.env is None:
            self.env = self.backend._idle.pop() if self.backend._idle else self.backend.factory()
        if self.pool is None:
            return self.env.reset(seed=seed, options=options)
        return await self.backend._run(self.pool, functools.partial(self.env.reset, seed=seed, options=options))

    async def step(self, action: Any) -> tuple[list, float, bool, bool, dict]:
        if self.pool is None:
            return self.env.step(action)
        return await self.backend._run(self.pool, self.env.step, action)

    async def release(self, healthy: bool) -> None:
        env, self.env = self.env, None
        if env is None:
            return
        if healthy:
            self.backend._idle.append(env)
        elif self.pool is not None:  # it may still be running in its thread: close it there, later
            self.pool.submit(close_quietly, env)
        else:
            close_quietly(env)
