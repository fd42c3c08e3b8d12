"""Training from agents: run a black-box OpenAI-client agent through the gateway, get Trajectories.

    from agentgym.gateway import start_gateway
    gateway = start_gateway(["http://127.0.0.1:8000"], model="tiny")        # or a gateway URL
    source = AgentTrajectorySource("examples.gsm8k_agent:run", load_agent_tasks("data/gsm8k"),
                                   n=8, gateway=gateway, tasks_per_step=16,
                                   sampling={"temperature": 1.0, "max_tokens": 256})
    trajectories = await source.collect(step)   # the same Trajectory objects the env runner makes
    async with source.weight_update():           # model calls wait while the weights move
        ...
    await source.aclose()

An *agent* is any function ``agent(base_url, api_key, task)``: it talks to ``base_url`` with the
``openai`` client and that key, however it likes (tools, many turns, re-sent or edited history).
Sync functions run in a thread pool, ``async def`` ones on the event loop. The reward of a session
is the reward function its task names (e.g. ``{"reward_fn": "gsm8k", "ground_truth": "72"}``) plus
the agent's return value when that is a float; any other return value (an int such as a count of
turns, a bool, a string) is not taken as a reward and is warned about once, as is a run whose
sessions get no reward from either. An agent that raises (or runs past ``agent_timeout``) finishes
its session ``failed``: its trajectories are kept for inspection, never trained on (a session with
no turn gives one empty failed trajectory, so the trainer's failed-episode check sees it); an agent
the gateway refused with 401 is told to send the ``api_key`` it was given. ``task`` reaches the agent
without its answer (``hidden_keys``).

For each task the source opens ``n`` sessions that share a group id (one GRPO group), runs the
agent once per session, finishes the sessions and collects their trajectories in a ``DataPool``;
a group is complete when all ``n`` sessions have finished. A session whose agent edited its
history yields more than one trajectory (one per branch, see ``agentgym.gateway.sessions``), so a
group can hold more than ``n``; ``branches="active"`` keeps only each session's last branch.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import numbers
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal

from agentgym.gateway.client import GatewayClient
from agentgym.gateway.episodes import join_session
from agentgym.registry import import_object
from agentgym.rollout.data_pool import DataPool
from agentgym.rollout.metrics import summarize
from agentgym.rollout.runner import epoch_order
from agentgym.rollout.sources import TrajectorySource
from agentgym.types import Trajectory

log = logging.getLogger("agentgym.trainer")

AgentFn = Callable[[str, str, dict[str, Any]], Any]
HIDDEN_KEYS = ("ground_truth", "reward_model")


def load_agent(spec: str | AgentFn) -> AgentFn:
    """``"package.module:function"`` -> the function (the working directory is importable, so
    ``examples.gsm8k_agent:run`` works from the repository root)."""
    if callable(spec):
        return spec
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"an agent is 'package.module:function', got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = import_object(spec)
    except ImportError as exc:
        raise ValueError(f"could not import the agent module {module_name!r}: {exc}") from None
    except AttributeError:
        raise ValueError(
            f"module {module_name!r} has no {attr!r}; the agent is a function run(base_url, api_key, task)"
        ) from None
    if not callable(obj):
        raise ValueError(f"{spec!r} is not callable")
    return obj


def load_agent_tasks(data_files: Any, split: str = "train", reward_fn: str | None = None) -> list[dict[str, Any]]:
    """Dataset rows as agent tasks: ``{"index", "question", "prompt", "ground_truth", "data_source",
    "extra_info"}`` (plus ``"reward_fn"`` when given). veRL-format rows (``prompt``,
    ``reward_model.ground_truth``) and raw GSM8K rows (``question``, ``answer``) are both read; with no
    ``reward_fn`` the gateway picks one from ``data_source`` (``openai/gsm8k`` -> ``gsm8k``)."""
    from agentgym.envs.data import is_verl_row, load_tasks, verl_task
    from agentgym.envs.gsm8k import gsm8k_task

    out = []
    for task in load_tasks(
        data_files, split, lambda row, where: (verl_task if is_verl_row(row) else gsm8k_task)(row, where)
    ):
        users = [m.get("content") or "" for m in task.prompt if m.get("role") == "user"]
        item = {
            "index": task.index,
            "question": task.extra_info.get("question") or (users[-1] if users else ""),
            "prompt": task.prompt,
            "ground_truth": task.ground_truth,
            "data_source": task.data_source,
            "extra_info": task.extra_info,
        }
        if reward_fn is not None:
            item["reward_fn"] = reward_fn
        out.append(item)
    return out


class AgentTrajectorySource(TrajectorySource):
    """Runs ``agent`` for every task x ``n`` through a gateway and returns the trajectories.

    ``agent``: a function ``(base_url, api_key, task)`` or ``"module:function"``. ``tasks``: task dicts
    (see ``load_agent_tasks``). ``gateway``: a ``GatewayHandle`` (``start_gateway``), a
    ``GatewayClient`` or the gateway's URL; ``close_gateway`` stops a handle at ``aclose``.
    ``tasks_per_step``: tasks per ``collect`` (default: all), walked through a seeded shuffled order
    per epoch (``shuffle``); step ``first_step`` (the trainer counts from 1) takes the first slice, so
    a step's tasks depend only on its number and a resumed run sees the same data. ``sampling``: pinned
    for every model call (``SamplingParams`` names, e.g. the training temperature). ``val_tasks``,
    ``val_n`` and ``val_sampling``: what ``validate`` runs (default: the first 16 tasks, greedy, once).
    ``concurrency``: agents running at once. ``branches``: ``"episode"`` (default: a session's chain of
    branches, from an agent that rewrote its context, is one episode; other branches each a trajectory),
    ``"all"`` (every branch is a trajectory) or ``"active"`` (each session's last branch only).
    ``weight_version``: a function giving the
    version the policy servers hold, told to the gateway before each run (for servers that do not
    report it with each sample); or use ``weight_update(version)`` around each weight push.
    """

    def __init__(
        self,
        agent: str | AgentFn,
        tasks: Iterable[dict[str, Any]],
        n: int = 1,
        gateway: Any = None,
        *,
        tasks_per_step: int | None = None,
        sampling: dict[str, Any] | None = None,
        concurrency: int = 64,
        agent_timeout: float | None = None,
        admin_key: str | None = None,
        shuffle: bool = True,
        seed: int = 0,
        first_step: int = 1,
        val_tasks: Iterable[dict[str, Any]] | None = None,
        val_n: int = 1,
        val_sampling: dict[str, Any] | None = None,
        hidden_keys: Sequence[str] = HIDDEN_KEYS,
        branches: Literal["episode", "all", "active"] = "episode",
        close_gateway: bool = False,
        weight_version: Callable[[], int] | None = None,
    ) -> None:
        if gateway is None:
            raise ValueError("AgentTrajectorySource needs a gateway: start_gateway(...), a GatewayClient or a URL")
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if branches not in ("episode", "all", "active"):
            raise ValueError(f"branches must be 'episode', 'all' or 'active', got {branches!r}")
        self.agent = load_agent(agent)
        self.is_async = inspect.iscoroutinefunction(self.agent) or inspect.iscoroutinefunction(
            type(self.agent).__call__
        )
        self.tasks = list(tasks)
        if not self.tasks:
            raise ValueError("AgentTrajectorySource needs at least one task")
        self.n = n
        self.tasks_per_step = tasks_per_step or len(self.tasks)
        if self.tasks_per_step > len(self.tasks):
            raise ValueError(
                f"{len(self.tasks)} tasks are fewer than the {self.tasks_per_step} a step takes; "
                "lower the tasks per step (data.train_batch_size) or give more tasks"
            )
        self.steps_per_epoch = len(self.tasks) // self.tasks_per_step
        self.sampling = dict(sampling or {})
        self.val_tasks = list(val_tasks) if val_tasks is not None else self.tasks[:16]
        self.val_n = val_n
        self.val_sampling = dict(val_sampling) if val_sampling is not None else {**self.sampling, "temperature": 0.0}
        self.concurrency = max(1, concurrency)
        self.agent_timeout = agent_timeout
        self.shuffle = shuffle
        self.seed = seed
        self.first_step = first_step
        self.hidden_keys = tuple(hidden_keys)
        self.branches = branches
        if isinstance(gateway, GatewayClient):
            self.client = gateway
        elif isinstance(gateway, str):
            self.client = GatewayClient(gateway, admin_key)
        else:  # a GatewayHandle
            self.client = GatewayClient(gateway.url, admin_key or getattr(gateway, "admin_key", None))
        self._handle = gateway if close_gateway and hasattr(gateway, "stop") else None
        self.weight_version = weight_version
        self._told_version: int | None = None
        self.pool = DataPool()
        self._threads = (
            None if self.is_async else ThreadPoolExecutor(self.concurrency, thread_name_prefix="agentgym-agent")
        )
        self.last_metrics: dict[str, float] = {}
        self._orders: dict[int, list[int]] = {}
        self._async_steps = 0  # steps handed out by next_tasks (asynchronous training)
        self._said_reward = False  # the rule of rewards was told (once)
        self._warned: set[str] = set()  # kinds of reward problems already warned about

    # ---- which tasks ----------------------------------------------------------------------
    def tasks_for_step(self, step: int) -> list[dict[str, Any]]:
        """Step ``step``'s tasks: consecutive slices of a per-epoch shuffled order, wrapping around."""
        count = len(self.tasks)
        block = step - self.first_step
        out = []
        for k in range(block * self.tasks_per_step, (block + 1) * self.tasks_per_step):
            epoch, at = divmod(k, count)
            out.append(self.tasks[self._order(epoch)[at]])
        return out

    def _order(self, epoch: int) -> list[int]:
        order = self._orders.get(epoch)
        if order is None:
            order = epoch_order(len(self.tasks), epoch, self.seed, self.shuffle)
            self._orders = {epoch: order}  # steps walk epochs in order: one is enough
        return order

    # ---- running --------------------------------------------------------------------------
    async def collect(self, step: int) -> list[Trajectory]:
        """One training step's trajectories: ``tasks_per_step`` tasks x ``n`` sessions, group by group."""
        await self._sync_version()
        return await self.run(self.tasks_for_step(step), step=step)

    async def _sync_version(self) -> None:
        """Tell the gateway the servers' weight version (for servers that do not report it)."""
        if self.weight_version is None:
            return
        version = int(self.weight_version())
        if version != self._told_version:
            await self.client.resume(version)
            self._told_version = version

    async def validate(self) -> list[Trajectory]:
        """The validation pass: ``val_tasks`` x ``val_n`` with ``val_sampling`` (greedy by default)."""
        await self._sync_version()
        return await self.run(self.val_tasks, n=self.val_n, sampling=self.val_sampling)

    async def run(
        self,
        tasks: Sequence[dict[str, Any]],
        n: int | None = None,
        sampling: dict[str, Any] | None = None,
        step: int | None = None,
    ) -> list[Trajectory]:
        """Run ``n`` sessions per task (e.g. a validation pass with its own ``n`` and ``sampling``);
        returns every trajectory, failed ones included, complete groups in task order."""
        n = n or self.n
        sampling = self.sampling if sampling is None else sampling
        batch = f"{'s' + str(step) if step is not None else 'run'}-{uuid.uuid4().hex[:6]}"
        semaphore = asyncio.Semaphore(self.concurrency)
        start = time.perf_counter()
        groups = []
        for i, task in enumerate(tasks):
            group_id = f"{batch}-{task.get('index', i)}-{i}"
            self.pool.open_group(group_id, n)
            groups.append((group_id, task))
        try:
            outcomes = await asyncio.gather(
                *(self._session(task, group_id, sampling, semaphore) for group_id, task in groups for _ in range(n))
            )
            trajectories = [t for group_id, _ in groups for t in self.pool.pop(group_id)]
        finally:
            for group_id, _ in groups:
                self.pool.discard(group_id)
        if self.branches == "active":
            trajectories = [t for t in trajectories if t.metrics.get("active_branch", 1.0)]
        elapsed = time.perf_counter() - start
        metrics = summarize(trajectories)
        metrics.update(
            {
                "agent/sessions": float(len(outcomes)),
                "agent/failed_sessions": float(sum(1 for o in outcomes if o is not None)),
                "agent/extra_branches": float(
                    sum(
                        max(0.0, t.metrics.get("branches", 1.0) - 1.0)
                        for t in trajectories
                        if t.metrics.get("active_branch")
                    )
                ),
                "time/rollout_s": elapsed,
                "throughput/episodes_per_s": len(outcomes) / elapsed if elapsed else 0.0,
            }
        )
        self.last_metrics = metrics
        return trajectories

    async def _session(
        self, task: dict[str, Any], group_id: str, sampling: dict[str, Any], semaphore: asyncio.Semaphore
    ) -> str | None:
        """One agent run in its own session; returns the failure (None when the agent returned)."""
        async with semaphore:
            info = await self.client.create_session(task=task, group_id=group_id, sampling=sampling)
            visible = {k: v for k, v in task.items() if k not in self.hidden_keys}
            failure: str | None = None
            reward: float | None = None
            try:
                result = await asyncio.wait_for(
                    self._call(info["base_url"], info["api_key"], visible), self.agent_timeout
                )
                reward = self._reward_of(result, task)
            except asyncio.TimeoutError:
                failure = f"the agent ran past agent_timeout={self.agent_timeout}s"
            except Exception as exc:
                failure = agent_failure(exc)
            trajectories = await self.client.finish_session(info["id"], failure=failure, reward=reward)
        if failure is not None and not trajectories:  # no model call got through: still an episode that failed
            trajectories = [Trajectory(group_id=group_id, status="failed", failure=failure, task=visible)]
        if self.branches == "episode":  # an agent that rewrote its context: one episode, per-turn samples
            trajectories = join_session(trajectories)
        self.pool.add(group_id, trajectories)
        return failure

    def _reward_of(self, result: Any, task: dict[str, Any]) -> float | None:
        """The agent's return value as the session's reward: a float is; anything else is not (warned once)."""
        from agentgym.gateway.rewards import task_reward_fn

        named = task_reward_fn(task)
        if not self._said_reward:
            self._said_reward = True
            log.warning(
                "agent sessions are rewarded by %s plus the agent's return value when it is a float",
                f"the tasks' reward function ({named})" if named else "the reward function each task names",
            )
        if isinstance(result, numbers.Real) and not isinstance(result, numbers.Integral):
            return float(result)
        if result is not None:
            self._warn_once(
                type(result).__name__,
                f"the agent returned {result!r} ({type(result).__name__}): not taken as its reward (only "
                f"a float is; an int is likely a count, e.g. of turns). Return float(reward) to post it",
            )
        elif not named:
            self._warn_once(
                "none",
                "the agent returned nothing and its task names no reward_fn: the session's "
                "reward is 0. Return a float, or give the tasks a reward_fn (veRL rows' "
                "data_source picks one)",
            )
        return None

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s", message)

    async def _call(self, base_url: str, api_key: str, task: dict[str, Any]) -> Any:
        if self.is_async:
            return await self.agent(base_url, api_key, task)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self.agent, base_url, api_key, task)

    # ---- asynchronous training: one task at a time (agentgym.trainer.async_trainer) ----------
    resumes_aborted = False  # a push holds model calls (weight_update) instead of aborting them

    async def next_tasks(self) -> list[dict[str, Any]]:
        """The next step's tasks, in ``collect``'s order."""
        step = self.first_step + self._async_steps
        self._async_steps += 1
        return self.tasks_for_step(step)

    async def run_task(self, task: dict[str, Any], group_id: str) -> list[Trajectory]:
        """One task's ``n`` sessions (the gateway records each turn's weight version)."""
        await self._sync_version()
        return await self.run([task])

    def state_dict(self) -> dict[str, Any]:
        return {"async_steps": self._async_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._async_steps = int(state.get("async_steps", 0))

    # ---- weights and shutdown -------------------------------------------------------------
    def weight_update(
        self, weight_version: int | None = None, drain_timeout: float = 60.0
    ) -> AbstractAsyncContextManager[None]:
        """``async with source.weight_update(version): <push weights>``: the gateway holds model calls
        (in-flight ones finish first, up to ``drain_timeout``) and lets them go afterwards."""
        return self.client.weight_update(weight_version, drain_timeout)

    async def aclose(self) -> None:
        await self.client.aclose()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._handle is not None:
            await asyncio.to_thread(self._handle.stop)
            self._handle = None


def agent_failure(exc: BaseException) -> str:
    """Why an agent run failed, from what it raised; a 401 from the gateway says what to fix."""
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    if status == 401 or type(exc).__name__ == "AuthenticationError":
        return (
            f"the gateway refused the agent's API key (401 {type(exc).__name__}: {exc}): the agent must call "
            f"the model with the api_key it is given, agent(base_url, api_key, task) -> "
            f"OpenAI(base_url=base_url, api_key=api_key), not OPENAI_API_KEY or a key of its own"
        )
    return f"the agent raised {type(exc).__name__}: {exc}"


def trajectory_source(cfg: Any, agent: str, servers: Any) -> Any:
    """``agentgym train --agent module:function``: a gateway in this process over the trainer's policy
    servers (``servers.urls``, ``servers.backend``), and an ``AgentTrajectorySource`` running the agent.

    From the config: tasks from ``data.train_files`` / ``data.val_files`` (veRL-format or raw GSM8K
    rows; each row's reward function from its data source), ``data.train_batch_size`` tasks per step
    walked in ``data.shuffle`` order seeded by ``trainer.seed``, ``rollout.n`` sessions per task,
    ``rollout.temperature`` / ``top_p`` / ``top_k`` / ``max_tokens_per_turn`` pinned for every model
    call, ``rollout.concurrency`` agents at once, ``rollout.val_kwargs`` and ``data.val_batch_size`` for
    validation; ``data.max_prompt_length + data.max_response_length`` bounds a session's context.
    """
    from omegaconf import OmegaConf

    from agentgym.gateway.serve import start_gateway

    data, rollout = cfg.data, cfg.actor_rollout_ref.rollout

    def files(value: Any) -> Any:
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value

    if not data.train_files:
        raise ValueError(
            "agentgym train --agent needs tasks for the agent: set data.train_files=<.jsonl/.parquet, "
            "veRL-format or raw GSM8K rows>"
        )
    tasks = load_agent_tasks(files(data.train_files), "train")
    val_tasks = load_agent_tasks(files(data.val_files), "test") if data.val_files else tasks
    pinned = {
        "temperature": float(rollout.temperature),
        "top_p": float(rollout.top_p),
        "top_k": int(rollout.top_k),
        "max_tokens": int(rollout.max_tokens_per_turn or data.max_response_length),
    }
    val = rollout.val_kwargs
    handle = start_gateway(
        list(servers.urls),
        model=str(cfg.actor_rollout_ref.model.path),
        backend=str(servers.backend),
        server_model=getattr(servers.client, "model", None),
        max_model_len=int(data.max_prompt_length + data.max_response_length),
    )
    try:
        return AgentTrajectorySource(
            agent,
            tasks,
            n=rollout.n,
            gateway=handle,
            close_gateway=True,
            tasks_per_step=data.train_batch_size,
            sampling=pinned,
            concurrency=rollout.concurrency,
            shuffle=data.shuffle,
            seed=cfg.trainer.seed,
            val_tasks=val_tasks[: data.val_batch_size or cfg.env.num_val_tasks],
            val_n=val.n,
            val_sampling={
                **pinned,
                "temperature": float(val.temperature),
                "top_p": float(val.top_p),
                "top_k": int(val.top_k),
            },
            weight_version=lambda: _servers_version(servers),
        )
    except BaseException:
        handle.stop()
        raise


def _servers_version(servers: Any) -> int:
    """The newest weight version the trainer's ``RolloutServers`` know of: their client's per-server
    versions (set by pushes through it) and the handles' own ``weight_version`` where they have one."""
    versions = [int(s.version) for s in getattr(servers.client, "servers", [])]
    for handle in getattr(servers, "handles", []):
        with contextlib.suppress(Exception):
            versions.append(int(handle.weight_version))
    return max(versions, default=0)
