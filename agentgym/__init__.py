"""agentgym: an environment-first agentic RL gym.

import agentgym
env = agentgym.make("sokoban")
messages, info = env.reset(seed=0)
"""

from agentgym.registry import EnvSpec, env_spec, make, register, registered
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
]
