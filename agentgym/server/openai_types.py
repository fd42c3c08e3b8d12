"""Request and response bodies of the embedded server, mirroring OpenAI's API field by field.

Like vLLM's ``entrypoints/openai/protocol.py``: requests are validated here, at the edge;
unknown fields are ignored; vLLM's extra sampling fields (``top_k``, ``min_tokens``,
``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``,
``return_token_ids``, ``structured_outputs`` and the older ``guided_*``, ...) are accepted. What
a request constrains its reply to (``tools``/``tool_choice``, ``response_format``,
``structured_outputs``) is checked here too and kept as ``request.constraint``
(``agentgym.client.structured``). Responses add ``prompt_token_ids``, ``choices[].token_ids`` (as vLLM does with
``return_token_ids``) and ``weight_version`` (the policy version that sampled them).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from agentgym.client.structured import ConstraintError, request_constraint
from agentgym.server.legacy_functions import legacy_error, legacy_messages, legacy_reply, legacy_request


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingFields(_Request):
    """The sampling fields shared by chat and completions requests."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=1 << 30)
    min_tokens: int = Field(0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=1024)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_token_ids: bool | None = None  # accepted for vLLM compatibility; ids are always returned
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0)
    logit_bias: dict[str, float] | None = Field(None, max_length=1 << 16)
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    user: str | None = None
    _constraint: dict[str, Any] | None = PrivateAttr(None)

    @property
    def constraint(self) -> dict[str, Any] | None:
        """What the reply is constrained to (``agentgym.client.structured``), None: free text."""
        return self._constraint

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (v or {}).items():
            if not key.strip().isdigit() or len(key) > 12:
                raise ValueError(f"logit_bias keys are token ids, got {key!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias values are between -100 and 100, got {value} for token {key}")
        return v

    def token_bias(self) -> dict[int, float]:
        return {int(k): float(v) for k, v in (self.logit_bias or {}).items()}

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if isinstance(v, str):
            v = [v]
        if v is not None and any(not s for s in v):
            raise ValueError("stop strings must not be empty")
        if v is not None and len(v) > 64:
            raise ValueError("at most 64 stop strings")
        return v

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int | None) -> int | None:
        if v is not None and not (-(2**63) <= v < 2**63):
            raise ValueError("seed must fit in 64 bits")
        return v


MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "video", "file", "input_file"}
)
"""Content parts a text-only model cannot read: a 400, as vLLM answers, rather than dropped."""


def check_message(m: dict[str, Any], where: str) -> None:
    """A ``ValueError`` naming the field if a chat message's fields have the wrong types: ``content``
    is text, null or a list of content parts (a ``text`` part's ``text`` is a string; images, audio,
    video and files are refused: every model served here reads text only; other parts are ignored);
    ``name`` and ``tool_call_id`` are strings; ``tool_calls`` are function calls."""
    content = m.get("content")
    if isinstance(content, list):
        for k, part in enumerate(content):
            if not isinstance(part, dict):
                raise ValueError(f"{where}.content[{k}] must be a content part object")
            if part.get("type") in MEDIA_PARTS:
                raise ValueError(
                    f"{where}.content[{k}] is an {part['type']} part, but this model reads text only; send text parts"
                )
            if part.get("type") in ("text", None) and not isinstance(part.get("text", ""), str):
                raise ValueError(f"{where}.content[{k}].text must be a string")
    elif content is not None and not isinstance(content, str):
        raise ValueError(f"{where}.content must be a string, null or a list of content parts")
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None and not isinstance(m[key], str):
            raise ValueError(f"{where}.{key} must be a string")
    calls = m.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise ValueError(f"{where}.tool_calls must be a list")
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"{where}.tool_calls[{k}] needs a function with a name")
        if not isinstance(function.get("arguments"), (str, dict, type(None))):
            raise ValueError(f"{where}.tool_calls[{k}].function.arguments must be a JSON string")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise ValueError(f"{where}.tool_calls[{k}].id must be a string")


