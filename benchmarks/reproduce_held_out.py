"""Does ``agentgym eval --run`` give back a finished run's held-out table? Prints, per temperature of
the run's table, the success the run recorded (``held_out.json``, "after RL"), the success
``agentgym eval --run RUN_DIR --temperature T`` measures on the same tasks, how many tasks agree, the
per-turn malformed shares of both, and the seconds eval took; then, greedy only, plain
``agentgym eval --model RUN_DIR/huggingface`` (the env's defaults) for contrast (slow for Sokoban: the
default 100 moves and 256 tokens a turn; ``--no-contrast`` leaves it out).

    python benchmarks/reproduce_held_out.py outputs/agentgym/sokoban-gigpo

Exit status 0 when every task agrees at every temperature, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def evaluate(args: list[str], out: Path) -> tuple[dict[int, float], dict[str, float], float]:
    """Per-seed success, per-turn malformed shares and seconds of one ``agentgym eval`` child process."""
    from agentgym.rollout.metrics import per_turn_metrics
    from agentgym.rollout.storage import read_trajectories

    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "eval", *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"agentgym eval {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    trajectories = read_trajectories(out)
    success = {t.seed: float(bool(t.metrics.get("success"))) for t in trajectories}
    malformed = {k: v for k, v in per_turn_metrics(trajectories).items() if k.endswith("/malformed")}
    return success, malformed, seconds


def shares(turns: dict[str, float], most: int = 6) -> str:
    ordered = sorted(turns, key=lambda k: int(k[4:].split("/")[0]))
    return " / ".join(f"{100 * turns[k]:.0f}%" for k in ordered[:most]) + (" / ..." if len(ordered) > most else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a finished run of agentgym train with held_out.enable (held_out.json)")
    parser.add_argument("--no-contrast", action="store_true", help="skip plain eval --model with the env's defaults")
    options = parser.parse_args()
    run_dir = Path(options.run_dir).resolve()
    report = json.loads((run_dir / "held_out.json").read_text())
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "config.yaml")
    first, count = int(cfg.env.val_seed_start), int(cfg.held_out.num_tasks)
    seeds = list(range(first, first + count))
    print(f"run {run_dir}: {count} held-out tasks of {cfg.env.name} (seeds {first}..{first + count - 1})")
    print(
        f"{'command':<34} {'T':>4} {'recorded':>9} {'measured':>9} {'agree':>9} {'seconds':>8}  malformed by turn "
        "(recorded | measured)"
    )
    all_agree = True
    with tempfile.TemporaryDirectory() as tmp:
        for key, recorded in sorted(report["policies"]["after RL"].items(), key=lambda kv: float(kv[0])):
            t = float(key)
            runs = [
                ("eval --run", ["--run", str(run_dir), "--temperature", f"{t:g}"]),
                (
                    "eval --model (env defaults)",
                    [
                        "--env",
                        str(cfg.env.name),
                        "--model",
                        str(run_dir / "huggingface"),
                        "--tasks",
                        str(count),
                        "--seed",
                        str(first),
                        "--temperature",
                        f"{t:g}",
                    ],
                ),
            ]
            if t > 0 or options.no_contrast:
                runs = runs[:1]
            for i, (name, args) in enumerate(runs):
                success, malformed, seconds = evaluate(args, Path(tmp) / f"eval{i}-{key}.jsonl")
                measured = [success.get(s, 0.0) for s in seeds]
                agree = sum(a == b for a, b in zip(measured, recorded["per_task"]))
                if name == "eval --run":
                    all_agree &= agree == count
                recorded_turns = {k: v for k, v in recorded.get("turns", {}).items() if k.endswith("/malformed")}
                print(
                    f"{name:<34} {t:>4g} {recorded['success']:>9.3f} {sum(measured) / count:>9.3f} "
                    f"{agree:>4}/{count:<4} {seconds:>8.1f}  {shares(recorded_turns)} | {shares(malformed)}"
                )
    return 0 if all_agree else 1


if __name__ == "__main__":
    sys.exit(main())
