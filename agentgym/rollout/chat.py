"""Chat-template tokenization for multi-turn rollouts: the first prompt, the per-turn token
deltas, and the end-of-episode template check.

The runner keeps one token sequence per episode and only ever appends to it:

* turn 1: ``prompt_ids(messages, tools)`` — the template rendered with the generation prompt;
* after each sampled response, the response ids exactly as the server returned them;
* before each later turn, ``delta_ids(new_messages, tools, last_token)`` — the tokens of the
  env/tool messages plus the generation prompt.

A delta is rendered in a fixed dummy context, never from the episode's history:
``[user: DUMMY, assistant: MARKER, *new_messages]`` with the generation prompt. Everything
after ``MARKER`` is what the template writes after an assistant message's content: the
closing of the assistant turn (``<|im_end|>\\n`` in ChatML), the new messages and the
generation prompt. When the sampled response already ends with the closing token (the model
stopped on ``<|im_end|>``), that token is dropped from the front of the delta; when it does
not (cut by ``max_tokens``, or stopped on another token) the whole closing is kept, so the
sequence reads exactly as a conversation whose assistant message was the sampled text.
Deltas are cached by (tools, messages, last token), so a repeated observation costs one dict
lookup. Because only the text after ``MARKER`` is used, a template that renders an assistant
message differently by position (Qwen3 adds an empty think block to the last one) still
yields the right delta.

Template check: a template that is not prefix-preserving (Qwen3's drops ``<think>`` blocks
from assistant turns before the last user message) renders the finished conversation
differently from the sequence the model actually saw. The runner never re-renders the
history, so its tokens stay what was sampled; ``mismatch(...)`` compares the decoded
sequence with a full re-render of the conversation (assistant messages as their raw sampled
text) and returns the first differing character, which the runner reports as the
``template_mismatch`` metric. Text, not tokens, is compared, so a sampled non-canonical
tokenization of the same text is not counted as a mismatch.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from agentgym.types import Message

MARKER = "AGENTGYM_ASSISTANT_CONTENT_MARKER"
_GENERATION_TAG = re.compile(r"(\{%[-+]?\s*)(end)?generation(\s*[-+]?%\})")
_DUMMY_USER = "AGENTGYM_DUMMY_USER"


def tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    """A hashable key for a tool list (computed once per episode)."""
    return json.dumps(tools, sort_keys=True) if tools else ""


def _messages_key(messages: Sequence[Message]) -> Hashable | None:
    try:
        key = tuple(
            (
                m.get("role"),
                m.get("content"),
                m.get("tool_call_id"),
                m.get("name"),
                json.dumps(m["tool_calls"], sort_keys=True) if m.get("tool_calls") else None,
            )
            for m in messages
        )
        hash(key)
        return key
    except TypeError:  # content parts (lists) and other unhashable content: render without caching
        return None


class ChatTokenizer:
    """A tokenizer's chat template turned into token deltas for append-only rollouts.

    ``tokenizer``: a Hugging Face tokenizer with a chat template (see ``agentgym.model.load_tokenizer``).
    ``template_kwargs``: extra template variables for every render (veRL's
    ``data.apply_chat_template_kwargs``, e.g. ``{"enable_thinking": False}`` for Qwen3).
    """

    def __init__(self, tokenizer: Any, cache_size: int = 8192, template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; rollouts render chats with it")
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        # The Rust tokenizer behind a fast HF tokenizer: same ids and text as tokenizer.encode /
        # decode(skip_special_tokens=False, clean_up_tokenization_spaces=False), without the
        # per-call Python overhead that dominates on short texts.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._extra_kwargs = dict(template_kwargs or {})
        self._template_kwargs = {**dict(getattr(tokenizer, "special_tokens_map", {}) or {}), **self._extra_kwargs}
        self._compiled: Any = None
        self._compiled = self._fast_renderer()
        self._deltas: OrderedDict[Hashable, list[int]] = OrderedDict()
        self._prompts: OrderedDict[Hashable, list[int]] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0
        closing = self._tail([], None)  # what the template writes after an assistant's content
        self.closing_text = closing
        # The special tokens that can end a response and that the template writes as the first
        # thing after an assistant's content (ChatML: <|im_end|>); only those are skipped.
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is not None:
            special.add(eos)
        self._closing_ids = {i for i in special if (t := self.decode([i])) and closing.startswith(t)}
        self._closing_len = {i: len(self.decode([i])) for i in self._closing_ids}

    # ---- rendering -------------------------------------------------------------------------
    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages`` (what ``apply_chat_template(tokenize=False)`` gives)."""
        if self._compiled is not None:
            return self._compiled.render(
                messages=[{k: v for k, v in m.items() if v is not None} for m in messages],
                tools=list(tools) if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._template_kwargs,
            )
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self._extra_kwargs,
        )

    def _fast_renderer(self) -> Any:
        """transformers' compiled Jinja template, called directly: ``apply_chat_template`` deep-copies
        every message and tool schema on each call, which costs more than the rendering. Used only
        when it renders a probe conversation exactly as ``apply_chat_template`` does."""
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            template = self.tokenizer.get_chat_template(None, None)
            # {% generation %} only marks assistant spans (for return_assistant_tokens_mask) and costs
            # a macro call per message; an {% if true %} block renders the same, whitespace control included.
            template = _GENERATION_TAG.sub(
                lambda m: m.group(1) + ("endif" if m.group(2) else "if true") + m.group(3), template
            )
            compiled = _compile_jinja_template(template)
        except Exception:  # noqa: BLE001 - any trouble: the public path
            return None
        probe: list[Message] = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "v"},
        ]
        tools = [
            {
                "type": "function",
                "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}},
            }
        ]
        try:
            for t in (None, tools):
                for gen in (False, True):
                    fast = compiled.render(
                        messages=probe, tools=t, documents=None, add_generation_prompt=gen, **self._template_kwargs
                    )
                    slow = self.tokenizer.apply_chat_template(
                        probe, tools=t, add_generation_prompt=gen, tokenize=False, **self._extra_kwargs
                    )
                    if fast != slow:
                        return None
        except Exception:  # noqa: BLE001
            return None
        return compiled

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _tail(
        self,
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None,
        add_generation_prompt: bool = False,
    ) -> str:
        """Template text after an assistant message's content, followed by ``new_messages``."""
        dummy: list[Message] = [{"role": "user", "content": _DUMMY_USER}, {"role": "assistant", "content": MARKER}]
        text = self.render(dummy + list(new_messages), tools, add_generation_prompt=add_generation_prompt)
        at = text.rfind(MARKER)
        if at < 0:
            raise ValueError(
                "the chat template dropped an assistant message's content; cannot compute token "
                "deltas for multi-turn rollouts with it"
            )
        return text[at + len(MARKER) :]

    # ---- the token sequence ----------------------------------------------------------------
    def prompt_ids(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None, tkey: str | None = None
    ) -> list[int]:
        """The first turn's prompt: ``messages`` rendered with the generation prompt (a fresh list)."""
        mkey = _messages_key(messages)
        key = None if mkey is None else (tools_key(tools) if tkey is None else tkey, mkey)
        if key is not None and (ids := self._prompts.get(key)) is not None:
            self._prompts.move_to_end(key)
            return list(ids)
        ids = self.encode(self.render(messages, tools, add_generation_prompt=True))
        if key is not None:
            self._remember(self._prompts, key, ids)
        return list(ids)

    def delta_ids(
        self,
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        last_token: int | None = None,
        tkey: str | None = None,
    ) -> list[int]:
        """Tokens to append after a response whose last sampled token is ``last_token``: the rest
        of the assistant turn's closing (all of it unless ``last_token`` is the closing token),
        the new messages and the generation prompt. The list is shared: do not modify it."""
        closed = last_token if last_token in self._closing_ids else None
        mkey = _messages_key(new_messages)
        key = None if mkey is None else (tools_key(tools) if tkey is None else tkey, closed, mkey)
        if key is not None:
            ids = self._deltas.get(key)
            if ids is not None:
                self.cache_hits += 1
                return ids
        self.cache_misses += 1
        text = self._tail(new_messages, tools, add_generation_prompt=True)
        if closed is not None:
            text = text[len(self.decode([closed])) :]
        ids = self.encode(text)
        if key is not None:
            self._remember(self._deltas, key, ids)
        return ids

    @property
    def closing_id(self) -> int | None:
        """The token that ends an assistant turn (ChatML: ``<|im_end|>``), or None if the template has none."""
        ranked = sorted(self._closing_ids, key=lambda i: -self._closing_len[i])
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return eos if eos in self._closing_ids else (ranked[0] if ranked else None)

    def assistant_ids(self, message: Message, tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The tokens a model generates to write the assistant ``message``: its content as the
        template renders it (tool calls included), then the closing token. What ``agentgym sft``
        trains on, so a demonstration reads exactly like a sampled reply followed by
        ``delta_ids(..., last_token=closing_id)``."""
        user: Message = {"role": "user", "content": _DUMMY_USER}
        head = self.render([user], tools, add_generation_prompt=True)
        full = self.render([user, message], tools)
        closing, closing_id = self.closing_text, self.closing_id
        if not full.startswith(head) or closing_id is None or not closing or not full.endswith(closing):
            raise ValueError(
                "this chat template does not render an assistant message as generation prompt + "
                "content + closing token, so its tokens cannot be told apart for supervised training"
            )
        return self.encode(full[len(head) : len(full) - len(closing)]) + [closing_id]

    def assistant_content(self, response_ids: Sequence[int], text: str | None = None) -> str:
        """The assistant message's text: the sampled text without the closing token.
        ``text``: ``decode(response_ids)`` when the caller already has it."""
        if text is None:
            text = self.decode(response_ids)
        if response_ids and (cut := self._closing_len.get(response_ids[-1])):
            return text[:-cut]
        return text

    # ---- template check --------------------------------------------------------------------
    def mismatch(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None, token_ids: Sequence[int]
    ) -> int | None:
        """Where a full re-render of ``messages`` departs from the decoded ``token_ids``: the first
        differing character, or None when the re-render starts with exactly the sampled sequence.
        Pass assistant messages with their raw sampled text as content (see ``assistant_content``)."""
        seen = self.decode(token_ids)
        rendered = self.render(messages, tools, add_generation_prompt=False)
        if rendered.startswith(seen):
            return None
        limit = min(len(seen), len(rendered))
        return next((i for i in range(limit) if seen[i] != rendered[i]), limit)

    def _remember(self, cache: OrderedDict[Hashable, list[int]], key: Hashable, ids: list[int]) -> None:
        cache[key] = ids
        if len(cache) > self.cache_size:
            cache.popitem(last=False)
