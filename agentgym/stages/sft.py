"""``agentgym sft``: supervised fine-tuning with the RL trainer's own pieces.

    agentgym sft data.train_files=demos.jsonl model.partial_pretrain=tiny trainer.total_epochs=2

Key names are veRL's ``sft_trainer.yaml`` (``configs/sft.yaml`` lists them all). What is shared
with RL, so that RL continues from the result with nothing lost in between:

* the data: each conversation is tokenized as the rollout runner tokenizes an episode
  (``sft_data.to_trajectory``: same chat template, token deltas, closing tokens), and
  ``batch.build_batch`` lays it out; the loss mask is 1 on every assistant token, 0 elsewhere;
* the workers: the same ``PolicyWorker`` (FSDP2 on CUDA, CPU otherwise), in this process or as
  a Ray worker group; the loss is the negative log-likelihood of the masked-in tokens,
  averaged over the mini-batch's tokens across micro-batches and ranks (``update_plan``);
* the output: ``global_step_N`` checkpoints and ``<run dir>/huggingface``, the model
  ``agentgym train ... actor_rollout_ref.model.path=<run dir>/huggingface`` starts from.

Every problem with the data (missing file, no assistant turn, demos for another env, a
tokenizer without a chat template) is reported before any model is loaded.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError, compose
from agentgym.stages.sft_data import SFTDataError, iter_batches, load_sft_trajectories
from agentgym.tracking import Tracking
from agentgym.trainer import checkpoint
from agentgym.trainer.batch import build_batch, pad_for_workers, rank_shards, update_plan
from agentgym.trainer.config import world_size
from agentgym.trainer.run_storage import check_shared, resolve_in_config
from agentgym.types import Trajectory

log = logging.getLogger("agentgym.trainer")


def load_sft_config(
    config_file: str | None = None, overrides: Sequence[str] = (), directory: str | None = None, warn: bool = True
) -> DictConfig:
    """``configs/sft.yaml`` + ``config_file`` + overrides, checked; veRL's ``sft_trainer.yaml`` keys that
    agentgym lacks are understood through ``agentgym.compat.verl_sft`` (each no-effect key warned about)."""
    from agentgym.compat.verl_sft import sft_key_policy

    composition = compose(None, config_file, overrides, directory, base_file="sft.yaml", key_policy=sft_key_policy)
    cfg = composition.cfg
    if warn:
        for key, reason in sorted(composition.ignored.items()):
            log.warning("%s: no effect in agentgym sft: %s", key, reason)
        if composition.added:
            log.warning("%s: nothing in agentgym sft reads these keys", ", ".join(f"+{k}" for k in composition.added))
    if cfg.model.strategy == "fsdp":  # veRL's FSDP: FSDP2 on GPUs, plain data parallel on CPU
        cfg.model.strategy = "auto"
    if cfg.model.target_modules == "all-linear":
        cfg.model.target_modules = None
    if cfg.trainer.device == "cuda":
        from agentgym.preflight import cuda_devices

        if cuda_devices() == 0:
            raise ConfigError(
                "trainer.device=cuda but this machine has no CUDA device (torch.cuda.is_available() is "
                "False); set trainer.device=auto (the GPU when there is one, else the CPU) or cpu"
            )
    from agentgym.preflight import _importable

    missing = [
        f"{why}: pip install {package}"
        for package, why in (
            ("peft", f"model.lora_rank={cfg.model.lora_rank}") if cfg.model.lora_rank > 0 else (None, ""),
            ("wandb", "trainer.logger has wandb") if "wandb" in cfg.trainer.logger else (None, ""),
            ("tensorboard", "trainer.logger has tensorboard") if "tensorboard" in cfg.trainer.logger else (None, ""),
        )
        if package and not _importable(package)
    ]
    if missing:
        raise ConfigError("the config needs packages that are not installed:\n  " + "\n  ".join(missing))
    if cfg.data.multiturn.enable:
        cfg.data.messages_key = cfg.data.multiturn.messages_key
        cfg.data.tools_key = cfg.data.multiturn.tools_key
    choices = {
        "data.truncation": ("error", "skip"),
        "optim.lr_scheduler": ("constant", "cosine"),
        "model.strategy": ("auto", "fsdp2", "dp"),
        "trainer.device": ("auto", "cpu", "cuda"),
    }
    for key, allowed in choices.items():
        if OmegaConf.select(cfg, key) not in allowed:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)!r} is not one of {', '.join(allowed)}")
    if not cfg.data.train_files:
        raise ConfigError(
            "no data to train on: pass data.train_files=<.jsonl/.parquet of chat messages> "
            "(demonstrations: agentgym demos --env ENV -o demos.jsonl)"
        )
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if world > 1 and not cfg.trainer.use_ray:
        raise ConfigError(f"{world} ranks need trainer.use_ray=true (without Ray, SFT runs one rank in this process)")
    batch, micro = cfg.data.train_batch_size, cfg.data.micro_batch_size_per_gpu
    if batch < 1 or micro < 1:
        raise ConfigError("data.train_batch_size and data.micro_batch_size_per_gpu must be at least 1")
    if batch % world:
        raise ConfigError(f"data.train_batch_size={batch} does not split over {world} ranks")
    return cfg


def worker_config(cfg: DictConfig) -> DictConfig:
    """The RL worker's view of an SFT config: the training config's defaults (``PolicyWorker`` reads
    RL's key names) with this run's model, optimizer, batch and trainer settings."""
    from agentgym.trainer.config import load_config

    optim, model, micro = cfg.optim, cfg.model, cfg.data.micro_batch_size_per_gpu
    return OmegaConf.merge(
        load_config(warn=False),
        {
            "trainer": {
                key: cfg.trainer[key]
                for key in ("device", "seed", "cpu_threads_per_worker", "nnodes", "n_gpus_per_node")
            },
            "actor_rollout_ref": {
                "model": {
                    "path": model.partial_pretrain,
                    "dtype": model.dtype,
                    "enable_gradient_checkpointing": model.enable_gradient_checkpointing,
                    "lora_rank": model.lora_rank,
                    "lora_alpha": model.lora_alpha,
                    "target_modules": model.target_modules,
                    "lora_export_merged": True,  # RL continues from a whole model
                },
                "actor": {
                    "strategy": model.strategy,
                    "optim": {
                        "lr": optim.lr,
                        "betas": optim.betas,
                        "weight_decay": optim.weight_decay,
                        "lr_warmup_steps_ratio": optim.warmup_steps_ratio,
                        "warmup_style": optim.lr_scheduler,
                        "min_lr_ratio": optim.min_lr_ratio,
                    },
                    "ppo_micro_batch_size_per_gpu": micro,
                    "log_prob_micro_batch_size_per_gpu": micro,
                    "grad_clip": optim.clip_grad,
                },
                "ref": {"log_prob_micro_batch_size_per_gpu": micro},
            },
        },
    )


class SFTTrainer:
    """Loads the data (checking it first), then trains epoch by epoch; ``fit()`` returns a summary."""

    def __init__(self, cfg: DictConfig, show_progress: bool = True) -> None:
        from agentgym.model import load_tokenizer
        from agentgym.rollout.chat import ChatTokenizer

        self.cfg = cfg
        self.show_progress = show_progress
        self.run_dir = Path(resolve_in_config(cfg))  # absolute, fixed on the driver (trainer.run_storage)
        self.world_size = world_size(cfg)
        path = str(cfg.model.partial_pretrain)
        try:
            tokenizer = load_tokenizer(path)
        except ValueError as exc:  # no chat template
            raise SFTDataError(
                f"{exc}. Give the model a tokenizer with a chat_template (tokenizer_config.json), "
                f"or start from one that has it (model.partial_pretrain=tiny works offline)"
            ) from None
        template_kwargs = OmegaConf.to_container(cfg.data.apply_chat_template_kwargs) or None
        self.chat = ChatTokenizer(tokenizer, template_kwargs=template_kwargs)
        self.pad_token_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
        )
        data = cfg.data
        common = {
            "messages_key": data.messages_key,
            "prompt_key": data.prompt_key,
            "response_key": data.response_key,
            "prompt_dict_keys": _files(data.prompt_dict_keys),
            "response_dict_keys": _files(data.response_dict_keys),
            "tools_key_name": data.tools_key,
            "max_length": data.max_length,
            "truncation": str(data.truncation),
            "expect_env": data.env,
            "context_policy": data.context_policy,
            "context_window": data.context_window,
            "summarize": _summarizer(data),
        }
        self.train_set, self.skipped = load_sft_trajectories(
            _files(data.train_files), self.chat, max_samples=data.train_max_samples, **common
        )
        self.val_set: list[Trajectory] = []
        if data.val_files:
            self.val_set, _ = load_sft_trajectories(
                _files(data.val_files), self.chat, max_samples=data.val_max_samples, **common
            )
            if data.val_batch_size:
                self.val_set = self.val_set[: data.val_batch_size]
        self.batch_size = data.train_batch_size
        if len(self.train_set) < self.batch_size:
            raise SFTDataError(
                f"{len(self.train_set)} conversations, fewer than data.train_batch_size="
                f"{self.batch_size}; lower it or give more data"
            )
        self.steps_per_epoch = len(self.train_set) // self.batch_size
        steps = cfg.trainer.total_training_steps
        self.total_steps = steps if steps is not None else self.steps_per_epoch * cfg.trainer.total_epochs
        self.actor: Any = None
        self.global_step = 0

    def init_workers(self) -> None:
        from agentgym.trainer.worker_group import WorkerGroup
        from agentgym.trainer.workers import PolicyWorker

        use_ray = self.cfg.trainer.use_ray
        if use_ray:
            import ray

            from agentgym.trainer.worker_group import init_ray

            self.started_ray = not ray.is_initialized()
            init_ray(self.cfg)  # ray_init.address / RAY_ADDRESS: join that cluster
        self.actor = WorkerGroup(PolicyWorker, worker_config(self.cfg), self.world_size, use_ray, "sft")
        check_shared(self.actor, self.run_dir)
        self.actor.call(PolicyWorker.init_model, self.total_steps, False)

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        batch, _ = build_batch(trajectories, self.pad_token_id)
        rows = len(batch)
        batch, pad_rows = pad_for_workers(batch, self.world_size, [1])
        plans = update_plan(batch["response_mask"], rows, pad_rows, 1, 1, self.world_size)
        shared = self.actor.put(batch.tensors)
        from agentgym.trainer.workers import PolicyWorker

        outs = self.actor.call(PolicyWorker.update_sft, shared, per_rank=[(p,) for p in plans])
        metrics = {k: float(sum(o[k] for o in outs) / len(outs)) for k in outs[0]}
        metrics["perf/update_tokens"] = float(sum(o["perf/update_tokens"] for o in outs))
        return metrics

    def validate(self) -> dict[str, float]:
        from agentgym.trainer.workers import PolicyWorker

        if not self.val_set:
            return {}
        nll = tokens = 0.0
        for start in range(0, len(self.val_set), self.batch_size):
            batch, _ = build_batch(self.val_set[start : start + self.batch_size], self.pad_token_id)
            batch, _ = pad_for_workers(batch, self.world_size, [1])
            shards = rank_shards(len(batch), self.world_size)
            for out in self.actor.call(
                PolicyWorker.sft_loss, self.actor.put(batch.tensors), per_rank=[(s,) for s in shards]
            ):
                nll += out["nll"]
                tokens += out["tokens"]
        return {"val/sft/loss": nll / max(tokens, 1.0)}

    def fit(self) -> dict[str, Any]:
        from agentgym.progress import progress_bar
        from agentgym.trainer.workers import PolicyWorker

        cfg = self.cfg.trainer
        if self.actor is None:
            self.init_workers()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(self.cfg))
        resumed = checkpoint.latest_checkpoint(self.run_dir)
        if resumed is not None:
            state = checkpoint.load_trainer_state(resumed)
            self.actor.call(PolicyWorker.load_checkpoint, str(resumed))
            self.global_step = int(state["global_step"])
        tracking = Tracking(
            list(cfg.logger) if "jsonl" in cfg.logger else [*cfg.logger, "jsonl"],
            self.run_dir,
            str(cfg.project_name),
            str(cfg.experiment_name),
            OmegaConf.to_container(self.cfg),
        )
        test_freq, save_freq = cfg.test_freq, cfg.save_freq
        bar = progress_bar(
            total=self.total_steps,
            initial=self.global_step,
            desc="sft",
            unit="step",
            dynamic_ncols=True,
            disable=not self.show_progress,
            file=sys.stderr,
        )
        started = time.perf_counter()
        last: dict[str, float] = {}
        last_val: dict[str, float] = {}
        try:
            epoch = self.global_step // self.steps_per_epoch
            while self.global_step < self.total_steps:
                skip = self.global_step - epoch * self.steps_per_epoch  # batches of this epoch already trained
                for k, trajectories in enumerate(
                    iter_batches(self.train_set, self.batch_size, cfg.seed, epoch, self.cfg.data.shuffle)
                ):
                    if k < skip:
                        continue
                    if self.global_step >= self.total_steps:
                        break
                    step_started = time.perf_counter()
                    metrics = self.step(trajectories)
                    self.global_step += 1
                    seconds = time.perf_counter() - step_started
                    metrics.update(
                        {
                            "timing_s/step": seconds,
                            "sft/epoch": float(epoch),
                            "perf/tokens_per_s": metrics["perf/update_tokens"] / max(seconds, 1e-9),
                        }
                    )
                    final = self.global_step == self.total_steps
                    if (test_freq > 0 and self.global_step % test_freq == 0) or final:
                        last_val = self.validate() or last_val
                        metrics.update(last_val)
                    if save_freq > 0 and (self.global_step % save_freq == 0 or final):
                        self.save_checkpoint()
                    tracking.log(metrics, self.global_step)
                    last = metrics
                    bar.set_postfix({"loss": f"{metrics['sft/loss']:.4f}", "epoch": epoch}, refresh=False)
                    bar.update(1)
                epoch += 1
        finally:
            bar.close()
            tracking.close()
        hf_dir = None
        if cfg.save_hf_model and self.global_step > 0:
            hf_dir = self.run_dir / "huggingface"
            self.actor.call(PolicyWorker.save_hf, str(hf_dir))
        curves = _curves(self.run_dir)
        return {
            "steps": self.global_step,
            "seconds": time.perf_counter() - started,
            "metrics": last,
            "val_metrics": last_val,
            "run_dir": str(self.run_dir),
            "hf_model": str(hf_dir) if hf_dir else None,
            "conversations": len(self.train_set),
            "skipped_too_long": self.skipped,
            "curves": curves,
        }

    def save_checkpoint(self) -> None:
        from agentgym.trainer.workers import PolicyWorker

        directory = checkpoint.step_dir(self.run_dir, self.global_step)
        directory.mkdir(parents=True, exist_ok=True)
        written = [name for part in self.actor.call(PolicyWorker.save_checkpoint, str(directory)) for name in part]
        checkpoint.save_trainer_state(directory, {"global_step": self.global_step, "kind": "sft"})
        checkpoint.mark_latest(self.run_dir, self.global_step, written)

    def shutdown(self) -> None:
        if self.actor is not None:
            self.actor.shutdown()
        if getattr(self, "started_ray", False):  # a cluster someone else connected to stays connected
            import ray

            ray.shutdown()


def _summarizer(data: Any) -> Any:
    """``compact`` demos: the env's summary rule (``TextEnv.summarize``), from an env built with its defaults."""
    if data.context_policy != "compact" or not data.env:
        return None
    from agentgym.registry import make

    return getattr(make(data.env), "summarize", None)


def _files(value: Any) -> Any:
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _curves(run_dir: Path) -> str | None:
    from agentgym.plots import PlotError, plot_run

    try:
        return str(plot_run(run_dir, run_dir / "curves.png"))
    except PlotError:
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentgym.stages.config_command import hydra_arguments

    parser.add_argument(
        "--config", "--config-file", default=None, help="a YAML config to start from (default: configs/sft.yaml)"
    )
    hydra_arguments(parser, "with --config-path: the file DIR/NAME.yaml (Hydra's form); sft_trainer: configs/sft.yaml")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted config overrides (veRL's sft_trainer keys), e.g. data.train_files=demos.jsonl "
        "model.partial_pretrain=tiny",
    )


def run(args: argparse.Namespace) -> int:
    """``agentgym sft [--config FILE] KEY=VALUE ...``."""

    from agentgym.trainer.worker_group import default_ray_auth

    default_ray_auth()
    from agentgym.stages.config_command import config_file_of

    if not log.handlers and not logging.getLogger().handlers:  # the key notes, readable on the command line
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("agentgym sft: warning: %(message)s"))
        log.addHandler(handler)
    try:
        cfg = load_sft_config(config_file_of(args, "sft_trainer"), list(args.overrides or ()))
        trainer = SFTTrainer(cfg)
    except (ConfigError, SFTDataError) as exc:
        print(f"agentgym sft: {exc}", file=sys.stderr)
        return 2
    world = trainer.world_size
    print(
        f"agentgym sft: {len(trainer.train_set)} conversations ({trainer.skipped} too long, left out) | model "
        f"{cfg.model.partial_pretrain} | {trainer.total_steps} steps of {trainer.batch_size} "
        f"({trainer.steps_per_epoch} per epoch) | {world} rank(s) | run dir {trainer.run_dir}",
        flush=True,
    )
    try:
        summary = trainer.fit()
    except ConfigError as exc:  # found once the workers run (a run directory other nodes do not see)
        print(f"agentgym sft: {exc}", file=sys.stderr)
        return 2
    finally:
        trainer.shutdown()
    metrics = summary["metrics"]
    line = f"done: {summary['steps']} steps in {summary['seconds']:.0f} s"
    if metrics:
        line += f" | loss {metrics['sft/loss']:.4f}"
    if summary["val_metrics"]:
        line += f" | val loss {summary['val_metrics']['val/sft/loss']:.4f}"
    print(line)
    if summary["hf_model"]:
        print(
            f"  final model: {summary['hf_model']}\n  continue with RL: agentgym train --env ENV "
            f"actor_rollout_ref.model.path={summary['hf_model']}"
        )
    if summary["curves"]:
        print(f"  curves:      {summary['curves']}")
    if metrics and not math.isfinite(metrics["sft/loss"]):
        print("agentgym sft: the loss is not finite; lower optim.lr", file=sys.stderr)
        return 1
    return 0
