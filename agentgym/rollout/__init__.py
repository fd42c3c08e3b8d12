"""Rollouts: the async multi-turn runner, chat-template token deltas, trajectory storage, metrics.

The trainer's entry point::

    from agentgym.rollout import RolloutConfig, RolloutRunner
    runner = RolloutRunner("sokoban", client, tokenizer="tiny", config=RolloutConfig(n=8))
    result = await runner.run(tasks=16)      # RolloutResult: .trajectories, .metrics, .trainable()
"""

from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.metrics import format_metrics, pass_at_k, summarize
from agentgym.rollout.runner import RolloutConfig, RolloutResult, RolloutRunner, Task, make_tasks
from agentgym.rollout.storage import TrajectoryWriter, read_trajectories, write_trajectories

__all__ = [
    "ChatTokenizer",
    "RolloutConfig",
    "RolloutResult",
    "RolloutRunner",
    "Task",
    "TrajectoryWriter",
    "format_metrics",
    "make_tasks",
    "pass_at_k",
    "read_trajectories",
    "summarize",
    "write_trajectories",
]
