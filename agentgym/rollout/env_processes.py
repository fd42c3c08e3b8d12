"""Env instances in worker processes (``env_executor="process"``): the pipe protocol, the worker's
main loop, and the handle of an env that lives in one."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentgym.rollout.env_handles import EnvHandle, EnvTimeout, WorkerCrashed, close_quietly, describe_env

STARTUP_TIMEOUT_S = 300.0  # a worker process's start (imports) is not an env call: its own, generous limit


class ProcessHandle(EnvHandle):
    """An env in a worker process. The worker is chosen at ``reset`` and kept for the episode: if
    it dies meanwhile, every later call raises ``WorkerCrashed`` (its env is gone)."""

    def __init__(self, backend: Any, key: int, index: int) -> None:
        self.backend = backend
        self.key = key
        self.index = index
        self.worker: WorkerProcess | None = None

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list, dict]:
        if self.worker is None:
            self.worker = self.backend._worker(self.index)
        return await self.worker.call(
            "reset", self.key, (self.backend.factory, seed, options), timeout=self.backend.timeout
        )

    async def step(self, action: Any) -> tuple[list, float, bool, bool, dict]:
        assert self.worker is not None, "reset() first"
        return await self.worker.call("step", self.key, action, timeout=self.backend.timeout)

    async def release(self, healthy: bool) -> None:
        worker, self.worker = self.worker, None
        if worker is None or not worker.alive:
            return
        if healthy:  # wait, so the env is back in the worker's pool before the next episode starts
            with contextlib.suppress(Exception):
                await worker.call("release", self.key, True, timeout=self.backend.timeout)
        else:
            worker.send_only("release", self.key, False)


class WorkerProcess:
    """A child process that answers ``(call_id, op, key, arg)`` messages over a pipe.

    A thread of the parent reads the answers and resolves the calls' futures on the event loop
    that made them. When the pipe closes (the child died) every call still waiting fails with
    ``WorkerCrashed``, once, and ``alive`` turns False; the owner starts a new worker for new
    work. Start-up (importing agentgym and the env's package) is waited for apart from calls,
    so it never counts against ``env_timeout``.
    """

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        ctx = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")
        self.name = name
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child, *args), name=f"agentgym {name}", daemon=True)
        self.process.start()
        child.close()
        self.alive = True
        self.exitcode: int | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._send_lock = threading.Lock()
        threading.Thread(target=self._read, name=f"agentgym {name} reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                call_id, ok, value = self.conn.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:  # noqa: BLE001 - an answer that does not unpickle fails its call only
                call_id, ok, value = -1, False, exc
            if call_id == 0:
                if not ok:
                    self._startup_error = value
                self._ready.set()
                continue
            with self._lock:
                waiter = self._pending.pop(call_id, None)
            if waiter is not None:
                _resolve(waiter, ok, value)
        self.process.join(timeout=5)
        self.exitcode = self.process.exitcode
        self.alive = False
        self._ready.set()
        error = WorkerCrashed(
            f"{self.name} (pid {self.process.pid}) died with exit code {self.exitcode}; "
            "the episodes it held failed, and a new worker takes the next ones"
        )
        with self._lock:
            waiters, self._pending = list(self._pending.values()), {}
        for waiter in waiters:
            _resolve(waiter, False, error)

    def _crashed(self) -> WorkerCrashed:
        return WorkerCrashed(
            f"{self.name} (pid {self.process.pid}) died with exit code {self.exitcode}; "
            "the episodes it held failed, and a new worker takes the next ones"
        )

    async def started(self) -> None:
        if not self._ready.is_set():
            ok = await asyncio.to_thread(self._ready.wait, STARTUP_TIMEOUT_S)
            if not ok:
                raise WorkerCrashed(f"{self.name} did not start within {STARTUP_TIMEOUT_S:.0f}s")
        if self._startup_error is not None:
            raise self._startup_error
        if not self.alive:
            raise self._crashed()

    async def call(self, op: str, key: Any, arg: Any, timeout: float | None) -> Any:
        await self.started()
        loop = asyncio.get_running_loop()
        call_id = next(self._ids)
        future = loop.create_future()
        with self._lock:
            if not self.alive:
                raise self._crashed()
            self._pending[call_id] = (loop, future)
        try:
            with self._send_lock:
                self.conn.send((call_id, op, key, arg))
        except (OSError, ValueError):
            with self._lock:
                self._pending.pop(call_id, None)
            raise self._crashed() from None
        try:
            return await asyncio.wait_for(future, timeout) if timeout is not None else await future
        except asyncio.TimeoutError:
            with self._lock:
                self._pending.pop(call_id, None)
            raise EnvTimeout(f"env {op} took longer than env_timeout={timeout}s") from None
        except asyncio.CancelledError:
            with self._lock:
                self._pending.pop(call_id, None)
            raise

    def send_only(self, op: str, key: Any, arg: Any) -> None:
        """A call whose answer nobody waits for (releasing a broken env)."""
        with contextlib.suppress(OSError, ValueError), self._send_lock:
            self.conn.send((-1, op, key, arg))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=2)
            if self.process.is_alive():
                self.process.kill()


def _resolve(waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future], ok: bool, value: Any) -> None:
    loop, future = waiter

    def settle() -> None:
        if not future.done():
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(settle)


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling both ways, else a RuntimeError with its type and message (an
    exception class whose ``__init__`` takes other arguments pickles but does not unpickle)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _answer(conn: Any, lock: threading.Lock, call_id: int, ok: bool, value: Any) -> None:
    if call_id < 0:
        return
    if not ok:
        value = portable_error(value)
    try:
        with lock:
            conn.send((call_id, ok, value))
    except Exception as exc:  # noqa: BLE001 - e.g. an exception or result that does not pickle
        with lock:
            conn.send((call_id, False, RuntimeError(f"{type(value).__name__} could not be sent back: {exc}")))


def env_worker_main(conn: Any, factory: Callable[[], Any]) -> None:
    """A ``process`` worker: envs by episode key, each call on its own thread. One env is built
    before the worker says it is ready, so imports never count against ``env_timeout``."""
    idle: list[Any] = []
    live: dict[int, Any] = {}
    state_lock = threading.Lock()
    send_lock = threading.Lock()

    def take(factory: Callable[[], Any]) -> Any:
        with state_lock:
            if idle:
                return idle.pop()
        return factory()

    def serve(call_id: int, op: str, key: Any, arg: Any) -> None:
        try:
            if op == "describe":
                env = take(arg)
                with state_lock:
                    idle.append(env)
                value: Any = describe_env(env)
            elif op == "reset":
                factory, seed, options = arg
                with state_lock:
                    env = live.get(key)
                if env is None:
                    env = take(factory)
                    with state_lock:
                        live[key] = env
                value = env.reset(seed=seed, options=options)
            elif op == "step":
                with state_lock:
                    env = live[key]
                value = env.step(arg)
            elif op == "release":
                with state_lock:
                    env = live.pop(key, None)
                    if env is not None and arg:
                        idle.append(env)
                if env is not None and not arg:
                    close_quietly(env)
                value = None
            else:
                raise ValueError(f"unknown env worker call {op!r}")
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            _answer(conn, send_lock, call_id, False, exc)
        else:
            _answer(conn, send_lock, call_id, True, value)

    threads = ThreadPoolExecutor(max_workers=256, thread_name_prefix="agentgym-env")
    try:
        idle.append(factory())
    except BaseException as exc:  # noqa: BLE001 - the runner reports it on its first call
        _answer(conn, send_lock, 0, False, exc)
    else:
        _answer(conn, send_lock, 0, True, "ready")
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        threads.submit(serve, *message)
    os._exit(0)  # threads still running a hung call must not keep the process alive
