"""The async rollout runner: many multi-turn episodes at once against one or more policy servers.

    runner = RolloutRunner("sokoban", client, tokenizer="tiny", config=RolloutConfig(n=8))
    result = await runner.run(tasks=16)          # 16 seeds x 8 episodes -> 128 trajectories
    batch = result.trainable()                   # failed episodes are kept but never trained on
    await runner.aclose()

Each task (an env seed, or a dataset row for envs with ``num_tasks()``) gets a group of
``n`` episodes that share a ``group_id`` (veRL's ``actor_rollout_ref.rollout.n``). Episodes
run concurrently (``max_concurrency``); env calls run where ``env_executor`` says (see
``agentgym.rollout.executors``: in this process, worker processes or remote OpenEnv servers;
with ``workers``/``ray`` whole episodes run in worker processes or on Ray actors).

A multi-agent env (one that has ``agents``, e.g. a two-player game in self-play) is played by the
same episode loop with a seat per agent (the protocol: ``agentgym.rollout.multi_agent``): one game
gives a trajectory per seat, each in its own group (``{group_id}/{agent}``).

Token bookkeeping (``agentgym.rollout.chat``): the runner renders the first prompt with the
chat template, then only appends — the sampled ids exactly as the server returned them
(loss mask 1), then the env's new messages as a token delta (mask 0). Every request sends
the whole sequence so far, so ``trajectory.token_ids()`` minus the last response is exactly
what the server saw on the final turn, and the stored logprobs are the server's. Requests of
an episode carry its session id (``"{group_id}/{sample}"``) for sticky routing.

Template check: for templates that are not prefix-preserving (Qwen3 drops ``<think>`` blocks
from earlier assistant turns), the runner's sequence is still exactly what was sampled, but a
re-render of the finished conversation would differ. Every ``template_check_every``-th
episode is re-rendered at its end and compared; a difference sets the trajectory metric
``template_mismatch`` to 1 (``template_mismatch_at``: the first differing character) and is
counted in the batch metrics. The trajectory is still trainable: its tokens are right.

Partial rollout (asynchronous training, ``partial_rollout=True``): a policy server that aborts
running generations to load new weights answers with the tokens sampled so far and
``finish_reason="abort"``. The runner then asks again with those tokens appended to the context
and the rest of the turn's token budget, until the generation ends for another reason; the turn
holds the whole reply, its logprobs, and in ``Turn.token_versions`` the version of each token
(``Trajectory.metrics["resumed_generations"]`` counts the continuations). Without it an abort
ends the turn where it stopped, as before.

Reproducible sampling (``sampling_seed``): each request carries a seed derived from
``(sampling_seed, task seed, sample, turn, continuation)``, so the same weights sample the same
episodes whatever else runs at the same time.

Limits: ``max_turns`` (else the env's ``max_turns``), ``max_tokens`` per turn,
``response_length`` tokens per episode after the first prompt (sampled and env tokens
together; a generation is cut to what is left, and the episode ends ``status="truncated"``),
``max_model_len`` tokens in the whole sequence, the most the policy server holds (the same:
generations are cut to the room left, and a full context ends the episode as truncated),
``prompt_length`` for the first prompt (longer: ``status="failed"``), ``env_timeout`` per env
call. An env that raises, a timeout, or a ``PolicyServerError`` after the client's retries
ends only that episode: ``status="failed"``, the reason in ``failure``, turns kept for
inspection, ``trainable`` False. ``status="ok"`` means the env terminated the episode;
``"truncated"`` that the env's step budget, ``max_turns`` or ``response_length`` ended it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgym.envs.tools.parsing import parse_tool_calls
from agentgym.rollout.chat import ChatTokenizer, tools_key
from agentgym.rollout.context import History, Summarizer, check_policy
from agentgym.rollout.executors import EPISODE_EXECUTORS, EnvBackend, EnvTimeout, EpisodePool
from agentgym.rollout.metrics import state_key, summarize, turn_facts
from agentgym.rollout.multi_agent import next_agent, seat_results
from agentgym.types import Message, SamplingParams, TokenSample, Trajectory, Turn


@dataclass
class RolloutConfig:
    """Rollout settings; veRL's names where veRL has the setting (``actor_rollout_ref.rollout.*``)."""

    n: int = 1  # episodes per task (one GRPO group)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256  # new tokens per turn
    prompt_length: int = 4096  # most tokens in the first prompt (veRL data.max_prompt_length)
    response_length: int = 4096  # most tokens after the first prompt, all turns (veRL response_length)
    max_model_len: int | None = None  # most tokens in the whole sequence: the server's context (veRL name)
    max_turns: int | None = None  # most model turns (veRL multi_turn.max_assistant_turns); None: env's
    stop_token_ids: list[int] = field(default_factory=list)
    max_concurrency: int = 64  # episodes in flight
    env_executor: Literal["thread", "process", "inline", "openenv", "workers", "ray"] = "thread"
    env_workers: int | None = None  # threads (default max_concurrency), processes or actors (default CPUs)
    env_timeout: float | None = 60.0  # seconds per reset/step (not for inline)
    env_urls: list[str] = field(default_factory=list)  # env_executor=openenv: the OpenEnv env servers
    worker_env_executor: Literal["thread", "inline"] = "thread"  # workers/ray: env calls inside each worker
    template_check_every: int = 1  # re-render every k-th episode at its end; 0: never
    seed: int = 0  # first env seed; task i uses seed + i
    partial_rollout: bool = False  # a generation a weight update aborted continues on the new weights
    sampling_seed: int | None = None  # seed every request from (this, task seed, sample, turn): reproducible
    context_policy: Literal["full", "window", "compact"] = "full"  # what each prompt holds (rollout/context.py)
    context_window: int = 4  # window / compact: the most recent turns kept word for word

    def sampling(self, max_tokens: int | None = None) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens if max_tokens is None else max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop_token_ids=list(self.stop_token_ids),
        )


