"""A multi-turn, tool-using GSM8K agent written with nothing but the ``openai`` package.

    agentgym train --agent examples.gsm8k_agent:run data.train_files=data/gsm8k/train.jsonl

The agent knows nothing about agentgym: it gets an OpenAI ``base_url``, an API key and a task,
asks the model, runs the calculator tool it implements itself whenever the model calls it, and
stops at a final answer (a reply without tool calls) or after ``MAX_TURNS`` model calls. Sampling
(temperature, max tokens) is pinned by the trainer through the gateway, so the agent sets none.
The reward is computed by the gateway from the task (GSM8K's score on the last assistant
message); the agent returns its final reply, which is text, so it is not taken as a reward.

Try it against any OpenAI-compatible server too:

    python examples/gsm8k_agent.py --base-url http://127.0.0.1:8000/v1 "What is 48 / 2 + 3?"
"""

from __future__ import annotations

import ast
import json
import operator

from openai import OpenAI

MAX_TURNS = 5
SYSTEM = (
    "You solve grade-school maths problems. Use the calculator tool for arithmetic. "
    'When you know the answer, reply with your reasoning and the final answer after "####".'
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 48 / 2 + 3"}},
                "required": ["expression"],
            },
        },
    }
]

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculator(expression: str) -> str:
    """The value of an arithmetic expression, or an error message the model can read."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"unsupported syntax: {ast.dump(node)[:40]}")

    try:
        result = value(ast.parse(str(expression).replace(",", ""), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError) as exc:
        return f"error: {exc}"
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


def call_tool(name: str, arguments: str) -> str:
    if name != "calculator":
        return f"error: unknown tool {name!r}; the only tool is calculator"
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"error: arguments are not JSON ({exc.msg})"
    if not isinstance(args, dict) or "expression" not in args:
        return 'error: call calculator with {"expression": "..."}'
    return calculator(args["expression"])


def run(base_url: str, api_key: str, task: dict, max_turns: int = MAX_TURNS, model: str = "policy") -> str:
    """Solve ``task["question"]``; returns the final reply (the gateway scores it)."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=5, timeout=600)
    question = task.get("question") or task["prompt"][-1]["content"]
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    reply = ""
    for _ in range(max_turns):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        reply = message.content or ""
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": call_tool(call.function.name, call.function.arguments),
                }
            )
    return reply


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Ask the GSM8K agent one question.")
    parser.add_argument("question")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    print(run(args.base_url, args.api_key, {"question": args.question}, model=args.model))
