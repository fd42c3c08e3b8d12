"""``agentgym plot`` and the trainer's curves.png."""

from __future__ import annotations

import json

import pytest

from agentgym.cli import main

plots = pytest.importorskip("agentgym.plots")
pytest.importorskip("matplotlib", reason="pip install matplotlib (the plot extra)")


def write_run(directory, steps=6, resumed_twice=(4,)):
    lines = []
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "reward/mean": 0.1 * step,
            "success_rate": 0.05 * step,
            "turns/mean": 3.0 - 0.1 * step,
            "actor/entropy": 2.0 - 0.2 * step,
            "actor/kl_loss": 0.0,
            "actor/ppo_kl": 0.01 * step,
            "rollout/weight_version_lag": 0,
            "timing_s/step": 1.0,
        }
        if step % 3 == 0:
            row.update({"val/reward/mean": 0.2 * step, "val/success_rate": 0.1 * step})
        lines.append(json.dumps(row))
        if step in resumed_twice:  # a resumed run logs the step again: the last line wins
            lines.append(json.dumps({**row, "reward/mean": 9.0}))
    lines.append('{"step": 7, "reward/me')  # a run killed mid-line
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def test_the_default_panels_hold_train_and_validation_series(tmp_path):
    rows = plots.read_metrics(write_run(tmp_path / "run"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and rows[3]["reward/mean"] == 9.0
    panels = plots.choose_panels(rows)
    assert [p[0] for p in panels] == ["reward", "success", "episode length", "KL", "entropy", "time per step"]
    fig = plots.figure(rows, panels)
    reward_axes = fig.axes[0]
    (train, val) = reward_axes.get_lines()
    assert list(train.get_xdata()) == [1, 2, 3, 4, 5, 6] and train.get_ydata()[3] == 9.0
    assert list(val.get_xdata()) == [3, 6] and list(val.get_ydata()) == pytest.approx([0.6, 1.2])
    assert [line.get_label() for line in reward_axes.get_lines()] == ["train", "validation"]
    kl_axes = fig.axes[3]  # no KL loss (logged as 0): the policy's KL per update instead; no staleness panel
    assert len(kl_axes.get_lines()) == 1 and kl_axes.get_lines()[0].get_ydata()[-1] == pytest.approx(0.06)
    flat = [{**r, "reward/mean": 0.0, "val/reward/mean": 0.0} for r in rows]  # a run that learns nothing shows it
    assert plots.choose_panels(flat)[0] == ("reward", "reward/mean", "mean episode reward")


def test_long_horizon_runs_plot_what_their_episodes_cost(tmp_path):
    rows = [
        {**r, "context/processed_tokens": 900.0 + r["step"], "context/last_turn_tokens": 300.0}
        for r in plots.read_metrics(write_run(tmp_path / "run"))
    ]
    titles = [p[0] for p in plots.choose_panels(rows)]
    assert titles[-3:] == ["tokens per episode", "last turn's prompt", "time per step"]


def test_a_rewritten_training_reward_is_told_apart_from_validation(tmp_path):
    """With ``algorithm.turn_reward_from`` (or a reward model, judge, teacher) the reward trained on is not
    the env's, which validation reports: the legend says which is which."""
    rows = [{**r, "reward/format_reward/mean": -0.1} for r in plots.read_metrics(write_run(tmp_path / "run"))]
    fig = plots.figure(rows, plots.choose_panels(rows))
    assert [line.get_label() for line in fig.axes[0].get_lines()] == [
        "train (reward trained on)",
        "validation (env's reward)",
    ]
    assert [line.get_label() for line in fig.axes[1].get_lines()] == ["train", "validation"]


def test_plot_command_writes_a_png(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    assert main(["plot", str(run)]) == 0
    png = run / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    out = tmp_path / "one.png"
    assert main(["plot", str(run), "-m", "actor/entropy", "-m", "val/success_rate", "-o", str(out)]) == 0
    assert out.is_file()
    assert main(["plot", str(run), "-m", "reward/maen"]) == 2
    assert "Did you mean reward/mean" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "nowhere")]) == 2


def test_the_no_signal_panel_tells_sampled_groups_from_trained_ones(tmp_path):
    """With dynamic sampling the share of flat groups among those sampled (``sampling/flat_group_frac``, before
    the filter) is drawn beside the share among those trained on (``batch/zero_variance_group_frac``), each
    labelled; without it the panel shows the trained share alone."""
    rows = plots.read_metrics(write_run(tmp_path / "run"))
    filtered = [{**r, "sampling/flat_group_frac": 0.4, "batch/zero_variance_group_frac": 0.0} for r in rows]
    panels = plots.choose_panels(filtered)
    index = [p[0] for p in panels].index("groups with no signal")
    assert panels[index][1] == "batch/zero_variance_group_frac"
    lines = plots.figure(filtered, panels).axes[index].get_lines()
    assert [line.get_label() for line in lines] == ["sampled, before the filter", "trained on"]
    assert list(lines[0].get_ydata()) == [0.4] * 6 and list(lines[1].get_ydata()) == [0.0] * 6
    plain = [{**r, "batch/zero_variance_group_frac": 0.25} for r in rows]
    panels = plots.choose_panels(plain)
    index = [p[0] for p in panels].index("groups with no signal")
    assert [line.get_label() for line in plots.figure(plain, panels).axes[index].get_lines()] == ["train"]
