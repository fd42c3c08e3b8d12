"""A GSM8K agent written with the OpenAI Agents SDK, on its default model class: ``OpenAIResponsesModel``,
which speaks OpenAI's Responses API (``POST /v1/responses``) to the server or the gateway.

    agentgym train --agent examples.agents_sdk_responses:run data.train_files=data/gsm8k/train.jsonl

The agent knows nothing about agentgym. It gets an OpenAI ``base_url``, an API key and a task, and runs
an ``Agents SDK`` agent with a calculator tool and a structured final answer (``output_type``: the
Responses ``text.format`` json_schema, enforced by constrained decoding) whose one field is the answer
in GSM8K's ``#### <number>`` form, so the gateway's GSM8K reward reads it from the last reply. The
gateway records every model call of the run token by token, as it does for chat completions
(docs/openai_api.md, "The Responses API"). Sampling is pinned by the trainer through the gateway, so
the agent sets none; tracing is off (nothing leaves the machine).

A run that does not end with an answer (``max_turns`` model calls, or a reply cut at the token limit:
the SDK raises ``ModelBehaviorError`` for an incomplete response) raises, so its session is finished
``failed``: kept for inspection, not trained on.

Try it against any Responses-compatible server too (``agentgym serve`` serves ``/v1/responses``):

    python examples/agents_sdk_responses.py --base-url http://127.0.0.1:8000/v1 "What is 48 / 2 + 3?"
"""

from __future__ import annotations

from typing import Annotated

from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

try:  # the same arithmetic as the chat-client example
    from examples.gsm8k_agent import calculator as evaluate
except ImportError:  # run as a script: examples/ is the script's folder
    from gsm8k_agent import calculator as evaluate

MAX_TURNS = 6
INSTRUCTIONS = (
    "You solve grade-school maths problems. Use the calculator tool for arithmetic, then give the "
    'final answer as "#### <number>".'
)


class Solution(BaseModel):
    answer: str = Field(pattern=r"^#### -?[0-9][0-9.,]{0,15}$", description='the final answer, e.g. "#### 72"')


@function_tool
def calculator(expression: Annotated[str, Field(max_length=120, description="e.g. 48 / 2 + 3")]) -> str:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses)."""
    return evaluate(expression)


def build_agent(client: AsyncOpenAI, model: str = "policy", settings: ModelSettings | None = None) -> Agent:
    return Agent(
        name="gsm8k",
        instructions=INSTRUCTIONS,
        tools=[calculator],
        output_type=Solution,
        model=OpenAIResponsesModel(model=model, openai_client=client),  # the SDK's default model class
        model_settings=settings or ModelSettings(),
    )


async def run(base_url: str, api_key: str, task: dict, max_turns: int = MAX_TURNS, model: str = "policy") -> str:
    """Solve ``task["question"]``; returns the answer (the gateway scores the last reply)."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=5, timeout=600)
    question = task.get("question") or task["prompt"][-1]["content"]
    try:
        result = await Runner.run(
            build_agent(client, model), question, max_turns=max_turns, run_config=RunConfig(tracing_disabled=True)
        )
    finally:
        await client.close()
    return result.final_output.answer


if __name__ == "__main__":
    import argparse
    import asyncio

    parser = argparse.ArgumentParser(description="Ask the Agents SDK GSM8K agent one question.")
    parser.add_argument("question")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="default")
    args = parser.parse_args()
    print(asyncio.run(run(args.base_url, args.api_key, {"question": args.question}, model=args.model)))
