"""Play any registered text env in the terminal: ``agentgym play --env sokoban --seed 0``.

You are the policy: each line you type is the assistant's reply. A line starting with
``{`` is read as a JSON message dict, so tool calls can be typed::

    {"tool_calls": [{"id": "1", "type": "function",
                     "function": {"name": "move", "arguments": "{\\"direction\\": \\"up\\"}"}}]}

``quit`` (or end of input) stops; the episode summary is printed either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

QUIT_WORDS = frozenset({"quit", "exit", ":q"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentgym.envs import env_args

    parser.add_argument("--env", required=True, help="registered env name (see `agentgym envs`)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help=env_args.HELP)


def run(args: argparse.Namespace) -> int:
    """``agentgym play --env NAME [--seed S] [--env-arg K=V ...]``."""
    from agentgym.envs.env_args import parse_env_args

    try:
        env_kwargs = parse_env_args(args.env_arg)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return play(args.env, seed=args.seed, env_kwargs=env_kwargs)


def play(
    env_name: str,
    seed: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    input_fn: Callable[[str], str] = input,
    output: TextIO | None = None,
) -> int:
    """Run one interactive episode of ``env_name``; returns the exit status (0, or 2 when
    the env cannot be built). ``input_fn`` reads one reply per call (``EOFError`` ends the
    game) and everything shown goes to ``output`` (default: ``sys.stdout`` at call time)."""
    from agentgym.registry import make

    out = sys.stdout if output is None else output

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    try:
        env = make(env_name, **(env_kwargs or {}))
    except (KeyError, ImportError, TypeError, ValueError) as exc:
        say(f"error: {exc}")
        return 2
    messages, info = env.reset(seed=seed)
    say(f"== {env_name}" + (f" (seed {seed})" if seed is not None else ""))
    for tool in info.get("tools") or ():
        function = tool.get("function", {})
        say(f"[tool available] {function.get('name')}: {function.get('description', '')}")
    _show(messages, say)
    say("Type your reply (a line starting with '{' is a JSON message); 'quit' to stop.")

    turns, total, done = 0, 0.0, False
    terminated = truncated = False
    while not done:
        try:
            line = input_fn("> ")
        except (EOFError, KeyboardInterrupt):
            say()
            break
        if line.strip().lower() in QUIT_WORDS:
            break
        action = _read_action(line)
        if isinstance(action, Exception):
            say(f"not a valid JSON message ({action}); try again")
            continue
        messages, reward, terminated, truncated, info = env.step(action)
        turns += 1
        total += float(reward)
        _show(messages, say)
        say(f"[reward {float(reward):+g}]")
        done = bool(terminated or truncated)
    _summary(say, turns, total, terminated, truncated, done, info)
    env.close()
    return 0


def _read_action(line: str) -> str | dict[str, Any] | Exception:
    """A typed line as the assistant's reply: text, or a message dict for JSON lines."""
    if not line.lstrip().startswith("{"):
        return line
    try:
        message = json.loads(line)
    except ValueError as exc:
        return exc
    if not isinstance(message, dict):
        return ValueError("expected a JSON object")
    message.setdefault("role", "assistant")
    message.setdefault("content", None)
    return message


def _show(messages: list[dict[str, Any]], say: Callable[[str], None]) -> None:
    for message in messages:
        say(f"--- {message.get('role', '?')}")
        say(str(message.get("content") or ""))


def _summary(
    say: Callable[[str], None],
    turns: int,
    total: float,
    terminated: bool,
    truncated: bool,
    done: bool,
    info: dict[str, Any],
) -> None:
    status = "terminated" if terminated else "truncated" if truncated else "stopped before the end"
    say("=== episode summary")
    say(f"turns: {turns}")
    say(f"total reward: {total:+g}")
    say(f"status: {status}")
    if done:
        say(f"outcome reward: {info.get('outcome_reward', 0.0):+g}")
        say(f"success: {bool(info.get('success', False))}")
    for name, value in (info.get("metrics") or {}).items():
        say(f"{name}: {value}")
