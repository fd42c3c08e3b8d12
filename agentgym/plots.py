"""Training curves as one PNG: ``agentgym plot RUN_DIR [-m METRIC ...] -o curves.png``.

Reads ``<run dir>/metrics.jsonl`` (one JSON object per step, written by the trainer and by
``agentgym sft``) and draws one panel per quantity, training as a line and validation
(``val/<metric>``) as dots on the same axes, against the step. Without ``-m`` the panels are
the ones a person looks at first, each drawn only when the run logged it: reward, success,
episode length, KL, entropy, staleness (async runs and weight-version lag), the groups with no signal
(the share trained on and, with dynamic sampling, the share sampled before the filter), what long episodes cost
(tokens processed per episode, the last turn's prompt: docs/long_horizon.md), time per step, and the
SFT loss.
``agentgym train`` writes ``curves.png`` into the run directory at every validation and at
the end of every run. matplotlib (the ``plot`` extra) draws off-screen (Agg backend).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (title, training keys tried in order, y label). A panel shows the first key the run logged,
# and its ``val/`` twin when there is one; a key with ``*`` (``turn*/malformed``) draws one line
# per turn number in one panel.
DEFAULT_PANELS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("reward", ("reward/mean",), "mean episode reward"),
    ("success", ("success_rate",), "success rate"),
    ("episode length", ("turns/mean", "response_length/mean"), "turns"),
    ("KL", ("actor/kl_loss", "actor/ppo_kl"), "KL"),
    ("entropy", ("actor/entropy", "actor/entropy_before_update"), "entropy"),
    ("staleness", ("async/version_lag/mean", "rollout/weight_version_lag"), "weight versions behind"),
    ("groups with no signal", ("batch/zero_variance_group_frac", "sampling/flat_group_frac"), "share of groups"),
    ("malformed replies by turn", ("turn*/malformed",), "share of replies"),
    ("reply length by turn", ("turn*/reply_tokens",), "tokens"),
    ("tokens per episode", ("context/processed_tokens",), "prompt + reply tokens, all turns"),
    ("last turn's prompt", ("context/last_turn_tokens",), "tokens"),
    ("time per step", ("timing_s/step",), "seconds"),
    ("SFT loss", ("sft/loss",), "loss per assistant token"),
    ("learning rate", ("sft/lr",), "lr"),
)

# a panel's second series, drawn beside its key when the run logged it, with the labels of both: with dynamic
# sampling (``algorithm.filter_groups``) the share of flat groups among those sampled (before the filter
# dropped them) is not the share among those trained on (``batch/zero_variance_group_frac``, 0 when the filter
# works)
COMPANIONS: dict[str, tuple[str, str, str]] = {
    "batch/zero_variance_group_frac": ("sampling/flat_group_frac", "trained on", "sampled, before the filter"),
}

# logged as 0 throughout when the feature is off (no KL loss; one update per batch has no PPO KL;
# a synchronous run has no lag): the panel moves to the next key, or is left out
OFF_WHEN_ZERO = frozenset({"actor/kl_loss", "actor/ppo_kl", "async/version_lag/mean", "rollout/weight_version_lag"})


class PlotError(ValueError):
    """Nothing to plot, or matplotlib missing; the message says what to do."""


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's metrics, one dict per step in step order; a step logged twice (a resumed run)
    keeps its last line, and an unreadable line (a run killed mid-write) is skipped."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise PlotError(
            f"no metrics at {path}: pass a run directory that holds metrics.jsonl "
            f"(trainer.default_local_dir of a run with the jsonl logger)"
        )
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
            by_step[int(row["step"])] = {**by_step.get(int(row["step"]), {}), **row}
    return [by_step[s] for s in sorted(by_step)]


def series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the rows that logged a finite number for it."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(int(row["step"]))
            values.append(float(value))
    return steps, values


def choose_panels(rows: Sequence[dict[str, Any]], metrics: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """``(title, training key, y label)`` per panel: ``metrics`` as given (a ``val/`` name or a
    training name, either way paired with its twin), else the default panels the run logged."""
    logged = {k for row in rows for k in row}
    if metrics:
        panels = []
        for name in metrics:
            base = name[4:] if name.startswith("val/") else name
            if base not in logged and f"val/{base}" not in logged:
                known = sorted(k for k in logged if k != "step")
                import difflib

                close = difflib.get_close_matches(base, known, n=3)
                hint = f" Did you mean {', '.join(close)}?" if close else ""
                raise PlotError(f"the run logged no metric {name!r}.{hint}")
            panels.append((base, base, base))
        return panels
    panels = []
    for title, keys, label in DEFAULT_PANELS:
        for key in keys:
            if "*" in key:
                if expand(key, logged):
                    panels.append((title, key, label))
                    break
                continue
            if key in OFF_WHEN_ZERO and not any(v != 0 for k in (key, f"val/{key}") for v in series(rows, k)[1]):
                continue
            if key in logged or f"val/{key}" in logged:
                panels.append((title, key, label))
                break
    if not panels:
        raise PlotError(
            "the run logged none of the usual metrics yet (reward, success, loss); name some with -m METRIC"
        )
    return panels


def expand(pattern: str, logged: set[str] | Sequence[str]) -> list[str]:
    """The logged training keys matching ``turn*/malformed`` (any turn number), in turn order."""
    head, tail = pattern.split("*", 1)
    found = [
        k for k in logged if k.startswith(head) and k.endswith(tail) and k[len(head) : len(k) - len(tail)].isdigit()
    ]
    return sorted(found, key=lambda k: int(k[len(head) : len(k) - len(tail)]))


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotError("agentgym plot needs matplotlib: pip install 'agentgym[plot]' (or matplotlib)") from exc
    return plt


SMOOTH_FROM = 20
"""From this many steps on, the train series also gets a trailing mean (the raw line stays, faint)."""


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def figure(rows: Sequence[dict[str, Any]], panels: Sequence[tuple[str, str, str]], title: str = "") -> Any:
    """A matplotlib figure with one axes per panel: ``train`` line, ``validation`` dots."""
    plt = _pyplot()
    columns = min(3, len(panels))
    lines = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.6 * columns, 3.2 * lines), squeeze=False)
    logged = {k for row in rows for k in row}
    for ax, (name, key, label) in zip(axes.flat, panels):
        if "*" in key:
            _per_turn_panel(ax, rows, expand(key, logged), name, label)
            continue
        steps, values = series(rows, key)
        # a reward source (turn facts, a reward model, a judge, a teacher: ``reward/<name>/mean``) rewrote
        # the reward trained on; validation still reports the env's own, so the two lines measure different things
        rescored = key == "reward/mean" and any(
            k.startswith("reward/") and k.endswith("/mean") and k != key for k in logged
        )
        train_label, val_label = (
            ("train (reward trained on)", "validation (env's reward)") if rescored else ("train", "validation")
        )
        companion = COMPANIONS.get(key)
        other = series(rows, companion[0]) if companion else ([], [])
        if companion and other[0]:
            train_label = companion[1]
            _train_lines(ax, *other, companion[2], "#ff7f0e")
        if steps:
            _train_lines(ax, steps, values, train_label, "#1f77b4")
        val_steps, val_values = series(rows, f"val/{key}")
        if val_steps:
            ax.plot(
                val_steps,
                val_values,
                color="#d62728",
                marker="o",
                markersize=4,
                linewidth=1.0,
                linestyle="--",
                label=val_label,
            )
        ax.set_title(name, fontsize=11)
        ax.set_xlabel("step")
        ax.set_ylabel(label if label != key else "")
        ax.grid(alpha=0.3)
        if steps and (val_steps or other[0]):
            ax.legend(fontsize=8, loc="best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    return fig


def _train_lines(ax: Any, steps: list[int], values: list[float], label: str, colour: str) -> None:
    """A training series: the raw line, and from ``SMOOTH_FROM`` steps on, faint under its trailing mean."""
    noisy = len(steps) >= SMOOTH_FROM
    ax.plot(steps, values, color=colour, linewidth=0.8 if noisy else 1.6, alpha=0.35 if noisy else 1.0, label=label)
    if noisy:  # a step's batch is a few tasks: the trend is what a reader wants
        window = max(3, len(steps) // 12)
        ax.plot(
            steps, trailing_mean(values, window), color=colour, linewidth=1.8, label=f"{label}, mean of {window} steps"
        )


def _per_turn_panel(ax: Any, rows: Sequence[dict[str, Any]], keys: Sequence[str], name: str, label: str) -> None:
    """One line per turn (trailing mean when the run is long), validation as dots of the same colour."""
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
    for i, key in enumerate(keys):
        colour = colours[i % len(colours)]
        turn = key.split("/", 1)[0].replace("turn", "turn ")
        steps, values = series(rows, key)
        if steps:
            smooth = trailing_mean(values, max(3, len(steps) // 12)) if len(steps) >= SMOOTH_FROM else values
            ax.plot(steps, smooth, color=colour, linewidth=1.6, label=turn)
        val_steps, val_values = series(rows, f"val/{key}")
        if val_steps:
            ax.plot(val_steps, val_values, color=colour, marker="o", markersize=4, linewidth=0.8, linestyle="--")
    ax.set_title(name + (" (dots: validation)" if any(series(rows, f"val/{k}")[0] for k in keys) else ""), fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def plot_run(
    run_dir: str | Path, output: str | Path | None = None, metrics: Sequence[str] = (), title: str | None = None
) -> Path:
    """Draw the run's curves into ``output`` (default ``<run dir>/curves.png``); returns the path."""
    plt = _pyplot()
    rows = read_metrics(run_dir)
    if not rows:
        raise PlotError(f"{run_dir} has a metrics file with no steps yet")
    run = Path(run_dir)
    home = run if run.is_dir() else run.parent
    fig = figure(rows, choose_panels(rows, metrics), title if title is not None else home.name)
    target = Path(output) if output is not None else home / "curves.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(target)  # a viewer never sees half a file
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holding metrics.jsonl) or a metrics file")
    parser.add_argument(
        "-m",
        "--metric",
        action="append",
        metavar="METRIC",
        help="a metric to plot (repeatable; its val/ twin is drawn too); default: the usual panels",
    )
    parser.add_argument("-o", "--output", default=None, help="PNG to write (default: RUN_DIR/curves.png)")


def run(args: argparse.Namespace) -> int:
    """``agentgym plot RUN_DIR [-m METRIC ...] [-o curves.png]``."""
    import sys

    try:
        path = plot_run(args.run_dir, args.output, args.metric or ())
    except PlotError as exc:
        print(f"agentgym plot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
