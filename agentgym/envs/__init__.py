"""Text environments: the TextEnv base, built-in envs, tools and rewards."""

from agentgym.envs.base import MessagesSpace, ReplySpace, TextEnv, reply_text

__all__ = ["MessagesSpace", "ReplySpace", "TextEnv", "reply_text"]