@dataclass(frozen=True)
class Task:
    """One task: an env seed, and for dataset envs the row ``index`` (passed as ``options["index"]``)."""

    seed: int | None = None
    index: int | None = None
    options: dict[str, Any] | None = None

    def reset_options(self) -> dict[str, Any] | None:
        if self.index is None:
            return self.options
        return {**(self.options or {}), "index": self.index}


def epoch_order(count: int, epoch: int, seed: int = 0, shuffle: bool = True) -> list[int]:
    """The order of ``count`` dataset rows in ``epoch``: a permutation seeded by ``(seed, epoch)``
    (veRL's ``data.shuffle``), or ``0..count-1``. The trainer's env tasks and the agent source's
    tasks are walked in this order, so one seed gives both the same data order."""
    order = list(range(count))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def make_tasks(count: int, start: int = 0, seed: int = 0, num_tasks: int | None = None) -> list[Task]:
    """``count`` tasks from ``start``: dataset rows (wrapping around ``num_tasks``) or seeds."""
    if num_tasks is None:
        return [Task(seed=seed + start + i) for i in range(count)]
    if num_tasks <= 0:
        raise ValueError("the env reports no tasks (num_tasks() == 0)")
    return [Task(seed=seed + start + i, index=(start + i) % num_tasks) for i in range(count)]


@dataclass
class RolloutResult:
    """The trajectories in task order (each task's ``n`` episodes together) and batch metrics."""

    trajectories: list[Trajectory]
    metrics: dict[str, float]

    def trainable(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.trainable]

    def groups(self) -> dict[str, list[Trajectory]]:
        out: dict[str, list[Trajectory]] = {}
        for t in self.trajectories:
            out.setdefault(t.group_id, []).append(t)
        return out


MAX_CONTINUATIONS = 64  # partial rollout: aborted-and-continued pieces of one generation, at most


def request_seed(base: int, task_seed: int | None, sample: int, turn: int, attempt: int = 0) -> int:
    """The seed of one request (``RolloutConfig.sampling_seed``): a fixed mix of where it is in the run."""
    value = base
    for part in (task_seed or 0, sample, turn, attempt):
        value = (value * 1_000_003 + part) % 2_147_483_647
    return value


