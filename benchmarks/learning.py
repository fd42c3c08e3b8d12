"""Does the main job learn? Runs the README's command from nothing and prints the held-out table.

    python benchmarks/learning.py                      # agentgym train --env sokoban, fresh run dir
    python benchmarks/learning.py --env arithmetic     # the single-turn job
    python benchmarks/learning.py --run-dir DIR -- trainer.total_training_steps=90   # extra overrides

The command runs as a user runs it (a child process, a fresh run directory, a fresh tiny-model
cache unless ``--keep-cache``), so every stage counts: building the tiny model, demos, SFT, the
held-out scores of the SFT model, RL, the held-out scores of the RL model. Prints the wall time
of each stage (from the run's own files), the table (random policy / after SFT / after RL,
greedy and sampled at T=1, binomial standard errors, the paired gain) and the issue's targets:
RL adds >= 10 points of greedy success over SFT with >= 3 standard errors, and the whole
command takes <= 15 minutes. Exit status 0 when both hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--run-dir", default=None, help="default: a new temporary directory")
    parser.add_argument("--keep-cache", action="store_true", help="reuse the tiny model from ~/.cache/agentgym")
    parser.add_argument("--min-gain", type=float, default=0.10)
    parser.add_argument("--min-z", type=float, default=3.0)
    parser.add_argument("--max-minutes", type=float, default=15.0)
    parser.add_argument("overrides", nargs="*", help="extra KEY=VALUE overrides for agentgym train")
    args = parser.parse_args()

    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="agentgym-learning-")) / "run"
    env = dict(os.environ)
    if not args.keep_cache:
        env["AGENTGYM_CACHE"] = str(run_dir.parent / "cache")
    cmd = [sys.executable, "-m", "agentgym.cli", "train", "--env", args.env,
           f"trainer.default_local_dir={run_dir}", *args.overrides]
    print("$", " ".join(cmd), flush=True)
    started = time.perf_counter()
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    minutes = (time.perf_counter() - started) / 60
    if code != 0:
        print(f"agentgym train exited {code} after {minutes:.1f} min", file=sys.stderr)
        return 1
    report = json.loads((run_dir / "held_out.json").read_text())
    print("\n" + report["table"])
    print(f"\nstages (wall seconds): {stage_times(run_dir)}")
    start, final = report["policies"]["after SFT"]["0.0"], report["policies"]["after RL"]["0.0"]
    diffs = [a - b for a, b in zip(final["per_task"], start["per_task"], strict=True)]
    n = len(diffs)
    gain = sum(diffs) / n
    se = (sum((d - gain) ** 2 for d in diffs) / (n - 1) / n) ** 0.5
    se_unpaired = (start["se"] ** 2 + final["se"] ** 2) ** 0.5
    z, z_unpaired = gain / se if se else 0.0, gain / se_unpaired if se_unpaired else 0.0
    learned = gain >= args.min_gain and z >= args.min_z
    fast = minutes <= args.max_minutes
    print(f"RL - SFT, greedy: {gain:+.3f} ({z:.1f} paired SE, {z_unpaired:.1f} unpaired SE); target >= "
          f"{args.min_gain:+.2f} with >= {args.min_z:g} SE: {'met' if learned else 'NOT met'}")
    print(f"whole command: {minutes:.1f} min; target <= {args.max_minutes:g} min: {'met' if fast else 'NOT met'} "
          f"({os.cpu_count()} CPUs)")
    print(f"run dir: {run_dir}")
    return 0 if learned and fast else 1


def stage_times(run_dir: Path) -> dict[str, float]:
    """Seconds per stage from the files the run wrote."""
    times: dict[str, float] = {}
    sft_stamp = run_dir / "warm_start" / "sft" / "stage.json"
    if sft_stamp.is_file():
        times["sft"] = round(json.loads(sft_stamp.read_text()).get("seconds", 0.0), 1)
    held = json.loads((run_dir / "held_out.json").read_text())
    for label, by_temp in held["policies"].items():
        for temp, score in by_temp.items():
            times[f"held-out {label} T={temp}"] = round(score["seconds"], 1)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times["rl steps"] = round(sum(m.get("timing_s/step", 0.0) for m in metrics), 1)
    return times


if __name__ == "__main__":
    sys.exit(main())
