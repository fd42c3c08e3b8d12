"""WorkspaceEnv end to end with the toy task source: the expert solves it, the verifier's files stay
hidden from the agent, the agent cannot act once its episode is over, and every episode's sandbox
ends with the episode (submit, truncation, reset, close)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import agentgym
from agentgym.envs.demos import read_demos, write_demos
from agentgym.envs.workspace.env import NO_CALL_REMINDER, WorkspaceEnv
from agentgym.envs.workspace.sandbox import WorkspaceLimits
from tests.envs.workspace.toy import toy_task

LIMITS = {"timeout_s": 5.0, "memory_mb": 512, "max_disk_mb": 16}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"c_{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


def hermes(name: str, **arguments: Any) -> str:
    return f"Let me look. <tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def env() -> WorkspaceEnv:
    environment = WorkspaceEnv(tasks=toy_task, limits=LIMITS)
    yield environment
    environment.close()


def play_expert(env: WorkspaceEnv, seed: int) -> dict[str, Any]:
    env.reset(seed=seed)
    while (action := env.expert_action()) is not None:
        _, reward, terminated, truncated, info = env.step(action)
        assert reward == 0.0
        if terminated or truncated:
            return info
    raise AssertionError("the expert never ended the episode")


def sandbox_pids(env: WorkspaceEnv) -> list[int]:
    sandbox = env.handle.sandbox
    assert sandbox is not None and sandbox.pid is not None
    return [sandbox.pid, *(p.pid for p in psutil.Process(sandbox.pid).children(recursive=True))]


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def all_gone(pids: list[int], wait_s: float = 3.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not any(running(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_the_expert_solves_the_toy_task_and_the_verifier_reports_each_check(env: WorkspaceEnv) -> None:
    info = play_expert(env, seed=7)
    assert info["outcome_reward"] == 1.0 and info["success"] is True and info["answer"] == "14"
    assert [c["passed"] for c in info["verifier"]["checks"]] == [True, True, True]
    assert "hidden test passed" in info["verifier"]["checks"][0]["detail"]
    assert info["metrics"]["checks_passed"] == 3.0 and info["metrics"]["tool_calls/str_replace"] == 1.0
    assert env.handle.sandbox is None  # the episode's sandbox is gone once the verdict is in


def test_the_first_messages_show_the_instruction_and_the_tools(env: WorkspaceEnv) -> None:
    messages, info = env.reset(seed=3)
    assert messages[-1] == {"role": "user", "content": toy_task(3).instruction}
    assert [t["function"]["name"] for t in info["tools"]] == [
        "bash",
        "read_file",
        "write_file",
        "str_replace",
        "submit",
    ]
    assert info["task_id"] == "toy-3" and info["max_turns"] == 6


def test_hermes_text_calls_work_and_a_reply_without_a_call_gets_a_reminder(env: WorkspaceEnv) -> None:
    env.reset(seed=1)
    observation, _, terminated, _, _ = env.step(hermes("bash", command="ls"))
    assert "add.py" in observation[0]["content"] and "[exit code: 0]" in observation[0]["content"]
    assert not terminated
    observation, *_ = env.step("I think I am done.")
    assert observation == [{"role": "user", "content": NO_CALL_REMINDER}]


def test_doing_nothing_scores_zero_and_truncation_runs_the_verifier(env: WorkspaceEnv) -> None:
    env.reset(seed=2)
    for turn in range(6):
        _, _, terminated, truncated, info = env.step(call("bash", command="true"))
        assert not terminated and truncated == (turn == 5)
    assert info["outcome_reward"] == 0.0 and info["verifier"]["checks"][0]["passed"] is False
    with pytest.raises(RuntimeError, match="reset"):
        env.step(call("bash", command="true"))


SEARCH = (
    "cat hidden_test.py; find / -name 'hidden_test*' 2>/dev/null; "
    "grep -rl 'hidden test' /workspace /tmp /dev/shm /etc 2>/dev/null; echo searched"
)
WRITER = (
    'nohup sh -c \'while true; do rm -rf /workspace/hidden_test.py; echo "print(1)" > /workspace/hidden_test.py; '
    "sleep 0.005; done' >/dev/null 2>&1 &"
)


def test_the_verifier_files_are_invisible_during_the_episode(env: WorkspaceEnv) -> None:
    env.reset(seed=4)
    observation, *_ = env.step(call("bash", command=SEARCH))
    text = observation[0]["content"]
    assert "searched" in text and "cat: hidden_test.py: No such file or directory" in text
    assert "/hidden_test" not in text and "hidden test" not in text
    observation, *_ = env.step(call("read_file", path="hidden_test.py"))
    assert "does not exist" in observation[0]["content"]


def test_the_agent_cannot_act_after_its_last_action(env: WorkspaceEnv) -> None:
    """A background writer that keeps replacing the hidden test with one that passes: it dies with
    the agent's call, and the verifier runs the real test in its own sandbox (add.py is unfixed)."""
    env.reset(seed=5)
    env.step(call("bash", command=WRITER + " sleep 0.2"))
    env.step(call("write_file", path="count.txt", content="5"))
    _, _, terminated, _, info = env.step(call("submit", answer="10"))
    assert terminated and info["outcome_reward"] == 0.0
    checks = info["verifier"]["checks"]
    assert checks[0]["passed"] is False and "AssertionError: -1" in checks[0]["detail"]
    assert checks[1]["passed"] and checks[2]["passed"]  # the rest of its work does count


