"""What a training run shows and writes: a live progress line and per-step metrics.

``Tracking`` sends each step's metrics to the backends in ``trainer.logger``:

* ``console``: one line per step with the headline numbers (the progress bar stays below);
* ``jsonl``: every metric, one JSON object per step, in ``<run dir>/metrics.jsonl`` (always written);
* ``tensorboard``: ``<run dir>/tensorboard`` (needs ``pip install tensorboard``);
* ``wandb``: Weights & Biases, project ``trainer.project_name``, run ``trainer.experiment_name``.

``Progress`` is the progress line: step, reward, success rate, seconds per step and ETA (and in
asynchronous training the largest version lag trained and the DataPool's size); tqdm's live bar on a
terminal, a line every 5% in a log file (``agentgym.progress``).
``write_samples`` appends a few whole trajectories per step to ``<run dir>/samples.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.rollout.metrics import per_turn_metrics
from agentgym.types import Trajectory

HEADLINE = (
    ("reward/mean", "reward"),
    ("success_rate", "success"),
    ("response_length/mean", "resp_len"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad_norm"),
    ("critic/vf_loss", "vf_loss"),
    ("timing_s/step", "s/step"),
    ("val/reward/mean", "val_reward"),
    ("val/success_rate", "val_success"),
    ("sft/loss", "loss"),
    ("val/sft/loss", "val_loss"),
)


def _fmt(value: float) -> str:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    if abs(value) >= 1000 or (value != 0 and abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:.4f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def headline(metrics: dict[str, float], step: int) -> str:
    parts = [f"step {step}"]
    parts += [f"{short} {_fmt(metrics[key])}" for key, short in HEADLINE if key in metrics]
    return " | ".join(parts)


class ConsoleLogger:
    def log(self, metrics: dict[str, float], step: int) -> None:
        from tqdm import tqdm

        tqdm.write(headline(metrics, step), file=sys.stdout)

    def close(self) -> None:
        pass


class JsonlLogger:
    """One JSON line per step, on disk (flushed and fsynced) before the next step starts.

    ``resume_step``: a run resumed from that step's checkpoint. Lines after it (steps the killed run
    took after its last checkpoint, which the resumed run takes again) are dropped, and the line
    of ``resume_step`` itself is restored from ``resume_line`` (the checkpoint's copy) if the run
    was killed between saving the checkpoint and writing it: no line lost, none doubled."""

    def __init__(self, path: Path, resume_step: int | None = None, resume_line: dict[str, float] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        kept = truncate_jsonl(path, resume_step) if resume_step is not None else set()
        self._file = open(path, "a")  # noqa: SIM115 - open for the run
        if resume_step is not None and resume_step not in kept and resume_line:
            self.log(resume_line, resume_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def truncate_jsonl(path: Path, last_step: int) -> set[int]:
    """Drop the lines of ``path`` whose ``step`` is after ``last_step`` (and any line a kill cut short);
    returns the steps kept. The file is replaced atomically."""
    if not path.is_file():
        return set()
    kept, steps = [], set()
    with open(path) as f:
        for line in f:
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
            if step <= last_step:
                kept.append(line if line.endswith("\n") else line + "\n")
                steps.add(step)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    tmp.replace(path)
    return steps


class TensorBoardLogger:
    def __init__(self, directory: Path, purge_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "trainer.logger has 'tensorboard' but the tensorboard package is not installed: "
                "pip install tensorboard (or drop it: trainer.logger=[console,jsonl])"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(directory), purge_step=purge_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, project: str, name: str, config: dict[str, Any], directory: Path) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                "trainer.logger has 'wandb' but wandb is not installed: pip install wandb "
                "(or drop it: trainer.logger=[console,jsonl])"
            ) from exc
        self.run = wandb.init(project=project, name=name, config=config, dir=str(directory))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracking:
    """Fans a step's metrics out to every chosen backend."""

    def __init__(
        self,
        loggers: Sequence[str],
        run_dir: Path,
        project: str = "agentgym",
        experiment: str = "",
        config: dict[str, Any] | None = None,
        resume_step: int | None = None,
        resume_line: dict[str, float] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.backends: list[Any] = []
        self.jsonl_path: Path | None = None
        self.tensorboard_dir: Path | None = None
        if "jsonl" not in loggers:  # the run directory always keeps its metrics (plots and resume read them)
            loggers = [*loggers, "jsonl"]
        for name in loggers:
            if name == "console":
                self.backends.append(ConsoleLogger())
            elif name == "jsonl":
                self.jsonl_path = run_dir / "metrics.jsonl"
                self.backends.append(JsonlLogger(self.jsonl_path, resume_step, resume_line))
            elif name == "tensorboard":
                self.tensorboard_dir = run_dir / "tensorboard"
                self.backends.append(
                    TensorBoardLogger(self.tensorboard_dir, None if resume_step is None else resume_step + 1)
                )
            elif name == "wandb":
                self.backends.append(WandbLogger(project, experiment, config or {}, run_dir))
            else:
                raise ValueError(f"unknown logger {name!r}; choose from console, jsonl, tensorboard, wandb")

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        for backend in self.backends:
            backend.log(clean, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


class Progress:
    """The live line: ``train  3/8 [00:12<00:20, 4.1s/step, reward=0.12, success=0.05]``."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True) -> None:
        from agentgym.progress import progress_bar

        self.bar = progress_bar(
            total=total,
            initial=initial,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=not enabled,
            file=sys.stderr,
        )

    def update(self, metrics: dict[str, float]) -> None:
        postfix = {}
        for key, short in (("reward/mean", "reward"), ("success_rate", "success"), ("val/success_rate", "val_success")):
            if key in metrics:
                postfix[short] = f"{metrics[key]:.3f}"
        for key, short in (("async/version_lag/max", "lag"), ("async/pool_size", "pool")):  # asynchronous training
            if key in metrics:
                postfix[short] = f"{metrics[key]:.0f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def write_samples(path: Path, trajectories: Sequence[Trajectory], step: int, count: int, tag: str = "train") -> None:
    """Append ``count`` trajectories (spread over the batch) whole: token ids, logprobs, rewards,
    versions and messages, plus ``step`` and ``split`` (``agentgym view samples.jsonl`` shows them).
    A distillation teacher's top-k tokens (``Turn.teacher_topk_*``, k ids and logprobs per token) are
    left out: they would make each record k times its size; its logprob of each token stays."""
    if count <= 0 or not trajectories:
        return
    stride = max(1, len(trajectories) // count)
    chosen = list(trajectories)[::stride][:count]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for traj in chosen:
            record = {"step": step, "split": tag, **traj.to_dict()}
            for turn in record["turns"]:
                turn.pop("teacher_topk_ids", None)
                turn.pop("teacher_topk_logprobs", None)
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")


def trajectory_metrics(trajectories: Sequence[Trajectory], prefix: str = "") -> dict[str, float]:
    """Reward, outcome, success, turns and lengths over a batch of episodes (all of them)."""
    trajs = list(trajectories)
    if not trajs:
        return {}

    def mean(xs: Sequence[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    rewards = [t.total_reward for t in trajs]
    success = [float(t.success) for t in trajs]
    response_lengths = [float(t.response_length()) for t in trajs]
    sampled = [float(sum(len(turn.response_ids) for turn in t.turns)) for t in trajs]
    out = {
        "reward/mean": mean(rewards),
        "reward/max": max(rewards),
        "reward/min": min(rewards),
        "reward/std": _std(rewards),
        "outcome_reward/mean": mean([t.outcome_reward for t in trajs]),
        "turn_reward/mean": mean([sum(turn.reward for turn in t.turns) for t in trajs]),
        "success_rate": mean(success),
        "turns/mean": mean([float(t.num_turns) for t in trajs]),
        "response_length/mean": mean(response_lengths),
        "response_length/max": max(response_lengths),
        "sampled_tokens/mean": mean(sampled),
        "prompt_length/mean": mean([float(t.prompt_length()) for t in trajs]),
        "episodes": float(len(trajs)),
        "failed": float(sum(t.status == "failed" for t in trajs)),
        "truncated": float(sum(t.status == "truncated" for t in trajs)),
        # partial rollout: generations a weight push aborted and the runner continued on the new weights
        "resumed_generations": float(sum(t.metrics.get("resumed_generations", 0.0) for t in trajs)),
    }
    played = [t for t in trajs if t.status != "failed"]
    for key in sorted({k for t in played for k in t.metrics if k.startswith("env/")}):
        out[key] = mean([t.metrics[key] for t in played if key in t.metrics])
    out.update(per_turn_metrics(trajs))
    out.update(context_metrics(trajs))
    return {prefix + k: v for k, v in out.items()}


def context_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """What long episodes cost (docs/long_horizon.md): ``context/processed_tokens`` per episode (every
    turn's whole prompt and reply, ``Trajectory.processed_tokens``), ``context/prompt_tokens_per_turn`` and
    ``context/last_turn_tokens`` (the prompt of each episode's last turn), means over the played episodes."""
    played = [t for t in trajectories if t.turns]
    if not played:
        return {}
    lengths = [t.context_lengths() for t in played]
    turns = sum(len(x) for x in lengths)
    return {
        "context/processed_tokens": sum(t.processed_tokens() for t in played) / len(played),
        "context/prompt_tokens_per_turn": sum(sum(x) for x in lengths) / turns,
        "context/last_turn_tokens": sum(x[-1] for x in lengths) / len(played),
    }


def _std(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def per_source_metrics(trajectories: Sequence[Trajectory], prefix: str = "") -> dict[str, float]:
    """``<prefix><source>/reward/mean`` and ``.../success_rate`` per data source or env tag, when the
    batch holds more than one (several envs in one run, or rows of several data sources)."""
    by_source: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        by_source.setdefault(traj.data_source or traj.env_id or "env", []).append(traj)
    if len(by_source) < 2:
        return {}
    out: dict[str, float] = {}
    for name, group in by_source.items():
        summary = trajectory_metrics(group)
        for key in ("reward/mean", "success_rate"):
            out[f"{prefix}{name}/{key}"] = summary[key]
    return out


def mean_of_dicts(dicts: Sequence[dict[str, float] | None]) -> dict[str, float]:
    """Each key's mean over the dicts that have it (the ranks' metrics of one call)."""
    present = [d for d in dicts if d]
    keys = {k for d in present for k in d}
    return {k: sum(d[k] for d in present if k in d) / sum(k in d for d in present) for k in sorted(keys)}
