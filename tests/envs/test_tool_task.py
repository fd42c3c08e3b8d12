"""tool_task: a task env's questions answered with an MCP server's tools, rolled out and trained."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

pytest.importorskip("mcp")

from agentgym.client import PolicyClient  # noqa: E402
from agentgym.model import load_tokenizer  # noqa: E402
from agentgym.rollout import RolloutConfig, RolloutRunner  # noqa: E402
from tests.envs.tools.test_mcp import SERVER, own_children  # noqa: E402
from tests.support.mcp_env import ensure_tool_task  # noqa: E402

TOK = load_tokenizer("tiny")


def calc_server(**kwargs) -> list[dict]:
    return [{"name": "calc", "command": sys.executable, "args": [SERVER], "tools": ["add"], **kwargs}]


def tool_using_policy(request):
    """Asks the MCP ``add`` tool for the sum in the question, then answers with what the tool said."""
    prompt = TOK.decode(request["prompt"])
    said = re.findall(r"<tool_response>\s*(-?[\d.]+)\s*</tool_response>", prompt)
    if said:
        text = f"The tool says {said[-1]}. #### {said[-1]}<|im_end|>"
    else:
        a, b = re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1]
        text = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call><|im_end|>'
    tokens = TOK.encode(text, add_special_tokens=False)
    return tokens, [-0.5] * len(tokens), "stop"


async def test_rollouts_answer_with_the_mcp_servers_results(standin_server):
    ensure_tool_task()
    standin_server.policy = tool_using_policy
    kwargs = {"task": "arithmetic", "task_kwargs": {"subtract": False}, "mcp_servers": calc_server()}
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner(
            "tool_task", client, "tiny", RolloutConfig(n=2, max_turns=3, max_tokens=64), env_kwargs=kwargs
        )
        result = await runner.run(tasks=3)
        await runner.aclose()
    trajs = result.trajectories
    assert len(trajs) == 6 and all(t.status != "failed" for t in trajs), [t.failure for t in trajs]
    for traj in trajs:  # the right sum, read from the server's tool message
        tool = [m for m in traj.messages if m["role"] == "tool"]
        assert len(tool) == 1 and traj.outcome_reward == 1.0, traj.messages
        assert traj.num_turns == 2 and traj.metrics.get("env/tool_calls/add") == 1.0, sorted(traj.metrics)


@pytest.mark.slow
def test_agentgym_train_runs_two_steps_with_mcp_tools(tmp_path):
    """`agentgym train --env mcp_arithmetic`: the calculator MCP server's tool over stdio, 2 GRPO steps."""
    from agentgym.cli import main

    ensure_tool_task()
    run = tmp_path / "run"
    code = main(
        [
            "train",
            "--env",
            "mcp_arithmetic",
            f"trainer.default_local_dir={run}",
            "trainer.total_training_steps=2",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "data.max_response_length=48",
            "actor_rollout_ref.rollout.max_tokens_per_turn=24",
            "env.num_val_tasks=2",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
        ]
    )
    assert code == 0
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "actor/pg_loss" in s] == [1, 2]
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    prompt = TOK.decode(sample["turns"][0]["prompt_ids"])
    assert '{"name": "calculate", "description": "Evaluate an arithmetic expression' in prompt  # the server's
    deadline = time.monotonic() + 5
    while any("calculator_server" in line for line in own_children()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any("calculator_server" in line for line in own_children()), "the MCP server outlived the run"
