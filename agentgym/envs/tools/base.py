"""``Tool``: something a model can call, described by an OpenAI function schema.

A tool subclass sets ``name``, ``description`` and ``parameters`` (a JSON Schema object) and
implements ``execute(arguments) -> (text, reward, metrics)``: the text goes back to the model
as a ``tool`` message, ``reward`` is an optional turn-level reward for the call and
``metrics`` are numbers worth logging. ``execute`` may raise; ``Toolbox`` turns any exception
into an error message for the model.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple


class ToolResult(NamedTuple):
    """What ``Tool.execute`` returns: a plain 3-tuple ``(text, reward, metrics)``."""

    text: str
    reward: float = 0.0
    metrics: dict[str, float] = {}  # a shared default: never mutate it


class ToolError(Exception):
    """A tool's way to say the call failed (bad argument, failed run): its message goes to the model.

    ``kind`` names the failure in metrics (``tool_errors/<kind>``); ``metrics`` are still logged.
    """

    def __init__(self, message: str, kind: str = "tool_error", metrics: dict[str, float] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.metrics = dict(metrics or {})


class Tool:
    """Base class for tools. Register a subclass under the ``agentgym.tools`` entry-point group."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI tool schema: ``{"type": "function", "function": {name, description, parameters}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def execute(self, arguments: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        """Run the tool on parsed ``arguments``; returns ``(text, reward, metrics)``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources held by the tool (none by default)."""
