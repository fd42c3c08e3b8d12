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
import contextlib
import functools
import itertools
import json
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

CALL_EXECUTORS = ("thread", "process", "inline", "openenv")
EPISODE_EXECUTORS = ("workers", "ray")
EXECUTORS = CALL_EXECUTORS + EPISODE_EXECUTORS
STARTUP_TIMEOUT_S = 300.0  # a worker process's start (imports) is not an env call: its own, generous limit


class EnvTimeout(TimeoutError):
    """An env call took longer than ``env_timeout``."""


class WorkerCrashed(RuntimeError):
    """The worker process (or actor, or env server) holding an episode's env went away."""


def _close_quietly(env: Any) -> None:
    with contextlib.suppress(Exception):
        env.close()


def _describe(env: Any) -> dict[str, Any]:
    """What the runner needs to know about an env: its tasks, turn budget and (multi-agent) seats."""
    num_tasks = env.num_tasks() if hasattr(env, "num_tasks") else None
    agents = getattr(env, "agents", None)
    return {"num_tasks": num_tasks, "max_turns": getattr(env, "max_turns", None),
            "agents": list(agents) if agents else None}


class EnvBackend:
    """Runs env calls for a runner. ``open()`` gives a handle for one episode's env.

    For ``workers``/``ray`` (whole episodes run elsewhere, see ``EpisodePool``) the backend
    builds envs inline: the runner only asks it to ``describe`` the env.
    """

    def __init__(self, factory: Callable[[], Any], executor: str = "thread", workers: int | None = None,
                 timeout: float | None = None, urls: list[str] | None = None) -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"env_executor must be one of {EXECUTORS}, got {executor!r}")
        if executor == "openenv" and not urls:
            raise ValueError("env_executor='openenv' needs env_urls: the OpenEnv servers that hold the envs "
                             "(start one with `agentgym env-serve --env NAME --port 8010`)")
        self.factory = factory
        self.kind = "inline" if executor in EPISODE_EXECUTORS else executor
        self.timeout = timeout
        self.urls = [u.rstrip("/") for u in urls or ()]
        self._idle: list[Any] = []
        self._pool: Executor | None = None
        self._workers: list[_WorkerProcess | None] = []
        self._keys = itertools.count()
        if self.kind == "thread":
            self._pool = ThreadPoolExecutor(max_workers=workers or 64, thread_name_prefix="agentgym-env")
        elif self.kind == "process":
            self._workers = [None] * (workers or os.cpu_count() or 1)
        elif self.kind == "openenv":
            self._sessions: list[_OpenEnvSession] = []

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

    def _worker(self, index: int) -> _WorkerProcess:
        """Worker ``index``, started (again) if it is not running."""
        worker = self._workers[index]
        if worker is None or not worker.alive:
            worker = self._workers[index] = _WorkerProcess(_env_worker_main, (self.factory,), name=f"env worker {index}")
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
            return _describe(env)
        finally:
            self._idle.append(env)

    def open(self) -> EnvHandle:
        key = next(self._keys)
        if self.kind == "process":
            return _ProcessHandle(self, key, key % len(self._workers))
        if self.kind == "openenv":
            return _OpenEnvHandle(self)
        return _LocalHandle(self, self._pool)

    async def _session(self) -> _OpenEnvSession:
        if self._sessions:
            return self._sessions.pop()
        url = self.urls[next(self._keys) % len(self.urls)]
        return await _OpenEnvSession.connect(url)

    def shutdown(self) -> None:
        for env in self._idle:
            _close_quietly(env)
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
    """An env in a worker process. The worker is chosen at ``reset`` and kept for the episode: if
    it dies meanwhile, every later call raises ``WorkerCrashed`` (its env is gone)."""

    def __init__(self, backend: EnvBackend, key: int, index: int) -> None:
        self.backend = backend
        self.key = key
        self.index = index
        self.worker: _WorkerProcess | None = None

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list, dict]:
        if self.worker is None:
            self.worker = self.backend._worker(self.index)
        return await self.worker.call("reset", self.key, (self.backend.factory, seed, options),
                                      timeout=self.backend.timeout)

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


# ---- worker processes ----------------------------------------------------------------------
class _WorkerProcess:
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
        error = WorkerCrashed(f"{self.name} (pid {self.process.pid}) died with exit code {self.exitcode}; "
                              "the episodes it held failed, and a new worker takes the next ones")
        with self._lock:
            waiters, self._pending = list(self._pending.values()), {}
        for waiter in waiters:
            _resolve(waiter, False, error)

    def _crashed(self) -> WorkerCrashed:
        return WorkerCrashed(f"{self.name} (pid {self.process.pid}) died with exit code {self.exitcode}; "
                             "the episodes it held failed, and a new worker takes the next ones")

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


def _portable(exc: BaseException) -> BaseException:
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
        value = _portable(value)
    try:
        with lock:
            conn.send((call_id, ok, value))
    except Exception as exc:  # noqa: BLE001 - e.g. an exception or result that does not pickle
        with lock:
            conn.send((call_id, False, RuntimeError(f"{type(value).__name__} could not be sent back: {exc}")))


