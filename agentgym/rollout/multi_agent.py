"""Multi-agent envs: one game, a token-exact trajectory per seat (self-play).

The protocol (a TextEnv with an ``agents`` attribute, e.g. ``["player_0", "player_1"]``):

* ``reset(seed, options) -> (messages, info)``: ``info["agent"]`` is the seat to act first and
  ``messages`` are that seat's opening messages.
* ``step(action) -> (messages, reward, terminated, truncated, info)``: ``action`` is the reply of
  the seat that was to act and ``reward`` is that seat's turn reward; ``info["agent"]`` is the
  next seat to act and ``messages`` are the new messages *for that seat* since it last acted
  (its opening messages if it has not acted yet). On the final step
  ``info["outcome_rewards"]`` maps each seat to its outcome reward (``info["successes"]``,
  optional, to its success; default: outcome > 0).

Every seat is the same policy: each keeps its own conversation and token sequence (its
prompt, its sampled tokens, the env's messages to it as deltas), sampled under its own session
id, so each seat's trajectory is exactly what the server saw for that seat. A seat's
trajectory goes in group ``{group_id}/{agent}``: the ``n`` games of a task give each seat a
group of ``n`` (GRPO compares a seat with itself). A seat that never acted gives no
trajectory. The limits of ``RolloutConfig`` apply per seat; one seat reaching a limit ends the
game as truncated for both. An env or server failure fails the game: every seat's trajectory.

The runner plays the game with its one episode loop (``RolloutRunner._play``, a seat per agent);
this module holds what is particular to the protocol: who acts next and what each seat got.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def next_agent(info: dict[str, Any], agents: Sequence[str]) -> str:
    """The seat the env named to act (``info["agent"]``)."""
    agent = str(info.get("agent"))
    if agent not in agents:
        raise RuntimeError(f"the env named seat {info.get('agent')!r} to act; its agents are {list(agents)}")
    return agent


def seat_results(info: dict[str, Any], agents: Sequence[str]) -> dict[str, tuple[float, dict[str, Any]]]:
    """Each seat's outcome reward and the info its trajectory is finished with (its success, when
    the env gave one, and the game's metrics), from the final step's ``info``."""
    outcomes = info.get("outcome_rewards") or {}
    successes = info.get("successes") or {}
    return {
        name: (
            float(outcomes.get(name, 0.0) or 0.0),
            {**({"success": successes[name]} if name in successes else {}), "metrics": info.get("metrics") or {}},
        )
        for name in agents
    }
