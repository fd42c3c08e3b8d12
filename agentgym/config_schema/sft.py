"""``agentgym sft``'s configuration (``configs/sft.yaml`` is written from it), veRL's ``sft_trainer.yaml`` names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentgym.config_schema.fields import section, setting
from agentgym.config_schema.train import RayInitConfig

HEADER = """\
agentgym sft: supervised fine-tuning on chat data (demonstrations, or any JSONL/Parquet of
conversations). Key names follow veRL's sft_trainer.yaml. The data is tokenized exactly as a
rollout is (same chat template, loss on every assistant turn and nothing else), trained by the
same workers as RL, and saved in the same checkpoint and Hugging Face format, so
  agentgym train --env ENV actor_rollout_ref.model.path=<trainer.default_local_dir>/huggingface
continues from it.
  agentgym sft data.train_files=demos.jsonl model.partial_pretrain=tiny trainer.total_epochs=2"""


@dataclass
class MultiturnConfig:
    enable: bool = setting(False, "read messages_key and tools_key from here instead")
    messages_key: str = setting("messages", "as data.messages_key")
    tools_key: str = setting("tools", "as data.tools_key")


@dataclass
class SFTDataConfig:
    train_files: Any = setting(None, ".jsonl/.parquet file(s) or a directory")
    val_files: Any = setting(None, "held-out conversations: the loss on them is logged as val/sft/loss")
    messages_key: str = setting("messages", "a row's chat messages (multi-turn); agentgym demos writes this")
    tools_key: str = setting("tools", "a row's OpenAI tool schemas (rendered into the prompt as at rollout)")
    prompt_key: str | None = setting(None, "single-turn rows instead: the prompt column ...")
    response_key: str | None = setting(None, "... and the reply column (both set: messages_key is not read)")
    prompt_dict_keys: list[str] | None = setting(
        None, "the column holds a mapping: the path to the text in it, e.g. [question]"
    )
    response_dict_keys: list[str] | None = setting(
        None, "... e.g. [answer] (veRL: prompt_key=extra_info prompt_dict_keys=[question])"
    )
    train_max_samples: int = setting(-1, "use only the first N rows (-1: all)")
    val_max_samples: int = setting(-1, "use only the first N rows of val_files (-1: all)")
    apply_chat_template_kwargs: dict[str, Any] = setting(
        {}, "extra chat-template variables (e.g. {enable_thinking: false})"
    )
    multiturn: MultiturnConfig = section(MultiturnConfig, "veRL's spelling of the same keys (read when enable is true)")
    max_length: int = setting(1024, "tokens per conversation")
    truncation: str = setting("error", "error | skip: what to do with a longer conversation")
    train_batch_size: int = setting(64, "conversations per optimizer step (all ranks together)")
    micro_batch_size_per_gpu: int = setting(16, "conversations per forward/backward on one rank")
    val_batch_size: int | None = setting(256, "held-out conversations scored per validation (null: all)")
    shuffle: bool = setting(True, "shuffle the conversations each epoch (seeded by trainer.seed)")
    env: str | None = setting(None, "demos only: refuse rows written for another env (set by the warm start)")
    context_policy: Literal["full", "window", "compact"] = setting(
        "full",
        "each reply's prompt as RL's multi_turn.context_policy builds it (set by the warm start): full | window "
        "| compact; a windowed reply is a row of its own, trained once. docs/long_horizon.md",
    )
    context_window: int = setting(4, "window / compact: the most recent turns kept (RL's multi_turn.context_window)")


@dataclass
class SFTModelConfig:
    partial_pretrain: str = setting("tiny", "the model to start from: 'tiny', an HF directory or a hub name")
    enable_gradient_checkpointing: bool = setting(False, "recompute activations in the backward (memory for speed)")
    dtype: str = setting("float32", "training dtype of the weights")
    strategy: str = setting("auto", "auto | fsdp2 | dp (as actor_rollout_ref.actor.strategy)")
    lora_rank: int = setting(0, "> 0: train LoRA adapters of this rank only (peft); the final model has them merged in")
    lora_alpha: int = setting(16, "adapter scale = lora_alpha / lora_rank")
    target_modules: Any = setting(
        None, "null or all-linear: every linear layer but the head; or a list of module names"
    )


@dataclass
class SFTOptimConfig:
    lr: float = setting(1.0e-4, "peak learning rate (AdamW)")
    betas: list[float] = setting([0.9, 0.95], "AdamW's beta1, beta2")
    weight_decay: float = setting(0.01, "AdamW's decoupled weight decay")
    warmup_steps_ratio: float = setting(0.0, "linear warm-up as a share of the total steps")
    clip_grad: float = setting(1.0, "clip the gradient's global norm to this")
    lr_scheduler: str = setting("cosine", "constant | cosine")
    min_lr_ratio: float = setting(0.0, "cosine: the final lr as a share of lr")


@dataclass
class SFTTrainerConfig:
    project_name: str = setting("agentgym-sft", "the project the run belongs to (run directory, loggers)")
    experiment_name: str = setting("sft", "the run's name")
    default_local_dir: str = setting(
        "outputs/${trainer.project_name}/${trainer.experiment_name}", "checkpoints, logs, final model"
    )
    total_epochs: int = setting(1, "passes over data.train_files")
    total_training_steps: int | None = setting(None, "wins over total_epochs")
    logger: list[str] = setting(["console", "jsonl"], "console | jsonl | tensorboard | wandb")
    seed: int = setting(0, "seeds the data order and the tiny model's initialisation")
    test_freq: int = setting(-1, "steps between validations, and the last step (-1: only the last, with val_files)")
    save_freq: int = setting(-1, "steps between checkpoints, and the last step (-1: only the final model)")
    save_hf_model: bool = setting(True, "<default_local_dir>/huggingface: the model RL starts from")
    nnodes: int = setting(1, "nodes (Ray)")
    n_gpus_per_node: int = setting(1, "data-parallel ranks per node (on CPU: worker processes)")
    device: str = setting("auto", "auto | cpu | cuda")
    cpu_threads_per_worker: int | None = setting(None, "torch threads in each CPU worker (null: cores / workers)")
    use_ray: bool = setting(False, "true: the same Ray worker group as RL (needed for several ranks)")


@dataclass
class SFTConfig:
    """``agentgym sft``'s whole configuration (``configs/sft.yaml``)."""

    data: SFTDataConfig = section(SFTDataConfig, "the conversations and how they are batched")
    model: SFTModelConfig = section(SFTModelConfig, "the model trained")
    optim: SFTOptimConfig = section(SFTOptimConfig, "the optimizer and learning-rate schedule")
    trainer: SFTTrainerConfig = section(SFTTrainerConfig, "the run: steps, logging, checkpoints, workers")
    ray_init: RayInitConfig = section(
        RayInitConfig, "with trainer.use_ray: passed to ray.init, as agentgym train's ray_init", open=True
    )
