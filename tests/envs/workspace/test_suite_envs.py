"""The suites and formats through the real workspace env: reset, tools, verifier, reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentgym
from agentgym.envs.workspace.suite_envs import HarborEnv, SweBenchEnv, SweEnv, TerminalEnv
from agentgym.envs.workspace.suites.swe import BUG_KINDS
from agentgym.envs.workspace.suites.terminal import KINDS
from agentgym.registry import ENVS, import_object

DATA = Path(__file__).parent / "data"


def _episode(env, seed: int, expert: bool = True):
    messages, info = env.reset(seed=seed)
    assert [m["role"] for m in messages] == ["system", "user"] and {t["function"]["name"] for t in info["tools"]} == {
        "bash", "read_file", "write_file", "str_replace", "submit"
    }  # fmt: skip
    while True:
        action = env.expert_action() if expert else {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
        ]}  # fmt: skip
        messages, reward, terminated, truncated, info = env.step(action)
        assert reward == 0.0 and all(m["role"] == "tool" for m in messages)
        if terminated or truncated:
            return info


@pytest.mark.parametrize(
    "make,seeds",
    [
        (lambda: TerminalEnv(), range(6)),
        (lambda: SweEnv(), range(2)),
        (lambda: HarborEnv(path=str(DATA / "harbor")), range(1)),
        (lambda: SweBenchEnv(path=str(DATA / "swebench" / "instances.jsonl")), range(1)),
    ],
    ids=["terminal", "swe", "harbor", "swebench"],
)
def test_expert_earns_the_reward_and_submitting_at_once_does_not(make, seeds):
    env = make()
    try:
        for seed in seeds:
            info = _episode(env, seed)
            assert info["outcome_reward"] == 1.0 and info["success"], (env.task.task_id, info["verifier"])
        info = _episode(env, seeds[0], expert=False)
        assert info["outcome_reward"] == 0.0 and not info["success"]
    finally:
        env.close()


def test_registered_names_and_families():
    from agentgym.registry import source_tree_entry_points

    declared = {"terminal": TerminalEnv, "swe": SweEnv, "harbor": HarborEnv, "swebench": SweBenchEnv}
    assert {name: ENVS.get(name) for name in declared} == declared
    env = agentgym.make("terminal", kinds="move", num_files=2)
    try:
        env.reset(seed=5)
        assert env.task.metadata["kind"] == "move" and len(env.task.files) <= 4
    finally:
        env.close()
    families = source_tree_entry_points("agentgym.envs")  # families are resolved on use, from pyproject here
    terminal, swe = import_object(families["terminal/*"]), import_object(families["swe/*"])
    assert terminal.members() == list(KINDS) and swe.members() == list(BUG_KINDS)
    assert terminal.spec("count_lines").kwargs == {"kinds": ["count_lines"]}
    assert swe.spec("off_by_one").make().task_source(0).metadata["kind"] == "off_by_one"
    with pytest.raises(ValueError, match="needs path="):
        HarborEnv()


def test_without_tool_schemas_text_calls_still_run():
    env = TerminalEnv(kinds="count_lines", offer_tools=False, system_prompt="")
    try:
        messages, info = env.reset(seed=2)
        assert "tools" not in info and [m["role"] for m in messages] == ["user"]
        command = env.task.expert[0]["arguments"]["command"]
        text = "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"
        messages, *_ = env.step({"role": "assistant", "content": text})
        answer = messages[0]["content"].split("\n")[0]
        assert answer == env.task.checks[0].answer
        submit = "<tool_call>\n" + json.dumps({"name": "submit", "arguments": {"answer": answer}}) + "\n</tool_call>"
        *_, terminated, _, info = env.step({"role": "assistant", "content": submit})
        assert terminated and info["outcome_reward"] == 1.0
    finally:
        env.close()
