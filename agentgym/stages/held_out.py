"""The held-out evaluation: success on levels no stage trained on, before and after RL.

    held_out:
      enable: true
      num_tasks: 200          # seeds env.val_seed_start .. + num_tasks - 1
      temperatures: [0.0, 1.0]  # greedy (the judged figure), and sampled beside it
      random_policy: true     # the env's random_action() as a floor (envs that have one)

``agentgym train`` with ``held_out.enable`` scores the model RL started from (after the warm
start: the SFT model) and the final model on the same tasks, then prints the table with
standard errors: binomial ``sqrt(p (1 - p) / n)`` per row, and for RL minus the start the
paired standard error over tasks (the same levels scored twice), ``std(d) / sqrt(n)``; for envs
that say whether a reply was well formed (Sokoban), the share of malformed replies at each turn
(``Score.turns``: a reply not well formed, or cut at the token cap), so a gain cannot hide a policy
that degenerates where the success rate does not look.
Every seed a stage trains on (demos, RL tasks) is checked to lie outside the held-out range
before any work starts.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError


@dataclass
class Score:
    """Success of one policy on the held-out tasks, per task in seed order."""

    label: str
    temperature: float | None  # None: not a model (the random policy)
    per_task: list[float]
    seconds: float = 0.0
    turns: dict[str, float] = field(default_factory=dict)  # per-turn metrics: turn{k}/reached, turn{k}/malformed

    def malformed(self) -> list[float]:
        """The share of malformed replies at each turn (envs that say whether a reply was well formed)."""
        return [self.turns[f"turn{k}/malformed"] for k in range(1, 100) if f"turn{k}/malformed" in self.turns]

    @property
    def success(self) -> float:
        return sum(self.per_task) / max(len(self.per_task), 1)

    @property
    def se(self) -> float:
        p, n = self.success, max(len(self.per_task), 1)
        return math.sqrt(p * (1 - p) / n)


def held_out_range(cfg: DictConfig) -> range:
    start = cfg.env.val_seed_start
    return range(start, start + cfg.held_out.num_tasks)


def rl_seed_range(cfg: DictConfig) -> range | None:
    """The seeds RL trains on for a generated env (task k is ``train_seed_start + k``); None when
    the length is given in epochs of a dataset (no seeds)."""
    steps = cfg.trainer.total_training_steps
    if steps is None:
        return None
    start = cfg.env.train_seed_start
    return range(start, start + int(steps) * cfg.data.train_batch_size)


def check_disjoint(cfg: DictConfig, trained: dict[str, range | None]) -> None:
    """A ConfigError naming the fix when any training seed range overlaps the held-out seeds."""
    held = held_out_range(cfg)
    for what, seeds in trained.items():
        if seeds is None or not len(seeds):
            continue
        low, high = max(seeds.start, held.start), min(seeds.stop, held.stop)
        if low < high:
            raise ConfigError(
                f"{what} seeds {seeds.start}..{seeds.stop - 1} overlap the held-out seeds "
                f"{held.start}..{held.stop - 1} "
                f"(env.val_seed_start, held_out.num_tasks): move one of them, e.g. env.val_seed_start={seeds.stop}"
            )


def env_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """The validation env's arguments (``env.kwargs`` with ``env.val_kwargs`` over them)."""
    kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) or {}
    return {**kwargs, **(OmegaConf.to_container(cfg.env.val_kwargs, resolve=True) or {})}


