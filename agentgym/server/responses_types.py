"""Request and response bodies of OpenAI's Responses API (``POST /v1/responses``), as the server and the
gateway serve it: the field names of ``openai.types.responses`` (``Response``, ``ResponseOutputMessage``,
``ResponseFunctionToolCall``, ``ResponseUsage``, the stream events).

What is served is the Responses API over the chat path (``agentgym.server.responses_api`` turns one into
the other): input as a string or as items (``message`` with ``input_text``/``output_text`` parts,
``function_call``, ``function_call_output``), ``instructions``, function ``tools`` and ``tool_choice``,
``text.format`` (``json_object``/``json_schema``: constrained decoding, as ``response_format`` is),
``max_output_tokens``, ``temperature``/``top_p``, ``stream``, ``include``
``["message.output_text.logprobs"]`` with ``top_logprobs``, and ``previous_response_id`` (the gateway
resolves it within a session; the policy server keeps no responses). What cannot be honoured is a 400
that says so: hosted tools, ``background``, ``conversation``, stored ``prompt`` templates, media parts.
``reasoning``, ``truncation``, ``metadata``, ``user``, ``service_tier``, ``prompt_cache_key`` and
``safety_identifier`` are accepted and change nothing (``metadata`` is echoed back).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LOGPROBS_INCLUDE = "message.output_text.logprobs"


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponsesRequest(_Request):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, Any] | None = None
    user: str | None = None
    # refused when set: nothing here can honour them
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    # vLLM's sampling extras, as the chat path takes them
    seed: int | None = None
    top_k: int | None = Field(None, ge=-1, le=1 << 30)

    @field_validator("input")
    @classmethod
    def _items(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(v, str) and not v:
            raise ValueError("input must not be empty")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("none", "auto", "required"):
            raise ValueError('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}')
        return v

    @model_validator(mode="after")
    def _refused(self) -> ResponsesRequest:
        if self.background:
            raise ValueError("background responses are not supported: send the request without background")
        if self.conversation is not None:
            raise ValueError(
                "conversations are not stored here: send the whole conversation as input "
                "(or previous_response_id, through the gateway)"
            )
        if self.prompt is not None:
            raise ValueError("stored prompt templates are not supported: send instructions and input instead")
        if self.top_logprobs and LOGPROBS_INCLUDE not in (self.include or []):
            raise ValueError(f'top_logprobs needs include=["{LOGPROBS_INCLUDE}"]')
        return self

    @property
    def logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])


# ---- the response ------------------------------------------------------------------------------
class OutputText(_Response):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None


class OutputMessage(_Response):
    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(_Response):
    id: str = Field(default_factory=lambda: f"fc_{uuid.uuid4().hex}")
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = ""
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"


class InputTokensDetails(_Response):
    cached_tokens: int = 0


class OutputTokensDetails(_Response):
    reasoning_tokens: int = 0


class ResponseUsage(_Response):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class IncompleteDetails(_Response):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(_Response):
    """``openai.types.responses.Response``; ``weight_version`` (the policy version that sampled it) is
    agentgym's, as on chat completions."""

    id: str = Field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    object: Literal["response"] = "response"
    created_at: float = Field(default_factory=time.time)
    status: Literal["completed", "failed", "in_progress", "incomplete"] = "in_progress"
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputMessage | FunctionCallItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = False
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    weight_version: int | None = None
