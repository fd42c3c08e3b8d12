"""``agentgym train --agent`` with the black-box agents of examples/ that speak the Anthropic Messages API
and the OpenAI Responses API, and one that keeps only its last exchanges: each trains for two steps on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train_two_steps(tmp_path: Path, agent: str, rows: list[dict], *overrides: str) -> list[dict]:
    """``agentgym train --agent <agent>`` for two GRPO steps of 2 tasks x 2 sessions on ``rows``, in a
    subprocess from the repository root; asserts it exits 0 after steps 1 and 2, and returns the trained
    samples of ``samples.jsonl``."""
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "agentgym.cli", "train", "--agent", agent]
    command += [f"data.train_files={tmp_path / 'train.jsonl'}", "data.train_batch_size=2", "data.val_batch_size=2"]
    command += ["actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=2", "trainer.use_ray=false"]
    command += [f"trainer.default_local_dir={out}", *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if s.get("split") != "val" and "reward/mean" in s] == [1, 2]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return [s for s in samples if s["split"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["examples.anthropic_agent:run", "examples.agents_sdk_responses:run"])
def test_agentgym_train_runs_the_example_agent(tmp_path, agent):
    """``agentgym train --agent <example>``: two GRPO steps on the CPU, the agent's Messages (anthropic
    client) or Responses (Agents SDK's default model) calls recorded through the gateway as the
    trajectories trained on."""
    rows = [{"question": f"What is {i} * 3 + {i}?", "answer": f"so #### {4 * i}"} for i in range(1, 5)]
    # the anthropic example's plain-text answers
    overrides = ["actor_rollout_ref.rollout.max_tokens_per_turn=32"] if "anthropic" in agent else []
    trained = train_two_steps(tmp_path, agent, rows, *overrides)
    assert trained and all(s["messages"][0]["content"].startswith("You solve grade-school maths") for s in trained)
    assert all(sum(len(t["response_ids"]) for t in s["turns"]) > 0 for s in trained)


@pytest.mark.slow
def test_agentgym_train_runs_the_windowed_example_agent(tmp_path):
    """``examples/windowed_agent.py`` keeps only its last exchanges, so no request extends the one before:
    each session still trains as one episode of all its turns (later ones starting a context of their
    own), with no template mismatch."""
    from examples.windowed_agent import TURNS, WINDOW

    # a number the game never accepts (it asks for 1-100), so every session plays every turn
    rows = [{"question": "Guess my number.", "answer": f"#### {101 + i}"} for i in range(4)]
    trained = train_two_steps(
        tmp_path, "examples.windowed_agent:run", rows, "actor_rollout_ref.rollout.max_tokens_per_turn=8"
    )
    assert trained and all(len(s["turns"]) == TURNS for s in trained)  # one episode per session, every turn
    assert all(s["metrics"]["joined_branches"] > 1 and s["metrics"]["template_mismatch"] == 0 for s in trained)
    assert all(any(t["new_context"] for t in s["turns"][WINDOW + 1 :]) for s in trained)  # old turns dropped
