"""The DataPool: finished trajectory groups, between whatever makes them and the trainer.

One pool serves every producer: the env rollout runner, the gateway's agent source, and a gateway
running as a process of its own (``agentgym gateway --data-pool-name NAME``). A *group* is one
task's episodes (one GRPO group). It is opened with the number of deliveries it waits for
(``size``: 1 when the runner hands over a whole group at once, ``rollout.n`` when every gateway
session delivers its own trajectories) and, when asynchronous training admitted it, the admission
``ticket`` and the weight ``version`` the servers held then. A group is *complete* once all its
deliveries arrived; complete groups are numbered in the order they completed.

Consumers take complete groups: ``ready()`` lists them in the order they completed, ``take(ids)``
takes chosen ones (the asynchronous trainer's deadline rule picks them, see
``agentgym.trainer.staleness``). Nothing delivered is ever dropped (dynamic sampling drops a flat group
before it is delivered, ``discard``-ing its announced place: ``agentgym.trainer.async_loop``):
``max_queue_size`` bounds the complete groups waiting, and is honoured by the producers' admission
(``full()``; they start no new task while it holds), not by refusing or discarding finished work.
Every trajectory keeps the policy version of each sampled token (``Turn.versions``).

In a local run the pool is an object of the trainer's process; with Ray it is an actor
(``create_pool_actor``, optionally named so another process can find it: ``connect_pool``).
``PoolClient`` gives both the same ``async`` methods.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.types import Trajectory

DEFAULT_NAMESPACE = "agentgym"


@dataclass
class PoolGroup:
    """One group in the pool: what is known about it and the deliveries received so far."""

    group_id: str
    size: int
    ticket: int | None = None  # admission order (None: pushed from outside, e.g. a gateway process)
    version: int | None = None  # the servers' weight version when the task was admitted
    task: dict[str, Any] | None = None
    sessions: list[list[Trajectory]] = field(default_factory=list)
    completed: int | None = None  # completion order, once complete

    @property
    def complete(self) -> bool:
        return len(self.sessions) >= self.size

    def trajectories(self) -> list[Trajectory]:
        return [t for session in self.sessions for t in session]

    def info(self) -> dict[str, Any]:
        """What the trainer's batch selection needs, without the trajectories."""
        return {
            "group_id": self.group_id,
            "ticket": self.ticket,
            "version": self.version,
            "complete": self.complete,
            "completed": self.completed,
            "task": self.task,
        }


