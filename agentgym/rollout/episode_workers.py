"""Whole episodes in worker processes or Ray actors (``env_executor`` ``workers`` / ``ray``), for when
the runner's own process is the ceiling."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from typing import Any

from agentgym.rollout.env_handles import EPISODE_EXECUTORS, WorkerCrashed
from agentgym.rollout.env_processes import WorkerProcess, portable_error


def client_spec(client: Any) -> dict[str, Any]:
    """What a worker needs to build its own client for the same policy servers.

    A ``PolicyClient`` is described by its servers and settings; any other client is sent as it
    is (it must pickle: a test double, say).
    """
    from agentgym.client import PolicyClient

    if isinstance(client, PolicyClient):
        return {
            "policy_client": {
                "urls": [s.url for s in client.servers],
                "backend": client.backend,
                "model": client.model,
                "max_retries": client.max_retries,
                "timeout": client.timeout,
                "backoff": client.backoff,
                "cooldown": client.cooldown,
            }
        }
    return {"object": client}


def _build_client(spec: dict[str, Any]) -> Any:
    if "policy_client" in spec:
        from agentgym.client import PolicyClient

        return PolicyClient(**spec["policy_client"])
    return spec["object"]


def failed_trajectories(
    runner: Any, task: Any, group_id: str, sample: int, agents: list[str] | None, reason: str
) -> list[Any]:
    """The trajectories of one job whose worker died: one failed episode (per seat for a game)."""
    from agentgym.types import Trajectory

    out = []
    for agent in agents or [None]:
        gid = f"{group_id}/{agent}" if agent is not None else group_id
        task_info = {"seed": task.seed, "index": task.index, "sample": sample, "session": f"{gid}/{sample}"}
        if agent is not None:
            task_info["agent"] = agent
        traj = Trajectory(
            env_id=runner.env_name,
            group_id=gid,
            seed=task.seed,
            data_source=runner.env_name,
            task=task_info,
            status="failed",
            failure=reason,
        )
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
            "template_kwargs": dict(getattr(runner.chat, "_extra_kwargs", {}) or {}),  # e.g. enable_thinking
            "config": replace(
                cfg,
                env_executor=cfg.worker_env_executor,
                env_workers=None,
                max_concurrency=max(1, cfg.max_concurrency // self.size + 1),
            ),
            "client": client_spec(runner.client),
        }
        self._workers: list[Any] = [None] * self.size
        self._busy = [0] * self.size

    def _worker(self, index: int) -> Any:
        worker = self._workers[index]
        if worker is None or not worker.alive:
            if self.kind == "workers":
                worker = WorkerProcess(_episode_worker_main, (self.spec,), name=f"episode worker {index}")
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
    tokenizer = spec["tokenizer"]
    if spec.get("template_kwargs"):
        from agentgym.rollout.chat import ChatTokenizer

        tokenizer = ChatTokenizer(tokenizer, template_kwargs=spec["template_kwargs"])
    runner = spec["runner_class"](spec["env_factory"], _build_client(spec["client"]), tokenizer, spec["config"])
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
            conn.send((call_id, False, portable_error(exc)))
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
    """An ``EpisodeActor`` on Ray, with ``WorkerProcess``'s ``call``/``alive``/``close``."""

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
            raise WorkerCrashed(
                f"Ray episode actor {self.index} died: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc

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
