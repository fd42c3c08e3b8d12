"""Long episodes with the whole history, a history window and a summary (docs/long_horizon.md).

The task is ``configs/env/frozenlake_long.yaml`` (FrozenLake 8x8 on slippery ice, one move a turn).
Two tables:

* **cost** (default): for each context policy and episode length (``--turns``, default 10 20 40),
  ``--episodes`` episodes rolled out by the built-in tiny model (random weights: its replies are not
  moves, so nothing moves and every episode lasts exactly its turn budget), then one PPO update on them
  (``full``: one row per episode; ``window`` / ``compact``: per-turn samples, ``trainer.step_wise_training``).
  Per cell: rollout seconds, update seconds (``timing_s/update_actor``), the trainer's step seconds,
  seconds per turn played (rollout and step) and its ratio to the same policy's shortest episodes, peak
  resident memory (``ru_maxrss``: after the rollout, and for the whole step; one process holds the server,
  a thread, the runner and the trainer) with its ratio, the same peak over what the imports alone hold, (on
  a GPU also ``torch.cuda.max_memory_allocated``), tokens processed per episode
  (``Trajectory.processed_tokens``: every turn's prompt and reply) and the last turn's prompt. Each cell
  runs in a child process of its own (the memory figure is its own).
* **learn** (``--table learn``): the same wall clock of RL per context policy. One warm start for all
  (``--demos`` expert episodes, ``--sft-steps`` SFT steps on whole-history rows, the cheapest layout to train;
  both policies start from it), the start model scored greedy on ``--tasks`` held-out lakes under each policy's
  context, then per seed (``--seeds``) and policy ``agentgym train`` from that model with
  ``trainer.total_training_minutes=--minutes`` (the run ends after the step that passes it), the final
  model scored the same way. Prints each run's steps and minutes, its held-out success, and per seed the
  paired difference (second policy minus first, over the same lakes) with its standard error, then the
  mean over seeds with the standard error over seeds. ``full`` keeps the model's 4096 positions: an
  episode whose history passes them ends there, truncated. ``--map-seed N`` plays one lake in every
  episode (with a new lake per episode the short warm starts tried on this CPU solved none; on map 16
  the expert wins 85% in 30 turns on average). ``--warm-model DIR`` reuses an earlier warm start's model
  (its run root's ``warm/warm_start/sft/huggingface``); ``--override KEY=VALUE`` (repeatable) reaches every RL
  run, e.g. a learning rate. ``--adapt-steps N`` gives each policy its own start: N more SFT steps from the
  shared warm start on the same demos, each reply on the prompt that policy shows (a window's rows for
  ``window``), so neither policy starts from a model trained on the other's prompts.

    nice -n 10 python benchmarks/long_horizon.py                       # the cost table
    nice -n 10 python benchmarks/long_horizon.py --turns 10 20 --episodes 2 --policies full window
    nice -n 10 python benchmarks/long_horizon.py --table learn --policies full window --minutes 5 \\
        --seeds 1 2 3 --map-seed 16 --demos 200 --sft-steps 300 --tasks 40 --run-root runs/long-horizon-learn \\
        --override actor_rollout_ref.actor.optim.lr=1e-5 --adapt-steps 30

The load average is printed with every table: the machine these figures come from may be shared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
        base_rss = max_rss_mb()  # the process with its imports: what every cell pays whatever its length
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
            rollout_rss = max_rss_mb()  # the server (a thread here) and the runner, at their peak
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
        "base_rss_mb": base_rss,
        "rollout_rss_mb": rollout_rss,
        "peak_rss_mb": max_rss_mb(),  # the whole step: server, runner and trainer (one process)
    }
    if torch.cuda.is_available():
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def max_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    head = "| policy | turns | played | rollout s | update s | step s | s / turn | x | rows | tokens / episode |"
    head += " last prompt | RSS rollout MB | peak RSS MB | x | over imports MB | x |"
    head += " peak CUDA MB |" if has_cuda else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    first: dict[str, dict[str, float]] = {}  # each policy's shortest episodes: the ratios' base
    for policy, turns, c in rows:
        if c is None:
            lines.append(f"| {policy} | {turns} | failed |")
            continue
        c = {**c, **per_step(c)}
        base = first.setdefault(policy, c)
        line = (
            f"| {policy} | {turns} | {c['turns_played']:.0f} | {c['rollout_s']:.1f} | {c['update_s']:.2f} "
            f"| {c['step_s']:.2f} | {c['s_per_turn']:.3f} | {c['s_per_turn'] / base['s_per_turn']:.2f} "
            f"| {c['rows']:.0f} | {c['tokens_per_episode']:.0f} | {c['last_prompt']:.0f} "
            f"| {c['rollout_rss_mb']:.0f} | {c['peak_rss_mb']:.0f} | {c['peak_rss_mb'] / base['peak_rss_mb']:.2f} "
            f"| {c['growth_mb']:.0f} | {c['growth_mb'] / max(base['growth_mb'], 1.0):.2f} |"
        )
        lines.append(line + (f" {c.get('peak_cuda_mb', 0):.0f} |" if has_cuda else ""))
    lines.append("")
    lines.append(
        f"{args.episodes} episodes per cell, window {args.window}. s / turn: (rollout s + step s) / turns played "
        "(step s: the trainer's step on the rolled-out episodes: log-probs and the update); x: over the same "
        "policy's shortest episodes. RSS: one process holds the server (a thread), the runner and the trainer; "
        "over imports: peak RSS minus the RSS before the server started."
    )
    lines.append(f"after: {load_average()}")
    return "\n".join(lines)


def per_step(c: dict[str, float]) -> dict[str, float]:
    """A cell's figures per turn played, and its memory over what the imports alone hold."""
    return {
        "s_per_turn": (c["rollout_s"] + c["step_s"]) / max(c["turns_played"], 1.0),
        "growth_mb": c["peak_rss_mb"] - c.get("base_rss_mb", 0.0),
    }


