"""A pydantic-ai agent with a tool AND a structured output (``NativeOutput``) against the embedded server and
through the gateway: pydantic-ai sends ``tools`` with ``tool_choice="auto"`` beside ``response_format``
``json_schema`` on every step, so its tool loop needs the union grammar (a tool call OR the JSON).

The tiny model's choice is made deterministic per step with ``logit_bias`` on the ``<tool_call>`` token
(pydantic-ai takes model settings per step from a callable): +100 on the first step (the tool is called),
-100 after (the JSON answer). The grammar makes the call's arguments and the answer valid. Through the
gateway the run is one recorded branch whose turns are, token for token, the replies pydantic-ai received
(read off the wire with an httpx event hook; ``return_token_ids`` asks the ids back)."""

from __future__ import annotations

import json

import httpx
import pytest

pydantic_ai = pytest.importorskip("pydantic_ai")
httpx2 = pytest.importorskip("httpx2")

from openai import AsyncOpenAI  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

from agentgym.gateway.serve import start_gateway  # noqa: E402
from agentgym.types import Trajectory  # noqa: E402


class Answer(BaseModel):
    found: bool
    count: int = Field(ge=0, le=9)


@pytest.fixture(scope="module")
def server(embedded_server):
    return embedded_server  # the session's (tests/conftest.py)


@pytest.fixture(scope="module")
def gw(server):
    handle = start_gateway([server.url], model="tiny", max_model_len=4096)
    yield handle
    handle.stop()


def run_agent(base_url: str, api_key: str, tool_call_token: int) -> tuple[object, list[int], list[dict]]:
    """Run the agent; ``(result, the keys its tool was called with, the chat responses it received)``."""
    received: list[dict] = []

    async def keep(response) -> None:
        await response.aread()
        if response.request.url.path.endswith("/chat/completions"):
            received.append(json.loads(response.content))

    http = httpx2.AsyncClient(event_hooks={"response": [keep]})
    model = OpenAIChatModel(
        "tiny", provider=OpenAIProvider(openai_client=AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http))
    )
    keys: list[int] = []

    def lookup(key: int) -> str:
        """Look a key up in the store."""
        keys.append(key)
        return f"key {key}: 3 items"

    def settings(ctx) -> dict:
        first = not keys  # until the tool has run, push the model to call it; then to answer
        return {
            "max_tokens": 160,
            "parallel_tool_calls": False,  # one call, so the reply always ends within max_tokens
            "logit_bias": {str(tool_call_token): 100 if first else -100},
            "extra_body": {"return_token_ids": True},
        }

    agent = pydantic_ai.Agent(
        model, output_type=pydantic_ai.NativeOutput(Answer), tools=[lookup], model_settings=settings
    )
    result = agent.run_sync("How many items are under key 7?")
    return result, keys, received


def check_run(result, keys, received) -> None:
    assert isinstance(result.output, Answer)
    assert keys, "the tool was never called: the reply was forced to JSON"
    kinds = [[type(p).__name__ for p in m.parts] for m in result.all_messages()]
    assert kinds[0] == ["UserPromptPart"] and set(kinds[1]) == {"ToolCallPart"}
    assert set(kinds[2]) == {"ToolReturnPart"} and kinds[-1] == ["TextPart"]
    assert [r["choices"][0]["finish_reason"] for r in received] == ["tool_calls", "stop"]


def test_a_pydantic_ai_tool_loop_with_native_output_against_the_server(server):
    token = server.engine.tokenizer.convert_tokens_to_ids("<tool_call>")
    check_run(*run_agent(server.base_url, "x", token))


def test_a_pydantic_ai_tool_loop_with_native_output_through_the_gateway(server, gw):
    token = server.engine.tokenizer.convert_tokens_to_ids("<tool_call>")
    admin = {"Authorization": f"Bearer {gw.admin_key}"}
    info = httpx.post(gw.url + "/sessions", json={}, headers=admin).json()
    result, keys, received = run_agent(info["base_url"], info["api_key"], token)
    check_run(result, keys, received)
    done = httpx.post(f"{gw.url}/sessions/{info['id']}/finish", json={}, headers=admin)
    [traj] = [Trajectory.from_dict(t) for t in done.json()["trajectories"]]
    assert [t.response_ids for t in traj.turns] == [r["choices"][0]["token_ids"] for r in received]
    assert all("grammar" in t.shaped_by for t in traj.turns)
