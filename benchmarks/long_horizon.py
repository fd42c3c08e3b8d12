"""Long episodes with the whole history, a history window and a summary (docs/long_horizon.md).

The task is ``configs/env/frozenlake_long.yaml`` (FrozenLake 8x8 on slippery ice, one move a turn).
Two tables:

* **cost** (default): for each context policy and episode length (``--turns``, default 10 20 40),
  ``--episodes`` episodes rolled out by the built-in tiny model (random weights: its replies are not
  moves, so nothing moves and every episode lasts exactly its turn budget), then one PPO update on them
  (``full``: one row per episode; ``window`` / ``compact``: per-turn samples, ``trainer.step_wise_training``).
  Per cell: rollout seconds, update seconds (``timing_s/update_actor``), whole step seconds, peak
  resident memory of the process (``ru_maxrss``; on a GPU also ``torch.cuda.max_memory_allocated``),
  tokens processed per episode (``Trajectory.processed_tokens``: every turn's prompt and reply) and the
  last turn's prompt. Each cell runs in a child process of its own (the memory figure is its own).
* **learn** (``--learn STEPS``): ``agentgym train --env frozenlake_long`` per policy and seed
  (``--seeds``): warm start, ``STEPS`` RL steps, the held-out table; prints greedy success before and
  after RL and the wall minutes. Slow (the warm start's SFT dominates): not part of the default run.

    nice -n 10 python benchmarks/long_horizon.py                       # the cost table
    nice -n 10 python benchmarks/long_horizon.py --turns 10 20 --episodes 2 --policies full window
    nice -n 10 python benchmarks/long_horizon.py --table learn --learn 10 --seeds 0 1 2

The load average is printed with every table: the machine these figures come from may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

POLICIES = ("full", "window", "compact")
MODEL_LEN = 4096  # the tiny model's context (max_position_embeddings)


def overrides(policy: str, window: int, turns: int, episodes: int, run_dir: str) -> list[str]:
    """The preset with this policy, a one-step run on the given episodes, nothing around it."""
    return [
        f"actor_rollout_ref.rollout.multi_turn.context_policy={policy}",
        f"actor_rollout_ref.rollout.multi_turn.context_window={window}",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={turns}",
        f"env.kwargs.max_steps={turns}",
        f"trainer.step_wise_training={'false' if policy == 'full' else 'true'}",
        "data.max_response_length=8192",  # full history: 40 turns of a board and a reply fit one row
        f"actor_rollout_ref.rollout.n={episodes}",
        "data.train_batch_size=1",
        "warm_start.enable=false",
        "held_out.enable=false",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.save_hf_model=false",
        "trainer.logger=[]",
        f"trainer.default_local_dir={run_dir}",
    ]


def one_cell(policy: str, turns: int, episodes: int, window: int) -> dict[str, float]:
    """Roll out and update once, in this process; returns the cell's figures."""
    import asyncio

    import torch

    from agentgym.client import PolicyClient
    from agentgym.model import load_tokenizer
    from agentgym.rollout import RolloutConfig, RolloutRunner, Task
    from agentgym.rollout.sources import FixedTrajectorySource
    from agentgym.server.launch import start_embedded_server
    from agentgym.trainer.config import load_config
    from agentgym.trainer.ppo_trainer import PPOTrainer

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = load_config(env="frozenlake_long", overrides=overrides(policy, window, turns, episodes, run_dir))
        tok = load_tokenizer("tiny")
        server = start_embedded_server("tiny", port=0)
        try:
            config = RolloutConfig(
                n=episodes,
                max_turns=turns,
                max_tokens=int(cfg.actor_rollout_ref.rollout.max_tokens_per_turn),
                prompt_length=cfg.data.max_prompt_length,
                response_length=cfg.data.max_response_length,
                max_model_len=MODEL_LEN,  # full history past it: the episode ends there, truncated
                env_executor="inline",
                context_policy=policy,
                context_window=window,
                sampling_seed=0,
            )

            async def rollout():
                async with PolicyClient([server.url], backend="embedded") as client:
                    runner = RolloutRunner("frozenlake", client, tok, config, env_kwargs=dict(cfg.env.kwargs))
                    try:
                        return await runner.run([Task(seed=0)])
                    finally:
                        await runner.aclose()

            started = time.perf_counter()
            result = asyncio.run(rollout())
            rollout_s = time.perf_counter() - started
        finally:
            server.stop()
        trajs = result.trajectories
        failed = [t.failure for t in trajs if t.status == "failed"]
        if failed:
            raise RuntimeError(f"episodes failed: {failed[:2]}")
        source = FixedTrajectorySource([trajs])
        trainer = PPOTrainer(cfg, source, pad_token_id=tok.pad_token_id or 0, show_progress=False)
        try:
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            metrics = trainer.fit()["metrics"]
        finally:
            trainer.shutdown()
    out = {
        "turns_played": sum(t.num_turns for t in trajs) / len(trajs),
        "rollout_s": rollout_s,
        "update_s": float(metrics.get("timing_s/update_actor", 0.0)),
        "step_s": float(metrics.get("timing_s/step", 0.0)),
        "rows": float(metrics.get("batch/samples_per_episode", 1.0)) * len(trajs),
        "tokens_per_episode": sum(t.processed_tokens() for t in trajs) / len(trajs),
        "last_prompt": sum(t.context_lengths()[-1] for t in trajs) / len(trajs),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if torch.cuda.is_available():
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def run_cell(policy: str, turns: int, args: argparse.Namespace) -> dict[str, float] | None:
    cmd = [sys.executable, __file__, "--one", policy, str(turns), "--episodes", str(args.episodes)]
    cmd += ["--window", str(args.window)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        print(f"{policy} x {turns} turns failed (exit {done.returncode}):\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len("RESULT ") :])


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min) on {os.cpu_count()} CPUs"


def cost_table(args: argparse.Namespace) -> str:
    print(f"before: {load_average()}", flush=True)
    rows = []
    for turns in args.turns:
        for policy in args.policies:
            cell = run_cell(policy, turns, args)
            print(f"  {policy:>7} x {turns:>2} turns: {cell}", flush=True)
            rows.append((policy, turns, cell))
    has_cuda = any(c and "peak_cuda_mb" in c for _, _, c in rows)
    head = "| policy | turns | played | rollout s | update s | step s | rows | tokens / episode | last prompt |"
    head += " peak RSS MB |"
    head += " peak CUDA MB |" if has_cuda else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for policy, turns, c in rows:
        if c is None:
            lines.append(f"| {policy} | {turns} | failed |")
            continue
        line = (
            f"| {policy} | {turns} | {c['turns_played']:.0f} | {c['rollout_s']:.1f} | {c['update_s']:.2f} "
            f"| {c['step_s']:.2f} | {c['rows']:.0f} "
            f"| {c['tokens_per_episode']:.0f} | {c['last_prompt']:.0f} | {c['peak_rss_mb']:.0f} |"
        )
        lines.append(line + (f" {c.get('peak_cuda_mb', 0):.0f} |" if has_cuda else ""))
    lines.append("")
    lines.append(f"{args.episodes} episodes per cell, window {args.window}; after: {load_average()}")
    return "\n".join(lines)


def learn_table(args: argparse.Namespace) -> str:
    print(f"before: {load_average()}", flush=True)
    lines = ["| policy | seed | greedy before RL | greedy after RL | minutes |", "|---|---|---|---|---|"]
    for policy in args.policies:
        for seed in args.seeds:
            run_dir = Path(tempfile.mkdtemp(prefix=f"long-horizon-{policy}-{seed}-"))
            cmd = [sys.executable, "-m", "agentgym.cli", "train", "--env", "frozenlake_long"]
            cmd += [f"actor_rollout_ref.rollout.multi_turn.context_policy={policy}", f"trainer.seed={seed}"]
            cmd += [f"trainer.total_training_steps={args.learn}", f"trainer.default_local_dir={run_dir}"]
            if policy == "full":
                cmd += ["trainer.step_wise_training=false", "data.max_response_length=8192"]
            started = time.perf_counter()
            code = subprocess.call(cmd, cwd=ROOT)
            minutes = (time.perf_counter() - started) / 60
            report = run_dir / "held_out.json"
            if code != 0 or not report.is_file():
                lines.append(f"| {policy} | {seed} | failed (exit {code}) | | {minutes:.1f} |")
                continue
            held = json.loads(report.read_text())["policies"]
            start = next(label for label in held if label != "after RL")
            before, after = held[start]["0.0"]["success"], held["after RL"]["0.0"]["success"]
            lines.append(f"| {policy} | {seed} | {before:.3f} | {after:.3f} | {minutes:.1f} |")
    lines += ["", f"{args.learn} RL steps per run; after: {load_average()}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", choices=("cost", "learn"), default="cost")
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--episodes", type=int, default=4, help="episodes per cell (one GRPO group)")
    parser.add_argument("--window", type=int, default=4, help="multi_turn.context_window")
    parser.add_argument("--learn", type=int, default=10, help="learn: RL steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--one", nargs=2, metavar=("POLICY", "TURNS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        cell = one_cell(args.one[0], int(args.one[1]), args.episodes, args.window)
        print("RESULT " + json.dumps(cell), flush=True)
        return 0
    print(cost_table(args) if args.table == "cost" else learn_table(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
