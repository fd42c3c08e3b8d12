"""``BaseInteraction``: the simulated other side of a multi-turn conversation, veRL's signatures.

An interaction is given a dataset row's ``extra_info.interaction_kwargs`` and, after each model
turn, the whole conversation so far; it answers with feedback text, a turn score and whether
the conversation should end. The method names, arguments and return tuple are veRL's
(``verl/interactions/base.py``), so an interaction class written for veRL runs here unchanged
(it need not subclass this class: only the method names and shapes matter).

Lifecycle, per episode (``instance_id`` identifies the episode)::

    instance_id = await start_interaction(instance_id, **interaction_kwargs)
    # after every model turn:
    should_terminate, text, turn_score, extra = await generate_response(instance_id, messages, **interaction_kwargs)
    score = await calculate_score(instance_id)      # the episode's outcome
    await finalize_interaction(instance_id)          # free per-episode state
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4


class BaseInteraction:
    """Default behaviour of every hook; subclass and override ``generate_response`` at least."""

    def __init__(self, config: dict[str, Any]) -> None:
        """``config`` is the ``config:`` mapping of this interaction's YAML entry (plus ``name``)."""
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Open an episode; ``kwargs`` are the row's ``interaction_kwargs``. Returns its instance id
        (the one given, or a new uuid)."""
        return instance_id if instance_id is not None else str(uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """React to the conversation so far (``messages``, OpenAI format, ending with the model's turn).

        Returns ``(should_terminate_sequence, response_content, current_turn_score, additional_data)``:
        end the episode or not, the text sent back as the next user message, this turn's score,
        and any extra information (reported in the env's ``info``).
        """
        return False, "", 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """The episode's score (used as the outcome reward when the episode ends)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Release whatever ``start_interaction`` kept for this episode."""
        return None
