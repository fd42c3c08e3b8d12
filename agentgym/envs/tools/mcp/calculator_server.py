"""An MCP server with agentgym's calculator: ``python -m agentgym.envs.tools.mcp.calculator_server``.

One tool, ``calculate(expression)``: arithmetic evaluated by walking Python's AST, never ``eval``
(``agentgym/envs/tools/calculator.py``: ``+ - * / // % **``, parentheses, ``abs round min max sqrt
floor ceil``, every number bounded). Serves stdio by default; ``--http PORT`` serves streamable
HTTP at ``http://127.0.0.1:PORT/mcp``. The tool server of ``agentgym train --env mcp_arithmetic``
(configs/env/mcp_arithmetic.yaml, docs/mcp.md) and a template for writing your own.
"""

from __future__ import annotations

import argparse

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError as MCPToolError

from agentgym.envs.tools.base import ToolError
from agentgym.envs.tools.calculator import CalculatorTool, calculate

server = FastMCP("agentgym-calculator", log_level="WARNING")


@server.tool(name="calculate", description=CalculatorTool.description)
def calculate_expression(expression: str) -> str:
    try:
        return calculate(expression)
    except ToolError as exc:
        raise MCPToolError(str(exc)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description="agentgym's calculator as an MCP server")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on this port (default: stdio)")
    args = parser.parse_args()
    if args.http:
        server.settings.port = args.http
        server.run(transport="streamable-http")
    else:
        server.run(transport="stdio")


if __name__ == "__main__":
    main()
