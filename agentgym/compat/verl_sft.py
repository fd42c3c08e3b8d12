"""veRL's ``sft_trainer.yaml`` (``verl.trainer.fsdp_sft_trainer``) in ``agentgym sft``.

``configs/sft.yaml`` holds the keys both have under veRL's names; ``SFT_RULES`` says what happens to
each veRL key it lacks: accepted with no effect (GPU performance knobs, with the reason), refused with
what to use instead, or an alias. ``sft_key_policy`` is the ``KeyPolicy`` ``agentgym.stages.sft``
composes with, so a veRL SFT command line runs as written with ``agentgym sft`` in place of
``torchrun -m verl.trainer.fsdp_sft_trainer``.
"""

from __future__ import annotations

from typing import Any

from agentgym.compat.rules import Rule, Verdict, apply_rules

PERF = "a GPU performance setting; the trained result does not depend on it"

SFT_RULES: list[Rule] = [
    Rule("*._target_", "ignore", "Hydra's instantiation target; agentgym builds its own objects"),
    Rule("data.micro_batch_size", "alias", "data.micro_batch_size_per_gpu"),  # veRL's deprecated name
    Rule("optim.lr_warmup_steps_ratio", "alias", "optim.warmup_steps_ratio"),
    Rule("optim.warmup_style", "alias", "optim.lr_scheduler"),
    Rule("optim.lr_scheduler_type", "alias", "optim.lr_scheduler"),
    Rule("optim.lr_warmup_steps", "ignore", "the warm-up is optim.warmup_steps_ratio of the steps", (-1, None)),
    Rule("optim.total_training_steps", "ignore", "set from trainer.total_training_steps"),
    Rule("optim.num_cycles", "ignore", "cosine falls once from lr to min_lr_ratio * lr", (0.5,)),
    Rule("optim.optimizer", "ignore", "agentgym's optimizer is AdamW", ("AdamW",)),
    Rule("optim.optimizer_impl", "ignore", "torch.optim.AdamW"),
    Rule("optim.eps", "ignore", "AdamW's eps is 1e-8", (1e-8,)),
    Rule("optim.override_optimizer_config", "ignore", "optimizer overrides are not applied", (None, {})),
    Rule(
        "data.multiturn.enable_thinking_key",
        "ignore",
        "a per-row thinking switch is not read: set data.apply_chat_template_kwargs.enable_thinking for all rows",
        ("enable_thinking",),
    ),
    Rule("data.balance_dp_token", "ignore", PERF),
    Rule("data.use_shm", "ignore", PERF),
    Rule(
        "data.chat_template", "ignore", "set the chat template in the model directory's tokenizer_config.json", (None,)
    ),
    Rule(
        "data.custom_cls.*",
        "ignore",
        "custom dataset classes are not loaded: write rows with messages or prompt/response columns",
        (None,),
    ),
    Rule("data.tokenizer", "ignore", "the tokenizer is the model's", (None,)),
    Rule("data.pad_mode", "ignore", "rows are padded per micro-batch"),
    Rule("data.ignore_input_ids_mismatch", "ignore", "tokens are rendered by the chat template, never re-tokenized"),
    Rule("model.use_shm", "ignore", PERF),
    Rule("model.fsdp_config.*", "ignore", "FSDP wrapping details: agentgym shards every decoder layer (FSDP2)"),
    Rule("model.external_lib", "ignore", "agentgym imports no model library: use a model transformers loads", (None,)),
    Rule("model.trust_remote_code", "ignore", "models are loaded with transformers' own classes"),
    Rule("model.use_liger", "ignore", PERF),
    Rule("model.override_config", "ignore", "model config overrides are not applied", (None, {})),
    Rule("model.tokenizer_path", "ignore", "the tokenizer is read from the model path", (None,)),
    Rule(
        "ulysses_sequence_parallel_size",
        "ignore",
        "no sequence parallelism: each conversation is on one rank; the trained result is the same",
    ),
    Rule("use_remove_padding", "ignore", "rows are padded per micro-batch; the trained result is the same"),
    Rule("trainer.default_hdfs_dir", "ignore", "HDFS upload is not supported: copy the run dir", (None,)),
    Rule("trainer.max_ckpt_to_keep", "ignore", "checkpoints are kept: delete old global_step_N directories", (None,)),
    Rule("trainer.checkpoint.*", "ignore", "checkpoints hold the model, the optimizer and the data position"),
    Rule(
        "trainer.resume_mode",
        "ignore",
        "a run resumes from its latest checkpoint in trainer.default_local_dir (start afresh in a new directory)",
        ("auto",),
    ),
    Rule("trainer.resume_from_path", "ignore", "a run resumes from its own latest checkpoint", (None,)),
]


def sft_key_policy(key: str, value: Any) -> Verdict | None:
    """What to do with veRL SFT key ``key`` that ``configs/sft.yaml`` lacks (None: a typo)."""
    return apply_rules(SFT_RULES, key, value)
