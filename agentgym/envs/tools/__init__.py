"""Tools a model can call: the ``Tool`` base, a calculator, a sandboxed Python, call parsing.

Tools are registered under the ``agentgym.tools`` entry-point group (``calculator``, ``python``);
``make_tool("python", timeout_s=2)`` builds one by name. ``Toolbox`` runs a turn's calls
within limits and turns every failure into a message for the model.
"""

from typing import Any

from agentgym.envs.tools.base import Tool, ToolError, ToolResult
from agentgym.envs.tools.calls import CallResult, Toolbox, call_metrics, split_reply
from agentgym.envs.tools.parsing import normalize_tool_calls, parse_tool_calls


def make_tool(name: str, **kwargs: Any) -> Tool:
    """Build the tool registered as ``name`` (``agentgym.tools`` group) with ``kwargs``."""
    from agentgym.registry import TOOLS

    return TOOLS.get(name)(**kwargs)


__all__ = [
    "CallResult",
    "Tool",
    "ToolError",
    "ToolResult",
    "Toolbox",
    "call_metrics",
    "make_tool",
    "normalize_tool_calls",
    "parse_tool_calls",
    "split_reply",
]
