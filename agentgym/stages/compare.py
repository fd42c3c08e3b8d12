"""``agentgym compare RUN_A RUN_B ... [-o compare.png]``: runs of different seeds or settings side by side.

Prints one table of the runs' held-out success (``<run>/held_out.json``, written by ``agentgym train``
with ``held_out.enable``): a row per run and policy (the model RL started from, the final model), a
column per temperature (greedy, sampled), each ``success ± binomial SE``; then, for runs scored on the
same held-out tasks as the first run (same env, env arguments and seeds: their ``config.yaml``), the
difference of their final models from the first run's with the paired standard error over those tasks,
and across those runs the mean final success with its standard error over runs (the seed-to-seed spread).

Draws one PNG of their curves (``<run>/metrics.jsonl``: a colour per run, training as a line and
validation as dots, the panels ``agentgym plot`` would draw) and a panel of the held-out success.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.plots import PlotError, choose_panels, read_metrics, series, trailing_mean
from agentgym.stages.held_out import Score, load_scores, paired_gain

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
FINAL = "after RL"
CELL = 24  # "+0.500 ± 0.289, 1.7 SE"


class CompareError(ValueError):
    """A run that cannot be compared; the message says what to pass."""


@dataclass
class RunResults:
    directory: Path
    label: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl, a dict per step
    policies: dict[str, dict[float, Score]] = field(default_factory=dict)  # held_out.json: policy -> T -> Score
    tasks: dict[str, Any] | None = None  # what the held-out tasks were: env, env kwargs, first seed, count

    @property
    def start_label(self) -> str | None:
        return next((p for p in self.policies if p != FINAL), None)

    def describe_tasks(self) -> str:
        if not self.tasks:
            return "unknown tasks"
        first, count = self.tasks["seed_start"], self.tasks["num_tasks"]
        return f"{count} tasks of {self.tasks['env']} (seeds {first}..{first + count - 1})"


def load_run(path: str | Path) -> RunResults:
    directory = Path(path)
    if directory.is_file():  # a metrics.jsonl or held_out.json given
        directory = directory.parent
    if not directory.is_dir():
        raise CompareError(f"{path} is not a run directory (trainer.default_local_dir of `agentgym train`)")
    run = RunResults(directory)
    held = directory / "held_out.json"
    if held.is_file():
        try:
            labels = json.loads(held.read_text()).get("policies", {})
        except ValueError as exc:
            raise CompareError(f"{held} is unreadable ({exc})") from None
        run.policies = {label: load_scores(held, label) for label in labels}
    if (directory / "metrics.jsonl").is_file():
        run.rows = read_metrics(directory)
    if not run.policies and not run.rows:
        raise CompareError(
            f"{directory} holds neither held_out.json nor metrics.jsonl: pass the directories of "
            "runs of `agentgym train` (the summary's `run dir:`)"
        )
    run.tasks = _held_out_tasks(directory)
    return run


def _held_out_tasks(directory: Path) -> dict[str, Any] | None:
    """The held-out tasks of the run's config: two runs with equal ones scored the same levels."""
    config = directory / "config.yaml"
    if not config.is_file():
        return None
    from omegaconf import OmegaConf

    from agentgym.stages.held_out import env_kwargs

    try:
        cfg = OmegaConf.load(config)
        return {
            "env": str(cfg.env.name),
            "env_kwargs": env_kwargs(cfg),
            "seed_start": cfg.env.val_seed_start,
            "num_tasks": cfg.held_out.num_tasks,
        }
    except Exception:  # noqa: BLE001 - an old or hand-made config: the runs are then not paired
        return None


def run_labels(directories: Sequence[Path]) -> list[str]:
    """The shortest trailing parts of the paths that tell the runs apart (``seed0/run``, ``seed1/run``)."""
    parts = [d.resolve().parts for d in directories]
    depth = 1
    while depth < max(len(p) for p in parts):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
        depth += 1
    return [str(d) for d in directories]


def temperatures(runs: Sequence[RunResults]) -> list[float]:
    return sorted({t for run in runs for by_temp in run.policies.values() for t in by_temp})


def _column(t: float) -> str:
    return "greedy" if t == 0 else f"sampled T={t:g}"


