"""Tools from MCP servers, offered to the model like built-in tools (``mcp_servers`` env argument).

    env = agentgym.make("tool_task", task="arithmetic", tools=[],
                        mcp_servers=[{"name": "calc", "command": "python", "args": ["calc_server.py"]}])

``mcp_tools(servers)`` connects to each server (a stdio command, or a streamable-HTTP ``url``), lists
its tools and wraps each as an agentgym ``Tool`` (``name`` with the server's ``prefix``, its
``description``, its ``inputSchema`` as ``parameters``), so ``Toolbox`` offers them as OpenAI tool
schemas and in the Hermes text format. Calls keep the built-in tools' bounds: ``call_timeout_s``
per call (a hanging call costs at most that), ``max_output_chars`` per result, and a server that
died or cannot be reached is an error message to the model, never a hang. See
``config.py`` for the keys, ``connection.py`` for the threads and process guarantees, and
docs/mcp.md for a worked example.
"""

from agentgym.envs.tools.mcp.config import MCPServerConfig, server_configs
from agentgym.envs.tools.mcp.connection import MCPCallError, MCPConnection, MCPUnavailable
from agentgym.envs.tools.mcp.tool import MCPTool, check_unique, mcp_tools, result_text

__all__ = [
    "MCPCallError",
    "MCPConnection",
    "MCPServerConfig",
    "MCPTool",
    "MCPUnavailable",
    "check_unique",
    "mcp_tools",
    "result_text",
    "server_configs",
]
