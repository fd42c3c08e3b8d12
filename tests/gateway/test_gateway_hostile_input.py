"""The gateway's own readers of what agents send (session matching) hold against hostile shapes:
they answer, never raise (the envs' doors are fuzzed in tests/envs/test_doors.py)."""

from __future__ import annotations

from agentgym.gateway.sessions import _json_equal, normalize_message, same_reply


def test_deeply_nested_tool_arguments_compare_as_different_not_raise():
    assert _json_equal("[" * 5000, "x") is False
    assert _json_equal('{"a": 1}', '{"a":1}') is True
    deep = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "[" * 5000}}],
    }
    assert same_reply(normalize_message(deep), normalize_message(deep)) is True  # equal text: no parse needed


def test_a_content_part_whose_text_is_not_a_string_adds_nothing():
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": 5},
            {"type": "text", "text": "hi"},
            {"type": "text", "text": None},
            "stray",
        ],
    }
    assert normalize_message(message)["content"] == "hi"


def test_ignore_eos_reaches_every_backend_dialect():
    """The gateway forwards ``ignore_eos`` (it was dropped, so an agent asking for it got a reply cut at EOS)."""
    from agentgym.client.dialects import completions_payload, sglang_payload
    from agentgym.types import SamplingParams

    asked = SamplingParams(max_tokens=8, ignore_eos=True)
    assert completions_payload([1, 2], asked, "vllm")["ignore_eos"] is True
    assert sglang_payload([1, 2], asked)["sampling_params"]["ignore_eos"] is True
    assert "ignore_eos" not in completions_payload([1, 2], SamplingParams(max_tokens=8), "vllm")
