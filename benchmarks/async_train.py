"""Asynchronous vs synchronous training on a long-tail multi-turn workload, in one run.

    python benchmarks/async_train.py                     # both back-ends
    python benchmarks/async_train.py --backend standin   # (i) only; --backend real: (ii) only

The workload: every task is a group of ``--n`` episodes of a multi-turn env whose episodes take
``--turns`` turns (give or take one), except ``--long-frac`` of them (10%) that take
``--long-factor`` (8) times as many; each turn samples ``--tokens`` tokens. Three ways to train on it, each for the
same number
of samples: ``sync`` (the synchronous trainer: generate a step's groups, update, push), ``async``
(``async_ppo_trainer``: ``--staleness``, a push every ``--sync-every`` updates, checkpoint engine on,
no partial rollout) and ``async+partial`` (the same with ``partial_rollout``).

Back-ends:

(i) ``standin``: a modelled GPU engine (``tests/support/standin_server.EngineStandin`` in a child
    process): one decode step every ``--step-ms`` ms for up to ``--cap`` sequences whatever their
    number, so a half-empty batch wastes as much time as a full one; a weight load takes
    ``--load-ms``; the trainer's update is modelled as ``--update-s`` seconds on its own pool. The
    rollout runner, the DataPool, admission control, batch choice and the pushes are agentgym's
    own (``AsyncCoordinator``, the code the asynchronous trainer runs): this measures the
    scheduling itself, free of this machine's cores.
(ii) ``real``: ``agentgym.trainer.run.train`` with the embedded server and the tiny model, real
    GRPO updates, in one process (``trainer.use_ray=false``): an honest figure for this CPU, where
    rollout and training share two cores.

Prints, per back-end, wall time and samples/s of each way and the speed-up over ``sync``, the
engine's batch occupancy and the generations its pushes aborted (i), and the version-lag histogram
of the trained samples.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from agentgym.envs.base import TextEnv  # noqa: E402


class LongTailEnv(TextEnv):
    """Multi-turn: ``turns - 1`` to ``turns + 1`` turns (uniform), ``long_factor`` times as many for a
    ``long_frac`` share of seeds."""

    max_turns = None

    def __init__(
        self, turns: int = 2, long_frac: float = 0.1, long_factor: int = 8, render_mode: str | None = None
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.turns, self.long_frac, self.long_factor = turns, long_frac, long_factor

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        rng = random.Random(seed)
        base = rng.randint(max(1, self.turns - 1), self.turns + 1)  # jitter: episodes do not finish in waves
        self.left = base * (self.long_factor if rng.random() < self.long_frac else 1)
        self.total = self.left
        return [{"role": "user", "content": f"Task {seed}: think aloud."}], {}

    def step(self, action):
        self.left -= 1
        done = self.left <= 0
        info = {"outcome_reward": float(random.random() < 0.5), "metrics": {"turns_planned": float(self.total)}}
        return ([] if done else [{"role": "user", "content": "Go on."}]), 0.0, done, False, info if done else {}


# ---- (i) the modelled GPU engine -----------------------------------------------------------------------------
class RunnerSource:
    """next_tasks / run_task over a RolloutRunner (what EnvRolloutSource does for the trainer)."""

    resumes_aborted = True

    def __init__(self, runner: Any, batch: int) -> None:
        self.runner, self.batch, self.next_seed = runner, batch, 0

    async def next_tasks(self) -> list[dict[str, Any]]:
        out = [{"seed": self.next_seed + i} for i in range(self.batch)]
        self.next_seed += self.batch
        return out

    async def run_task(self, task: dict[str, Any], group_id: str) -> list[Any]:
        from agentgym.rollout.runner import Task

        return (await self.runner.run([Task(seed=task["seed"])])).trajectories


async def _post(url: str, path: str, body: dict[str, Any]) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=600) as http:
        (await http.post(url + path, json=body)).raise_for_status()


async def standin_run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from agentgym.client import PolicyClient
    from agentgym.rollout.data_pool import DataPool, PoolClient
    from agentgym.rollout.runner import RolloutConfig, RolloutRunner, Task
    from agentgym.trainer.async_loop import AsyncCoordinator
    from agentgym.trainer.staleness import StalenessPlan
    from tests.support.standin_server import start_engine_standin

    engine = start_engine_standin(args.step_ms, args.cap, args.load_ms)
    partial = mode == "async+partial"
    config = RolloutConfig(
        n=args.n,
        max_tokens=args.tokens,
        response_length=1 << 20,
        partial_rollout=partial,
        env_executor="inline",
        template_check_every=0,
        max_concurrency=4 * args.cap,
    )
    env_kwargs = {"turns": args.turns, "long_frac": args.long_frac, "long_factor": args.long_factor}
    lags: collections.Counter[int] = collections.Counter()
    try:
        async with PolicyClient(engine.url) as client:
            runner = RolloutRunner(LongTailEnv, client, "tiny", config, env_kwargs=env_kwargs)

            async def push(version: int, snapshot: Any, abort: bool) -> dict[str, float]:
                await _post(engine.url, "/pause_generation", {"mode": "abort" if abort else "wait"})
                await _post(engine.url, "/update_weights", {"weight_version": version})
                await _post(engine.url, "/resume_generation", {})
                return {}

            started = time.perf_counter()
            samples = 0
            if mode == "sync":
                for step in range(1, args.steps + 1):
                    tasks = [Task(seed=(step - 1) * args.batch + i) for i in range(args.batch)]
                    result = await runner.run(tasks)
                    samples += len(result.trajectories)
                    lags.update(step - 1 - t.oldest_version() for t in result.trajectories)
                    await asyncio.sleep(args.update_s)  # the update, on the trainer's pool
                    await push(step, None, False)
            else:
                plan = StalenessPlan(args.batch, args.sync_every, args.staleness, total_tasks=args.steps * args.batch)
                coordinator = AsyncCoordinator(
                    RunnerSource(runner, args.batch),
                    PoolClient(DataPool()),
                    plan,
                    push,
                    partial_rollout=partial,
                    snapshot=lambda: None,
                    max_tasks_in_flight=max(1, (4 * args.cap) // args.n),
                )
                for step in range(1, args.steps + 1):
                    trajectories, _, _ = await coordinator.next_batch(step)
                    samples += len(trajectories)
                    await asyncio.sleep(args.update_s)
                    await coordinator.after_update(step, last=step == args.steps)
                await coordinator.wait_push()
                await coordinator.stop()
                lags = coordinator.lag_histogram
            wall = time.perf_counter() - started
            await runner.aclose()
            import httpx

            stats = httpx.get(engine.url + "/stats").json()
    finally:
        engine.kill()
        engine.wait()
    occupancy = stats["sequence_steps"] / max(1, stats["steps"] * args.cap)
    return {
        "mode": mode,
        "wall_s": wall,
        "samples": samples,
        "samples_per_s": samples / wall,
        "occupancy": occupancy,
        "aborted": stats["aborted"],
        "lags": dict(sorted(lags.items())),
    }


# ---- (ii) the real trainer ----------------------------------------------------------------------------------------
def real_run(mode: str, args: argparse.Namespace, directory: str) -> dict[str, Any]:
    import agentgym
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    with contextlib.suppress(ValueError):  # registered by an earlier run in this process
        agentgym.register("longtail-bench", LongTailEnv)
    overrides = [
        f"trainer.default_local_dir={directory}/{mode}",
        "trainer.logger=[jsonl]",
        "trainer.use_ray=false",
        f"trainer.total_training_steps={args.real_steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_hf_model=false",
        "trainer.resume_mode=disable",
        "env.name=longtail-bench",
        "env.executor=inline",
        f"+env.kwargs.turns={args.turns}",
        f"+env.kwargs.long_frac={args.long_frac}",
        f"+env.kwargs.long_factor={args.long_factor}",
        f"data.train_batch_size={args.real_batch}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.max_tokens_per_turn={args.real_tokens}",
        "data.max_prompt_length=256",
        f"data.max_response_length={4096}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.real_batch}",
    ]
    if mode != "sync":
        overrides += [
            f"async_training.staleness_threshold={args.staleness}",
            f"async_training.trigger_parameter_sync_step={args.sync_every}",
            f"async_training.partial_rollout={'true' if mode == 'async+partial' else 'false'}",
        ]
    cfg = load_config(config_name=None if mode == "sync" else "async_ppo_trainer", overrides=overrides)
    summary = train(cfg, show_progress=False)
    samples = args.real_steps * args.real_batch * args.n
    return {
        "mode": mode,
        "wall_s": summary["seconds"],
        "samples": samples,
        "samples_per_s": samples / summary["seconds"],
        "lags": summary.get("lag_histogram") or {0: samples},
    }


# ---- tables --------------------------------------------------------------------------------------------------------
def table(title: str, rows: list[dict[str, Any]]) -> str:
    base = rows[0]["samples_per_s"]
    lines = [
        title,
        f"{'mode':<15}{'wall s':>9}{'samples':>9}{'samples/s':>11}{'speed-up':>10}"
        + (f"{'engine busy':>13}{'aborted':>9}" if "occupancy" in rows[0] else ""),
    ]
    for r in rows:
        speedup = r["samples_per_s"] / base
        line = f"{r['mode']:<15}{r['wall_s']:>9.1f}{r['samples']:>9}{r['samples_per_s']:>11.2f}{speedup:>9.2f}x"
        if "occupancy" in r:
            line += f"{100 * r['occupancy']:>12.0f}%{r['aborted']:>9}"
        lines.append(line)
    lines.append("version lag of trained samples (lag: samples):")
    for r in rows:
        total = sum(r["lags"].values())
        hist = "  ".join(f"{lag}: {count} ({100 * count / total:.0f}%)" for lag, count in r["lags"].items())
        lines.append(f"  {r['mode']:<13} {hist}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["both", "standin", "real"], default="both")
    parser.add_argument("--batch", type=int, default=8, help="tasks per update (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="episodes per task")
    parser.add_argument("--steps", type=int, default=16, help="updates (stand-in back-end)")
    parser.add_argument("--turns", type=int, default=2, help="turns of a normal episode")
    parser.add_argument("--long-frac", type=float, default=0.1)
    parser.add_argument("--long-factor", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per turn (stand-in back-end)")
    parser.add_argument("--step-ms", type=float, default=20.0, help="one decode step of the modelled engine")
    parser.add_argument("--cap", type=int, default=64, help="sequences the modelled engine decodes at once")
    parser.add_argument("--load-ms", type=float, default=200.0, help="a weight load in the modelled engine")
    parser.add_argument("--update-s", type=float, default=1.5, help="the modelled trainer update")
    parser.add_argument("--staleness", type=float, default=0.1, help="async_training.staleness_threshold")
    parser.add_argument("--sync-every", type=int, default=4, help="async_training.trigger_parameter_sync_step")
    parser.add_argument("--real-steps", type=int, default=8)
    parser.add_argument("--real-batch", type=int, default=4)
    parser.add_argument("--real-tokens", type=int, default=16)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    modes = ("sync", "async", "async+partial")
    print(
        f"workload: {args.n} episodes per task, {args.turns}+-1 turns each, {100 * args.long_frac:.0f}% of episodes "
        f"{args.long_factor}x longer; async: staleness_threshold {args.staleness}, push every {args.sync_every} "
        f"updates, checkpoint engine on",
        flush=True,
    )
    if args.backend in ("both", "standin"):
        print(
            f"\n(i) modelled GPU engine: decode step {args.step_ms:g} ms for up to {args.cap} sequences, weight load "
            f"{args.load_ms:g} ms, update {args.update_s:g} s on the trainer's pool; {args.steps} updates x "
            f"{args.batch} tasks x {args.n} episodes, {args.tokens} tokens per turn",
            flush=True,
        )
        rows = [asyncio.run(standin_run(mode, args)) for mode in modes]
        print(table("", rows), flush=True)
    if args.backend in ("both", "real"):
        print(
            f"\n(ii) embedded server + tiny model + real GRPO updates, in one process on this machine's CPU; "
            f"{args.real_steps} updates x {args.real_batch} tasks x {args.n} episodes, {args.real_tokens} tokens "
            f"per turn",
            flush=True,
        )
        with tempfile.TemporaryDirectory() as directory:
            rows = [real_run(mode, args, directory) for mode in modes]
        print(table("", rows), flush=True)
    print(json.dumps({"note": "timings from a shared 2-core machine"}))


if __name__ == "__main__":
    main()