LEARN_COMMON = [
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[jsonl]",
    "held_out.enable=false",  # scored here instead: the start model once per policy, not once per run
]


def policy_overrides(policy: str) -> list[str]:
    """``full``: one row per episode, whose whole history must fit the model (4096 positions: a longer
    episode ends there, truncated); ``window`` / ``compact``: the preset (per-turn rows)."""
    out = [f"actor_rollout_ref.rollout.multi_turn.context_policy={policy}"]
    if policy == "full":
        out += ["trainer.step_wise_training=false", f"data.max_response_length={MODEL_LEN - 1024}"]
    return out


def task_overrides(args: argparse.Namespace) -> list[str]:
    """The learn table's lake (``--map-seed``: one fixed lake for every episode, held-out ones included) and
    window (``--window``), for the warm start, every run and every score alike."""
    out = [f"actor_rollout_ref.rollout.multi_turn.context_window={args.window}"]
    return out + ([f"env.kwargs.map_seed={args.map_seed}"] if args.map_seed is not None else [])


def task_flags(args: argparse.Namespace) -> list[str]:
    """``task_overrides``' flags, for a child process of this script."""
    return ["--window", str(args.window)] + (["--map-seed", str(args.map_seed)] if args.map_seed is not None else [])


def warm_start_model(
    directory: str, demos: int, sft_steps: int, extra: list[str], policy: str = "full", adapt: list[str] | None = None
) -> str:
    """One warm start for every policy and seed: expert demos, then SFT on whole-history rows (``policy``
    ``full``). With ``adapt`` (a model and its demos file): SFT continued from that model on the same demos,
    each reply on the prompt ``policy`` shows it (a window's rows for ``window``)."""
    from agentgym.stages.warm_start import run_warm_start
    from agentgym.trainer.config import load_config

    start = [f"actor_rollout_ref.model.path={adapt[0]}", f"warm_start.demos_file={adapt[1]}"] if adapt else []
    cfg = load_config(
        env="frozenlake_long",
        overrides=[
            *policy_overrides(policy),
            f"warm_start.demos={demos}",
            f"warm_start.sft.trainer.total_training_steps={sft_steps}",
            "warm_start.sft.data.train_batch_size=4",
            f"warm_start.sft.data.max_length={MODEL_LEN}",
            "warm_start.sft.data.truncation=skip",  # a demo longer than the model's context is left out
            f"trainer.default_local_dir={directory}",
            *start,
            *extra,
        ],
    )
    return str(run_warm_start(cfg, show_progress=False))


