"""Tools from MCP servers: schemas, routed calls, errors, the timeout bound, the output cap, a dead
server, process-group cleanup, stdio and streamable HTTP (tests/support/mcp_server.py)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from agentgym.envs.tools import Toolbox, make_tools  # noqa: E402
from agentgym.envs.tools.mcp import MCPServerConfig, MCPUnavailable, mcp_tools  # noqa: E402

SERVER = str(Path(__file__).resolve().parents[2] / "support" / "mcp_server.py")


def stdio(name: str = "test", **kwargs) -> dict:
    return {"name": name, "command": sys.executable, "args": [SERVER], **kwargs}


def call(box: Toolbox, name: str, **arguments):
    return box.execute({"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split(")")[-1].split()[0] != "Z"


def wait_gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def box():
    box = Toolbox(mcp_tools([stdio("routes", call_timeout_s=1.0, max_output_chars=300)]), max_output_chars=1000)
    yield box
    box.close()


def test_schemas_come_from_the_servers_tools(box):
    schemas = {s["function"]["name"]: s["function"] for s in box.schemas}
    assert set(schemas) >= {"add", "lookup", "sleep_forever", "huge", "crash"}
    add = schemas["add"]
    assert add["description"] == "Add two numbers and return the sum."
    assert add["parameters"]["type"] == "object"
    assert set(add["parameters"]["properties"]) == {"a", "b"} and add["parameters"]["required"] == ["a", "b"]


def test_calls_are_routed_to_the_server(box):
    assert call(box, "add", a=2, b=40.5).text == "42.5"
    assert call(box, "lookup", city="Tokyo").text == "Japan"
    result = call(box, "fail", message="no such row")
    assert result.error == "tool_error" and "no such row" in result.text
    assert call(box, "add", a=1).error == "tool_error"  # the server's own argument check


def test_a_hanging_call_costs_its_timeout_and_the_server_goes_on(box):
    start = time.perf_counter()
    result = call(box, "sleep_forever")
    took = time.perf_counter() - start
    assert result.error == "timeout" and "did not answer within 1 s" in result.text
    assert 1.0 <= took < 1.75, took  # the timeout + GRACE_S (0.1 s), with room for a loaded machine
    assert call(box, "add", a=1, b=1).text == "2"


def test_output_is_capped(box):
    result = call(box, "huge", n=100_000)
    assert result.ok and result.text.startswith("x" * 300) and "truncated: 99700 more characters" in result.text
    assert len(result.text) < 400


def test_hermes_text_calls_reach_the_server():
    import agentgym
    from tests.support.mcp_env import ensure_tool_task

    ensure_tool_task()
    env = agentgym.make("tool_task", task="arithmetic", mcp_servers=[stdio("hermes", tools=["add"], prefix="calc_")])
    try:
        messages, info = env.reset(seed=3)
        assert [t["function"]["name"] for t in info["tools"]] == ["calc_add"]
        reply = '<tool_call>{"name": "calc_add", "arguments": {"a": 20, "b": 22}}</tool_call>'
        observation, _, terminated, _, _ = env.step(reply)
        assert observation[0]["role"] == "tool" and observation[0]["content"] == "42" and not terminated
        _, _, terminated, _, final = env.step(f"#### {info['answer']}")
        assert terminated and final["outcome_reward"] == 1.0 and final["metrics"]["tool_calls/calc_add"] == 1.0
    finally:
        env.close()


def test_a_dead_server_is_an_error_then_restarted():
    tools = mcp_tools([stdio("crashy", max_restarts=1, call_timeout_s=5)])
    box = Toolbox(tools)
    try:
        first = tools[0].connection.pid
        start = time.perf_counter()
        crashed = call(box, "crash")
        assert crashed.error == "mcp_server_dead" and "not running" in crashed.text
        assert time.perf_counter() - start < 2.0  # told at once, not after call_timeout_s
        assert call(box, "add", a=1, b=2).text == "3"  # started again
        assert tools[0].connection.pid != first and wait_gone(first)
        call(box, "crash")
        again = call(box, "add", a=1, b=2)  # no restarts left
        assert again.error == "mcp_server_dead" and "again" not in again.text
    finally:
        box.close()


def test_close_kills_the_servers_process_group(monkeypatch):
    monkeypatch.setenv("AGENTGYM_TEST_SECRET", "do-not-leak")
    tools = mcp_tools([stdio("group", shared=False, memory_mb=2048, env={"GREETING": "hi"})])
    box = Toolbox(tools)
    server = tools[0].connection.pid
    grandchild = int(call(box, "spawn_child").text)
    assert alive(server) and alive(grandchild) and os.getpgid(grandchild) == server == os.getsid(server)
    environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
    assert b"GREETING=hi" in environ and not any(b"AGENTGYM_TEST_SECRET" in e for e in environ)
    limits = Path(f"/proc/{server}/limits").read_text()
    assert re.search(r"Max address space\s+2147483648", limits) and re.search(r"Max core file size\s+0", limits)
    box.close()
    assert wait_gone(server) and wait_gone(grandchild)


def test_the_server_dies_with_agentgym():
    """SIGKILL agentgym: its stdio server goes too (PR_SET_PDEATHSIG), though nobody closed anything."""
    script = (
        "import sys, time\n"
        "from agentgym.envs.tools.mcp import mcp_tools\n"
        f"tools = mcp_tools([{{'name': 'orphan', 'command': sys.executable, 'args': [{SERVER!r}]}}])\n"
        "print(tools[0].connection.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    root = str(Path(SERVER).parents[2])
    agentgym_process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        server = int(agentgym_process.stdout.readline())
        assert alive(server)
    finally:
        agentgym_process.kill()
        agentgym_process.wait()
    assert wait_gone(server)


def test_envs_share_one_server_until_the_last_closes():
    first = mcp_tools([stdio("shared")])
    second = mcp_tools([stdio("shared", tools=["add"], call_timeout_s=3, prefix="p_")])  # same server, own settings
    assert first[0].connection is second[0].connection and [t.name for t in second] == ["p_add"]
    pid = first[0].connection.pid
    Toolbox(first).close()
    assert alive(pid) and call(Toolbox(second), "p_add", a=2, b=2).text == "4"
    Toolbox(second).close()
    assert wait_gone(pid)


def test_servers_that_cannot_start_fail_fast_with_a_clear_message():
    with pytest.raises(MCPUnavailable, match="could not be started"):
        mcp_tools([{"name": "nope", "command": "/nonexistent/server"}])
    start = time.perf_counter()
    with pytest.raises(MCPUnavailable, match="within connect_timeout_s=1 s"):
        mcp_tools([{"name": "mute", "command": "sleep", "args": ["600"], "connect_timeout_s": 1}])
    assert time.perf_counter() - start < 3.0
    deadline = time.monotonic() + 5.0  # stopped when the connect times out; on busy cores its exit can lag
    while any("sleep 600" in line for line in own_children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any("sleep 600" in line for line in own_children())


def own_children() -> list[str]:
    """The command lines of this process's live descendants (zombies and processes gone meanwhile left out)."""
    import psutil

    lines = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                lines.append(" ".join(child.cmdline()))
        except psutil.Error:
            pass
    return lines