class ChatCompletionRequest(_SamplingFields):
    messages: list[dict[str, Any]] = Field(..., min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None  # OpenAI's legacy function calling: legacy_functions.py
    function_call: str | dict[str, Any] | None = None
    _legacy: bool = PrivateAttr(False)

    @field_validator("messages")
    @classmethod
    def _roles(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(v):
            if not isinstance(m, dict) or m.get("role") not in (
                "system",
                "developer",
                "user",
                "assistant",
                "tool",
                "function",
            ):
                raise ValueError(f"messages[{i}] needs a role of system, developer, user, assistant, tool or function")
            check_message(m, f"messages[{i}]")
        return legacy_messages(v)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("none", "auto", "required"):
            raise ValueError("tool_choice must be 'none', 'auto', 'required' or a named function")
        return v

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        legacy = legacy_request(vars(self))
        if legacy is not None:
            self.tools, self.tool_choice, self.parallel_tool_calls = (
                legacy["tools"],
                legacy["tool_choice"],
                legacy["parallel_tool_calls"],
            )
            self._legacy = True
        try:
            self._constraint = request_constraint(vars(self), chat=True)
        except ConstraintError as exc:
            raise legacy_error(exc) if self._legacy else exc from None
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def legacy_functions(self) -> bool:
        """Whether the request used ``functions``/``function_call`` (read as ``tools``/``tool_choice``):
        its reply then takes the legacy shape (``message.function_call``)."""
        return self._legacy


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and (not v or any(isinstance(p, (list, str)) and not p for p in v)):
            raise ValueError("prompt must not be empty")
        if isinstance(v, str) and not v:
            raise ValueError("prompt must not be empty")
        return v

    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs name tokens "token_id:<id>"

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported by the embedded server")
        return v

    @model_validator(mode="after")
    def _constrained(self) -> CompletionRequest:
        self._constraint = request_constraint(vars(self), chat=False)
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


# ---- responses ----------------------------------------------------------------------------
class UsageInfo(_Response):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(_Response):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(_Response):
    name: str
    arguments: str


class ToolCall(_Response):
    id: str = Field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    function_call: FunctionCall | None = None  # the legacy shape, for a request with functions

    @classmethod
    def reply(
        cls, content: str | None, calls: list[dict[str, Any]], finish_reason: str, legacy: bool
    ) -> tuple[ChatMessage, str]:
        """``(message, finish_reason)`` for a parsed reply (``tool_calls.assistant_reply``); ``legacy``:
        the reply to a ``functions`` request, its call as ``function_call`` (``legacy_functions``)."""
        function_call = None
        if legacy:
            content, function_call, calls, finish_reason = legacy_reply(content, calls, finish_reason)
        return cls(
            content=content,
            tool_calls=[ToolCall(**c) for c in calls],
            function_call=FunctionCall(**function_call) if function_call else None,
        ), finish_reason


class ChatChoice(_Response):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(_Response):
    id: str = Field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None
    weight_version: int = 0


class DeltaMessage(_Response):
    role: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None


class ChatStreamChoice(_Response):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None
    weight_version: int = 0


class CompletionLogprobs(_Response):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(_Response):
    id: str = Field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None
    weight_version: int = 0


class CompletionChunk(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    weight_version: int = 0


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "agentgym"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(_Response):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(_Response):
    error: ErrorInfo


# ---- weight control -------------------------------------------------------------------------
class UpdateWeightsFromDiskRequest(_Request):
    """SGLang's ``/update_weights_from_disk`` body."""

    model_path: str = Field(..., min_length=1)
    weight_version: int | str | None = None
    load_format: str | None = None
    abort_all_requests: bool = False

    @field_validator("weight_version")
    @classmethod
    def _int_version(cls, v: int | str | None) -> int | None:
        if isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v.strip()) <= 20:
            v = int(v)
        if v is None or (isinstance(v, int) and -(2**63) <= v < 2**63):
            return v
        raise ValueError("weight_version must be a 64-bit integer (or a string of one)")


class UpdateWeightsResponse(_Response):
    success: bool
    message: str
    weight_version: int | None = None


class PauseRequest(_Request):
    mode: Literal["wait", "abort"] = "wait"
