"""Does the main job learn, every run? Runs the README's command per seed from nothing and prints the
held-out figures of every run, their mean and spread, and (``--ablate``) each change switched off.

    python benchmarks/learning.py                              # agentgym train --env sokoban, seed 0
    python benchmarks/learning.py --seeds 1 2 3                # one clean run per trainer.seed
    python benchmarks/learning.py --seeds 1 2 3 --ablate       # and each change of the recipe off, per seed
    python benchmarks/learning.py --env arithmetic             # the single-turn job
    python benchmarks/learning.py --seeds 1 -- trainer.total_training_steps=90   # extra overrides
    python benchmarks/learning.py --seeds 1 2 3 --async        # and agentgym train --async beside each
    python benchmarks/learning.py --seeds 1 --async --dry-run  # print the commands, run nothing

Each run is a child process in a fresh run directory with a fresh tiny-model cache (unless
``--keep-cache``), so every stage counts: building the tiny model, demos, SFT, held-out scores of the
SFT model, RL, held-out scores of the RL model. Per run it prints the SFT and RL greedy success, the
greedy gain RL - SFT with its paired standard error (the same 200 levels scored twice), the sampled
gain, the share of malformed replies per turn (greedy, SFT -> RL: Sokoban's ``well_formed``, or cut at
the token cap) and the wall minutes; then the mean gain over seeds with the standard error of that
mean (spread between runs). ``--ablate`` repeats each seed with one change switched off (the
variants in ``ABLATIONS``), in a table beside the full recipe: each ablation runs RL only, from the
full recipe's SFT model of the same seed, so the change is the only difference between the two rows.

``--async`` runs each seed a second time with ``agentgym train --async`` (the asynchronous trainer, the
same recipe and overrides, its own fresh directory) and prints the two side by side: per seed the greedy
gain and the wall minutes of sync and async, then the means.

Targets (issue 22), checked on the full recipe's runs: greedy gain >= ``--min-gain`` (3 points) in
every run and >= ``--min-mean-gain`` (8 points) on average; malformed replies after RL at each turn at
most ``--max-malformed-rise`` (5 points) above SFT's; each run <= ``--max-minutes``. With ``--async``
(issue 37): every async run's greedy gain >= ``--min-gain``, the async mean within ``--async-tolerance``
(3 points) of the sync mean, and each async run no slower than the sync run of its seed. Exit 0 when all
hold.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ABLATIONS: dict[str, list[str]] = {
    "GRPO instead of GiGPO": ["algorithm.adv_estimator=grpo"],
    "no dynamic sampling": ["algorithm.filter_groups.enable=false"],
    "no format reward": ["algorithm.turn_reward_coef=0", "algorithm.turn_reward_from=null"],
    "PPO with a critic instead of GiGPO": ["algorithm=ppo"],
}
"""Each change of the main job's recipe (configs/env/sokoban.yaml), switched off on its own."""
ASYNC = "async (agentgym train --async)"


@dataclass
class Run:
    variant: str
    seed: int
    minutes: float
    ok: bool
    start: dict = field(default_factory=dict)  # held_out.json's start row, by temperature
    final: dict = field(default_factory=dict)
    run_dir: str = ""

    def gain(self, temp: str = "0.0") -> tuple[float, float]:
        """RL - SFT success and its paired standard error over the same tasks."""
        before, after = self.start[temp]["per_task"], self.final[temp]["per_task"]
        diffs = [a - b for a, b in zip(after, before, strict=True)]
        mean = sum(diffs) / len(diffs)
        var = sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1)
        return mean, (var / len(diffs)) ** 0.5

    def malformed(self, row: dict) -> list[float]:
        turns = row["0.0"].get("turns", {})
        return [turns[f"turn{k}/malformed"] for k in range(1, 100) if f"turn{k}/malformed" in turns]


