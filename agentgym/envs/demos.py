"""Demonstrations: an env's expert played through its own ``reset``/``step``, saved as chat.

    agentgym demos --env sokoban --n 5000 -o demos.jsonl
    write_demos("sokoban", n=5000, path="demos.jsonl")            # the same from Python
    demos = read_demos("demos.jsonl", env="sokoban")               # checked on the way in

Every reply of a demonstration is the env's ``expert_action()`` and went through ``step``, so
a demonstration is valid by construction: its turn rewards and outcome are the env's own.
Episode ``i`` is the task the rollout runner would give it (``make_tasks``): seed
``seed + i``, and for dataset envs row ``i % num_tasks()``.

One JSON object per line:

* ``env``, ``env_kwargs``: the registered name and constructor arguments it was built with;
* ``seed``, ``index``: the task (``index`` is the dataset row, None for generated envs);
* ``messages``: the conversation exactly as the rollout runner builds it — the reset
  messages, then per turn the assistant message and the env's new messages (the last turn's
  feedback included). An expert reply given as text becomes ``{"role": "assistant",
  "content": text}``; a message dict (e.g. with ``tool_calls``) is kept as it is;
* ``tools``: ``info["tools"]`` from ``reset`` (None when the env offers none); render the
  messages with these tools, as the runner does, to get the tokens the policy sees;
* ``turn_rewards``, ``outcome_reward``, ``success``, ``turns``, ``status`` (``ok``: the env
  ended the episode; ``truncated``: its step budget or ``max_turns`` did).

Episodes the expert did not solve are left out unless ``keep_failures`` (they would teach
the model to fail); the count is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.envs.base import NoExpertError, has_expert
from agentgym.envs.env_args import parse_env_args
from agentgym.types import Message


class DemoError(ValueError):
    """Bad input for writing or reading demonstrations; the message says what to do."""


@dataclass
class DemoStats:
    """What ``write_demos`` did: episodes played, lines written, where."""

    episodes: int
    written: int
    solved: int
    path: str

    @property
    def left_out(self) -> int:
        return self.episodes - self.written


def _envs_with_experts() -> list[str]:
    from agentgym.registry import env_spec, registered

    names = []
    for name in registered("env"):
        try:
            if has_expert(env_spec(name).load()):
                names.append(name)
        except Exception:  # noqa: BLE001 - a broken plugin must not hide the others
            continue
    return names


def _no_expert(name: str) -> DemoError:
    return DemoError(
        f"env {name!r} has no expert, so it cannot write demonstrations. Envs with one: "
        f"{', '.join(_envs_with_experts()) or '(none)'}. To give an env an expert, implement "
        "TextEnv.expert_action() (see agentgym.envs.base)."
    )


def build_env(env: str | Any, env_kwargs: dict[str, Any] | None = None) -> tuple[Any, str]:
    """``(env instance, name)`` for a registered name or an instance; DemoError if it cannot demonstrate."""
    if isinstance(env, str):
        from agentgym.registry import env_spec, make

        spec = env_spec(env)  # UnknownNameError suggests the closest name
        if has_expert(spec.load()) is False:
            raise _no_expert(env)
        try:
            instance = make(env, **(env_kwargs or {}))
        except (TypeError, ValueError, OSError) as exc:
            raise DemoError(
                f"could not build env {env!r} with {env_kwargs or {}}: {type(exc).__name__}: {exc}"
            ) from exc
        name = env
    else:
        if env_kwargs:
            raise DemoError(
                "env_kwargs are only used with a registered env name; pass the instance built as you want it"
            )
        instance = env
        name = getattr(env, "spec_name", None) or type(env).__name__
    if has_expert(instance) is False:
        raise _no_expert(name)
    return instance, name


def play_expert(env: Any, seed: int | None, index: int | None = None, max_turns: int | None = None) -> dict[str, Any]:
    """One episode of the env's expert: the demonstration record (without ``env``/``env_kwargs``)."""
    options = None if index is None else {"index": index}
    observation, info = env.reset(seed=seed, options=options)
    tools = info.get("tools") or None
    messages: list[Message] = [dict(m) for m in observation]  # type: ignore[misc]
    if max_turns is None:
        max_turns = getattr(env, "max_turns", None)
    turn_rewards: list[float] = []
    status = "truncated"
    outcome = 0.0
    success = False
    while max_turns is None or len(turn_rewards) < max_turns:
        try:
            action = env.expert_action()
        except NoExpertError as exc:
            raise _no_expert(getattr(env, "spec_name", type(env).__name__)) from exc
        if action is None:
            break
        messages.append(_assistant(action))
        observation, reward, terminated, truncated, info = env.step(action)
        turn_rewards.append(float(reward))
        messages.extend(dict(m) for m in observation)  # type: ignore[misc]
        if terminated or truncated:
            status = "ok" if terminated else "truncated"
            outcome = float(info.get("outcome_reward", 0.0) or 0.0)
            success = bool(info.get("success", outcome > 0))
            break
    return {
        "seed": seed,
        "index": index,
        "messages": messages,
        "tools": tools,
        "turn_rewards": turn_rewards,
        "outcome_reward": outcome,
        "success": success,
        "turns": len(turn_rewards),
        "status": status,
    }


