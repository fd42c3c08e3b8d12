"""Multi-agent envs: one game, a token-exact trajectory per seat (self-play).

The protocol (a TextEnv with an ``agents`` attribute, e.g. ``["player_0", "player_1"]``):

* ``reset(seed, options) -> (messages, info)``: ``info["agent"]`` is the seat to act first and
  ``messages`` are that seat's opening messages.
* ``step(action) -> (messages, reward, terminated, truncated, info)``: ``action`` is the reply of
  the seat that was to act and ``reward`` is that seat's turn reward; ``info["agent"]`` is the
  next seat to act and ``messages`` are the new messages *for that seat* since it last acted
  (its opening messages if it has not acted yet). On the final step
  ``info["outcome_rewards"]`` maps each seat to its outcome reward (``info["successes"]``,
  optional, to its success; default: outcome > 0).

Every seat is the same policy: each keeps its own conversation and token sequence (its
prompt, its sampled tokens, the env's messages to it as deltas), sampled under its own session
id, so each seat's trajectory is exactly what the server saw for that seat. A seat's
trajectory goes in group ``{group_id}/{agent}``: the ``n`` games of a task give each seat a
group of ``n`` (GRPO compares a seat with itself). A seat that never acted gives no
trajectory. The limits of ``RolloutConfig`` apply per seat; one seat reaching a limit ends the
game as truncated for both. An env or server failure fails the game: every seat's trajectory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentgym.rollout.chat import tools_key
from agentgym.rollout.executors import EnvTimeout
from agentgym.types import Message, Trajectory, Turn


@dataclass
class _Seat:
    traj: Trajectory
    session: str
    pending: list[Message] = field(default_factory=list)  # the env's messages not yet tokenized
    context: list[int] | None = None  # the whole sequence so far (None: no prompt rendered yet)
    last_ids: list[int] = field(default_factory=list)
    used: int = 0  # tokens after the first prompt


async def run_game(
    runner: Any,
    task: Any,
    group_id: str,
    sample: int,
    max_turns: int | None,
    *,
    reply_message: Callable[[str, bool], Message],
    failure: type[Exception],
) -> list[Trajectory]:
    """Play one game of a multi-agent env; returns a trajectory per seat that acted.

    ``reply_message`` and ``failure`` are the runner's ``assistant_message`` and ``EpisodeFailure``
    (passed in, so this module does not import the runner that imports it)."""
    cfg = runner.config
    chat = runner.chat
    agents = [str(a) for a in (await runner.env_info())["agents"]]
    seats: dict[str, _Seat] = {}
    for agent in agents:
        gid = f"{group_id}/{agent}"
        session = f"{gid}/{sample}"
        traj = Trajectory(
            env_id=runner.env_name,
            group_id=gid,
            seed=task.seed,
            data_source=runner.env_name,
            task={"seed": task.seed, "index": task.index, "sample": sample, "session": session, "agent": agent},
        )
        seats[agent] = _Seat(traj, session)
    check = runner.start_episode()
    handle = runner.envs.open()
    healthy = True
    stage = "env.reset"
    env_time = gen_time = 0.0
    tools: list[dict[str, Any]] | None = None
    info: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        observation, info = await handle.reset(task.seed, task.reset_options())
        env_time += time.perf_counter() - t0
        source = str(info.get("data_source") or runner.env_name)
        for seat in seats.values():
            seat.traj.data_source = source
        tools = info.get("tools") or None
        tkey = tools_key(tools)
        agent = _agent(info, seats)
        seats[agent].pending.extend(observation)
        status = "truncated"
        while True:
            seat = seats[agent]
            stage = "chat template"
            observation = seat.pending
            seat.pending = []
            if seat.context is None:
                delta = chat.prompt_ids(observation, tools, tkey=tkey)
                if len(delta) > cfg.prompt_length:
                    raise failure(f"{agent}: prompt has {len(delta)} tokens > prompt_length={cfg.prompt_length}")
                seat.context = list(delta)
                seat.traj.messages = list(observation)
            else:
                delta = chat.delta_ids(observation, tools, seat.last_ids[-1] if seat.last_ids else None, tkey=tkey)
                full = cfg.max_model_len is not None and len(seat.context) + len(delta) >= cfg.max_model_len
                if full or seat.used + len(delta) >= cfg.response_length:
                    break
                seat.context.extend(delta)
                seat.used += len(delta)
                seat.traj.messages.extend(observation)
            room = cfg.max_model_len - len(seat.context) if cfg.max_model_len else cfg.max_tokens
            max_tokens = min(cfg.max_tokens, cfg.response_length - seat.used, room)
            if max_tokens < 1:
                break
            stage = "policy server"
            t0 = time.perf_counter()
            sampling = cfg.sampling(max_tokens)
            sample_out = await runner.client.generate(seat.context, sampling, session_id=seat.session)
            gen_time += time.perf_counter() - t0
            ids = sample_out.token_ids
            if len(ids) > max_tokens:
                raise failure(f"server returned {len(ids)} tokens for max_tokens={max_tokens}")
            text = chat.decode(ids)
            turn = Turn(
                prompt_ids=list(delta),
                response_ids=list(ids),
                logprobs=list(sample_out.logprobs),
                weight_version=sample_out.weight_version,
                finish_reason=sample_out.finish_reason,
                observation=observation,
                response_text=text,
            )
            seat.traj.turns.append(turn)
            seat.context.extend(ids)
            seat.used += len(ids)
            seat.last_ids = list(ids)
            action = reply_message(chat.assistant_content(ids, text), tools is not None)
            seat.traj.messages.append(action)

            stage = "env.step"
            t0 = time.perf_counter()
            observation, reward, terminated, truncated, info = await handle.step(action)
            env_time += time.perf_counter() - t0
            turn.reward = float(reward)
            if terminated:
                status = "ok"
                break
            if (
                truncated
                or seat.used >= cfg.response_length
                or (max_turns is not None and len(seat.traj.turns) >= max_turns)
            ):
                break
            agent = _agent(info, seats)
            seats[agent].pending.extend(observation)
        outcomes = info.get("outcome_rewards") or {}
        successes = info.get("successes") or {}
        for name, seat in seats.items():
            seat.traj.status = status
            seat.traj.outcome_reward = float(outcomes.get(name, 0.0) or 0.0)
            seat.traj.messages.extend(seat.pending)  # what the seat was told last (the result)
        seat_infos = {
            name: {
                **({"success": successes[name]} if name in successes else {}),
                "metrics": info.get("metrics") or {},
            }
            for name in seats
        }
    except asyncio.CancelledError:
        healthy = False
        raise
    except Exception as exc:  # noqa: BLE001 - any failure ends only this game
        healthy = stage not in ("env.reset", "env.step")
        reason = "timed out" if isinstance(exc, EnvTimeout) else "raised"
        for seat in seats.values():
            seat.traj.status = "failed"
            seat.traj.failure = f"{stage} {reason}: {type(exc).__name__}: {exc}"
        seat_infos = {name: {} for name in seats}
    finally:
        with contextlib.suppress(Exception):
            await handle.release(healthy)
        release = getattr(runner.client, "release_session", None)
        if release is not None:
            for seat in seats.values():
                release(seat.session)
    out = []
    for name, seat in seats.items():
        if not seat.traj.turns and seat.traj.status != "failed":
            continue  # the game ended before this seat's first move: nothing to train on
        runner._finish(seat.traj, seat_infos[name], tools, check, env_time, gen_time)
        out.append(seat.traj)
    return out


def _agent(info: dict[str, Any], seats: dict[str, _Seat]) -> str:
    agent = str(info.get("agent"))
    if agent not in seats:
        raise RuntimeError(f"the env named seat {info.get('agent')!r} to act; its agents are {list(seats)}")
    return agent
