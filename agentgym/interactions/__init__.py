"""Interactions: veRL-compatible simulated users that give feedback between model turns.

``BaseInteraction`` has veRL's async signatures; ``load_interactions(path)`` reads veRL's
interaction YAML; ``agentgym.interactions.env.InteractionEnv`` turns (dataset row,
interaction) into a multi-turn ``TextEnv``.
"""

from agentgym.interactions.base import BaseInteraction
from agentgym.interactions.config import (
    InteractionConfigError,
    build_interactions,
    interaction_class,
    load_interactions,
)

__all__ = ["BaseInteraction", "InteractionConfigError", "build_interactions", "interaction_class", "load_interactions"]