def test_config_is_checked():
    with pytest.raises(ValueError, match="unknown keys \\['cmd'\\]"):
        MCPServerConfig.from_value({"name": "a", "cmd": "x"})
    with pytest.raises(ValueError, match="exactly one of command"):
        MCPServerConfig.from_value({"name": "a", "command": "x", "url": "http://h"})
    with pytest.raises(ValueError, match="has no tool \\['subtract'\\]"):
        mcp_tools([stdio("routes", tools=["subtract"])])  # the module's server (same command): no new start
    with pytest.raises(ValueError, match="two tools are named 'add' \\(MCP server 'routes' and MCP server 'two'\\)"):
        make_tools((), None, [stdio("routes", tools=["add"]), stdio("two", tools=["add"])])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    port = _free_port()
    process = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield process, f"http://127.0.0.1:{port}/mcp"
    process.kill()
    process.wait()


def test_streamable_http_server(http_server):
    process, url = http_server
    tools = mcp_tools([{"name": "web", "url": url, "call_timeout_s": 1.0, "tools": ["add", "sleep_forever"]}])
    box = Toolbox(tools)
    try:
        assert [t.name for t in tools] == ["add", "sleep_forever"]
        assert call(box, "add", a=3, b=4).text == "7"
        start = time.perf_counter()
        assert call(box, "sleep_forever").error == "timeout" and time.perf_counter() - start < 1.5
        process.kill()
        process.wait()
        start = time.perf_counter()
        gone = call(box, "add", a=1, b=1)
        assert gone.error == "mcp_server_dead" and time.perf_counter() - start < 0.9, gone  # not the timeout
        port = url.split(":")[-1].split("/")[0]
        back = subprocess.Popen([sys.executable, SERVER, "http", port], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while socket.socket().connect_ex(("127.0.0.1", int(port))) != 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert call(box, "add", a=5, b=5).text == "10"  # reconnected
        finally:
            back.kill()
            back.wait()
    finally:
        box.close()


def test_agentgyms_calculator_server():
    """agentgym.envs.tools.mcp.calculator_server (configs/env/mcp_arithmetic.yaml), started as `python -m`."""
    server = {"name": "calc", "command": "python", "args": ["-m", "agentgym.envs.tools.mcp.calculator_server"]}
    box = Toolbox(mcp_tools([server]))
    try:
        assert [s["function"]["name"] for s in box.schemas] == ["calculate"]
        assert call(box, "calculate", expression="(16 - 3 - 4) * 2").text == "18"
        refused = call(box, "calculate", expression="9**9**9")
        assert refused.error == "tool_error" and "too large" in refused.text
    finally:
        box.close()