def score_model(cfg: DictConfig, model_dir: str, temperature: float, label: str, show_progress: bool = True) -> Score:
    """Run the held-out tasks once each on an embedded server over ``model_dir``."""
    import time

    from agentgym.client import PolicyClient
    from agentgym.model import load_tokenizer
    from agentgym.rollout.chat import ChatTokenizer
    from agentgym.rollout.metrics import per_turn_metrics
    from agentgym.rollout.runner import RolloutConfig, RolloutRunner
    from agentgym.server.launch import start_embedded_server

    rollout = cfg.actor_rollout_ref.rollout
    seeds = held_out_range(cfg)
    max_len = cfg.data.max_prompt_length + cfg.data.max_response_length
    concurrency = rollout.concurrency
    # the run's own executor where it needs nothing else; threads for the remote and worker kinds
    executor = str(cfg.env.executor) if cfg.env.executor in ("thread", "inline", "process") else "thread"

    async def run() -> list[Any]:
        server = await asyncio.to_thread(
            start_embedded_server,
            model=model_dir,
            port=0,
            max_batch_size=concurrency,
            max_model_len=max_len,
            device=str(rollout.device) if rollout.device else None,
            kv_cache_memory_bytes=rollout.kv_cache_memory_bytes,
        )
        try:
            async with PolicyClient([server.url], backend="embedded") as client:
                config = RolloutConfig(
                    n=1,
                    temperature=temperature,
                    max_tokens=rollout.max_tokens_per_turn,
                    prompt_length=cfg.data.max_prompt_length,
                    response_length=cfg.data.max_response_length,
                    max_model_len=max_len,
                    max_turns=rollout.multi_turn.max_assistant_turns,
                    max_concurrency=concurrency,
                    seed=seeds.start,
                    env_executor=executor,
                    sampling_seed=cfg.trainer.seed if temperature > 0 else None,
                    context_policy=rollout.multi_turn.context_policy,  # as training prompts
                    context_window=rollout.multi_turn.context_window,
                )
                template_kwargs = OmegaConf.to_container(cfg.data.apply_chat_template_kwargs, resolve=True) or None
                chat = ChatTokenizer(load_tokenizer(model_dir), template_kwargs=template_kwargs)  # as training renders
                runner = RolloutRunner(str(cfg.env.name), client, chat, config, env_kwargs=env_kwargs(cfg))
                try:
                    result = await runner.run(len(seeds), progress=label if show_progress else None)
                finally:
                    await runner.aclose()
                return result.trajectories
        finally:
            server.stop()

    started = time.perf_counter()
    trajectories = asyncio.run(run())
    by_seed = {t.seed: float(t.success) for t in trajectories}
    turns = {k: v for k, v in per_turn_metrics(trajectories).items() if k.endswith(("/reached", "/malformed"))}
    return Score(label, temperature, [by_seed.get(s, 0.0) for s in seeds], time.perf_counter() - started, turns)


def start_scores(cfg: DictConfig, model_dir: str, show_progress: bool = True) -> dict[float, Score]:
    """The model RL starts from, scored at each held-out temperature; reused from
    ``<trainer.default_local_dir>/held_out_start/`` when the same model files and settings made
    them: a rerun of a finished or killed job does not score the same model again."""
    from agentgym.stages.stage_cache import is_cached, model_key, stamp

    directory = Path(str(cfg.trainer.default_local_dir)) / "held_out_start"
    output = directory / "scores.json"
    settings = {
        "model": model_key(model_dir),
        "env": str(cfg.env.name),
        "env_kwargs": env_kwargs(cfg),
        "seeds": [held_out_range(cfg).start, cfg.held_out.num_tasks],
        "temperatures": [float(t) for t in cfg.held_out.temperatures],
        "seed": cfg.trainer.seed,
        "rollout": OmegaConf.to_container(cfg.actor_rollout_ref.rollout, resolve=True),
        "lengths": [cfg.data.max_prompt_length, cfg.data.max_response_length],
    }
    if is_cached(directory, settings, output):
        print(f"held-out: scores of the start model reused from {output}", flush=True)
        return load_scores(output, "start")
    found = {
        float(t): score_model(cfg, model_dir, float(t), f"held-out start T={float(t):g}", show_progress)
        for t in cfg.held_out.temperatures
    }
    directory.mkdir(parents=True, exist_ok=True)
    save(output, {"start": found}, None, {"model": model_dir})
    stamp(directory, settings)
    return found