def table(runs: Sequence[RunResults]) -> str:
    """The held-out table of ``runs`` as text (see the module docstring)."""
    temps = temperatures(runs)
    scored = [r for r in runs if r.policies]
    if not scored:
        return "held-out: none of these runs has a held-out table (held_out.enable was off, or the run did not finish)"
    width = max(22, *(len(r.label) + 2 for r in runs))
    described = {r.describe_tasks() for r in scored}
    on = (
        f"on {described.pop()}"
        if len(described) == 1
        else "on " + "; ".join(f"{r.label}: {r.describe_tasks()}" for r in scored)
    )
    lines = [
        f"held-out success ± SE (binomial) {on}",
        "  ".join(["run".ljust(width), "policy".ljust(12)] + [_column(t).ljust(CELL) for t in temps]),
    ]
    for run in runs:
        if not run.policies:
            lines.append(f"{run.label.ljust(width)}  (no held_out.json)")
            continue
        for policy, by_temp in run.policies.items():
            cells = [f"{by_temp[t].success:.3f} ± {by_temp[t].se:.3f}" if t in by_temp else "" for t in temps]
            lines.append("  ".join([run.label.ljust(width), policy.ljust(12)] + [c.ljust(CELL) for c in cells]))
        start = run.start_label
        if start is not None and FINAL in run.policies:
            gains = [_gain(run.policies[start].get(t), run.policies[FINAL].get(t)) for t in temps]
            lines.append(
                "  ".join([run.label.ljust(width), "RL gain".ljust(12)] + [g.ljust(CELL) for g in gains])
                + f"  ({FINAL} - {start}, paired over tasks)"
            )
    lines += _paired_section(scored, temps, width)
    lines += _across_runs(scored, temps)
    return "\n".join(lines)


def _gain(before: Score | None, after: Score | None) -> str:
    if before is None or after is None or len(before.per_task) != len(after.per_task) or not after.per_task:
        return ""
    gain, se = paired_gain(before, after)
    return f"{gain:+.3f} ± {se:.3f}" + (f", {gain / se:.1f} SE" if se > 0 else "")


def _paired_section(runs: Sequence[RunResults], temps: Sequence[float], width: int) -> list[str]:
    if len(runs) < 2:
        return []
    first = runs[0]
    lines = [f"\n{FINAL}, each run minus {first.label} (paired over the same held-out tasks):"]
    for run in runs[1:]:
        why = None
        if FINAL not in run.policies or FINAL not in first.policies:
            why = f"no {FINAL!r} row"
        elif first.tasks is None or run.tasks is None:
            why = "which held-out tasks were scored is unknown (no config.yaml)"
        elif run.tasks != first.tasks:
            why = f"other held-out tasks ({run.describe_tasks()}; env arguments or seeds differ)"
        if why is not None:
            lines.append(f"{run.label.ljust(width)}  not paired: {why}")
            continue
        cells = [_gain(first.policies[FINAL].get(t), run.policies[FINAL].get(t)) for t in temps]
        lines.append("  ".join([run.label.ljust(width), "".ljust(12)] + [c.ljust(CELL) for c in cells]))
    return lines


def _across_runs(runs: Sequence[RunResults], temps: Sequence[float]) -> list[str]:
    finals = [r for r in runs if FINAL in r.policies and r.tasks == runs[0].tasks]  # scored on the same tasks
    if len(finals) < 2:
        return []
    cells = []
    for t in temps:
        values = [r.policies[FINAL][t].success for r in finals if t in r.policies[FINAL]]
        if len(values) < 2:
            continue
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        cells.append(f"{_column(t)} {mean:.3f} ± {sd / math.sqrt(len(values)):.3f} (sd {sd:.3f})")
    return (
        [f"\n{FINAL}, mean over the {len(finals)} runs on {runs[0].label}'s tasks ± SE over runs: " + "; ".join(cells)]
        if cells
        else []
    )


