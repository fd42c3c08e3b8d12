"""agentgym: an environment-first agentic RL gym.

import agentgym
env = agentgym.make("sokoban")
messages, info = env.reset(seed=0)
result = agentgym.train(env="sokoban")  # `agentgym train --env sokoban`; returns the run's summary
"""

from agentgym.registry import EnvSpec, env_spec, make, register, registered
from agentgym.stages.train_api import train
from agentgym.types import Message, ToolCall, Trajectory, Turn

__version__ = "0.1.0"

__all__ = [
    "EnvSpec",
    "Message",
    "ToolCall",
    "Trajectory",
    "Turn",
    "env_spec",
    "make",
    "register",
    "registered",
    "train",
]