def _env_worker_main(conn: Any, factory: Callable[[], Any]) -> None:
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
                value: Any = _describe(env)
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
                    _close_quietly(env)
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


# ---- remote envs over OpenEnv's WebSocket protocol -----------------------------------------
class _OpenEnvSession:
    """One ``/ws`` session with an OpenEnv server: one env instance there, reused across episodes."""

    def __init__(self, url: str, ws: Any) -> None:
        self.url = url
        self.ws = ws

    @classmethod
    async def connect(cls, url: str) -> _OpenEnvSession:
        from websockets.asyncio.client import connect

        ws_url = "ws" + url[len("http"):] if url.startswith("http") else url
        try:
            ws = await connect(f"{ws_url}/ws", max_size=None, open_timeout=30, ping_interval=None)
        except Exception as exc:  # noqa: BLE001
            raise WorkerCrashed(f"could not open an OpenEnv session at {url}/ws: {type(exc).__name__}: {exc}. "
                                "Is the env server running (agentgym env-serve --env NAME)?") from exc
        return cls(url, ws)

    async def request(self, message: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        try:
            await self.ws.send(json.dumps(message))
            raw = await asyncio.wait_for(self.ws.recv(), timeout) if timeout is not None else await self.ws.recv()
        except asyncio.TimeoutError:
            raise EnvTimeout(f"OpenEnv {message['type']} at {self.url} took longer than env_timeout={timeout}s") from None
        except Exception as exc:  # noqa: BLE001 - the connection closed: the server or its env is gone
            raise WorkerCrashed(f"OpenEnv session at {self.url} closed: {type(exc).__name__}: {exc}") from exc
        reply = json.loads(raw)
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise RuntimeError(f"OpenEnv server {self.url}: {data.get('message', data)}")
        return reply.get("data") or {}

    async def describe(self, timeout: float | None) -> dict[str, Any]:
        state = await self.request({"type": "state"}, timeout)
        return {"num_tasks": state.get("num_tasks"), "max_turns": state.get("max_turns"),
                "agents": state.get("agents")}

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.transport.abort()


class _OpenEnvHandle(EnvHandle):
    def __init__(self, backend: EnvBackend) -> None:
        self.backend = backend
        self.session: _OpenEnvSession | None = None

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list, dict]:
        if self.session is None:
            self.session = await self.backend._session()
        data = await self.session.request({"type": "reset", "data": {"seed": seed, "options": options}},
                                          self.backend.timeout)
        observation = data.get("observation") or {}
        return observation.get("messages") or [], observation.get("info") or {}

    async def step(self, action: Any) -> tuple[list, float, bool, bool, dict]:
        assert self.session is not None, "reset() first"
        data = await self.session.request({"type": "step", "data": {"message": action}}, self.backend.timeout)
        observation = data.get("observation") or {}
        truncated = bool(observation.get("truncated"))
        terminated = bool(data.get("done")) and not truncated
        return (observation.get("messages") or [], float(data.get("reward") or 0.0), terminated, truncated,
                observation.get("info") or {})

    async def release(self, healthy: bool) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        if healthy:
            self.backend._sessions.append(session)
        else:  # a timed-out or failed call: drop the session, so the server drops that env
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.ws.close(), 1.0)
            session.abort()


# ---- whole episodes in worker processes or Ray actors --------------------------------------
def client_spec(client: Any) -> dict[str, Any]:
    """What a worker needs to build its own client for the same policy servers.

    A ``PolicyClient`` is described by its servers and settings; any other client is sent as it
    is (it must pickle: a test double, say).
    """
    from agentgym.server.client import PolicyClient

    if isinstance(client, PolicyClient):
        return {"policy_client": {
            "urls": [s.url for s in client.servers], "backend": client.backend, "model": client.model,
            "max_retries": client.max_retries, "timeout": client.timeout, "backoff": client.backoff,
            "cooldown": client.cooldown}}
    return {"object": client}


def _build_client(spec: dict[str, Any]) -> Any:
    if "policy_client" in spec:
        from agentgym.server.client import PolicyClient

        return PolicyClient(**spec["policy_client"])
    return spec["object"]


def failed_trajectories(runner: Any, task: Any, group_id: str, sample: int, agents: list[str] | None,
                        reason: str) -> list[Any]:
    """The trajectories of one job whose worker died: one failed episode (per seat for a game)."""
    from agentgym.types import Trajectory

    out = []
    for agent in agents or [None]:
        gid = f"{group_id}/{agent}" if agent is not None else group_id
        task_info = {"seed": task.seed, "index": task.index, "sample": sample, "session": f"{gid}/{sample}"}
        if agent is not None:
            task_info["agent"] = agent
        traj = Trajectory(env_id=runner.env_name, group_id=gid, seed=task.seed, data_source=runner.env_name,
                          task=task_info, status="failed", failure=reason)
        traj.metrics.update({"turns": 0.0, "success": 0.0, "sampled_tokens": 0.0, "tokens": 0.0})
        out.append(traj)
    return out


