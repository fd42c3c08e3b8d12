"""Context policies: what each turn's prompt holds in a long env episode (docs/long_horizon.md).

``actor_rollout_ref.rollout.multi_turn.context_policy`` (``RolloutConfig.context_policy``):

* ``full`` (default): the whole history. Each turn's prompt is the previous turn's plus the reply
  and the env's new messages, so a trajectory is one growing token sequence.
* ``window``: the *task* (the messages ``reset`` returned: system and first user message) and the
  last ``context_window`` turns (each turn: the model's reply and the env's messages after it). While
  the history fits, prompts grow as with ``full``; from then on every turn's prompt is rendered afresh
  from those messages and is not a prefix of the next one.
* ``compact``: as ``window``, with a user message after the task that summarises the turns left out,
  written by the env's rule ``summarize(history) -> str`` (``TextEnv.summarize``; ``default_summary``
  for envs without one).

A turn whose prompt is rendered afresh is recorded with ``Turn.new_context`` and its whole prompt in
``prompt_ids``: the tokens sent to the server, exactly. The trainer then trains it as a sample of its
own (``trainer.step_wise_training``; see ``agentgym.trainer.batch``). The model's earlier replies inside
a windowed prompt are rendered from their sampled text (they are read, never trained on there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentgym.envs.base import default_summary
from agentgym.types import Message

CONTEXT_POLICIES = ("full", "window", "compact")

Summarizer = Callable[[list[Message]], str]


def check_policy(policy: str, window: int) -> None:
    """Raise a clear error for an unknown policy or a window that keeps no turn."""
    if policy not in CONTEXT_POLICIES:
        raise ValueError(
            f"multi_turn.context_policy={policy!r} is not one of {', '.join(CONTEXT_POLICIES)} (docs/long_horizon.md)"
        )
    if policy != "full" and window < 1:
        raise ValueError(
            f"multi_turn.context_window={window}: a {policy} context keeps at least the last turn (the env's latest "
            f"message is in it); set it to 1 or more"
        )


@dataclass
class History:
    """One seat's conversation split the way context policies cut it: the task (what ``reset`` said)
    and one block per turn (the model's reply as sampled text, then the env's messages after it)."""

    task: list[Message] = field(default_factory=list)
    turns: list[list[Message]] = field(default_factory=list)

    def reply(self, reply: str | Message) -> None:
        """The model's reply: its sampled text (the runner), or a whole assistant message (demonstrations)."""
        self.turns.append([{"role": "assistant", "content": reply} if isinstance(reply, str) else dict(reply)])

    def observe(self, messages: Sequence[Message]) -> None:
        if self.turns:
            self.turns[-1].extend(messages)
        else:
            self.task.extend(messages)

    def dropped(self, window: int) -> int:
        """How many of the oldest turns a window of ``window`` turns leaves out."""
        return max(0, len(self.turns) - window)

    def prompt(self, policy: str, window: int, summarize: Summarizer | None = None) -> list[Message] | None:
        """The messages of the next prompt under ``policy``; None while the whole history is kept (then the
        prompt extends the previous one)."""
        drop = self.dropped(window) if policy != "full" else 0
        if not drop:
            return None
        kept = [m for turn in self.turns[drop:] for m in turn]
        if policy == "window":
            return list(self.task) + kept
        old = [m for turn in self.turns[:drop] for m in turn]
        summary = (summarize or default_summary)(old)
        return list(self.task) + [{"role": "user", "content": f"Summary of the earlier turns:\n{summary}"}] + kept
