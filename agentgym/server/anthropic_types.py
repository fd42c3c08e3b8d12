"""Request and response bodies of Anthropic's Messages API (``POST /v1/messages`` and
``POST /v1/messages/count_tokens``), field by field.

Mirrors ``openai_types`` for chat: requests are validated here, at the edge (unknown fields are
ignored, as Anthropic's own ``cache_control`` marks are); what a text-only model served here cannot
take (images, documents, extended thinking, server tools) is a 400 that says so, never dropped.
Field names follow the ``anthropic`` package's types (``anthropic.types.MessageCreateParams``,
``Message``, ``Usage``, the ``Raw*Event`` stream events).

Content blocks a request may hold: ``text``; ``tool_use`` (an assistant's call: ``id``, ``name``,
``input``); ``tool_result`` (a user's answer to one: ``tool_use_id``, ``content`` as a string or
text blocks, ``is_error``). A response holds ``text`` and ``tool_use`` blocks.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

REQUEST_BLOCKS = frozenset({"text", "tool_use", "tool_result"})
"""The content blocks a request may hold here."""

TEXT_ONLY_BLOCKS = frozenset({"image", "document", "search_result", "container_upload"})
"""Blocks a text-only model cannot read: a 400 naming them."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---- request content blocks ----------------------------------------------------------------------
class TextBlockParam(_Request):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlockParam(_Request):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str = Field(..., min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlockParam(_Request):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str | list[TextBlockParam] | None = None
    is_error: bool = False

    @field_validator("content", mode="before")
    @classmethod
    def _text_blocks(cls, v: Any) -> Any:
        if isinstance(v, list):
            return _check_blocks(v, frozenset({"text"}), "a tool_result's content")
        return v

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


ContentBlockParam = Annotated[TextBlockParam | ToolUseBlockParam | ToolResultBlockParam, Field(discriminator="type")]
_BLOCKS = TypeAdapter(list[ContentBlockParam])


def _check_blocks(blocks: list[Any], allowed: frozenset[str], where: str) -> list[Any]:
    """``blocks`` validated, or a ``ValueError`` that names the block and says what to send instead
    (pydantic's own message for a bad block in a ``str | list`` field names the string branch)."""
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
        if kind in allowed:
            continue
        if kind in TEXT_ONLY_BLOCKS:
            raise ValueError(f"{where}[{k}] is an {kind} block, but this model reads text only; send text blocks")
        if kind in ("thinking", "redacted_thinking"):
            raise ValueError(f"{where}[{k}] is a {kind} block: extended thinking is not supported here; drop it")
        raise ValueError(f"{where}[{k}] has type {kind!r}; the blocks taken here are {', '.join(sorted(allowed))}")
    try:
        return _BLOCKS.validate_python(blocks)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first["loc"]
        field = ".".join(str(p) for p in loc[2:])  # past the index and the block type
        raise ValueError(f"{where}[{loc[0]}]{'.' + field if field else ''}: {first['msg']}") from None


class MessageParam(_Request):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlockParam]

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, v: Any) -> Any:
        if isinstance(v, list):
            return _check_blocks(v, REQUEST_BLOCKS, "content")
        return v

    def blocks(self) -> list[TextBlockParam | ToolUseBlockParam | ToolResultBlockParam]:
        return [TextBlockParam(text=self.content)] if isinstance(self.content, str) else list(self.content)


# ---- tools --------------------------------------------------------------------------------------
class ToolParam(_Request):
    """A client tool (``type`` absent or ``custom``); Anthropic's server tools (``bash_...``,
    ``web_search_...``) run on Anthropic's side and are refused."""

    type: Literal["custom"] | None = None
    name: str = Field(..., min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]

    @field_validator("type", mode="before")
    @classmethod
    def _client_tool(cls, v: Any) -> Any:
        if v not in (None, "custom"):
            raise ValueError(
                f"tool type {v!r} is one of Anthropic's server tools, which run on Anthropic's side; "
                "declare it as a client tool (name, description, input_schema) and run it yourself"
            )
        return v


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @field_validator("name")
    @classmethod
    def _non_empty(cls, v: str | None) -> str | None:
        if v is not None and not v:
            raise ValueError("tool_choice.name must not be empty")
        return v


class Metadata(_Request):
    user_id: str | None = None


class ThinkingParam(_Request):
    type: Literal["enabled", "disabled", "adaptive"]

    @field_validator("type")
    @classmethod
    def _no_thinking(cls, v: str) -> str:
        if v != "disabled":
            raise ValueError("extended thinking is not supported by this server; leave thinking out")
        return v


class OutputFormat(_Request):
    """Structured outputs: the reply is JSON under ``schema`` (decoded under it, as chat's
    ``response_format`` ``json_schema``)."""

    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(..., alias="schema")


class OutputConfig(_Request):
    format: OutputFormat | None = None  # its other keys (effort) are Anthropic's model settings: ignored


# ---- the request --------------------------------------------------------------------------------
class CountTokensRequest(_Request):
    """``POST /v1/messages/count_tokens``: the prompt of a Messages request (what it is rendered
    from), without ``max_tokens`` and the sampling fields; ``MessagesRequest`` adds those."""

    model: str | None = None
    messages: list[MessageParam] = Field(..., min_length=1)
    system: str | list[TextBlockParam] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's name for output_config.format

    @field_validator("system", mode="before")
    @classmethod
    def _system_text(cls, v: Any) -> Any:
        if isinstance(v, list):
            return _check_blocks(v, frozenset({"text"}), "system")
        return v

    @property
    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system
        return "".join(b.text for b in self.system)


class CountTokensResponse(_Response):
    input_tokens: int


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``: ``max_tokens`` is required, as Anthropic requires it."""

    max_tokens: int = Field(..., ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=64)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    stream: bool = False

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not s for s in v):
            raise ValueError("stop sequences must not be empty")
        return v


# ---- responses ----------------------------------------------------------------------------------
class TextBlock(_Response):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(_Response):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(_Response):
    input_tokens: int = 0
    output_tokens: int = 0


class MessagesResponse(_Response):
    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None = None
    stop_sequence: str | None = None
    usage: Usage
    weight_version: int | None = None  # agentgym's: the policy version that sampled the reply


class ErrorObject(_Response):
    type: str
    message: str


class ErrorResponse(_Response):
    type: Literal["error"] = "error"
    error: ErrorObject
