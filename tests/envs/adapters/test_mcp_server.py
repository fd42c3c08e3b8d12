"""``agentgym env-serve --mcp``: an MCP client (the ``mcp`` SDK) plays sokoban through reset/step tools."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def env_serve(*args: str) -> StdioServerParameters:
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "agentgym.cli", "env-serve", *args], env=env, cwd=str(ROOT)
    )


def result(call) -> dict:
    assert not call.isError, call.content
    assert json.loads(call.content[0].text) == call.structuredContent  # the same observation, as text and data
    return call.structuredContent


async def test_an_mcp_agent_plays_sokoban_over_stdio():
    import agentgym

    local = agentgym.make("sokoban")  # the same env in process: what the served one must answer
    expected_first, _ = local.reset(seed=7)
    plan = []
    while (move := local.unwrapped.expert_action()) is not None and len(plan) < 40:
        plan.append(move)
        *_, terminated, truncated, local_info = local.step(move)
        if terminated or truncated:
            break
    async with stdio_client(env_serve("--env", "sokoban", "--mcp")) as (read, write):  # noqa: SIM117
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert set(tools) == {"reset", "step"}
            assert "sokoban" in tools["reset"].description and "action" in tools["step"].inputSchema["properties"]

            early = await session.call_tool("step", {"action": "<answer>Up</answer>"})
            assert early.isError and "call reset first" in early.content[0].text

            first = result(await session.call_tool("reset", {"seed": 7}))
            assert first["messages"] == expected_first and first["done"] is False
            for move in plan:
                observation = result(await session.call_tool("step", {"action": move}))
            assert observation["done"] and observation["info"]["success"] is True
            assert observation["info"]["outcome_reward"] == local_info["outcome_reward"]

            after = await session.call_tool("step", {"action": plan[0]})
            assert after.isError and "call reset first" in after.content[0].text


async def test_a_bad_env_is_a_clear_error():
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "env-serve", "--env", "no-such-env", "--mcp"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 2 and "no-such-env" in done.stderr


async def test_each_http_session_has_its_own_env():
    import socket
    import subprocess
    import time

    from mcp.client.streamable_http import streamablehttp_client

    import agentgym

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["env-serve", "--env", "sokoban", "--mcp", "--mcp-transport", "streamable-http", "--port", str(port)]
    server = subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and server.poll() is None, "env-serve --mcp did not start"
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        async with streamablehttp_client(url) as (r1, w1, _), streamablehttp_client(url) as (r2, w2, _):  # noqa: SIM117
            async with ClientSession(r1, w1) as one, ClientSession(r2, w2) as two:
                await one.initialize()
                await two.initialize()
                first = result(await one.call_tool("reset", {"seed": 1}))
                second = result(await two.call_tool("reset", {"seed": 2}))
                assert first["messages"] == agentgym.make("sokoban").reset(seed=1)[0]
                assert second["messages"] == agentgym.make("sokoban").reset(seed=2)[0]
                expected = {}
                for seed, session in ((1, one), (2, two)):  # each steps its own board
                    local = agentgym.make("sokoban")
                    local.reset(seed=seed)
                    expected[seed] = local.step("<answer>Up</answer>")[0]
                    stepped = result(await session.call_tool("step", {"action": "<answer>Up</answer>"}))
                    assert stepped["messages"] == expected[seed]
                assert expected[1] != expected[2]  # so a shared env would have been caught
    finally:
        server.kill()
        server.wait()


async def test_max_sessions_bounds_the_envs_held():
    from mcp.shared.memory import create_connected_server_and_client_session

    from agentgym.envs.adapters.mcp_server import create_mcp_server

    server = create_mcp_server("sokoban", max_sessions=1)
    async with create_connected_server_and_client_session(server._mcp_server) as one:
        assert result(await one.call_tool("reset", {"seed": 1}))["done"] is False
        async with create_connected_server_and_client_session(server._mcp_server) as two:
            full = await two.call_tool("reset", {"seed": 2})
            assert full.isError and "env server full: 1 sessions" in full.content[0].text