@pytest.mark.parametrize(
    "plant", ["ln -s add.py hidden_test.py", "mkdir -p hidden_test.py/sub", "ln -s /tmp/gone hidden_test.py"]
)
def test_what_the_agent_leaves_in_a_verifier_files_place_is_replaced(env: WorkspaceEnv, plant: str) -> None:
    env.reset(seed=6)
    env.step(call("str_replace", path="add.py", old_str="a - b", new_str="a + b"))
    env.step(call("bash", command=f"printf 6 > count.txt && {plant}"))
    _, _, terminated, _, info = env.step(call("submit", answer="12"))
    assert info["outcome_reward"] == 1.0, info["verifier"]
    assert "hidden test passed" in info["verifier"]["checks"][0]["detail"]


def test_calls_after_submit_are_not_run(env: WorkspaceEnv) -> None:
    env.reset(seed=6)
    action = call("submit")
    action["tool_calls"].append({"id": "late", "type": "function", "function": {"name": "bash", "arguments": "{}"}})
    observation, _, terminated, _, _ = env.step(action)
    assert terminated and "not run: the task was submitted" in observation[1]["content"]


def test_each_episode_sandbox_ends_with_its_episode(env: WorkspaceEnv) -> None:
    env.reset(seed=1)
    first = sandbox_pids(env)
    env.reset(seed=2)  # a new task: the old workspace goes
    assert all_gone(first)
    second = sandbox_pids(env)
    env.step(call("submit"))  # submitted: gone after the verdict
    assert all_gone(second)
    env.reset(seed=3)
    third = sandbox_pids(env)
    env.close()
    assert all_gone(third)


def test_a_dead_sandbox_ends_the_episode_with_reward_zero(env: WorkspaceEnv) -> None:
    env.reset(seed=9)
    sandbox = env.handle.sandbox
    assert sandbox is not None and sandbox.pid is not None
    for server in psutil.Process(sandbox.pid).children(recursive=True):  # the agent cannot signal it: the host
        server.kill()
    observation, _, terminated, _, info = env.step(call("bash", command="true"))
    assert terminated and "workspace failed" in observation[0]["content"]
    assert info["outcome_reward"] == 0.0 and info["metrics"]["workspace_lost"] == 1.0


def test_output_and_time_stay_bounded_through_the_tools() -> None:
    env = WorkspaceEnv(
        tasks=toy_task, limits=WorkspaceLimits(timeout_s=1.0, max_output_bytes=1000), max_output_chars=1500
    )
    try:
        env.reset(seed=0)
        start = time.perf_counter()
        observation, *_ = env.step(call("bash", command="sleep 30"))
        assert time.perf_counter() - start < 4.0 and "did not finish within 1 s" in observation[0]["content"]
        observation, *_ = env.step(call("bash", command="yes | head -c 200000"))
        assert len(observation[0]["content"]) < 1200 and "[output truncated]" in observation[0]["content"]
    finally:
        env.close()


def test_registered_and_named_by_module(tmp_path: Path) -> None:
    env = agentgym.make("workspace", tasks="tests.envs.workspace.toy:toy_task", limits=LIMITS)
    try:
        messages, _ = env.reset(seed=8)
        assert "8 * 2" in messages[-1]["content"]
    finally:
        env.close()
    with pytest.raises(ValueError, match="tasks="):
        WorkspaceEnv()


def test_demos_replay_the_expert(tmp_path: Path) -> None:
    path = tmp_path / "demos.jsonl"
    stats = write_demos(
        "workspace", n=2, path=path, env_kwargs={"tasks": "tests.envs.workspace.toy:toy_task"}, progress=False
    )
    assert stats.written == 2 and stats.solved == 2
    demos = read_demos(path, env="workspace")
    assert demos[0]["messages"][2]["tool_calls"][0]["function"]["name"] == "read_file"
    assert demos[0]["outcome_reward"] == 1.0


def wait_for_spare(env: WorkspaceEnv, wait_s: float = 20.0) -> Any:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with env.spares._lock:
            if env.spares._ready:
                return env.spares._ready[0]
        time.sleep(0.02)
    raise AssertionError("no spare sandbox was started")


def test_spares_are_fresh_for_each_episode_and_die_with_the_env() -> None:
    env = WorkspaceEnv(tasks=toy_task, limits=LIMITS, spares=1)
    env.reset(seed=1)
    env.step(call("bash", command="echo leftover > left.txt"))
    spare = wait_for_spare(env)
    env.reset(seed=2)
    assert env.handle.sandbox is spare  # the reset took the spare that was started ahead
    observation, *_ = env.step(call("bash", command="ls"))
    assert "left.txt" not in observation[0]["content"] and "add.py" in observation[0]["content"]
    next_spare = wait_for_spare(env)
    pids = sandbox_pids(env) + [next_spare.pid, *(p.pid for p in psutil.Process(next_spare.pid).children(True))]
    env.close()
    assert all_gone(pids)


def test_without_spares_every_reset_starts_its_own_sandbox() -> None:
    env = WorkspaceEnv(tasks=toy_task, limits=LIMITS, spares=0)
    try:
        env.reset(seed=1)
        time.sleep(0.2)
        assert env.spares._ready == [] and env.handle.sandbox is not None and env.handle.sandbox.alive
    finally:
        env.close()