def _assistant(action: Any) -> Message:
    if isinstance(action, str):
        return {"role": "assistant", "content": action}
    if isinstance(action, dict):
        return {"role": "assistant", **{k: v for k, v in action.items() if k != "role"}}  # type: ignore[return-value]
    raise DemoError(f"expert_action() returned a {type(action).__name__}; it must return text or a message dict")


def write_demos(
    env: str | Any,
    n: int,
    path: str | os.PathLike[str],
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    keep_failures: bool = False,
    progress: bool = True,
) -> DemoStats:
    """Play ``n`` expert episodes (tasks ``seed .. seed + n - 1``) and write them to ``path``
    (JSONL, one episode a line). ``env``: a registered name (built with ``env_kwargs``) or a
    TextEnv instance. ``max_turns``: the rollout's turn limit (default the env's ``max_turns``);
    use the same one the policy will be trained and evaluated with. Returns the counts."""
    if not isinstance(n, int) or n < 1:
        raise DemoError(f"n must be a positive number of episodes, got {n!r}")
    if max_turns is not None and max_turns < 1:
        raise DemoError(f"max_turns must be at least 1, got {max_turns}")
    instance, name = build_env(env, env_kwargs)
    num_tasks = instance.num_tasks() if hasattr(instance, "num_tasks") else None
    if num_tasks is not None and num_tasks < 1:
        raise DemoError(f"env {name!r} has no tasks (num_tasks() == 0): give it data (e.g. data_files=...)")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    kwargs = dict(env_kwargs or {})
    bar = None
    if progress:
        from agentgym.progress import progress_bar

        bar = progress_bar(total=n, desc=f"demos {name}", unit="ep")
    written = solved = 0
    staging = target.with_name(f".{target.name}.partial")
    try:
        with staging.open("w") as out:
            for i in range(n):
                index = None if num_tasks is None else i % num_tasks
                record = play_expert(instance, seed + i, index, max_turns)
                solved += record["success"]
                if record["success"] or keep_failures:
                    out.write(json.dumps({"env": name, "env_kwargs": kwargs, **record}, ensure_ascii=False) + "\n")
                    written += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"solved {solved / (i + 1):.0%}", refresh=False)
        staging.replace(target)  # a finished file or none: an interrupted run leaves no half file
    finally:
        staging.unlink(missing_ok=True)
        if bar is not None:
            bar.close()
    return DemoStats(episodes=n, written=written, solved=solved, path=str(target))


