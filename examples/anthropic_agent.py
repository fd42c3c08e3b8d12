"""A multi-turn, tool-using GSM8K agent written with nothing but the ``anthropic`` package.

    agentgym train --agent examples.anthropic_agent:run data.train_files=data/gsm8k/train.jsonl

The same agent as ``examples/gsm8k_agent.py``, on Anthropic's Messages API: it gets a ``base_url``,
an API key and a task, asks the model with ``client.messages.create``, runs the calculator tool it
implements itself whenever the reply holds ``tool_use`` blocks (answering each with a
``tool_result``), and stops at a reply without tool calls or after ``MAX_TURNS`` model calls.

The agent protocol hands every agent the OpenAI base URL of its gateway session
(``.../sessions/<id>/v1``); the ``anthropic`` client adds ``/v1/messages`` itself, so its base URL is
that one without ``/v1`` (``POST /sessions`` returns it as ``anthropic_base_url``). The gateway
records each Messages call token by token, as it records chat completions, and pins the sampling
(temperature, max tokens): the ``max_tokens`` Anthropic requires of every request is a ceiling the
trainer's ``max_tokens_per_turn`` replaces.

Try it against the embedded server (``agentgym serve --model tiny --port 8000``), which serves
``POST /v1/messages`` too:

    python -m examples.anthropic_agent --base-url http://127.0.0.1:8000 "What is 48 / 2 + 3?"
"""

from __future__ import annotations

from typing import Any

from anthropic import Anthropic

from examples.gsm8k_agent import calculator

MAX_TURNS = 5
MAX_TOKENS = 1024
SYSTEM = (
    "You solve grade-school maths problems. Use the calculator tool for arithmetic. "
    'When you know the answer, reply with your reasoning and the final answer after "####".'
)
TOOLS = [
    {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 48 / 2 + 3"}},
            "required": ["expression"],
        },
    }
]


def anthropic_base_url(base_url: str) -> str:
    """The ``anthropic`` client's base URL for an OpenAI-style one (``.../v1``): the client adds ``/v1``."""
    return base_url.rstrip("/").removesuffix("/v1")


def call_tool(name: str, tool_input: dict[str, Any]) -> tuple[str, bool]:
    """``(result, is_error)`` for one ``tool_use`` block."""
    if name != "calculator":
        return f"unknown tool {name!r}; the only tool is calculator", True
    if "expression" not in tool_input:
        return 'call calculator with {"expression": "..."}', True
    return calculator(tool_input["expression"]), False  # its errors are text the model can read


def run(base_url: str, api_key: str, task: dict, max_turns: int = MAX_TURNS, model: str = "policy") -> str:
    """Solve ``task["question"]``; returns the final reply's text (the gateway scores it)."""
    client = Anthropic(base_url=anthropic_base_url(base_url), api_key=api_key, max_retries=5, timeout=600)
    question = task.get("question") or task["prompt"][-1]["content"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    reply = ""
    for _ in range(max_turns):
        response = client.messages.create(
            model=model, max_tokens=MAX_TOKENS, system=SYSTEM, tools=TOOLS, messages=messages
        )
        content = [block.model_dump(include={"type", "text", "id", "name", "input"}) for block in response.content]
        messages.append({"role": "assistant", "content": content})
        reply = "".join(block.text for block in response.content if block.type == "text")
        calls = [block for block in response.content if block.type == "tool_use"]
        if not calls:
            break
        results = []
        for call in calls:
            result, is_error = call_tool(call.name, call.input)
            results.append({"type": "tool_result", "tool_use_id": call.id, "content": result, "is_error": is_error})
        messages.append({"role": "user", "content": results})
    return reply


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Ask the Anthropic-client GSM8K agent one question.")
    parser.add_argument("question")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server's root (or .../v1)")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    print(run(args.base_url, args.api_key, {"question": args.question}, model=args.model))
