"""One episode from a session's chain of branches: agents that rewrite their own context.

An agent that keeps a history window (drops its oldest turns) or replaces old turns by a summary
sends requests that no recorded branch extends: the gateway starts a new branch for each (a fresh
one, or a fork at the last reply it still shows; ``agentgym.gateway.sessions``). The session then
finishes as a *chain*: branches whose turns follow one another in time (``first_reply`` of each
after ``last_reply`` of the one before). As separate trajectories the chain would train badly: the
posted reward lands on the last branch only, and each branch would count as an episode of its own
in the task's group.

``join_chain`` makes the chain one trajectory again: every branch's turns in order, the first turn
of each later branch marked ``Turn.new_context`` (its ``prompt_ids`` already hold the whole context
the gateway rendered and sent), turn rewards where they were posted, the outcome the sum of the
branches' posted rewards plus the reward function's score on the last branch (the one the agent
ended on). The trainer trains it as per-turn samples (``agentgym.trainer.batch``), each turn with
exactly the tokens the server saw and sampled, all with the episode's advantage.

Branches that interleave (``n > 1`` samples, an agent that goes back to an earlier branch) are
alternatives, not a chain: they stay separate trajectories, as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agentgym.types import Trajectory, Turn


def is_chain(branches: Sequence[Trajectory]) -> bool:
    """Whether a session's branches follow one another in time (each starts after the last ended)."""
    if len(branches) < 2 or any("first_reply" not in t.metrics for t in branches):
        return False
    ordered = sorted(branches, key=lambda t: t.metrics["first_reply"])
    return all(b.metrics["first_reply"] > a.metrics["last_reply"] for a, b in zip(ordered, ordered[1:]))


def join_chain(branches: Sequence[Trajectory]) -> Trajectory:
    """The session's chain of branches as one episode (see the module docstring)."""
    ordered = sorted(branches, key=lambda t: t.metrics["first_reply"])
    turns: list[Turn] = []
    for b in ordered:
        for k, turn in enumerate(b.turns):
            turns.append(dataclasses.replace(turn, new_context=bool(turns) and k == 0 or turn.new_context))
    last = ordered[-1]
    failed = next((b for b in ordered if b.status == "failed"), None)
    outcome = sum(b.metrics.get("posted_reward", 0.0) for b in ordered) + last.metrics.get("reward_fn_score", 0.0)
    metrics = dict(last.metrics)
    sampled = sum(len(t.response_ids) for t in turns)
    metrics.update(
        joined_branches=float(len(ordered)),
        turns=float(len(turns)),
        sampled_tokens=float(sampled),
        tokens=float(sampled + sum(len(t.prompt_ids) for t in turns)),
        template_mismatch=max(b.metrics.get("template_mismatch", 0.0) for b in ordered),
        posted_reward=sum(b.metrics.get("posted_reward", 0.0) for b in ordered),
    )
    joined = dataclasses.replace(
        last,
        turns=turns,
        outcome_reward=outcome,
        status=failed.status if failed else last.status,
        failure=failed.failure if failed else last.failure,
        messages=list(last.messages),
        metrics=metrics,
        task={**last.task, "branch": [b.task.get("branch") for b in ordered]},
    )
    joined.metrics["success"] = float(joined.success)
    return joined


def join_session(trajectories: list[Trajectory]) -> list[Trajectory]:
    """A session's trajectories with a chain of branches joined into one episode; anything else as it was."""
    return [join_chain(trajectories)] if is_chain(trajectories) else trajectories
