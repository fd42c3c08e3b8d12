"""The built-in tiny model: builds offline, reloads token-exactly, renders chats with tools."""

from __future__ import annotations

from transformers import AutoTokenizer

from agentgym.model import load_causal_lm, load_tokenizer, resolve_model_path
from agentgym.model.tiny import build_tokenizer

MESSAGES = [
    {"role": "system", "content": "Solve it."},
    {"role": "user", "content": "What is 48 / 2? héllo ∑"},
    {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "48 / 2"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "24"},
    {"role": "assistant", "content": "#### 24"},
]


def test_tiny_reloads_with_identical_token_ids():
    fresh = build_tokenizer()
    reloaded = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
    text = fresh.apply_chat_template(MESSAGES, tokenize=False)
    assert reloaded(text)["input_ids"] == fresh(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"]) == text


def test_chat_template_is_prefix_preserving_and_masks_assistant_tokens():
    tok = load_tokenizer("tiny")
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    short = tok.apply_chat_template(MESSAGES[:2], tools=tools, add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(MESSAGES, tools=tools, tokenize=False)
    assert full.startswith(short)
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48 / 2"}}\n</tool_call>' in full
    assert "<tool_response>\n24\n</tool_response>" in full
    enc = tok.apply_chat_template(
        MESSAGES, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [t for t, m in zip(enc["input_ids"], enc["assistant_masks"]) if m]
    assert tok.decode(masked).count("<|im_end|>") == 2
    assert "#### 24" in tok.decode(masked) and "Solve it" not in tok.decode(masked)


def test_tiny_model_runs_a_forward_pass():
    import torch

    tok = load_tokenizer("tiny")
    model = load_causal_lm("tiny")
    ids = torch.tensor([tok("hello world")["input_ids"]])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert model.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