def run_once(
    env_name: str,
    seed: int,
    variant: str,
    overrides: list[str],
    base: Path,
    keep_cache: bool,
    start_model: Path | None = None,
    flags: tuple[str, ...] = (),
    dry_run: bool = False,
) -> Run:
    """One ``agentgym train`` in a fresh run directory; ``start_model``: RL from this model (the full
    recipe's SFT model of the same seed) instead of running the warm start again; ``flags``: flags of
    ``agentgym train`` (``--async``); ``dry_run``: print the command only."""
    run_dir = base / f"{re.sub(r'[^A-Za-z0-9]+', '_', variant).strip('_')}-seed{seed}" / "run"
    if start_model is not None:
        overrides = ["warm_start.enable=false", f"actor_rollout_ref.model.path={start_model}", *overrides]
    env = dict(os.environ)
    if not keep_cache:
        env["AGENTGYM_CACHE"] = str(run_dir.parent / "cache")
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        *flags,
        "--env",
        env_name,
        f"trainer.seed={seed}",
        f"trainer.default_local_dir={run_dir}",
        *overrides,
    ]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    if dry_run:
        return Run(variant, seed, 0.0, False, run_dir=str(run_dir))
    started = time.perf_counter()
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    minutes = (time.perf_counter() - started) / 60
    report = run_dir / "held_out.json"
    if code != 0 or not report.is_file():
        print(f"agentgym train exited {code} after {minutes:.1f} min", file=sys.stderr)
        return Run(variant, seed, minutes, False, run_dir=str(run_dir))
    held = json.loads(report.read_text())
    start_label = next(label for label in held["policies"] if label != "after RL")
    print("\n" + held["table"], flush=True)
    return Run(variant, seed, minutes, True, held["policies"][start_label], held["policies"]["after RL"], str(run_dir))


def pct(values: list[float]) -> str:
    return " / ".join(f"{100 * v:.0f}%" for v in values) or "-"


