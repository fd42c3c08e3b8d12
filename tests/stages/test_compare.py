"""``agentgym compare``: one table of the runs' held-out success (binomial SE; paired SE where they scored
the same tasks) and one PNG of their curves and held-out success."""

from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

pytest.importorskip("matplotlib", reason="pip install matplotlib (the plot extra)")

from agentgym.cli import main  # noqa: E402
from agentgym.stages import held_out  # noqa: E402
from agentgym.trainer.config import load_config  # noqa: E402

BLUE, RED = (0x1F, 0x77, 0xB4), (0xD6, 0x27, 0x28)  # the first two runs' colours


def make_run(directory, final_greedy, start_greedy=(0, 0, 1, 0), val_seed_start=1_000_000, steps=30, slope=0.01):
    cfg = load_config(
        env="sokoban",
        overrides=[
            f"trainer.default_local_dir={directory}",
            "held_out.num_tasks=4",
            f"env.val_seed_start={val_seed_start}",
        ],
    )
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    rows = {
        "after SFT": {
            0.0: held_out.Score("after SFT", 0.0, [float(x) for x in start_greedy]),
            1.0: held_out.Score("after SFT", 1.0, [0.0, 0.0, 1.0, 0.0]),
        },
        "after RL": {
            0.0: held_out.Score("after RL", 0.0, [float(x) for x in final_greedy]),
            1.0: held_out.Score("after RL", 1.0, [1.0, 0.0, 0.0, 0.0]),
        },
    }
    held_out.save(directory / "held_out.json", rows, None, {"table": ""})
    with open(directory / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            row = {"step": step, "reward/mean": slope * step, "success_rate": slope * step / 2}
            if step % 10 == 0:
                row["val/success_rate"] = slope * step
            f.write(json.dumps(row) + "\n")


def colour_pixels(png, rgb, tolerance=40):
    from matplotlib.image import imread

    image = imread(png)[..., :3] * 255
    distance = abs(image - rgb).sum(-1)
    return int((distance < tolerance).sum()), image.shape


def test_compare_prints_the_table_with_paired_errors_and_draws_both_runs(tmp_path, capsys):
    make_run(tmp_path / "seed0" / "run", final_greedy=[1, 0, 1, 1])
    make_run(tmp_path / "seed1" / "run", final_greedy=[1, 1, 1, 0], slope=0.02)
    make_run(tmp_path / "other" / "run", final_greedy=[1, 1, 1, 1], val_seed_start=2_000_000_000, slope=0.005)
    png = tmp_path / "compare.png"
    assert (
        main(
            [
                "compare",
                str(tmp_path / "seed0" / "run"),
                str(tmp_path / "seed1" / "run"),
                str(tmp_path / "other" / "run"),
                "-o",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("seed1/run") and "after RL" in line)
    assert "0.750 ± 0.217" in row and "0.250 ± 0.217" in row  # greedy 3/4, sampled 1/4, sqrt(p(1-p)/n)
    gain = next(line for line in lines if line.startswith("seed0/run") and "RL gain" in line)
    assert "+0.500 ± 0.289" in gain  # [1,0,1,1] - [0,0,1,0]: mean 0.5, sd sqrt(1/3), / sqrt(4)
    paired = lines[lines.index(next(line for line in lines if "each run minus seed0/run" in line)) + 1]
    # [1,1,1,0] - [1,0,1,1] = [0,1,0,-1]: mean 0, sd sqrt(2/3), SE sqrt(2/3)/2
    assert paired.startswith("seed1/run") and f"+0.000 ± {math.sqrt(2 / 3) / 2:.3f}" in paired
    assert "other/run" in out and "not paired: other held-out tasks" in out
    assert "mean over the 2 runs on seed0/run's tasks" in out and "greedy 0.750 ± 0.000" in out
    assert f"wrote {png}" in out

    blue, shape = colour_pixels(png, BLUE)
    red, _ = colour_pixels(png, RED)
    assert shape[0] > 300 and shape[1] > 800 and blue > 200 and red > 200  # both runs are drawn


def test_compare_refuses_what_is_not_a_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty"), str(tmp_path / "missing"), "-o", str(tmp_path / "x.png")]) == 2
    assert "neither held_out.json nor metrics.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