def adapt_models(args: argparse.Namespace, model: str, root: Path) -> dict[str, str] | None:
    """Each policy's own start: ``--adapt-steps`` more SFT steps from the shared warm start on the same
    demos, laid out as that policy's prompts (the same steps and demos for every policy)."""
    demos = Path(model).parents[1] / "demos" / "demos.jsonl"  # <run>/warm_start/sft/huggingface
    if not demos.is_file():
        print(f"--adapt-steps: no demos beside the warm start ({demos})", file=sys.stderr, flush=True)
        return None
    models = {}
    for policy in args.policies:
        t0 = time.perf_counter()
        directory = str(root / f"adapt-{policy}")
        adapt = ["--adapt", policy, model, str(demos), directory, str(args.adapt_steps), *task_flags(args)]
        found = child(adapt, root / f"adapt-{policy}.log")
        if found is None:
            return None
        models[policy] = found
        print(f"adapted for {policy}: {(time.perf_counter() - t0) / 60:.1f} min -> {found}", flush=True)
    return models


def turn_overrides(turns: int) -> list[str]:
    """The lake's step budget and the turn limit (the preset: 50)."""
    return [f"env.kwargs.max_steps={turns}", f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={turns}"]


def held_out_scores(
    policy: str, model: str, tasks: int, directory: str, turns: int, extra: list[str]
) -> dict[str, Any]:
    """Greedy success of ``model`` on the held-out tasks under ``policy``'s context, per task."""
    from agentgym.stages.held_out import score_model
    from agentgym.trainer.config import load_config

    overrides = [*policy_overrides(policy), *turn_overrides(turns), f"held_out.num_tasks={tasks}", *extra]
    overrides.append(f"trainer.default_local_dir={directory}")
    cfg = load_config(env="frozenlake_long", overrides=overrides)
    score = score_model(cfg, model, 0.0, f"{policy} greedy", show_progress=False)
    return {"per_task": score.per_task, "seconds": score.seconds}


def child(args: list[str], log: Path) -> Any:
    """Run this script with ``args`` in a child process (its own memory); its RESULT line, or None."""
    cmd = [sys.executable, __file__, *args]
    with log.open("a") as out:
        code = subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=child_env())
    lines = [line for line in log.read_text().splitlines() if line.startswith("RESULT ")]
    if code != 0 or not lines:
        print(f"{' '.join(args)} failed (exit {code}): see {log}", file=sys.stderr, flush=True)
        return None
    return json.loads(lines[-1][len("RESULT ") :])


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of a - b over paired items and its standard error, ``std(d) / sqrt(n)``."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / max(n - 1, 1)
    return mean, math.sqrt(var / n)


