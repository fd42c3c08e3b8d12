"""The asynchronous loop's scheduler: the rollout side and the trainer side on one asyncio loop.

``AsyncCoordinator`` knows nothing of PPO. It is given

* a *task source* (a ``TrajectorySource``: ``next_tasks()``, the next update's tasks in the
  synchronous trainer's order; ``run_task(task, group_id)``, one task's group of trajectories;
  ``weight_update(version)``, an async context manager that holds model calls during a push, and
  ``resumes_aborted``, whether its episodes continue a generation a push aborted);
* a ``PoolClient`` (``agentgym.rollout.data_pool``);
* a ``StalenessPlan`` (``agentgym.trainer.staleness``: the admission budget and the lag bound);
* ``push(version, snapshot, abort)``: loads new weights into every policy server, and optionally
  ``snapshot()``: copies the trainer's weights so the push can run while training goes on
  (``async_training.checkpoint_engine.enable``);
* optionally a *group filter* (dynamic sampling, ``agentgym.trainer.dynamic_sampling.GroupFilter``):
  ``keep(group)``, whether a finished group goes to the pool, ``has_signal(group)`` and ``step_metrics()``.

Dynamic sampling filters where groups form: a finished group the filter drops never enters the pool
(its announced place there is discarded), and its admission place is given back (``dropped``), so the
admission budget and the trainer's batch choice count only the tasks that are kept or still running.
That keeps the lag bound for what is trained (the kept tasks admitted under ``V`` still number at most
``V * b + A``), and a dropped task is never consumed work: a new task takes its place under the
servers' current version. Filtering at the trainer's take instead would let flat groups fill the pool
(``max_queue_size``) and hold admission places until an update took them. The flat groups the filter keeps
past its drop budget are the exception: they are taken like any other (their admission places counted as
consumed), but when a taken batch also holds groups with a signal, only those train
(``sampling/flat_groups_left_out`` counts the rest), as the synchronous trainer trains on the groups with a
signal it has; a batch of flat groups alone trains as it is (the flat-reward warning).

The rollout side (``_produce``) admits tasks while the plan allows (and the pool is not
``full()``, and fewer than ``max_tasks_in_flight`` run), runs each as its own asyncio task and
delivers its group to the pool. The trainer side asks ``next_batch(step)`` for an update's groups
(``select_batch``) and calls ``after_update(step)``; every ``sync_every`` updates (and after the
last) that pushes the weights as version ``step``:

* ``partial_rollout=False``: admission stops, every running episode finishes on the weights it
  started with (the drain), the weights load, admission resumes under the new version;
* ``partial_rollout=True``: the servers abort running generations, load, and the episodes continue
  where they stopped on the new weights (``RolloutRunner``); admission never stops. A source whose
  episodes cannot continue an aborted generation (the gateway's) is pushed inside its
  ``weight_update`` instead: model calls in flight finish, the next ones wait for the new weights.

``checkpoint_state()`` is a consistent cut for checkpoints: admission stops, running episodes
finish (nothing is dropped, so nothing is biased), and the pool, the unadmitted tasks, the
counters and the source's data position are returned; ``load_state_dict`` restores them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentgym.rollout.data_pool import PoolClient
from agentgym.rollout.sources import TrajectorySource
from agentgym.trainer.staleness import StalenessPlan, lag_stats, select_batch
from agentgym.types import Trajectory

Push = Callable[[int, Any, bool], Awaitable[dict[str, float]]]


class AsyncCoordinator:
    """Admission, the pool, batch choice and weight pushes of asynchronous training."""

    def __init__(
        self,
        source: TrajectorySource,
        pool: PoolClient,
        plan: StalenessPlan,
        push: Push,
        *,
        partial_rollout: bool = False,
        snapshot: Callable[[], Any] | None = None,
        max_tasks_in_flight: int = 64,
        version: int = 0,
        group_filter: Any = None,
    ) -> None:
        self.source = source
        self.pool = pool
        self.plan = plan
        self.push_fn = push
        self.snapshot_fn = snapshot
        self.partial_rollout = partial_rollout
        self.max_tasks_in_flight = max(1, max_tasks_in_flight)
        self.version = version
        self.group_filter = group_filter
        self.started = 0  # tasks admitted (their tickets)
        self.dropped = 0  # of those, groups the filter dropped: their admission places were given back
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.in_flight: dict[int, asyncio.Task] = {}
        self.closed_for: set[str] = set()  # why admission is stopped: "sync", "checkpoint"
        self.lag_histogram: collections.Counter[int] = collections.Counter()
        self.last_push: dict[str, float] = {}
        self.pushes = 0
        self._changed = asyncio.Event()
        self._changes = 0
        self._producer: asyncio.Task | None = None
        self._stopping = False
        self._push_task: asyncio.Task | None = None
        self._failure: BaseException | None = None
        # idle accounting: time with no task running (rollout side), time waiting for a batch (trainer)
        now = time.perf_counter()
        self._idle_since: float | None = now
        self._rollout_idle = 0.0
        self._mark = (now, 0.0)  # (time, rollout idle total) when the last batch was handed out

    # ---- life ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._producer is None:
            self._stopping = False
            self._producer = asyncio.get_running_loop().create_task(self._produce())

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in (self._producer, self._push_task, *self.in_flight.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._producer = None

    def _wake(self) -> None:
        self._changes += 1
        self._changed.set()

    async def _wait(self, after: int, timeout: float = 1.0) -> None:
        """Until something changed since ``self._changes == after`` (or ``timeout`` s)."""

        async def until() -> None:
            while self._changes <= after:
                self._changed.clear()
                await self._changed.wait()

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(until(), timeout)

    def _check(self) -> None:
        if self._failure is not None:
            raise RuntimeError(
                f"the rollout side of asynchronous training failed: {type(self._failure).__name__}: {self._failure}"
            ) from self._failure

    # ---- the rollout side ------------------------------------------------------------------------
    @property
    def counted(self) -> int:
        """Admitted tasks that count against admission: kept, running, or waiting to be trained."""
        return self.started - self.dropped

    def admission_open(self) -> bool:
        return (
            not self.closed_for
            and self.plan.may_admit(self.counted, self.version)
            and len(self.in_flight) < self.max_tasks_in_flight
        )

    async def _produce(self) -> None:
        total = self.plan.total_tasks
        try:
            # with a filter a running task may still be dropped and give its place back: keep producing
            while total is None or self.counted < total or self.group_filter is not None:
                while True:
                    # asyncio.wait_for (Python < 3.12) can swallow a cancel that lands as its wait ends
                    if self._stopping:
                        return
                    seen = self._changes
                    if self.admission_open() and not await self.pool.full():
                        break
                    await self._wait(seen)
                if not self.queue:
                    self.queue.extend(await self.source.next_tasks())
                    if not self.queue:
                        raise RuntimeError("the trajectory source has no more tasks")
                task = self.queue.popleft()
                ticket = self.started
                self.started += 1
                group_id = f"task{ticket}"
                await self.pool.open_group(group_id, 1, ticket=ticket, version=self.version, task=task)
                self._set_running(+1)
                self.in_flight[ticket] = asyncio.get_running_loop().create_task(self._run(ticket, group_id, task))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer side, which raises it
            self._failure = exc
            self._wake()

    async def _run(self, ticket: int, group_id: str, task: dict[str, Any]) -> None:
        try:
            trajectories = await self.source.run_task(task, group_id)
            for traj in trajectories:
                traj.group_id = group_id
            if self.group_filter is not None and not self.group_filter.keep(trajectories):
                self.dropped += 1
                await self.pool.discard(group_id)
            else:
                await self.pool.add(group_id, trajectories)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer side
            self._failure = exc
        finally:
            self.in_flight.pop(ticket, None)
            self._set_running(-1)
            self._wake()

    def _set_running(self, change: int) -> None:
        now = time.perf_counter()
        running = len(self.in_flight) + (1 if change > 0 else 0)
        if change > 0 and self._idle_since is not None:
            self._rollout_idle += now - self._idle_since
            self._idle_since = None
        elif change < 0 and running == 0 and self._idle_since is None:
            self._idle_since = now

    def _idle_total(self, now: float) -> float:
        return self._rollout_idle + (now - self._idle_since if self._idle_since is not None else 0.0)

    async def _drain(self) -> None:
        while self.in_flight:
            seen = self._changes
            self._check()
            await self._wait(seen)

    # ---- the trainer side ------------------------------------------------------------------------
    async def next_batch(self, step: int) -> tuple[list[Trajectory], dict[str, float], list[dict[str, Any]]]:
        """The groups update ``step`` trains on (their trajectories in admission order), the step's
        ``async/*`` metrics, and each group's pool info (``ticket``, ``version``, ``task``)."""
        self.start()
        waited_from = time.perf_counter()
        deadline_wait = False
        while True:
            self._check()
            seen, after = self._changes, await self.pool.changes()
            choice = select_batch(await self.pool.groups_info(), step, self.plan, self.version, self.counted)
            if choice.group_ids is not None:
                break
            deadline_wait = deadline_wait or choice.deadline_wait
            await self._wait_pool(seen, after)
        taken = await self.pool.take(choice.group_ids)
        self._wake()
        left_out = 0
        if self.group_filter is not None:  # flat groups kept past the drop budget never train beside a signal
            signal = [(info, group) for info, group in taken if self.group_filter.has_signal(group)]
            if signal:
                left_out, taken = len(taken) - len(signal), signal
        now = time.perf_counter()
        trajectories = [t for _, group in taken for t in group]
        oldest = []
        for info, group in taken:
            for traj in group:
                version = traj.oldest_version()
                oldest.append(version if version is not None else info.get("version"))
        for v in oldest:
            if v is not None:
                self.lag_histogram[step - 1 - v] += 1
        last_time, last_idle = self._mark
        wall = max(now - last_time, 1e-9)
        idle = self._idle_total(now)
        self._mark = (now, idle)
        stats = await self.pool.stats()
        metrics = {
            **lag_stats(step, oldest),
            "async/version_lag/bound": float(self.plan.max_lag),
            "async/pool_size": stats["ready"],
            "async/running_tasks": float(len(self.in_flight)),
            "async/rollout_idle_frac": min(1.0, (idle - last_idle) / wall),
            "async/trainer_idle_frac": min(1.0, (now - waited_from) / wall),
            "async/deadline_wait": float(deadline_wait),
            "async/servers_version": float(self.version),
            "async/admitted_tasks": float(self.started),
        }
        if self.group_filter is not None:
            metrics.update(self.group_filter.step_metrics())
            metrics["sampling/flat_groups_left_out"] = float(left_out)
        return trajectories, metrics, [info for info, _ in taken]

    async def _wait_pool(self, seen: int, after: int) -> None:
        """Until the pool changes after ``after`` or this coordinator's state after ``seen``."""
        pool_change = asyncio.ensure_future(self.pool.wait_changed(after, 1.0))
        own_change = asyncio.ensure_future(self._wait(seen))
        done, pending = await asyncio.wait({pool_change, own_change}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def after_update(self, step: int, last: bool = False) -> dict[str, float]:
        """Push the weights as version ``step`` when a sync is due; returns what the trainer logs."""
        if step % self.plan.sync_every and not last:
            return {}
        return await self.sync(step)

    async def sync(self, version: int) -> dict[str, float]:
        """One weight push (see the module docstring); with a snapshot function it runs in the
        background and the trainer goes on (the previous push is awaited first)."""
        started = time.perf_counter()
        await self.wait_push()
        if self.snapshot_fn is None:
            return {**await self._push(version, None), "async/sync_blocked_s": time.perf_counter() - started}
        snapshot = await asyncio.to_thread(self.snapshot_fn)
        self._push_task = asyncio.get_running_loop().create_task(self._push(version, snapshot))
        out = {f"{k}_previous" if k.startswith("weight_sync/") else k: v for k, v in self.last_push.items()}
        return {**out, "async/sync_blocked_s": time.perf_counter() - started}

    async def wait_push(self) -> None:
        if self._push_task is not None:
            task, self._push_task = self._push_task, None
            await task

    async def _push(self, version: int, snapshot: Any) -> dict[str, float]:
        started = time.perf_counter()
        if not self.partial_rollout:
            self.closed_for.add("sync")
            try:
                await self._drain()
            except BaseException:
                self.closed_for.discard("sync")
                raise
        drained = time.perf_counter()
        try:
            abort = self.partial_rollout and self.source.resumes_aborted
            # a source whose episodes cannot continue an aborted generation holds its model calls instead
            hold = (
                self.source.weight_update(version) if self.partial_rollout and not abort else contextlib.nullcontext()
            )
            async with hold:
                metrics = await self.push_fn(version, snapshot, abort)
            self.version = version
            self.pushes += 1
        finally:
            self.closed_for.discard("sync")
            self._wake()
        self.last_push = {**metrics, "async/drain_s": drained - started, "async/push_s": time.perf_counter() - drained}
        return dict(self.last_push)

    # ---- checkpoints -------------------------------------------------------------------------------
    async def checkpoint_state(self) -> dict[str, Any]:
        """A consistent cut (see the module docstring); admission resumes once it is taken."""
        await self.wait_push()
        self.closed_for.add("checkpoint")
        try:
            await self._drain()
            self._check()
            return {
                "started": self.started,
                "dropped": self.dropped,
                "version": self.version,
                "queue": list(self.queue),
                "pool": await self.pool.state_dict(),
                "source": self.source.state_dict(),
            }
        finally:
            self.closed_for.discard("checkpoint")
            self._wake()

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``checkpoint_state`` before ``start``."""
        if self._producer is not None:
            raise RuntimeError("load the asynchronous state before the rollout side starts")
        self.started = int(state["started"])
        self.dropped = int(state.get("dropped", 0))
        self.version = int(state["version"])
        self.queue = collections.deque(state.get("queue") or [])
        await self.pool.load_state_dict(state["pool"])
        if state.get("source") is not None:
            self.source.load_state_dict(state["source"])