class EpisodeFailure(RuntimeError):
    """Ends one episode as failed (prompt too long, malformed server answer, ...)."""


def _env_factory(env: str | Callable[[], Any], env_kwargs: dict[str, Any]) -> Callable[[], Any]:
    if isinstance(env, str):
        from agentgym.registry import make

        return functools.partial(make, env, **env_kwargs)
    return functools.partial(env, **env_kwargs) if env_kwargs else env


def assistant_message(text: str, with_tools: bool) -> Message:
    """The assistant message an env gets: the sampled text; for envs with tools, Hermes
    ``<tool_call>`` blocks parsed into ``tool_calls`` (content then holds the rest of the text).
    A reply with a malformed call stays plain text, so an env that parses text itself (the
    GSM8K tool env) can tell the model what was wrong."""
    if with_tools and "<tool_call>" in text:
        content, calls, errors = parse_tool_calls(text)
        if calls and not errors:
            return {"role": "assistant", "content": content, "tool_calls": calls}  # type: ignore[typeddict-item]
    return {"role": "assistant", "content": text}


@dataclass
class _Seat:
    """One side of an episode: a single-agent episode has one seat, a multi-agent game one per agent."""

    traj: Trajectory
    session: str
    pending: list[Message] = field(default_factory=list)  # the env's messages to this seat, not yet tokenized
    state: str = ""  # the state the seat's next reply answers (``Turn.state_key``)
    context: list[int] | None = None  # the whole sequence so far (None: no prompt rendered yet)
    last_ids: list[int] = field(default_factory=list)  # the seat's last reply
    used: int = 0  # tokens after the first prompt
    history: History = field(default_factory=History)  # the conversation as context policies cut it

    def receive(self, observation: Sequence[Message], info: dict[str, Any]) -> None:
        self.pending.extend(observation)
        self.state = state_key(info, self.pending)


