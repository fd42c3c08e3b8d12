"""Batch metrics over trajectories: success rate, rewards, pass@k, lengths, failures.

Every episode counts, failed ones included (a failed episode is not a success and its
reward is what it earned before failing); ``failed`` says how many there were.
``pass@k`` is the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021) per
task (``group_id``: n episodes, c successes), averaged over tasks, for k = 1, 2, 4, ... up
to the smallest group size. Each metric also appears per data source as
``{data_source}/{metric}`` (veRL reports validation metrics per data source the same way).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from agentgym.types import Message, Trajectory

EPISODE_KEYS = frozenset({"outcome_reward", "success", "metrics", "tools", "state_key", "data_source"})
"""Step ``info`` keys about the episode, not the turn: left out of a turn's facts."""


def state_key(info: dict[str, Any], observation: Sequence[Message]) -> str:
    """The state the next reply answers: the env's ``info["state_key"]`` when it names one (Sokoban's
    board), else a hash of the observation messages' text (two equal observations, one state)."""
    key = info.get("state_key")
    if isinstance(key, str) and key:
        return key
    text = json.dumps(
        [m.get("content") if isinstance(m, dict) else str(m) for m in observation], ensure_ascii=False, default=str
    )
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def turn_facts(info: dict[str, Any], finish_reason: str) -> dict[str, float]:
    """One turn's facts for ``Turn.metrics``: the numbers and flags of the env's step ``info`` (its
    episode-level keys aside) and ``cut``, 1.0 when the reply stopped at the token cap."""
    facts = {k: float(v) for k, v in info.items() if k not in EPISODE_KEYS and isinstance(v, (bool, int, float))}
    facts["cut"] = float(finish_reason == "length")
    return facts


def per_turn_metrics(trajectories: Sequence[Trajectory], prefix: str = "") -> dict[str, float]:
    """``turn{k}/...`` for each turn number k: the share of episodes that reached it, its reply length,
    the mean of each fact in ``Turn.metrics`` and, for envs that say whether a reply was well formed,
    ``turn{k}/malformed``: the share of replies that were not, or were cut at the token cap. Episodes
    cut at the turn limit count like any other: every turn they played is here."""
    trajs = [t for t in trajectories if t.status != "failed"]
    if not trajs:
        return {}
    out: dict[str, float] = {}
    for k in range(1, max(len(t.turns) for t in trajs) + 1):
        turns = [t.turns[k - 1] for t in trajs if len(t.turns) >= k]
        name = f"{prefix}turn{k}/"
        out[name + "reached"] = len(turns) / len(trajs)
        out[name + "reply_tokens"] = _mean([float(len(t.response_ids)) for t in turns])
        for key in sorted({key for t in turns for key in t.metrics}):
            out[name + key] = _mean([t.metrics.get(key, 0.0) for t in turns])
        if any("well_formed" in t.metrics for t in turns):
            out[name + "malformed"] = _mean(
                [float(not t.metrics.get("well_formed", 0.0) or t.metrics.get("cut", 0.0)) for t in turns]
            )
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: n samples, c correct: ``1 - C(n-c, k) / C(n, k)``."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    miss = 1.0  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i), computed stably
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def default_ks(n: int) -> list[int]:
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    if ks[-1] != n:
        ks.append(n)
    return ks


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _summary(trajs: list[Trajectory], ks: Sequence[int] | None) -> dict[str, float]:
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    n_min = min((len(g) for g in groups.values()), default=0)
    out = {
        "episodes": float(len(trajs)),
        "failed": float(sum(t.status == "failed" for t in trajs)),
        "truncated": float(sum(t.status == "truncated" for t in trajs)),
        "success_rate": _mean([float(t.success) for t in trajs]),
        "reward/mean": _mean([t.total_reward for t in trajs]),
        "outcome_reward/mean": _mean([t.outcome_reward for t in trajs]),
        "turns/mean": _mean([float(t.num_turns) for t in trajs]),
        "sampled_tokens/mean": _mean([t.metrics.get("sampled_tokens", 0.0) for t in trajs]),
        "tokens/mean": _mean([t.metrics.get("tokens", 0.0) for t in trajs]),
        "template_mismatch": float(sum(t.metrics.get("template_mismatch", 0.0) > 0 for t in trajs)),
    }
    for k in ks if ks is not None else default_ks(n_min):
        if 0 < k <= n_min:
            out[f"pass@{k}"] = _mean([pass_at_k(len(g), sum(t.success for t in g), k) for g in groups.values()])
    return out


def summarize(trajectories: Iterable[Trajectory], ks: Sequence[int] | None = None) -> dict[str, float]:
    """Flat metrics for a batch, plus ``{data_source}/...`` for each data source."""
    trajs = list(trajectories)
    out = _summary(trajs, ks)
    by_source: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_source.setdefault(t.data_source or t.env_id or "unknown", []).append(t)
    for source, group in sorted(by_source.items()):
        for key, value in _summary(group, ks).items():
            out[f"{source}/{key}"] = value
    return out


def format_metrics(metrics: dict[str, float]) -> str:
    """A two-column table: overall metrics first, then per data source."""
    overall = {
        k: v
        for k, v in metrics.items()
        if "/" not in k
        or k.split("/")[0] in ("reward", "outcome_reward", "turns", "sampled_tokens", "tokens", "time", "throughput")
    }
    rest = {k: v for k, v in metrics.items() if k not in overall}
    width = max((len(k) for k in metrics), default=10)
    lines = []
    for block in (overall, rest):
        if lines and block:
            lines.append("")
        for key, value in block.items():
            text = f"{int(value)}" if float(value).is_integer() and abs(value) < 1e12 else f"{value:.4f}"
            lines.append(f"{key:<{width}}  {text}")
    return "\n".join(lines)


def format_eval_table(metrics: dict[str, float]) -> str:
    """One row per data source (then ``all``): episodes, success, reward, pass@k, turns, tokens, failed."""
    sources = sorted(k[: -len("/episodes")] for k in metrics if k.endswith("/episodes"))
    ks = sorted(int(k[len("pass@") :]) for k in metrics if k.startswith("pass@"))
    columns = [("episodes", "episodes", "d"), ("success", "success_rate", ".3f"), ("reward", "reward/mean", ".3f")]
    columns += [(f"pass@{k}", f"pass@{k}", ".3f") for k in ks]
    columns += [
        ("turns", "turns/mean", ".2f"),
        ("sampled", "sampled_tokens/mean", ".1f"),
        ("tokens", "tokens/mean", ".1f"),
        ("failed", "failed", "d"),
        ("truncated", "truncated", "d"),
    ]
    rows = [(source, f"{source}/") for source in sources]
    if len(sources) != 1:
        rows.append(("all", ""))
    width = max([len("data source")] + [len(name) for name, _ in rows])
    lines = [f"{'data source':<{width}}  " + "  ".join(f"{title:>9}" for title, _, _ in columns)]
    for name, prefix in rows:
        cells = []
        for _, key, fmt in columns:
            value = metrics.get(prefix + key, 0.0)
            cells.append(f"{int(value):>9d}" if fmt == "d" else f"{value:>9{fmt}}")
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)