# ---- the plot ------------------------------------------------------------------------------------
def figure(runs: Sequence[RunResults], metrics: Sequence[str] = ()) -> Any:
    from agentgym.plots import _pyplot

    plt = _pyplot()
    with_rows = [r for r in runs if r.rows]
    panels = []
    if with_rows:
        panels = [p for p in choose_panels([row for r in with_rows for row in r.rows], metrics) if "*" not in p[1]]
    held = [r for r in runs if r.policies]
    count = len(panels) + (1 if held else 0)
    if count == 0:
        raise PlotError("nothing to draw: the runs logged no curves and have no held-out table")
    columns = min(3, count)
    lines = math.ceil(count / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.8 * columns, 3.4 * lines), squeeze=False)
    flat = list(axes.flat)
    for ax, (title, key, label) in zip(flat, panels):
        for i, run in enumerate(runs):
            colour = COLOURS[i % len(COLOURS)]
            steps, values = series(run.rows, key)
            if steps:
                if len(steps) >= 20:
                    ax.plot(steps, values, color=colour, linewidth=0.7, alpha=0.25)
                    values = trailing_mean(values, max(3, len(steps) // 12))
                ax.plot(steps, values, color=colour, linewidth=1.6, label=run.label)
            val_steps, val_values = series(run.rows, f"val/{key}")
            if val_steps:
                ax.plot(
                    val_steps,
                    val_values,
                    color=colour,
                    marker="o",
                    markersize=4,
                    linewidth=0.8,
                    linestyle="--",
                    label=None if steps else run.label,
                )
        ax.set_title(
            title + " (dots: validation)" if any(series(r.rows, f"val/{key}")[0] for r in runs) else title, fontsize=11
        )
        ax.set_xlabel("step")
        ax.set_ylabel(label if label != key else "")
        ax.grid(alpha=0.3)
    if panels:
        flat[0].legend(fontsize=8, loc="best")
    if held:
        _held_out_panel(flat[len(panels)], runs)
    for ax in flat[count:]:
        ax.set_visible(False)
    fig.suptitle("agentgym compare: " + ", ".join(r.label for r in runs), fontsize=12)
    fig.tight_layout()
    return fig


def _held_out_panel(ax: Any, runs: Sequence[RunResults]) -> None:
    """Grouped bars in each run's colour: the start model pale, the final model full, sampled hatched;
    binomial SE as error bars."""
    from matplotlib.patches import Patch

    temps = temperatures(runs)
    kinds = [(policy, t) for policy in ("start", FINAL) for t in temps]
    width = 0.8 / max(len(kinds), 1)
    for i, run in enumerate(runs):
        for k, (policy, t) in enumerate(kinds):
            score = run.policies.get((run.start_label if policy == "start" else policy) or "", {}).get(t)
            if score is not None:
                ax.bar(
                    i - 0.4 + width * (k + 0.5),
                    score.success,
                    width * 0.9,
                    yerr=score.se,
                    capsize=2,
                    color=COLOURS[i % len(COLOURS)],
                    alpha=0.35 if policy == "start" else 1.0,
                    hatch="//" if t > 0 else None,
                    edgecolor="white" if t > 0 else None,
                )
    legend = [
        Patch(
            facecolor="grey",
            alpha=0.35 if policy == "start" else 1.0,
            hatch="//" if t > 0 else None,
            label=("start" if policy == "start" else "final") + (" greedy" if t == 0 else f" T={t:g}"),
        )
        for policy, t in kinds
    ]
    ax.legend(handles=legend, fontsize=7, loc="best")
    ax.set_xticks(range(len(runs)), [r.label for r in runs], rotation=20, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title("held-out success (± SE)", fontsize=11)
    ax.grid(alpha=0.3, axis="y")


def compare(
    paths: Sequence[str | Path], output: str | Path | None = "compare.png", metrics: Sequence[str] = ()
) -> tuple[str, Path | None]:
    """The table's text, and the PNG written (None when ``output`` is None)."""
    runs = [load_run(p) for p in paths]
    for run, label in zip(runs, run_labels([r.directory for r in runs])):
        run.label = label
    text = table(runs)
    if output is None:
        return text, None
    from agentgym.plots import _pyplot

    plt = _pyplot()
    fig = figure(runs, metrics)
    target = Path(output)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(target)
    return text, target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run directories (holding held_out.json, metrics.jsonl)"
    )
    parser.add_argument(
        "-m",
        "--metric",
        action="append",
        metavar="METRIC",
        help="a metric to plot (repeatable; its val/ twin is drawn too); default: the usual panels",
    )
    parser.add_argument("-o", "--output", default="compare.png", help="PNG to write (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """``agentgym compare RUN_A RUN_B ... [-o compare.png] [-m METRIC ...]``."""
    try:
        text, path = compare(args.runs, args.output, args.metric or ())
    except (CompareError, PlotError) as exc:
        print(f"agentgym compare: {exc}", file=sys.stderr)
        return 2
    print(text)
    if path is not None:
        print(f"\nwrote {path}")
    return 0
