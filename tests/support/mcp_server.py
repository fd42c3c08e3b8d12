"""A tiny MCP server for the tests (FastMCP): ``python tests/support/mcp_server.py [stdio|http PORT]``.

Tools: ``add`` (a + b), ``lookup`` (a fixed table), ``sleep_forever``, ``huge`` (n characters),
``fail`` (an error result), ``crash`` (the process exits at once), ``spawn_child`` (starts a
sleeping grandchild and returns its pid, for the process-group test).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from mcp.server.fastmcp import FastMCP

TABLE = {"paris": "France", "berlin": "Germany", "tokyo": "Japan"}

server = FastMCP("agentgym-test", log_level="WARNING")


@server.tool()
def add(a: float, b: float) -> str:
    """Add two numbers and return the sum."""
    total = a + b
    return str(int(total) if float(total).is_integer() else total)


@server.tool()
def lookup(city: str) -> str:
    """The country a city is in."""
    return TABLE.get(city.strip().lower(), f"unknown city {city!r}")


@server.tool()
async def sleep_forever() -> str:
    """Never returns."""
    await asyncio.sleep(10**6)
    return "woke up"


@server.tool()
def huge(n: int = 100_000) -> str:
    """Return n characters."""
    return "x" * n


@server.tool()
def fail(message: str = "boom") -> str:
    """Always fails."""
    raise ValueError(message)


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@server.tool()
def spawn_child() -> str:
    """Start a grandchild that sleeps (in the server's process group) and return its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    return str(child.pid)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "http":
        server.settings.port = int(sys.argv[2])
        server.run(transport="streamable-http")
    else:
        server.run(transport="stdio")
