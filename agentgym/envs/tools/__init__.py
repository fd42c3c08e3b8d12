"""Tools a model can call: the ``Tool`` base, a calculator, a sandboxed Python, call parsing,
and the tools of MCP servers (``mcp/``, with the ``mcp`` extra).

Tools are registered under the ``agentgym.tools`` entry-point group (``calculator``, ``python``);
``make_tool("python", timeout_s=2)`` builds one by name. ``Toolbox`` runs a turn's calls
within limits and turns every failure into a message for the model.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.envs.tools.base import Tool, ToolError, ToolResult
from agentgym.envs.tools.calls import CallResult, Toolbox, call_metrics, split_reply
from agentgym.envs.tools.parsing import normalize_tool_calls, parse_tool_calls


def make_tool(name: str, **kwargs: Any) -> Tool:
    """Build the tool registered as ``name`` (``agentgym.tools`` group) with ``kwargs``."""
    from agentgym.registry import TOOLS

    return TOOLS.get(name)(**kwargs)


def make_tools(
    names: Sequence[str] = (),
    tool_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    mcp_servers: Any = None,
) -> list[Tool]:
    """The registered tools ``names`` (each with ``tool_kwargs[name]``), then the tools of each MCP
    server in ``mcp_servers`` (``agentgym/envs/tools/mcp/config.py``). Tool names must be unique."""
    kwargs = tool_kwargs or {}
    tools = [make_tool(name, **dict(kwargs.get(name, {}))) for name in names]
    if mcp_servers:
        from agentgym.envs.tools.mcp import check_unique, mcp_tools

        try:
            tools.extend(mcp_tools(mcp_servers))
            check_unique(tools)
        except BaseException:
            for tool in tools:
                tool.close()
            raise
    return tools


__all__ = [
    "CallResult",
    "Tool",
    "ToolError",
    "ToolResult",
    "Toolbox",
    "call_metrics",
    "make_tool",
    "make_tools",
    "normalize_tool_calls",
    "parse_tool_calls",
    "split_reply",
]
