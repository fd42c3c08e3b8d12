"""What an LLM judge reads and how its answer becomes scores.

A trajectory is shown to the judge as its *task* (the messages before the first reply: system and
user prompts), its *response* (every message from the first reply to the last, the env's and tools'
messages between replies included) and, where the task has one, its *reference* answer
(``ground_truth``, veRL's ``reward_model.ground_truth``, ``reference`` or ``answer`` in
``Trajectory.task``; env rollouts record the env's ``ground_truth``).

* **pointwise**: one trajectory per request; the judge ends with ``SCORE: <number>`` on the scale
  ``score_range`` (default 0..10), mapped to [0, 1]. The last such line counts.
* **group** (ART's RULER): the n trajectories of one task in one request, as ``<attempt id="k">``
  blocks; the judge answers JSON ``{"scores": [{"id": k, "explanation": ..., "score": s}, ...]}``
  with every ``s`` in [0, 1], one entry per attempt (``trajectory_id`` is read as ``id`` too).

An answer that does not follow the format (no score line, a number off the scale, JSON without an
entry for every attempt) is *unparsed*: ``parse_*`` return None and the caller decides (see
``agentgym.rewards.judge``). A template of one's own (``judge.prompt_template``, a file) is the user
message with these fields substituted: ``{task}``, ``{response}`` (pointwise) or ``{attempts}`` and
``{n}`` (group), ``{reference}`` (empty when there is none), ``{reference_block}`` (a "# Reference
answer" section, or nothing), ``{low}`` and ``{high}`` (pointwise scale). Other braces are kept as
written, so a template may show JSON.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from agentgym.types import Trajectory

SYSTEM = (
    "You are a careful, strict grader of an AI assistant's work. Judge only what the assistant did; "
    "follow the answer format you are given exactly."
)

POINTWISE = """Grade the assistant's response to the task below.

# Task
{task}

{reference_block}# Response
{response}

Decide whether the response does what the task asks and whether its final answer is right. Give a short \
reason, then end with one line of exactly this form:
SCORE: <a number from {low} to {high}, {high} being a fully correct response>"""

GROUP = """Below are {n} attempts by an AI assistant at the same task. Score each attempt between 0 and 1 \
relative to the others: a better attempt scores higher, a correct one close to 1, an attempt that fails \
the task close to 0. Attempts that are equally good get equal scores.

# Task
{task}

{reference_block}# Attempts
{attempts}

Answer with JSON only, one entry per attempt, in this form:
{{"scores": [{{"id": 1, "explanation": "<one sentence>", "score": <0 to 1>}}, ...]}}"""

_SCORE_LINE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_FIELDS = ("task", "response", "attempts", "n", "reference", "reference_block", "low", "high")


def fill(template: str, fields: dict[str, Any]) -> str:
    """``template`` with ``{name}`` replaced for the known fields only (other braces stay); ``{{``/``}}``
    in the built-in templates become single braces."""
    out = template.replace("{{", "\x00").replace("}}", "\x01")  # a substituted text keeps its own braces
    for name in _FIELDS:
        if name in fields:
            out = out.replace("{" + name + "}", str(fields[name]).replace("{", "\x02"))
    return out.replace("\x00", "{").replace("\x01", "}").replace("\x02", "{")


def reference(traj: Trajectory) -> str | None:
    """The task's reference answer, if it has one (see the module docstring)."""
    task = traj.task or {}
    for key in ("ground_truth", "reference"):
        if task.get(key) not in (None, ""):
            return str(task[key])
    nested = task.get("reward_model")
    if isinstance(nested, dict) and nested.get("ground_truth") not in (None, ""):
        return str(nested["ground_truth"])
    if task.get("answer") not in (None, ""):
        return str(task["answer"])
    return None


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    text = str(content or "")
    calls = message.get("tool_calls") or []
    if calls:
        text += "".join(f"\n[tool call] {json.dumps(c.get('function', c), ensure_ascii=False)}" for c in calls)
    return text


def split_trajectory(traj: Trajectory) -> tuple[str, str]:
    """(task, response) as the judge reads them."""
    messages = list(traj.messages)
    replies = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not replies:  # no messages recorded: the sampled text is all there is
        return "", "\n".join(t.response_text for t in traj.turns)
    task = "\n\n".join(f"[{m.get('role')}]\n{_message_text(m)}" for m in messages[: replies[0]])
    shown = messages[replies[0] : replies[-1] + 1]
    if len(replies) == 1:
        return task, _message_text(shown[0])
    return task, "\n\n".join(f"[{m.get('role')}]\n{_message_text(m)}" for m in shown)


def reference_fields(ref: str | None) -> dict[str, str]:
    return {"reference": ref or "", "reference_block": f"# Reference answer\n{ref}\n\n" if ref else ""}


def pointwise_messages(traj: Trajectory, template: str | None, low: float, high: float) -> list[dict[str, str]]:
    task, response = split_trajectory(traj)
    fields = {
        "task": task,
        "response": response,
        "low": f"{low:g}",
        "high": f"{high:g}",
        **reference_fields(reference(traj)),
    }
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": fill(template or POINTWISE, fields)}]


def group_messages(group: Sequence[Trajectory], template: str | None) -> list[dict[str, str]]:
    task = split_trajectory(group[0])[0]
    attempts = "\n\n".join(
        f'<attempt id="{k}">\n{split_trajectory(t)[1]}\n</attempt>' for k, t in enumerate(group, start=1)
    )
    fields = {"task": task, "attempts": attempts, "n": str(len(group)), **reference_fields(reference(group[0]))}
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": fill(template or GROUP, fields)}]


def parse_pointwise(answer: str, low: float, high: float) -> float | None:
    """The last ``SCORE: x`` of the answer mapped from [low, high] to [0, 1]; None when there is none
    or it is off the scale."""
    found = _SCORE_LINE.findall(answer or "")
    if not found:
        return None
    value = float(found[-1])
    if not math.isfinite(value) or not low <= value <= high or high <= low:
        return None
    return (value - low) / (high - low)


def parse_group(answer: str, n: int) -> list[float] | None:
    """One score in [0, 1] per attempt (in attempt order), from the answer's JSON; None unless every
    attempt 1..n has exactly one valid score."""
    text = answer or ""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        data = json.loads(text[start : end + 1])
    except ValueError:
        return None
    entries = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    scores: dict[int, float] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        key = entry.get("id", entry.get("trajectory_id"))
        try:
            k, value = int(key), float(entry.get("score"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        if k in scores or not 1 <= k <= n or not math.isfinite(value) or not 0.0 <= value <= 1.0:
            return None
        scores[k] = value
    if len(scores) != n:
        return None
    return [scores[k] for k in range(1, n + 1)]
