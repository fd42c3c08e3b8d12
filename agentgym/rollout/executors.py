"""Where env ``reset``/``step`` calls run, so that one slow env never stalls the other episodes.

``env_executor`` (``RolloutConfig``):

* ``thread`` (default): each call runs in a thread pool; ``env_timeout`` applies. A call that
  times out keeps its thread busy until it returns (Python cannot kill a thread); that env is
  then dropped, never reused.
* ``process``: each env lives in one of ``env_workers`` worker processes (started with
  ``forkserver``) for its whole episode, so CPU-heavy envs run in parallel. The env must be
  buildable there: a registered name from an installed entry point, or an importable
  class/factory; as with any ``multiprocessing`` code, a script that uses it needs an
  ``if __name__ == "__main__":`` guard. ``env_timeout`` applies; a timed-out call still
  occupies its worker until it returns, delaying the other episodes on that worker.
* ``inline``: calls run on the event loop itself — the fast path for cheap, pure-Python envs
  (Sokoban steps take microseconds). No timeout can interrupt an inline call.

Envs are reused across episodes (``reset`` starts each one); an env whose call raised or
timed out is closed and replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

EXECUTORS = ("thread", "process", "inline")


class EnvTimeout(TimeoutError):
    """An env call took longer than ``env_timeout``."""


def _close_quietly(env: Any) -> None:
    with contextlib.suppress(Exception):
        env.close()


class EnvBackend:
    """Runs env calls for a runner. ``open()`` gives a handle for one episode's env."""

    def __init__(self, factory: Callable[[], Any], executor: str = "thread", workers: int | None = None,
                 timeout: float | None = None) -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"env_executor must be one of {EXECUTORS}, got {executor!r}")
        self.factory = factory
        self.kind = executor
        self.timeout = timeout
        self._idle: list[Any] = []
        self._pool: Executor | None = None
        self._workers: list[ProcessPoolExecutor] = []
        self._keys = itertools.count()
        if executor == "thread":
            self._pool = ThreadPoolExecutor(max_workers=workers or 64, thread_name_prefix="agentgym-env")
        elif executor == "process":
            ctx = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")
            self._workers = [ProcessPoolExecutor(max_workers=1, mp_context=ctx)
                             for _ in range(workers or os.cpu_count() or 1)]

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
            raise EnvTimeout(f"env call {getattr(fn, '__name__', fn)} took longer than env_timeout="
                             f"{self.timeout}s") from None

    async def describe(self) -> dict[str, Any]:
        """``num_tasks`` and ``max_turns`` of the env (builds one env, kept for reuse)."""
        if self.kind == "process":
            return await self._run(self._workers[0], _worker_describe, self.factory)
        env = self._idle.pop() if self._idle else self.factory()
        try:
            return _describe(env)
        finally:
            self._idle.append(env)

    def open(self) -> EnvHandle:
        key = next(self._keys)
        if self.kind == "process":
            return _ProcessHandle(self, key, self._workers[key % len(self._workers)])
        return _LocalHandle(self, self._pool)

    def shutdown(self) -> None:
        for env in self._idle:
            _close_quietly(env)
        self._idle.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for worker in self._workers:
            worker.shutdown(wait=False, cancel_futures=True)


class EnvHandle:
    """One episode's env. ``reset``/``step`` follow the TextEnv contract; ``release`` ends it."""

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list, dict]:
        raise NotImplementedError

    async def step(self, action: Any) -> tuple[list, float, bool, bool, dict]:
        raise NotImplementedError

    async def release(self, healthy: bool) -> None:
        raise NotImplementedError


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
            self.pool.submit(_close_quietly, env)
        else:
            _close_quietly(env)


class _ProcessHandle(EnvHandle):
    def __init__(self, backend: EnvBackend, key: int, worker: ProcessPoolExecutor) -> None:
        self.backend = backend
        self.key = key
        self.worker = worker

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list, dict]:
        return await self.backend._run(self.worker, _worker_reset, self.key, self.backend.factory, seed, options)

    async def step(self, action: Any) -> tuple[list, float, bool, bool, dict]:
        return await self.backend._run(self.worker, _worker_step, self.key, action)

    async def release(self, healthy: bool) -> None:
        future = asyncio.get_running_loop().run_in_executor(self.worker, _worker_release, self.key, healthy)
        if healthy:  # wait, so the env is back in the worker's pool before the next episode starts
            with contextlib.suppress(Exception):
                await future


def _describe(env: Any) -> dict[str, Any]:
    num_tasks = env.num_tasks() if hasattr(env, "num_tasks") else None
    return {"num_tasks": num_tasks, "max_turns": getattr(env, "max_turns", None)}


# ---- inside a worker process ---------------------------------------------------------------
_WORKER_IDLE: list[Any] = []
_WORKER_LIVE: dict[int, Any] = {}


def _worker_describe(factory: Callable[[], Any]) -> dict[str, Any]:
    env = _WORKER_IDLE.pop() if _WORKER_IDLE else factory()
    _WORKER_IDLE.append(env)
    return _describe(env)


def _worker_reset(key: int, factory: Callable[[], Any], seed: int | None,
                  options: dict[str, Any] | None) -> tuple[list, dict]:
    env = _WORKER_LIVE.get(key)
    if env is None:
        env = _WORKER_IDLE.pop() if _WORKER_IDLE else factory()
        _WORKER_LIVE[key] = env
    return env.reset(seed=seed, options=options)


def _worker_step(key: int, action: Any) -> tuple[list, float, bool, bool, dict]:
    return _WORKER_LIVE[key].step(action)


def _worker_release(key: int, healthy: bool) -> None:
    env = _WORKER_LIVE.pop(key, None)
    if env is None:
        return
    if healthy:
        _WORKER_IDLE.append(env)
    else:
        _close_quietly(env)