def score_random(cfg: DictConfig) -> Score | None:
    """The env's random policy (``TextEnv.random_action``) on the held-out tasks; None without one."""
    import time

    from agentgym.registry import make

    env = make(str(cfg.env.name), **env_kwargs(cfg))
    if not hasattr(env.unwrapped, "random_action"):
        return None
    rng = random.Random(cfg.trainer.seed)
    turns = cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns
    started = time.perf_counter()
    per_task = []
    for seed in held_out_range(cfg):
        env.reset(seed=seed)
        solved = False
        for _ in range(int(turns) if turns else 1000):
            _, reward, terminated, truncated, info = env.step(env.unwrapped.random_action(rng))
            if terminated or truncated:  # Trajectory.success's rule: the env's verdict, else a positive outcome
                solved = bool(info["success"]) if "success" in info else info.get("outcome_reward", reward) > 0
                break
        per_task.append(float(solved))
    return Score("random policy", None, per_task, time.perf_counter() - started)


def paired_gain(before: Score, after: Score) -> tuple[float, float]:
    """Mean of after - before over the same tasks, and its paired standard error."""
    diffs = [a - b for a, b in zip(after.per_task, before.per_task, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / max(n - 1, 1)
    return mean, math.sqrt(var / n)


def table(
    cfg: DictConfig, rows: dict[str, dict[float, Score]], random_score: Score | None, start: str, final: str
) -> str:
    """The before/after table as text: a row per policy, a column per temperature, then the gains."""
    temps = [float(t) for t in cfg.held_out.temperatures]
    seeds = held_out_range(cfg)
    names = {0.0: "greedy"}
    header = ["policy".ljust(22)] + [(names.get(t, f"sampled T={t:g}")).ljust(16) for t in temps]
    lines = [
        f"held-out: {len(seeds)} tasks of {cfg.env.name} (seeds {seeds.start}..{seeds.stop - 1}, never trained on)",
        "  ".join(header),
    ]

    def cell(score: Score | None) -> str:
        return (f"{score.success:.3f} ± {score.se:.3f}" if score is not None else "").ljust(16)

    if random_score is not None:
        lines.append("  ".join(["random policy".ljust(22), cell(random_score)]))
    for label, by_temp in rows.items():
        lines.append("  ".join([label.ljust(22)] + [cell(by_temp.get(t)) for t in temps]))
    if start in rows and final in rows:
        gains = []
        for t in temps:
            if t in rows[start] and t in rows[final]:
                gain, se = paired_gain(rows[start][t], rows[final][t])
                z = f", {gain / se:.1f} SE" if se > 0 else ""
                gains.append(f"{gain:+.3f} ± {se:.3f}{z}".ljust(16))
        lines.append("  ".join([f"{final} - {start}".ljust(22)] + gains) + "  (paired over tasks)")
    for t in temps:
        shares = {label: by_temp[t].malformed() for label, by_temp in rows.items() if t in by_temp}
        if any(shares.values()):
            lines.append(
                f"malformed replies, {names.get(t, f'T={t:g}')}, turns 1/2/...: "
                + "; ".join(
                    f"{label} {' / '.join(f'{100 * s:.0f}%' for s in share)}"
                    for label, share in shares.items()
                    if share
                )
            )
    return "\n".join(lines)


def save(path: Path, rows: dict[str, dict[float, Score]], random_score: Score | None, extra: dict[str, Any]) -> None:
    data = {
        "policies": {
            label: {str(t): {**asdict(s), "success": s.success, "se": s.se} for t, s in by.items()}
            for label, by in rows.items()
        },
        "random_policy": (
            {**asdict(random_score), "success": random_score.success, "se": random_score.se} if random_score else None
        ),
        **extra,
    }
    path.write_text(json.dumps(data, indent=1))


def load_scores(path: Path, label: str) -> dict[float, Score]:
    """The scores of ``label`` saved by ``save`` (empty when the file or the label is missing)."""
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text()).get("policies", {}).get(label, {})
    return {
        float(t): Score(s["label"], s["temperature"], s["per_task"], s.get("seconds", 0.0), s.get("turns", {}))
        for t, s in saved.items()
    }