class EpisodePool:
    """Runs whole episodes on ``size`` workers (processes or Ray actors), each with its own runner.

    ``run_job`` has ``RolloutRunner.run_job``'s signature: the runner's episode loop calls it
    instead of running the episode itself. Each job goes to the worker with the fewest jobs in
    flight. A worker that dies fails exactly the jobs it held (each once, as failed
    trajectories) and is replaced; the jobs after it run on the new worker.
    """

    def __init__(self, runner: Any, kind: str, size: int | None = None) -> None:
        if kind not in EPISODE_EXECUTORS:
            raise ValueError(f"EpisodePool kind must be one of {EPISODE_EXECUTORS}, got {kind!r}")
        from dataclasses import replace

        self.runner = runner
        self.kind = kind
        self.size = size or os.cpu_count() or 1
        cfg = runner.config
        self.spec = {
            "runner_class": type(runner),  # pickled by name: this module never imports the runner
            "env_factory": runner.envs.factory,
            "env_name": runner.env_name,
            "tokenizer": runner.chat.tokenizer,
            "config": replace(cfg, env_executor=cfg.worker_env_executor, env_workers=None,
                              max_concurrency=max(1, cfg.max_concurrency // self.size + 1)),
            "client": client_spec(runner.client),
        }
        self._workers: list[Any] = [None] * self.size
        self._busy = [0] * self.size

    def _worker(self, index: int) -> Any:
        worker = self._workers[index]
        if worker is None or not worker.alive:
            if self.kind == "workers":
                worker = _WorkerProcess(_episode_worker_main, (self.spec,), name=f"episode worker {index}")
            else:
                worker = _RayEpisodeWorker(self.spec, index)
            self._workers[index] = worker
        return worker

    async def run_job(self, task: Any, group_id: str, sample: int, max_turns: int | None) -> list[Any]:
        index = min(range(self.size), key=self._busy.__getitem__)
        self._busy[index] += 1
        worker = self._worker(index)
        try:
            return await worker.call("job", None, (task, group_id, sample, max_turns), timeout=None)
        except WorkerCrashed as exc:
            agents = (await self.runner.env_info()).get("agents")
            return failed_trajectories(self.runner, task, group_id, sample, agents, f"episode worker crashed: {exc}")
        finally:
            self._busy[index] -= 1

    def shutdown(self) -> None:
        for worker in self._workers:
            if worker is not None:
                worker.close()
        self._workers = [None] * self.size


def _episode_worker_main(conn: Any, spec: dict[str, Any]) -> None:
    """A ``workers`` worker: a runner of its own; jobs in, trajectories out."""
    import asyncio as _asyncio

    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    _asyncio.run(_episode_worker(conn, spec))
    os._exit(0)


def _make_runner(spec: dict[str, Any]) -> Any:
    runner = spec["runner_class"](spec["env_factory"], _build_client(spec["client"]), spec["tokenizer"],
                                  spec["config"])
    runner.env_name = spec["env_name"]
    return runner


async def _episode_worker(conn: Any, spec: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    runner = _make_runner(spec)
    client = runner.client

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            loop.call_soon_threadsafe(inbox.put_nowait, message)
        loop.call_soon_threadsafe(inbox.put_nowait, None)

    async def job(call_id: int, args: tuple[Any, ...]) -> None:
        try:
            value = await runner.run_job(*args)
        except BaseException as exc:  # noqa: BLE001 - run_job never raises for env/server failures
            conn.send((call_id, False, _portable(exc)))
        else:
            conn.send((call_id, True, value))

    threading.Thread(target=read, daemon=True).start()
    conn.send((0, True, "ready"))
    running: set[asyncio.Task] = set()
    while (message := await inbox.get()) is not None:
        call_id, _op, _key, args = message
        task = asyncio.create_task(job(call_id, args))
        running.add(task)
        task.add_done_callback(running.discard)
    for task in running:
        task.cancel()
    with contextlib.suppress(Exception):
        await runner.aclose()
        aclose = getattr(client, "aclose", None)
        if aclose is not None:
            await aclose()


class _RayEpisodeWorker:
    """An ``EpisodeActor`` on Ray, with ``_WorkerProcess``'s ``call``/``alive``/``close``."""

    def __init__(self, spec: dict[str, Any], index: int) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        actor_cls = ray.remote(max_restarts=0)(EpisodeActor)
        self.index = index
        self.actor = actor_cls.options(name=None).remote(spec)
        self.alive = True

    async def call(self, op: str, key: Any, args: tuple[Any, ...], timeout: float | None) -> Any:
        import ray.exceptions

        try:
            return await self.actor.run_job.remote(*args)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
            self.alive = False
            raise WorkerCrashed(f"Ray episode actor {self.index} died: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor)
        self.alive = False


class EpisodeActor:
    """The Ray actor behind ``env_executor='ray'`` (an async actor: its jobs run concurrently)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.runner = _make_runner(spec)
        self.started = time.time()

    async def run_job(self, task: Any, group_id: str, sample: int, max_turns: int | None) -> list[Any]:
        return await self.runner.run_job(task, group_id, sample, max_turns)

    def pid(self) -> int:
        return os.getpid()