class RolloutRunner:
    """Runs groups of episodes of one env against a policy client.

    ``env``: a registered env name or a factory returning a TextEnv; ``env_kwargs`` go to it.
    ``client``: a ``PolicyClient`` (anything with ``async generate(prompt_ids, sampling, session_id=)``).
    ``tokenizer``: a model path/``"tiny"`` or a loaded Hugging Face tokenizer (its chat template is used).
    """

    def __init__(
        self,
        env: str | Callable[[], Any],
        client: Any,
        tokenizer: Any = "tiny",
        config: RolloutConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.config = config or RolloutConfig()
        self.env_name = env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)
        self.client = client
        if isinstance(tokenizer, str):
            from agentgym.model import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.chat = tokenizer if isinstance(tokenizer, ChatTokenizer) else ChatTokenizer(tokenizer)
        cfg = self.config
        self.envs = EnvBackend(
            _env_factory(env, dict(env_kwargs or {})),
            cfg.env_executor,
            workers=cfg.env_workers or (cfg.max_concurrency if cfg.env_executor == "thread" else None),
            timeout=cfg.env_timeout,
            urls=cfg.env_urls,
        )
        self.episodes: EpisodePool | None = None  # workers / ray: whole episodes run there
        if cfg.env_executor in EPISODE_EXECUTORS:
            self.episodes = EpisodePool(self, cfg.env_executor, cfg.env_workers)
        self._env_info: dict[str, Any] | None = None
        self._episodes_started = 0
        check_policy(cfg.context_policy, cfg.context_window)
        self._summarize: Summarizer | None = None
        if cfg.context_policy == "compact" and self.episodes is None:
            self._summarize = self.envs.summarizer()

    # ---- public API ------------------------------------------------------------------------
    async def env_info(self) -> dict[str, Any]:
        """``num_tasks`` (dataset rows, or None) and ``max_turns`` of the env."""
        if self._env_info is None:
            self._env_info = await self.envs.describe()
        return self._env_info

    async def tasks(self, count: int | None = None, start: int = 0) -> list[Task]:
        """``count`` tasks from ``start`` (default: every dataset row, or a single seed)."""
        num_tasks = (await self.env_info())["num_tasks"]
        if count is None:
            count = num_tasks if num_tasks is not None else 1
        return make_tasks(count, start=start, seed=self.config.seed, num_tasks=num_tasks)

    async def run(
        self,
        tasks: Sequence[Task] | int | None = None,
        *,
        on_trajectory: Callable[[Trajectory], None] | None = None,
        progress: bool | str = False,
    ) -> RolloutResult:
        """Run ``n`` episodes per task; returns every trajectory (failed ones too) and metrics.

        ``tasks``: a list of ``Task``, a count (see ``tasks()``), or None for the default.
        ``on_trajectory`` is called as each episode finishes (e.g. a ``TrajectoryWriter.write``);
        ``progress`` shows a tqdm bar (a string: its label).
        """
        if tasks is None or isinstance(tasks, int):
            tasks = await self.tasks(tasks)
        cfg = self.config
        env_info = await self.env_info()
        max_turns = cfg.max_turns if cfg.max_turns is not None else env_info.get("max_turns")
        bar = None
        if progress:
            from agentgym.progress import progress_bar

            label = progress if isinstance(progress, str) else f"rollout {self.env_name}"
            bar = progress_bar(total=len(tasks) * cfg.n, desc=label, unit="ep")
        batch = uuid.uuid4().hex[:8]
        jobs = [
            (j, task, f"{batch}-{i}", k)
            for j, (i, task, k) in enumerate((i, task, k) for i, task in enumerate(tasks) for k in range(cfg.n))
        ]
        trajectories: list[list[Trajectory] | None] = [None] * len(jobs)
        pending = iter(jobs)
        run_job = self.episodes.run_job if self.episodes is not None else self.run_job

        async def worker() -> None:  # max_concurrency workers pull episodes: no queue of waiting tasks
            for j, task, group_id, k in pending:
                trajs = await run_job(task, group_id, k, max_turns)
                trajectories[j] = trajs
                for traj in trajs:
                    if on_trajectory is not None:
                        on_trajectory(traj)
                    if bar is not None and traj.status == "failed":
                        bar.set_postfix_str(f"failed: {(traj.failure or '')[:60]}", refresh=False)
                if bar is not None:
                    bar.update(1)

        start = time.perf_counter()
        try:
            await asyncio.gather(*(worker() for _ in range(max(1, min(cfg.max_concurrency, len(jobs))))))
        finally:
            if bar is not None:
                bar.close()
        elapsed = time.perf_counter() - start
        done = [t for trajs in trajectories if trajs is not None for t in trajs]
        metrics = summarize(done)
        turns = sum(t.num_turns for t in done)
        metrics.update(
            {
                "time/rollout_s": elapsed,
                "throughput/turns_per_s": turns / elapsed if elapsed else 0.0,
                "throughput/episodes_per_s": len(done) / elapsed if elapsed else 0.0,
            }
        )
        return RolloutResult(done, metrics)

    async def run_job(
        self, task: Task, group_id: str = "", sample: int = 0, max_turns: int | None = None
    ) -> list[Trajectory]:
        """One episode (``[trajectory]``), or one game of a multi-agent env (a trajectory per seat)."""
        agents = (await self.env_info()).get("agents")
        if agents:
            return await self._play(task, group_id, sample, max_turns, [str(a) for a in agents])
        return [await self.run_episode(task, group_id, sample, max_turns=max_turns)]

    def start_episode(self) -> bool:
        """Count an episode starting (single- or multi-agent); True when its chat template is to be
        checked (every ``template_check_every``-th episode)."""
        self._episodes_started += 1
        every = self.config.template_check_every
        return every > 0 and self._episodes_started % every == 0

    async def run_episode(
        self, task: Task, group_id: str = "", sample: int = 0, max_turns: int | None = None
    ) -> Trajectory:
        """One episode; never raises for env or server failures (the trajectory says ``failed``)."""
        return (await self._play(task, group_id, sample, max_turns, None))[0]

    def _seat(self, task: Task, group_id: str, sample: int, agent: str | None) -> _Seat:
        gid = group_id if agent is None else f"{group_id}/{agent}"
        session = f"{gid}/{sample}"
        info = {"seed": task.seed, "index": task.index, "sample": sample, "session": session}
        traj = Trajectory(
            env_id=self.env_name,
            group_id=gid,
            seed=task.seed,
            data_source=self.env_name,
            task=info if agent is None else {**info, "agent": agent},
        )
        return _Seat(traj, session)

    async def _play(
        self, task: Task, group_id: str, sample: int, max_turns: int | None, agents: list[str] | None
    ) -> list[Trajectory]:
        """The episode loop: one seat (``agents`` None), or a game of a multi-agent env with a seat per
        agent, all played by this policy (``agentgym.rollout.multi_agent``). Each seat keeps its own
        conversation and token sequence; the env says which seat acts next. Never raises for env or
        server failures (every seat's trajectory says ``failed``)."""
        cfg = self.config
        chat = self.chat
        names: list[str | None] = list(agents) if agents is not None else [None]
        seats = {name: self._seat(task, group_id, sample, name) for name in names}
        check = self.start_episode()
        default_sampling = cfg.sampling()
        handle = self.envs.open()
        healthy = True
        stage = "env.reset"
        env_time = gen_time = 0.0
        tools: list[dict[str, Any]] | None = None
        finish_infos: dict[str | None, dict[str, Any]] = {name: {} for name in names}  # what _finish reads
        try:
            t0 = time.perf_counter()
            observation, info = await handle.reset(task.seed, task.reset_options())
            env_time += time.perf_counter() - t0
            source = str(info.get("data_source") or self.env_name)
            for seat in seats.values():
                seat.traj.data_source = source
            tools = info.get("tools") or None
            tkey = tools_key(tools)
            seat = seats[names[0] if agents is None else next_agent(info, agents)]
            seat.receive(observation, info)
            status = "truncated"
            while True:
                stage = "chat template"
                observation, seat.pending = seat.pending, []
                who = f"{seat.traj.task['agent']}: " if agents is not None else ""
                seat.history.observe(observation)
                windowed = None
                if seat.context is None:
                    seat.traj.messages = list(observation)
                    delta = chat.prompt_ids(observation, tools, tkey=tkey)
                    if len(delta) > cfg.prompt_length:
                        raise EpisodeFailure(f"{who}prompt has {len(delta)} tokens > prompt_length={cfg.prompt_length}")
                    seat.context = list(delta)  # the whole sequence so far, sent on every turn
                else:
                    seat.traj.messages.extend(observation)
                    delta = chat.delta_ids(observation, tools, seat.last_ids[-1] if seat.last_ids else None, tkey=tkey)
                    if cfg.context_policy != "full":
                        windowed = self._window(seat, len(seat.context) + len(delta), tools, tkey)
                        if windowed is False:  # not even the task and the last turn fit a sample
                            break
                    if windowed is not None:  # older turns left out: this prompt is rendered afresh
                        delta, seat.context = windowed, list(windowed)
                    else:
                        full = cfg.max_model_len is not None and len(seat.context) + len(delta) >= cfg.max_model_len
                        if full or cfg.context_policy == "full" and seat.used + len(delta) >= cfg.response_length:
                            break
                        seat.context.extend(delta)
                        seat.used += len(delta)
                room = cfg.max_model_len - len(seat.context) if cfg.max_model_len else cfg.max_tokens
                if cfg.context_policy != "full":  # a sample holds the prompt and response budget, per turn
                    budget = cfg.prompt_length + cfg.response_length - len(seat.context)
                else:
                    budget = cfg.response_length - seat.used
                max_tokens = min(cfg.max_tokens, budget, room)
                if max_tokens < 1:  # the server's context is full
                    break
                stage = "policy server"
                t0 = time.perf_counter()
                versions: list[int] = []
                if cfg.partial_rollout or cfg.sampling_seed is not None:
                    sample_out, versions = await self._generate(
                        seat.context, max_tokens, seat.session, task, sample, len(seat.traj.turns), seat.traj.metrics
                    )
                else:
                    sampling = default_sampling if max_tokens == cfg.max_tokens else cfg.sampling(max_tokens)
                    sample_out = await self.client.generate(seat.context, sampling, session_id=seat.session)
                gen_time += time.perf_counter() - t0
                ids = sample_out.token_ids
                if len(ids) > max_tokens:
                    raise EpisodeFailure(f"server returned {len(ids)} tokens for max_tokens={max_tokens}")
                text = chat.decode(ids)
                turn = Turn(
                    prompt_ids=list(delta),
                    response_ids=list(ids),
                    logprobs=list(sample_out.logprobs),
                    weight_version=sample_out.weight_version,
                    finish_reason=sample_out.finish_reason,
                    observation=observation,
                    response_text=text,
                    token_versions=versions if len(set(versions)) > 1 else [],
                    state_key=seat.state,
                    new_context=windowed is not None,
                )
                seat.traj.turns.append(turn)
                seat.context.extend(ids)
                seat.used += len(ids)
                seat.last_ids = list(ids)
                raw = chat.assistant_content(ids, text)
                seat.history.reply(raw)
                action = assistant_message(raw, tools is not None)
                seat.traj.messages.append(action)

                stage = "env.step"
                t0 = time.perf_counter()
                observation, reward, terminated, truncated, info = await handle.step(action)
                env_time += time.perf_counter() - t0
                turn.reward = float(reward)
                turn.metrics = turn_facts(info, sample_out.finish_reason)
                over = terminated or truncated or (cfg.context_policy == "full" and seat.used >= cfg.response_length)
                over = over or (max_turns is not None and len(seat.traj.turns) >= max_turns)
                if agents is None:
                    seat.receive(observation, info)  # kept in the conversation even when the episode ends here
                elif not over:
                    seat = seats[next_agent(info, agents)]
                    seat.receive(observation, info)
                if terminated:
                    status = "ok"
                if over:
                    break
            for seat in seats.values():
                seat.traj.status = status
                seat.traj.messages.extend(seat.pending)  # what the seat was told last (the result)
            results: dict[Any, tuple[float, dict[str, Any]]]
            if agents is None:
                results = {None: (float(info.get("outcome_reward", 0.0) or 0.0), info)}
            else:
                results = seat_results(info, agents)
            for name, seat in seats.items():
                seat.traj.outcome_reward, finish_infos[name] = results[name]
                if isinstance(info.get("ground_truth"), (str, int, float)):  # the reference an LLM judge is shown
                    seat.traj.task["ground_truth"] = info["ground_truth"]
        except asyncio.CancelledError:
            healthy = False
            raise
        except Exception as exc:  # noqa: BLE001 - any failure ends only this episode (every seat's trajectory)
            healthy = stage not in ("env.reset", "env.step")
            reason = "timed out" if isinstance(exc, EnvTimeout) else "raised"
            for seat in seats.values():
                seat.traj.status = "failed"
                seat.traj.failure = f"{stage} {reason}: {type(exc).__name__}: {exc}"
            finish_infos = {name: {} for name in names}
        finally:
            with contextlib.suppress(Exception):
                await handle.release(healthy)
            release = getattr(self.client, "release_session", None)
            if release is not None:
                for seat in seats.values():
                    release(seat.session)
        out = []
        for name, seat in seats.items():
            if agents is not None and not seat.traj.turns and seat.traj.status != "failed":
                continue  # the game ended before this seat's first move: nothing to train on
            self._finish(seat.traj, finish_infos[name], tools, check, env_time, gen_time)
            out.append(seat.traj)
        return out

    def _window(self, seat: _Seat, extended: int, tools: Any, tkey: str) -> list[int] | None | Literal[False]:
        """The next prompt under a ``window`` / ``compact`` policy: None when the history still fits the window
        and a sample's budget (``extended`` tokens: the prompt extended by the new delta), else the ids of the
        prompt rendered afresh with the most recent turns that fit (``context_window`` at most, fewer when the
        budget is short); False when not even the last turn fits."""
        cfg = self.config
        limit = cfg.prompt_length + cfg.response_length
        if cfg.max_model_len is not None:
            limit = min(limit, cfg.max_model_len)
        window = cfg.context_window
        if seat.history.dropped(window) == 0 and extended < limit:
            return None
        for keep in range(min(window, len(seat.history.turns)), 0, -1):
            messages = seat.history.prompt(cfg.context_policy, keep, self._summarize)
            if messages is None:  # every turn fits this window, but not the budget: keep fewer
                continue
            ids = self.chat.prompt_ids(messages, tools, tkey=tkey)
            if len(ids) < limit:
                return ids
        return False

    async def _generate(
        self,
        context: list[int],
        max_tokens: int,
        session: str,
        task: Task,
        sample: int,
        turn: int,
        metrics: dict[str, float],
    ) -> tuple[TokenSample, list[int]]:
        """One turn's generation, seeded (``sampling_seed``) and, with ``partial_rollout``, continued
        after aborts: returns the whole sample (the first token's version) and each token's version."""
        cfg = self.config
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for attempt in range(MAX_CONTINUATIONS + 1):
            sampling = cfg.sampling(max_tokens - len(ids))
            if cfg.sampling_seed is not None:
                sampling.seed = request_seed(cfg.sampling_seed, task.seed, sample, turn, attempt)
            out = await self.client.generate(context + ids, sampling, session_id=session)
            ids += out.token_ids
            logprobs += out.logprobs
            versions += [out.weight_version] * len(out.token_ids)
            if not cfg.partial_rollout or out.finish_reason != "abort" or len(ids) >= max_tokens:
                finish = "length" if out.finish_reason == "abort" and len(ids) >= max_tokens else out.finish_reason
                first = versions[0] if versions else out.weight_version
                return TokenSample(ids, logprobs, finish, first, out.text), versions
            metrics["resumed_generations"] = metrics.get("resumed_generations", 0.0) + 1.0
        raise EpisodeFailure(
            f"the policy server aborted this generation {MAX_CONTINUATIONS + 1} times in a row; is it shutting down?"
        )

    def _finish(
        self,
        traj: Trajectory,
        info: dict[str, Any],
        tools: list[dict[str, Any]] | None,
        check: bool,
        env_time: float,
        gen_time: float,
    ) -> None:
        m = traj.metrics
        sampled = sum(len(t.response_ids) for t in traj.turns)
        m["turns"] = float(traj.num_turns)
        m["sampled_tokens"] = float(sampled)
        m["tokens"] = float(sampled + sum(len(t.prompt_ids) for t in traj.turns))
        m["env_time_s"] = env_time
        m["gen_time_s"] = gen_time
        if traj.status != "failed":
            if "success" in info:
                m["success"] = float(bool(info["success"]))
            for key, value in (info.get("metrics") or {}).items():
                if isinstance(value, (int, float)):
                    m[f"env/{key}"] = float(value)
        m["success"] = float(traj.success)
        if check and traj.turns and traj.status != "failed":
            # the first token sequence (later ones, windowed prompts, are rendered afresh: nothing to compare)
            end = traj.segments()[0][1]
            ids = [i for t in traj.turns[:end] for i in (*t.prompt_ids, *t.response_ids)]
            at = self.chat.mismatch(self._raw_messages(traj, end), tools, ids)
            m["template_mismatch"] = 0.0 if at is None else 1.0
            if at is not None:
                m["template_mismatch_at"] = float(at)

    def _raw_messages(self, traj: Trajectory, turns: int | None = None) -> list[Message]:
        """The conversation up to the last assistant message (what the token sequence covers), or up to the
        ``turns``-th, each assistant message as its raw sampled text (for the template check)."""
        raw = iter(self.chat.assistant_content(t.response_ids, t.response_text) for t in traj.turns)
        out: list[Message] = [
            {"role": "assistant", "content": next(raw)} if m.get("role") == "assistant" else m for m in traj.messages
        ]
        ends = [i for i, m in enumerate(out) if m.get("role") == "assistant"]
        last = ends[-1] if turns is None else ends[turns - 1]
        return out[: last + 1]

    async def aclose(self) -> None:
        self.envs.shutdown()
        if self.episodes is not None:
            self.episodes.shutdown()

    async def __aenter__(self) -> RolloutRunner:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
