"""``MCPTool``: one tool of an MCP server as an agentgym ``Tool``; ``mcp_tools`` builds them all."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from agentgym.envs.tools.base import Tool, ToolError
from agentgym.envs.tools.calls import truncate
from agentgym.envs.tools.mcp.config import MCPServerConfig, server_configs
from agentgym.envs.tools.mcp.connection import MCPCallError, MCPConnection, acquire, release, retain


def result_text(result: Any) -> str:
    """The text the model reads for a ``CallToolResult``: its text blocks, a note per image, audio
    or binary resource, and the structured content as JSON when there is no text."""
    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mimeType}, {len(block.data) * 3 // 4} bytes]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[resource {resource.uri}: {resource.mimeType or 'binary'}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}]")
        else:
            parts.append(f"[{kind or type(block).__name__} content]")
    if not parts and getattr(result, "structuredContent", None) is not None:
        parts.append(json.dumps(result.structuredContent))
    return "\n".join(parts)


class MCPTool(Tool):
    """A tool of an MCP server: its ``inputSchema`` is the parameters; calls go to the server."""

    def __init__(self, connection: MCPConnection, remote: Any, config: MCPServerConfig) -> None:
        """``remote``: the server's ``Tool`` (name, description, inputSchema); ``config``: this env's
        settings for it (prefix, call timeout, output cap), on a connection that may be shared."""
        self.connection = connection
        self.config = config
        self.remote_name: str = remote.name
        self.name = config.prefix + remote.name  # type: ignore[misc]
        self.description = remote.description or remote.title or f"{remote.name} (MCP server {config.name})"  # type: ignore[misc]
        schema = dict(remote.inputSchema or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        self.parameters = schema  # type: ignore[misc]
        retain(connection)
        self._closed = False

    def execute(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        config = self.config
        try:
            result, seconds = self.connection.call(self.remote_name, arguments, config.call_timeout_s)
        except MCPCallError as exc:
            kind = {"timeout": "timeout", "server_dead": "mcp_server_dead"}.get(exc.kind, "mcp_error")
            raise ToolError(str(exc), kind=kind) from None
        text = truncate(result_text(result), config.max_output_chars)
        metrics = {"mcp_seconds": seconds}
        if result.isError:
            raise ToolError(text or f"{self.name} failed", kind="tool_error", metrics=metrics)
        return text, 0.0, metrics

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            release(self.connection)


def mcp_tools(servers: Iterable[MCPServerConfig | dict[str, Any]] | Any) -> list[MCPTool]:
    """Connect to each server (``mcp_servers`` as configured), list its tools and wrap each one.

    Raises ``MCPUnavailable`` when a server cannot be started or reached, and ``ValueError`` when a
    ``tools:`` allow-list names a tool the server does not have or two servers offer the same name
    (give one a ``prefix``). Close every tool (``Toolbox.close``) to let the servers go."""
    tools: list[MCPTool] = []
    try:
        for config in server_configs(servers):
            connection = acquire(config)
            try:
                remote = _chosen(connection.tools, config.tools, config)
                tools.extend(MCPTool(connection, r, config) for r in remote)
            finally:
                release(connection)
        check_unique(tools)
    except BaseException:
        for tool in tools:
            tool.close()
        raise
    return tools


def _chosen(remote: Sequence[Any], allow: Sequence[str] | None, config: MCPServerConfig) -> list[Any]:
    if allow is None:
        return list(remote)
    names = [r.name for r in remote]
    missing = [n for n in allow if n not in names]
    if missing:
        raise ValueError(f"MCP server {config.name!r} has no tool {missing} (its tools: {', '.join(names) or 'none'})")
    return [r for r in remote if r.name in allow]


def check_unique(tools: Sequence[Tool]) -> None:
    """``ValueError`` naming any tool name offered twice (give an MCP server a ``prefix``)."""
    seen: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in seen:
            pair = (seen[tool.name], tool)
            origin = [f"MCP server {t.config.name!r}" if isinstance(t, MCPTool) else "built-in" for t in pair]
            raise ValueError(
                f"two tools are named {tool.name!r} ({origin[0]} and {origin[1]}): set a prefix on an MCP server "
                f"(mcp_servers: [{{name: ..., prefix: 'calc_'}}]) or leave one out (tools: [...])"
            )
        seen[tool.name] = tool