def learn_table(args: argparse.Namespace) -> str:
    """The same warm start, then RL for the same wall clock per policy and seed, scored greedy held out."""
    root = Path(args.run_root or tempfile.mkdtemp(prefix="long-horizon-learn-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"before: {load_average()}; run dirs under {root}", flush=True)
    started = time.perf_counter()
    if args.warm_model:
        model, warm_min = args.warm_model, 0.0
        print(f"warm start: reused {model}", flush=True)
    else:
        warm = ["--warm", str(root / "warm"), str(args.demos), str(args.sft_steps), *task_flags(args)]
        model = child(warm, root / "warm.log")
        if model is None:
            return "the warm start failed"
        warm_min = (time.perf_counter() - started) / 60
        print(f"warm start: {warm_min:.1f} min -> {model}", flush=True)
    models = adapt_models(args, model, root) if args.adapt_steps else dict.fromkeys(args.policies, model)
    if models is None:
        return "adapting the warm start failed"
    scores: dict[tuple[str, str], dict[str, Any]] = {}
    for policy in args.policies:
        start_dir = str(root / f"start-{policy}")
        scored = ["--score", policy, models[policy], str(args.tasks), start_dir, str(args.max_turns)]
        found = child([*scored, *task_flags(args)], root / "score.log")
        scores[(policy, "start")] = found
        print(f"  start model under {policy}: {summary_of(found)}", flush=True)
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in args.seeds:
        for policy in args.policies:
            run_dir = root / f"{policy}-seed{seed}"
            cmd = [sys.executable, "-m", "agentgym.cli", "train", "--env", "frozenlake_long", *LEARN_COMMON]
            cmd += [*policy_overrides(policy), *turn_overrides(args.max_turns), "warm_start.enable=false"]
            cmd += task_overrides(args)
            cmd += [f"data.train_batch_size={args.batch}", f"actor_rollout_ref.rollout.n={args.n}"]
            cmd += [f"actor_rollout_ref.model.path={models[policy]}"]
            cmd += [f"trainer.seed={seed}", f"trainer.total_training_steps={args.max_steps}"]
            cmd += [f"trainer.total_training_minutes={args.minutes}", f"trainer.default_local_dir={run_dir}"]
            cmd += args.override
            t0 = time.perf_counter()
            with (root / f"{policy}-seed{seed}.log").open("w") as out:
                code = subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=child_env())
            wall = (time.perf_counter() - t0) / 60
            metrics = run_dir / "metrics.jsonl"
            rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
            step_min = sum(r.get("timing_s/step", 0.0) for r in rows) / 60
            hf = run_dir / "huggingface"
            found = None
            if code == 0 and hf.is_dir():
                scored = ["--score", policy, str(hf), str(args.tasks), str(run_dir / "held_out"), str(args.max_turns)]
                found = child([*scored, *task_flags(args)], root / "score.log")
            runs[(policy, seed)] = {"steps": len(rows), "step_min": step_min, "wall_min": wall, "code": code}
            scores[(policy, str(seed))] = found
            print(f"  {policy} seed {seed}: {runs[(policy, seed)]}, held out {summary_of(found)}", flush=True)
            record = {
                "scores": {"/".join(k): v for k, v in scores.items()},
                "runs": {f"{p}/{s}": v for (p, s), v in runs.items()},
            }
            (root / "learn.json").write_text(json.dumps(record))  # every figure so far, per task
    return learn_report(args, scores, runs, warm_min)


def summary_of(found: dict[str, Any] | None) -> str:
    if not found:
        return "failed"
    p = sum(found["per_task"]) / len(found["per_task"])
    return f"{p:.3f} ({len(found['per_task'])} tasks, {found['seconds']:.0f} s)"


def learn_report(args: argparse.Namespace, scores: dict, runs: dict, warm_min: float) -> str:
    head = "| policy | seed | RL steps | minutes of steps | run minutes | greedy held-out success |"
    lines = [head, "|---|---|---|---|---|---|"]
    for policy in args.policies:
        start = f"start (warm start + {args.adapt_steps} SFT steps on its prompts)" if args.adapt_steps else "start"
        lines.append(f"| {policy} | {start} | 0 | | | {summary_of(scores.get((policy, 'start')))} |")
        for seed in args.seeds:
            r = runs[(policy, seed)]
            lines.append(
                f"| {policy} | {seed} | {r['steps']} | {r['step_min']:.1f} | {r['wall_min']:.1f} "
                f"| {summary_of(scores.get((policy, str(seed))))} |"
            )
    lines.append("")
    if len(args.policies) == 2:
        a, b = args.policies[1], args.policies[0]
        lines.append(f"{a} minus {b}, greedy held-out success (paired over the same tasks):")
        per_seed = []
        for seed in args.seeds:
            sa, sb = scores.get((a, str(seed))), scores.get((b, str(seed)))
            if not sa or not sb:
                lines.append(f"  seed {seed}: a run failed")
                continue
            mean, se = paired(sa["per_task"], sb["per_task"])
            per_seed.append(mean)
            lines.append(f"  seed {seed}: {mean:+.3f} ± {se:.3f} (paired SE over {len(sa['per_task'])} tasks)")
        if len(per_seed) > 1:
            mean = sum(per_seed) / len(per_seed)
            se = math.sqrt(sum((d - mean) ** 2 for d in per_seed) / (len(per_seed) - 1) / len(per_seed))
            lines.append(f"  mean over {len(per_seed)} seeds: {mean:+.3f} ± {se:.3f} (SE over seeds)")
    lake = f" (one lake, map_seed={args.map_seed}: they differ in where it slips)" if args.map_seed is not None else ""
    warm = (
        f"reused ({args.warm_model})"
        if args.warm_model
        else f"{args.demos} expert episodes, {args.sft_steps} SFT steps on whole-history rows, {warm_min:.1f} min"
    )
    if args.adapt_steps:
        warm += f", then {args.adapt_steps} SFT steps on the same demos per policy, on its own prompts"
    overrides = f" with {' '.join(args.override)}" if args.override else ""
    lines.append(
        f"warm start (shared): {warm}; RL{overrides}: {args.batch} tasks x {args.n} episodes a step, "
        f"up to {args.max_turns} turns, "
        f"trainer.total_training_minutes={args.minutes:g} per run (the run ends after the step that passes it), "
        f"{args.tasks} held-out tasks{lake}"
        f"; window {args.window}; after: {load_average()}"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", choices=("cost", "learn"), default="cost")
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--episodes", type=int, default=4, help="episodes per cell (one GRPO group)")
    parser.add_argument("--window", type=int, default=4, help="multi_turn.context_window")
    parser.add_argument("--minutes", type=float, default=5.0, help="learn: RL wall clock per run (minutes of steps)")
    parser.add_argument("--max-steps", type=int, default=1000, help="learn: RL steps at most (the clock ends it first)")
    parser.add_argument("--demos", type=int, default=60, help="learn: expert episodes of the shared warm start")
    parser.add_argument("--sft-steps", type=int, default=30, help="learn: SFT steps (of 4 episodes) of the warm start")
    parser.add_argument("--tasks", type=int, default=40, help="learn: held-out tasks scored greedy")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--run-root", help="learn: where the run dirs go (default: a new temporary directory)")
    parser.add_argument("--one", nargs=2, metavar=("POLICY", "TURNS"), help=argparse.SUPPRESS)
    parser.add_argument("--warm", nargs=3, metavar=("DIR", "DEMOS", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--map-seed", type=int, default=None, help="learn: one fixed lake (env.kwargs.map_seed) for every episode"
    )
    parser.add_argument("--max-turns", type=int, default=50, help="learn: RL and held-out turn limit (the lake's)")
    parser.add_argument("--batch", type=int, default=2, help="learn: data.train_batch_size (tasks per RL step)")
    parser.add_argument("--n", type=int, default=4, help="learn: actor_rollout_ref.rollout.n (episodes per task)")
    parser.add_argument("--warm-model", help="learn: a warm start's model to reuse (no demos, no SFT)")
    parser.add_argument(
        "--adapt-steps",
        type=int,
        default=0,
        help="learn: continue the warm start's SFT this many steps per policy, on rows laid out as its prompts",
    )
    adapt_meta = ("POLICY", "MODEL", "DEMOS", "DIR", "STEPS")
    parser.add_argument("--adapt", nargs=5, metavar=adapt_meta, help=argparse.SUPPRESS)
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="learn: a config override for every RL run (repeatable), e.g. actor_rollout_ref.actor.optim.lr=1e-5",
    )
    parser.add_argument(
        "--score", nargs=5, metavar=("POLICY", "MODEL", "TASKS", "DIR", "TURNS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one or args.warm or args.score or args.adapt:
        if args.one:
            found: Any = one_cell(args.one[0], int(args.one[1]), args.episodes, args.window)
        elif args.warm:
            found = warm_start_model(args.warm[0], int(args.warm[1]), int(args.warm[2]), task_overrides(args))
        elif args.adapt:
            policy, base, demos, directory, steps = args.adapt
            found = warm_start_model(directory, 1, int(steps), task_overrides(args), policy, [base, demos])
        else:
            score = args.score
            found = held_out_scores(score[0], score[1], int(score[2]), score[3], int(score[4]), task_overrides(args))
        print("RESULT " + json.dumps(found), flush=True)
        return 0
    print(cost_table(args) if args.table == "cost" else learn_table(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
