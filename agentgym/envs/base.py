"""``TextEnv``: a Gymnasium env whose observations are chat messages and whose action is a reply.

The contract:

* ``reset(seed=None, options=None) -> (messages, info)`` — the opening messages (system/user
  prompt). ``info["tools"]`` holds OpenAI tool schemas when the env offers tools.
* ``step(action) -> (messages, reward, terminated, truncated, info)`` — ``action`` is the
  assistant's reply (text, or a message dict that may carry ``tool_calls``); ``messages``
  are only the *new* messages since the last step (env feedback, tool results).
  ``reward`` is the turn-level reward. ``terminated`` means the task reached an end state
  (solved, answered, failed for good); ``truncated`` means a limit cut it short (step budget).
* On the final step ``info`` carries ``outcome_reward`` (trajectory-level reward, kept apart
  from turn rewards), ``success`` and ``metrics`` (env-specific counters).
* Optional, the expert: ``expert_action() -> Action | None`` — the reply an expert would give
  in the current state (None: it has none here, e.g. the episode is over). An env that
  overrides it can demonstrate (``has_expert``); ``agentgym demos`` plays the expert through
  ``reset``/``step`` and saves the episodes as chat messages for supervised warm starts.
"""

from __future__ import annotations

import random
import string
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from agentgym.types import Action, Message

ROLES = ("system", "user", "assistant", "tool")


class MessagesSpace(spaces.Space):
    """A list of OpenAI chat messages (dicts with a ``role`` and ``content``)."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        rng = self.np_random
        text = "".join(rng.choice(list(string.ascii_letters + " ")) for _ in range(int(rng.integers(1, 40))))
        return [{"role": "user", "content": text}]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(is_message(m) for m in x)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MessagesSpace)

    def __repr__(self) -> str:
        return "MessagesSpace()"


class ReplySpace(spaces.Space):
    """The assistant's reply: a string, or a message dict (``content`` and/or ``tool_calls``)."""

    def __init__(self, max_length: int = 1 << 20, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_length = max_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        rng = self.np_random
        alphabet = list(string.printable)
        return "".join(rng.choice(alphabet) for _ in range(int(rng.integers(0, 64))))

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return len(x) <= self.max_length
        return (
            isinstance(x, dict)
            and x.get("role", "assistant") == "assistant"
            and (isinstance(x.get("content"), (str, type(None))) or "tool_calls" in x)
        )

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ReplySpace)

    def __repr__(self) -> str:
        return "ReplySpace()"


def is_message(m: Any) -> bool:
    return (
        isinstance(m, dict)
        and m.get("role") in ROLES
        and (isinstance(m.get("content"), (str, type(None))) or "tool_calls" in m)
    )


def reply_text(action: Action) -> str:
    """The text of an assistant reply, whether it came as a string or a message dict."""
    if isinstance(action, str):
        return action
    if isinstance(action, dict):
        content = action.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # OpenAI content parts; a part whose text is not a string is no text
            return "".join(t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str))
    return ""


SUMMARY_CHARS = 400  # default_summary quotes at most this much of the last dropped env message


def default_summary(history: list[Message]) -> str:
    """The summary of dropped turns for envs without a rule of their own (``TextEnv.summarize``): how many
    turns are not shown and the env's last message among them (cut to ``SUMMARY_CHARS``), so its length
    stays bounded however long the episode."""
    turns = sum(1 for m in history if m.get("role") == "assistant")
    last = next((m for m in reversed(history) if m.get("role") in ("user", "tool")), None)
    text = f"{turns} earlier turn{'s' if turns != 1 else ''} not shown."
    content = last.get("content") if last is not None else None
    if isinstance(content, str) and content:
        text += f" The last of them ended with:\n{content[-SUMMARY_CHARS:]}"
    return text


class TextEnv(gym.Env):
    """Base class for agentgym environments. Subclasses implement ``reset`` and ``step``.

    Class attributes a subclass may set:
    ``max_turns`` — default turn budget a runner applies (None: the env ends itself);
    ``tools`` — OpenAI tool schemas offered to the model (also returned in ``info["tools"]``).
    Dataset-backed envs implement ``num_tasks()`` and pick a row with ``options={"index": i}``.
    Envs that can demonstrate implement ``expert_action()`` (see its docstring).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    max_turns: int | None = None
    tools: ClassVar[list[dict[str, Any]]] = []

    observation_space = MessagesSpace()
    action_space = ReplySpace()

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.spec_name: str = type(self).__name__

    def num_tasks(self) -> int | None:
        """How many distinct tasks the env holds (dataset rows), or None if generated from seeds."""
        return None

    def task_rng(self) -> random.Random:
        """A fast stdlib RNG drawn from Gymnasium's ``np_random`` (call after ``super().reset(seed=seed)``)."""
        return random.Random(int(self.np_random.integers(0, 2**63 - 1)))

    def render(self) -> str | None:  # pragma: no cover - subclasses override
        return None

    def expert_action(self) -> Action | None:
        """The expert's reply in the current state (after ``reset`` or a ``step``): an action
        ``step`` accepts, exactly what a model should have answered (it becomes the assistant
        message of a demonstration). None when the expert has no reply here (the episode is
        over, or the state can no longer be solved). Envs without an expert leave this alone:
        it raises ``NoExpertError``."""
        raise NoExpertError(f"{type(self).__name__} has no expert (it does not implement expert_action())")

    def summarize(self, history: list[Message]) -> str:
        """The summary of earlier turns a ``compact`` context policy shows in place of them
        (``agentgym.rollout.context``): ``history`` is the dropped turns' messages (the model's replies
        and the env's answers). A function of the messages only (it runs on an env instance of its own,
        not the episode's). The default says how many turns are left out and quotes the env's last
        message among them; envs override it with what matters in their task."""
        return default_summary(history)

    # Optional, the floor of a learning table: ``random_action(rng) -> Action``, a reply drawn
    # uniformly from the env's valid answers (Sokoban: random moves). Envs without a meaningful
    # one leave it out; the held-out evaluation then shows no random-policy row.


class NoExpertError(NotImplementedError):
    """The env cannot demonstrate: it does not implement ``TextEnv.expert_action``."""


def has_expert(env: Any) -> bool | None:
    """Whether an env (an instance or a class) implements ``expert_action``; None for anything
    else (a factory function: only building the env tells)."""
    if isinstance(env, gym.Env):
        env = type(env.unwrapped)
    if not isinstance(env, type):
        return None
    method = getattr(env, "expert_action", None)
    return method is not None and method is not TextEnv.expert_action
