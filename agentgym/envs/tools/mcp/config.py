"""``MCPServerConfig``: one MCP server an env takes tools from, as written in ``env.kwargs.mcp_servers``.

    mcp_servers:
      - name: calc                                   # what errors and metrics call it
        command: python                              # stdio: a local command (python: agentgym's own) ...
        args: [-m, agentgym.envs.tools.mcp.calculator_server]
        call_timeout_s: 10
      - name: search
        url: http://127.0.0.1:8000/mcp               # ... or a streamable-HTTP endpoint
        headers: {Authorization: Bearer ...}
        tools: [web_search]                          # only these of its tools (default: all)
        prefix: search_                              # tool names as the model sees them: search_web_search

Exactly one of ``command`` and ``url``. Unknown keys are an error that lists the known ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MCPServerConfig:
    """One MCP server (stdio command or streamable-HTTP URL) and the bounds its tools are called under."""

    name: str
    command: str | None = None  # stdio: the executable; python / python3: this interpreter (+ $PYTHONPATH)
    args: tuple[str, ...] = ()  # stdio: its arguments
    env: tuple[tuple[str, str], ...] = ()  # stdio: environment added to the SDK's safe default (HOME, PATH, ...)
    cwd: str | None = None  # stdio: working directory
    url: str | None = None  # streamable HTTP: the endpoint, e.g. http://127.0.0.1:8000/mcp
    headers: tuple[tuple[str, str], ...] = ()  # streamable HTTP: request headers
    tools: tuple[str, ...] | None = None  # the server's tools to offer (None: all of them)
    prefix: str = ""  # prepended to each tool's name as the model sees it (avoids clashes between servers)
    call_timeout_s: float = 30.0  # one call's bound; a hanging call costs at most this (+ ~0.1 s)
    connect_timeout_s: float = 30.0  # starting the server, the MCP handshake and listing its tools
    max_output_chars: int = 4000  # the text of one result is cut to this many characters
    memory_mb: int | None = None  # stdio: the server's address-space limit (RLIMIT_AS); None: no limit
    shared: bool = True  # one connection per process for every env using this server (else one per env)
    max_restarts: int = 3  # a dead server is started again on a later call, at most this many times

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("an MCP server needs a name (mcp_servers: [{name: calc, command: ...}])")
        if bool(self.command) == bool(self.url):
            raise ValueError(
                f"MCP server {self.name!r}: give exactly one of command (a stdio server) and url (streamable HTTP)"
            )
        if self.call_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError(f"MCP server {self.name!r}: call_timeout_s and connect_timeout_s must be positive")
        if self.max_output_chars < 1:
            raise ValueError(f"MCP server {self.name!r}: max_output_chars must be at least 1")

    @property
    def server_key(self) -> tuple[Any, ...]:
        """What makes a server the same server: processes and connections are shared by this key (a
        different ``tools``, ``prefix``, ``call_timeout_s`` or ``max_output_chars`` reuses them)."""
        return (self.name, self.command, self.args, self.env, self.cwd, self.url, self.headers, self.memory_mb)

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "streamable-http"

    @property
    def where(self) -> str:
        """The command line or URL, for messages."""
        return " ".join([self.command or "", *self.args]) if self.command else str(self.url)

    @classmethod
    def from_value(cls, value: MCPServerConfig | Mapping[str, Any]) -> MCPServerConfig:
        """A config from a mapping (YAML / ``--env-arg``); raises ``ValueError`` naming unknown keys."""
        if isinstance(value, MCPServerConfig):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"an MCP server is a mapping like {{name: calc, command: python, args: [...]}}, got {value!r}"
            )
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(
                f"MCP server {value.get('name')!r}: unknown keys {unknown}; known keys: {', '.join(known)}"
            )
        kwargs = dict(value)
        for key in ("args", "tools"):
            if kwargs.get(key) is not None:
                if isinstance(kwargs[key], str):
                    raise ValueError(f"MCP server {value.get('name')!r}: {key} is a list of strings, got a string")
                kwargs[key] = tuple(str(a) for a in kwargs[key])
        for key in ("env", "headers"):
            if kwargs.get(key) is not None:
                kwargs[key] = tuple(sorted((str(k), str(v)) for k, v in dict(kwargs[key]).items()))
        return cls(**kwargs)


def server_configs(values: Any) -> list[MCPServerConfig]:
    """``mcp_servers`` as given (a list of mappings, or one mapping) -> configs; names must be unique."""
    if values is None:
        return []
    if isinstance(values, (Mapping, MCPServerConfig)):
        values = [values]
    configs = [MCPServerConfig.from_value(v) for v in values]
    names = [c.name for c in configs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"MCP server names must be unique; repeated: {duplicated}")
    return configs