def read_demos(
    path: str | os.PathLike[str], env: str | None = None, env_kwargs: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The demonstrations in ``path``, checked: every line has messages with an assistant turn,
    and when ``env`` (and ``env_kwargs``) are given, they were written for that env with those
    arguments. Raises ``DemoError`` naming the fix."""
    source = Path(path)
    if not source.is_file():
        raise DemoError(
            f"no demonstrations file at {str(path)!r}: write one with "
            f"agentgym demos --env {env or 'ENV'} --n N -o {path}"
        )
    records = []
    with source.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise DemoError(f"{where}: not a JSON line ({exc})") from None
            messages = record.get("messages") if isinstance(record, dict) else None
            if not isinstance(messages, list) or not any(
                isinstance(m, dict) and m.get("role") == "assistant" for m in messages
            ):
                raise DemoError(f"{where}: no assistant turn in 'messages': nothing to learn from")
            if env is not None and record.get("env") != env:
                raise DemoError(
                    f"{where}: a demonstration of env {record.get('env')!r}, not {env!r}; write demos "
                    f"for this env with: agentgym demos --env {env} --n N -o FILE"
                )
            if env_kwargs is not None:
                differ = _differing(record.get("env_kwargs") or {}, env_kwargs)
                if differ:
                    raise DemoError(
                        f"{where}: written with other env arguments ({differ}); write new demos with the "
                        "same arguments the policy is trained with (--env-arg KEY=VALUE)"
                    )
            records.append(record)
    if not records:
        raise DemoError(f"{path} holds no demonstrations")
    return records


def _differing(written: dict[str, Any], wanted: dict[str, Any]) -> str:
    keys = sorted(set(written) | set(wanted))
    plain = json.loads(json.dumps(wanted))  # tuples as lists, as they were written
    return ", ".join(
        f"{k}: {written.get(k)!r} in the file, {plain.get(k)!r} wanted" for k in keys if written.get(k) != plain.get(k)
    )


# ---- the command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentgym.envs import env_args

    parser.add_argument("--env", required=True, help="registered env with an expert (see `agentgym envs`)")
    parser.add_argument("--n", type=int, required=True, help="episodes to play (tasks seed .. seed+n-1)")
    parser.add_argument("-o", "--out", required=True, help="output JSONL file")
    parser.add_argument("--seed", type=int, default=0, help="first seed (keep held-out seeds out of the range)")
    parser.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help=env_args.HELP)
    parser.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="turns per episode: the same limit the policy is trained and evaluated with",
    )
    parser.add_argument("--keep-failures", action="store_true", help="also write episodes the expert did not solve")


def run(args: argparse.Namespace) -> int:
    """``agentgym demos --env NAME --n N -o FILE [--seed S] [--env-arg K=V ...] [--max-turns T]
    [--keep-failures]``: write demonstrations; exit status 2 on bad input, 1 when none was solved."""
    from agentgym.registry import UnknownNameError

    try:
        try:
            env_kwargs = parse_env_args(args.env_arg)
        except ValueError as exc:
            raise DemoError(str(exc)) from None
        stats = write_demos(
            args.env,
            args.n,
            args.out,
            seed=args.seed,
            env_kwargs=env_kwargs,
            max_turns=args.max_turns,
            keep_failures=args.keep_failures,
        )
    except (DemoError, UnknownNameError) as exc:
        print(f"agentgym demos: error: {exc}", file=sys.stderr)
        return 2
    line = (
        f"wrote {stats.written} demonstrations of {args.env} to {stats.path} "
        f"(seeds {args.seed}..{args.seed + args.n - 1}; the expert solved {stats.solved} of {stats.episodes})"
    )
    print(line)
    if stats.left_out:
        print(
            f"{stats.left_out} unsolved episodes were left out (--keep-failures keeps them); when the turn or "
            f"step budget is too small for the expert, raise --max-turns or the env's max_steps",
            file=sys.stderr,
        )
    return 0 if stats.written else 1