class DataPool:
    """Finished sessions' trajectories, grouped by group id (see the module docstring).

    ``group_size``: the size of a group first seen through ``add`` (a gateway process pushing
    sessions it never announced). ``max_queue_size``: complete groups waiting before ``full()``.
    """

    def __init__(self, max_queue_size: int | None = None, group_size: int | None = None) -> None:
        if max_queue_size is not None and max_queue_size < 1:
            raise ValueError(f"max_queue_size must be at least 1 (or None: unbounded), got {max_queue_size}")
        self.max_queue_size = max_queue_size
        self.group_size = group_size
        self._groups: dict[str, PoolGroup] = {}
        self._completions = 0
        self._taken = 0
        self._changed = asyncio.Event()
        self._changes = 0

    # ---- producers -------------------------------------------------------------------------
    def open_group(
        self,
        group_id: str,
        size: int | None = None,
        *,
        ticket: int | None = None,
        version: int | None = None,
        task: dict[str, Any] | None = None,
    ) -> None:
        """Announce a group: ``size`` deliveries make it complete."""
        size = self.group_size if size is None else size
        if size is None or size < 1:
            raise ValueError(f"a group needs at least one session, got size={size}")
        if group_id in self._groups:
            raise ValueError(f"group {group_id!r} is already open")
        self._groups[group_id] = PoolGroup(group_id, int(size), ticket, version, task)
        self._notify()

    def add(self, group_id: str, trajectories: Sequence[Trajectory]) -> None:
        """One finished session's trajectories (possibly none: an agent that never called the model).
        A group never announced is opened with ``group_size`` when the pool has one."""
        group = self._groups.get(group_id)
        if group is None:
            if self.group_size is None:
                raise KeyError(f"group {group_id!r} was never opened; call open_group(group_id, size) first")
            self.open_group(group_id)
            group = self._groups[group_id]
        if group.complete:
            raise ValueError(f"group {group_id!r} already has all its {group.size} sessions")
        group.sessions.append(list(trajectories))
        if group.complete:
            group.completed = self._completions
            self._completions += 1
        self._notify()

    def full(self) -> bool:
        """``max_queue_size`` complete groups are waiting: start no new task until the trainer takes some."""
        return self.max_queue_size is not None and self.ready_count() >= self.max_queue_size

    # ---- what is there ---------------------------------------------------------------------
    def complete(self, group_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and group.complete

    def pending(self) -> list[str]:
        """Open groups still waiting for deliveries, in the order they were opened."""
        return [g for g, group in self._groups.items() if not group.complete]

    def ready(self) -> list[str]:
        """Complete groups, in the order they completed."""
        done = [group for group in self._groups.values() if group.complete]
        return [group.group_id for group in sorted(done, key=lambda g: g.completed or 0)]

    def ready_count(self) -> int:
        return sum(1 for group in self._groups.values() if group.complete)

    def groups_info(self) -> list[dict[str, Any]]:
        """Every open group's ``PoolGroup.info()``, in the order they were opened."""
        return [group.info() for group in self._groups.values()]

    def stats(self) -> dict[str, float]:
        ready = self.ready_count()
        return {"ready": float(ready), "pending": float(len(self._groups) - ready), "taken": float(self._taken)}

    def __len__(self) -> int:
        return len(self._groups)

    # ---- consumers ---------------------------------------------------------------------------
    def pop(self, group_id: str) -> list[Trajectory]:
        """A complete group's trajectories (its sessions' in the order they finished); forgets it."""
        group = self._groups.get(group_id)
        if group is None or not group.complete:
            have = len(group.sessions) if group else 0
            raise KeyError(
                f"group {group_id!r} is not complete ({have} of {group.size if group else '?'} sessions finished)"
            )
        del self._groups[group_id]
        self._taken += 1
        self._notify()
        return group.trajectories()

    def take(self, group_ids: Sequence[str]) -> list[tuple[dict[str, Any], list[Trajectory]]]:
        """Chosen complete groups as ``(info, trajectories)``, in the order asked; forgets them."""
        out = []
        for group_id in group_ids:
            info = self._groups[group_id].info() if group_id in self._groups else {}
            out.append((info, self.pop(group_id)))
        return out

    def pop_complete(self) -> list[list[Trajectory]]:
        """Every complete group, oldest first (see ``pop``)."""
        return [self.pop(g) for g in self.ready()]

    def discard(self, group_id: str) -> None:
        """Forget a group whatever its state (a run that failed, a group dynamic sampling dropped)."""
        if self._groups.pop(group_id, None) is not None:
            self._notify()

    # ---- waiting -------------------------------------------------------------------------------
    def _notify(self) -> None:
        self._changes += 1
        self._changed.set()

    def changes(self) -> int:
        """A counter that moves on every change (``wait_changed(after=...)``)."""
        return self._changes

    async def wait_changed(self, after: int | None = None, timeout: float | None = None) -> int:
        """Until the pool changes after ``changes() == after`` (None: from now): a group opened,
        delivered or taken. Returns the counter (unchanged on timeout)."""
        after = self._changes if after is None else after

        async def until() -> None:
            while self._changes <= after:
                self._changed.clear()
                await self._changed.wait()

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(until(), timeout)
        return self._changes

    # ---- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every group with its trajectories (JSON-able), and the counters."""
        return {
            "completions": self._completions,
            "taken": self._taken,
            "groups": [
                {**group.info(), "size": group.size, "sessions": [[t.to_dict() for t in s] for s in group.sessions]}
                for group in self._groups.values()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._groups = {}
        for g in state.get("groups", []):
            group = PoolGroup(
                g["group_id"],
                int(g["size"]),
                g.get("ticket"),
                g.get("version"),
                g.get("task"),
                [[Trajectory.from_dict(t) for t in s] for s in g["sessions"]],
                g.get("completed"),
            )
            self._groups[group.group_id] = group
        self._completions = int(state.get("completions", 0))
        self._taken = int(state.get("taken", 0))
        self._notify()


class PoolClient:
    """The same ``async`` methods over a ``DataPool`` in this process or a pool actor on Ray."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.remote = not isinstance(pool, DataPool)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.remote:
            return await getattr(self.pool, method).remote(*args, **kwargs)
        result = getattr(self.pool, method)(*args, **kwargs)
        return await result if asyncio.iscoroutine(result) else result

    async def open_group(self, group_id: str, size: int | None = None, **meta: Any) -> None:
        await self._call("open_group", group_id, size, **meta)

    async def add(self, group_id: str, trajectories: Sequence[Trajectory]) -> None:
        await self._call("add", group_id, list(trajectories))

    async def discard(self, group_id: str) -> None:
        await self._call("discard", group_id)

    async def groups_info(self) -> list[dict[str, Any]]:
        return await self._call("groups_info")

    async def changes(self) -> int:
        return await self._call("changes")

    async def take(self, group_ids: Sequence[str]) -> list[tuple[dict[str, Any], list[Trajectory]]]:
        return await self._call("take", list(group_ids))

    async def full(self) -> bool:
        return await self._call("full")

    async def stats(self) -> dict[str, float]:
        return await self._call("stats")

    async def wait_changed(self, after: int | None = None, timeout: float | None = None) -> int:
        return await self._call("wait_changed", after, timeout)

    async def state_dict(self) -> dict[str, Any]:
        return await self._call("state_dict")

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        await self._call("load_state_dict", state)


def create_pool_actor(name: str | None = None, namespace: str = DEFAULT_NAMESPACE, **kwargs: Any) -> Any:
    """A ``DataPool`` as a Ray actor (Ray must be initialised); ``name``: findable by other processes
    (``connect_pool``). ``kwargs`` go to ``DataPool``."""
    import ray

    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000}
    if name:
        options.update(name=name, namespace=namespace, get_if_exists=False)
    return ray.remote(DataPool).options(**options).remote(**kwargs)


def connect_pool(
    name: str, namespace: str = DEFAULT_NAMESPACE, address: str | None = None, timeout: float = 60.0
) -> Any:
    """The named pool actor, joining the Ray cluster at ``address`` first when this process is not in
    one yet. Waits up to ``timeout`` s for the actor to appear (the trainer may still be starting)."""
    import time

    import ray

    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=namespace, logging_level="WARNING", log_to_driver=False)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get_actor(name, namespace=namespace)
        except ValueError:
            if time.monotonic() > deadline:
                raise ValueError(
                    f"no DataPool named {name!r} in Ray namespace {namespace!r} at "
                    f"{address or 'auto'}; start the trainer first, or check --data-pool-name "
                    f"and --ray-namespace"
                ) from None
            time.sleep(0.5)


def kill_pool_actor(actor: Any) -> None:
    import ray

    with contextlib.suppress(Exception):
        ray.kill(actor)
