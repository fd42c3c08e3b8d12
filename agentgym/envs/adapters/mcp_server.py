"""``agentgym env-serve --mcp``: any registered env as MCP tools, so an MCP-speaking agent can act in it.

    agentgym env-serve --env sokoban --mcp                                   # stdio (an MCP client launches it)
    agentgym env-serve --env sokoban --mcp --mcp-transport streamable-http --port 8010   # http://HOST:PORT/mcp

Tools (each MCP session holds its own env instance, closed when the session ends; at most
``--max-sessions`` at once):

* ``reset(seed?, options?)``: start an episode; the result is the first observation.
* ``step(action)``: the agent's reply (text; or an OpenAI assistant message with ``tool_calls`` for
  envs that offer tools) -> the new observation.

A result is ``{"messages": [...new chat messages...], "reward": r, "terminated": t, "truncated": u,
"done": t or u, "info": {...}}`` (``reward`` is null after ``reset``; ``info`` as the env returned it,
made JSON-safe: ``info["tools"]`` lists the env's own tool schemas, ``info["outcome_reward"]`` the
episode's score on its last step). It comes back both as the call's text (JSON) and as MCP
structured content. ``step`` before ``reset`` or after ``done`` is an error result that says so.
"""

# No ``from __future__ import annotations``: FastMCP reads the tools' annotations at runtime, and
# ``Context`` is imported inside create_mcp_server (the mcp package is optional).
import argparse
import asyncio
import contextlib
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from agentgym.envs.adapters.wire import jsonable


class _Episode:
    """One MCP session's env and whether its episode is running."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.running = False
        self.lock = asyncio.Lock()


def _close(env: Any) -> None:
    with contextlib.suppress(Exception):
        env.close()


def create_mcp_server(
    env_name: str,
    env_kwargs: dict[str, Any] | None = None,
    factory: Callable[[], Any] | None = None,
    host: str = "127.0.0.1",
    port: int = 8010,
    max_sessions: int = 1024,
) -> Any:
    """The FastMCP server offering ``reset`` and ``step`` on ``env_name`` (or ``factory``'s envs)."""
    from mcp.server.fastmcp import Context, FastMCP
    from mcp.server.fastmcp.exceptions import ToolError

    from agentgym.registry import env_spec, make

    kwargs = dict(env_kwargs or {})
    build = factory or (lambda: make(env_name, **kwargs))
    probe = build()  # fail now, not on the first call, when the env cannot be built
    max_turns = getattr(probe, "max_turns", None)
    description = ""
    with contextlib.suppress(Exception):
        description = env_spec(env_name).description
    idle: list[Any] = [probe]
    episodes: weakref.WeakKeyDictionary[Any, _Episode] = weakref.WeakKeyDictionary()
    guard = threading.Lock()
    about = f"the agentgym env {env_name!r}" + (f" ({description})" if description else "")
    server = FastMCP(
        name=f"agentgym-{env_name}",
        instructions=f"Act in {about}: call reset to start an episode, then step with your reply until done. "
        + (f"An episode lasts at most {max_turns} steps." if max_turns else ""),
        host=host,
        port=port,
        log_level="WARNING",
    )

    def episode_of(session: Any) -> _Episode:
        with guard:
            episode = episodes.get(session)
            if episode is None:
                if len(episodes) >= max_sessions:
                    raise ToolError(
                        f"env server full: {max_sessions} sessions hold an env (agentgym env-serve --max-sessions)"
                    )
                env = idle.pop() if idle else build()
                episode = episodes[session] = _Episode(env)
                weakref.finalize(session, _close, env)  # the session is gone: so is its env
            return episode

    @server.tool(
        name="reset",
        description=f"Start a new episode of {about}. Returns the first observation: the messages (the task) "
        "and info (info.tools lists the env's own tools, if any). seed picks the task; options are env-specific.",
    )
    async def reset(ctx: Context, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        episode = episode_of(ctx.session)
        async with episode.lock:
            try:
                messages, info = await asyncio.to_thread(episode.env.reset, seed=seed, options=options)
            except Exception as exc:
                raise ToolError(f"the env's reset raised {type(exc).__name__}: {exc}") from exc
            episode.running = True
        return {
            "messages": jsonable(list(messages)),
            "reward": None,
            "terminated": False,
            "truncated": False,
            "done": False,
            "info": jsonable(dict(info or {})),
        }

    @server.tool(
        name="step",
        description=f"Act in {about}: send your reply to the last observation (plain text, or an OpenAI "
        "assistant message with tool_calls for the env's own tools). Returns the new messages, the reward, "
        "done (the episode is over: call reset for a new one) and info (info.outcome_reward: the episode's score).",
    )
    async def step(ctx: Context, action: str | dict[str, Any]) -> dict[str, Any]:
        episode = episode_of(ctx.session)
        async with episode.lock:
            if not episode.running:
                raise ToolError("no episode is running: call reset first (an episode also ends when done is true)")
            try:
                messages, reward, terminated, truncated, info = await asyncio.to_thread(episode.env.step, action)
            except Exception as exc:
                episode.running = False
                raise ToolError(f"the env's step raised {type(exc).__name__}: {exc}; call reset") from exc
            done = bool(terminated or truncated)
            episode.running = not done
        return {
            "messages": jsonable(list(messages)),
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "done": done,
            "info": jsonable(dict(info or {})),
        }

    return server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mcp",
        action="store_true",
        help="serve the env as MCP tools (reset, step) instead of OpenEnv's API (agentgym/envs/adapters/mcp_server.py)",
    )
    parser.add_argument(
        "--mcp-transport",
        choices=("stdio", "streamable-http"),
        default="stdio",
        help="--mcp: stdio (an MCP client starts this command) or streamable-http (at http://HOST:PORT/mcp)",
    )


def run(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> int:
    """``agentgym env-serve --env NAME --mcp [--mcp-transport stdio|streamable-http] [--host] [--port]``."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        print("error: env-serve --mcp needs the mcp package: pip install 'agentgym[mcp]'", file=sys.stderr)
        return 2
    from agentgym.registry import UnknownNameError

    try:
        server = create_mcp_server(args.env, env_kwargs, host=args.host, port=args.port, max_sessions=args.max_sessions)
    except UnknownNameError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bad --env-arg, a missing package: say so
        print(
            f"error: could not build env {args.env!r} with {env_kwargs}: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return 2
    where = "stdio" if args.mcp_transport == "stdio" else f"http://{args.host}:{args.port}/mcp"
    print(f"serving {args.env} as MCP tools (reset, step) over {where}", file=sys.stderr, flush=True)
    server.run(transport=args.mcp_transport)
    return 0