def report(runs: list[Run]) -> str:
    lines = [
        "| variant | seed | SFT greedy | RL - SFT greedy | RL - SFT sampled | malformed greedy, turns 1/2/3: "
        "SFT -> RL | minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if not r.ok:
            lines.append(f"| {r.variant} | {r.seed} | failed | | | | {r.minutes:.1f} |")
            continue
        g, se = r.gain()
        sampled = next((t for t in r.start if t != "0.0"), None)
        s = f"{r.gain(sampled)[0]:+.3f}" if sampled and sampled in r.final else "-"
        lines.append(
            f"| {r.variant} | {r.seed} | {r.start['0.0']['success']:.3f} | {g:+.3f} ({g / se if se else 0:.1f} SE)"
            f" | {s} | {pct(r.malformed(r.start))} -> {pct(r.malformed(r.final))} | {r.minutes:.1f} |"
        )
    lines.append("")
    for variant in dict.fromkeys(r.variant for r in runs):
        gains = [r.gain()[0] for r in runs if r.variant == variant and r.ok]
        if gains:
            spread = statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else 0.0
            lines.append(
                f"{variant}: mean greedy gain {statistics.mean(gains):+.3f} ± {spread:.3f} over {len(gains)} "
                f"run(s) (range {min(gains):+.3f} .. {max(gains):+.3f})"
            )
    return "\n".join(lines)


def side_by_side(runs: list[Run], sync: str, other: str) -> str:
    """Per seed, the greedy gain and the minutes of ``sync`` and ``other`` runs beside each other; then the means."""
    lines = [f"| seed | {sync}: gain | {other}: gain | {sync}: minutes | {other}: minutes |", "|---|---|---|---|---|"]
    by = {(r.variant, r.seed): r for r in runs}
    for seed in dict.fromkeys(r.seed for r in runs):
        a, b = by.get((sync, seed)), by.get((other, seed))
        cells = []
        for r in (a, b):
            cells.append(f"{r.gain()[0]:+.3f} ± {r.gain()[1]:.3f}" if r and r.ok else "failed" if r else "-")
        lines.append(
            f"| {seed} | {cells[0]} | {cells[1]} | {a.minutes if a else 0:.1f} | {b.minutes if b else 0:.1f} |"
        )
    for name in (sync, other):
        gains = [r.gain()[0] for r in runs if r.variant == name and r.ok]
        minutes = [r.minutes for r in runs if r.variant == name and r.ok]
        if gains:
            lines.append(f"{name}: mean gain {statistics.mean(gains):+.3f}, mean {statistics.mean(minutes):.1f} min")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--ablate", action="store_true", help="also run each ABLATIONS variant per seed")
    parser.add_argument(
        "--ablate-seeds",
        type=int,
        nargs="+",
        default=None,
        help="run the ablations for these seeds only (default: every seed)",
    )
    parser.add_argument("--run-dir", default=None, help="where the runs go (default: a new temporary directory)")
    parser.add_argument("--keep-cache", action="store_true", help="reuse the tiny model from ~/.cache/agentgym")
    parser.add_argument("--min-gain", type=float, default=0.03)
    parser.add_argument("--min-mean-gain", type=float, default=0.08)
    parser.add_argument("--max-malformed-rise", type=float, default=0.05)
    parser.add_argument("--max-minutes", type=float, default=15.0)
    parser.add_argument(
        "--async",
        dest="run_async",
        action="store_true",
        help="also run each seed with agentgym train --async and print the two side by side",
    )
    parser.add_argument("--async-tolerance", type=float, default=0.03, help="async mean gain >= sync mean - this")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and run nothing")
    parser.add_argument("overrides", nargs="*", help="extra KEY=VALUE overrides for every run")
    args = parser.parse_args()

    base = Path(args.run_dir or tempfile.mkdtemp(prefix="agentgym-learning-"))
    dry = args.dry_run
    runs, async_runs = [], []
    for seed in args.seeds:  # a seed's sync and async runs back to back: both see the machine's load of the moment
        runs.append(run_once(args.env, seed, "full recipe", list(args.overrides), base, args.keep_cache, dry_run=dry))
        if args.run_async:
            async_runs.append(
                run_once(
                    args.env, seed, ASYNC, list(args.overrides), base, args.keep_cache, flags=("--async",), dry_run=dry
                )
            )
    runs += async_runs
    if dry:
        return 0
    if args.ablate:  # RL only, from the full recipe's SFT model of the same seed: the change is the only difference
        for name, extra in ABLATIONS.items():
            for full in list(runs[: len(args.seeds)]):
                if args.ablate_seeds is not None and full.seed not in args.ablate_seeds:
                    continue
                sft = Path(full.run_dir) / "warm_start" / "sft" / "huggingface"
                if full.ok and sft.is_dir():
                    runs.append(
                        run_once(
                            args.env,
                            full.seed,
                            name,
                            list(args.overrides) + extra,
                            base,
                            args.keep_cache,
                            start_model=sft,
                            dry_run=dry,
                        )
                    )
    text = report(runs)
    if args.run_async:
        text += "\n\n" + side_by_side(runs, "full recipe", ASYNC)
    print(f"\n{text}\n({os.cpu_count()} CPUs; runs under {base})")
    (base / "learning.md").write_text(text + "\n")

    full = [r for r in runs if r.variant == "full recipe"]
    gains = [r.gain()[0] for r in full if r.ok]
    checks = {
        f"every run's greedy gain >= {args.min_gain:+.2f}": bool(gains)
        and len(gains) == len(full)
        and min(gains) >= args.min_gain,
        f"mean greedy gain >= {args.min_mean_gain:+.2f}": bool(gains) and statistics.mean(gains) >= args.min_mean_gain,
        f"malformed after RL <= SFT + {100 * args.max_malformed_rise:.0f} points at every turn": all(
            rl <= sft + args.max_malformed_rise + 1e-9
            for r in full
            if r.ok
            for sft, rl in zip(r.malformed(r.start), r.malformed(r.final))
        ),
        f"every run <= {args.max_minutes:g} min": all(r.minutes <= args.max_minutes for r in full),
    }
    if args.run_async:
        by_seed = {r.seed: r for r in full}
        other = [r for r in runs if r.variant == ASYNC]
        async_gains = [r.gain()[0] for r in other if r.ok]
        checks[f"every async run's greedy gain >= {args.min_gain:+.2f}"] = (
            len(async_gains) == len(other) > 0 and min(async_gains) >= args.min_gain
        )
        checks[f"async mean gain within {100 * args.async_tolerance:.0f} points of sync's"] = (
            bool(async_gains and gains)
            and statistics.mean(async_gains) >= statistics.mean(gains) - args.async_tolerance
        )
        checks["every async run no slower than the sync run of its seed"] = all(
            r.ok and r.seed in by_seed and r.minutes <= by_seed[r.seed].minutes for r in other
        )
    for name, held in checks.items():
        print(f"target: {name}: {'met' if held else 'NOT met'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
