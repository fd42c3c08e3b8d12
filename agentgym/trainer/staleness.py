"""How stale a trained sample may be: admission control and the trainer's batch choice.

Notation (``docs/async_training.md`` derives the bound):

* ``b`` = ``data.train_batch_size``: tasks (groups of ``rollout.n`` episodes) per trainer update;
* ``K`` = ``async_training.trigger_parameter_sync_step``: updates per weight push, so samples per
  sync = ``K * b`` tasks;
* ``s`` = ``async_training.staleness_threshold``;
* ``V``: the weight version the policy servers hold (the number of updates in those weights;
  pushes publish ``V = K, 2K, ...``, and the last step);
* a task is *admitted* (its first episode starts) under the ``V`` the servers hold at that moment.

**Admission**: a new task may start only while ``started < V * b + A`` with the budget
``A = floor((1 + s) * K * b)``: the tasks started under versions ``<= V`` never exceed the ``V * b``
the trainer consumed to make ``V``, plus ``(1 + s)`` times one sync's worth. Finished work is never
discarded.

**Lag**: a trajectory trained by update ``t`` (which starts from weights ``t - 1``) has version lag
``t - 1 - v``, ``v`` the oldest version among its sampled tokens. Every trained trajectory has lag
at most ``L = ceil(A / b) - 1`` (``max_lag``); with ``s = 0`` and ``K = 1``, ``L = 0``: the
synchronous trainer. The deadline of a task admitted under ``V`` is update ``V + L + 1``.

**Batch choice** (``select_batch``): the trainer takes the groups that completed first, except that
it must keep every deadline reachable: for each deadline ``d`` it counts the unconsumed tasks due by
``d`` (admitted, and those admission may still start) against the ``(d - t) * b`` places the later
updates up to ``d`` have, and takes the surplus now, from the groups due soonest (completed ones
first; it waits for one still running only when it must). Without partial rollout completion order
alone already meets every deadline (the weight push waits for running episodes, so a group is never
overtaken by tasks admitted after a newer version), and the rule never makes the trainer wait; with
partial rollout a long episode can span pushes, and the rule makes the trainer wait for it rather
than let it go stale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StalenessPlan:
    """The numbers of admission control (see the module docstring)."""

    batch_tasks: int  # b
    sync_every: int = 1  # K
    staleness_threshold: float = 0.0  # s
    total_tasks: int | None = None  # tasks the run trains on (steps * b); None: endless

    def __post_init__(self) -> None:
        if self.batch_tasks < 1 or self.sync_every < 1:
            raise ValueError("batch_tasks and sync_every must be at least 1")
        if self.staleness_threshold < 0:
            raise ValueError(f"staleness_threshold must be >= 0, got {self.staleness_threshold}")

    @property
    def budget(self) -> int:
        """``A = floor((1 + s) * K * b)``: tasks that may be started beyond those already trained on."""
        return math.floor((1 + self.staleness_threshold) * self.sync_every * self.batch_tasks + 1e-9)

    @property
    def max_lag(self) -> int:
        """``L = ceil(A / b) - 1``: the largest version lag of any trained trajectory."""
        return -(-self.budget // self.batch_tasks) - 1

    def admission_limit(self, version: int) -> int:
        """How many tasks may have been started in all while the servers hold ``version``."""
        limit = version * self.batch_tasks + self.budget
        return limit if self.total_tasks is None else min(limit, self.total_tasks)

    def may_admit(self, started: int, version: int) -> bool:
        return started < self.admission_limit(version)

    def deadline(self, version: int) -> int:
        """The last update that may train a task admitted under ``version``."""
        return version + self.max_lag + 1


@dataclass
class Choice:
    """``select_batch``'s answer: the groups to take (None: wait), and whether it waits because a
    deadline needs a group still running although enough others are complete."""

    group_ids: list[str] | None
    deadline_wait: bool = False


def select_batch(
    groups: Sequence[dict[str, Any]],
    step: int,
    plan: StalenessPlan,
    version: int,
    started: int,
    size: int | None = None,
) -> Choice:
    """The ``size`` (default ``b``) groups update ``step`` trains on, from the pool's ``groups_info``.

    ``groups``: every unconsumed group (complete or running) with ``ticket`` (None: pushed from outside
    the admission, no deadline), ``version`` (admitted under), ``complete`` and ``completed`` (order).
    ``version``: the servers' version now; ``started``: tasks admitted so far.
    """
    size = plan.batch_tasks if size is None else size
    b = plan.batch_tasks

    def due(group: dict[str, Any]) -> float:
        if group.get("ticket") is None or group.get("version") is None:
            return math.inf
        return max(step, plan.deadline(int(group["version"])))

    complete = sorted((g for g in groups if g["complete"]), key=lambda g: g.get("completed") or 0)
    if len(complete) < size:
        return Choice(None)
    admitted = [due(g) for g in groups if due(g) != math.inf]
    candidates = sorted(set(admitted) | {max(step, plan.deadline(version))})
    chosen: list[dict[str, Any]] = []
    for d in candidates:
        waiting = sum(1 for dd in admitted if dd <= d)
        phantom = 0
        if d - plan.max_lag - 1 >= version:  # admission may still start tasks due by d
            phantom = max(0, plan.admission_limit(int(d) - plan.max_lag - 1) - started)
        need = min(waiting, waiting + phantom - (int(d) - step) * b)
        have = sum(1 for g in chosen if due(g) <= d)
        if need <= have:
            continue
        extra = [g for g in complete if due(g) <= d and g not in chosen][: need - have]
        chosen += extra
        if have + len(extra) < need:  # a group due by d is still running: wait for it
            return Choice(None, deadline_wait=True)
        if len(chosen) > size:  # more is due than one update can take: take the soonest due
            chosen = sorted(chosen, key=due)[:size]
            break
    chosen += [g for g in complete if g not in chosen][: size - len(chosen)]
    ordered = sorted(chosen, key=lambda g: (g.get("ticket") is None, g.get("ticket") or 0, g.get("completed") or 0))
    return Choice([g["group_id"] for g in ordered])


def lag_stats(step: int, oldest_versions: Sequence[int | None]) -> dict[str, float]:
    """``async/version_lag/{min,mean,max}`` of trajectories trained by update ``step`` (lag = ``step - 1 - v``)."""
    lags = [step - 1 - v for v in oldest_versions if v is not None]
    if not lags:
        return {}
    return {
        "async/version_lag/min": float(min(lags)),
        "async/version_lag/mean": float(sum(lags) / len(lags)),
        "async/version_lag/max": float(max(lags)),
    }
