"""ROLL's agentic pipeline config (``AgenticConfig``: ``examples/qwen2.5-0.5B-agentic/*.yaml``) in agentgym.

ROLL counts batches in trajectories (``rollout_batch_size``; a group is ``group_size`` trajectories of
one env seed), agentgym in tasks (``data.train_batch_size``, each ``rollout.n`` trajectories): the
translator divides. ROLL's agentic ``grpo`` is REINFORCE on rewards normalised by
``reward_normalization`` (agentgym's ``reinforce`` estimator with the same normalisation);
``custom_envs`` become ``env.custom_envs`` and the env managers' tags and group counts ``env.tags`` /
``env.n_groups`` (and ``val_*``).
"""

from __future__ import annotations

from typing import Any

from agentgym.compat.translate import KeyMap, Translation, engine_or_embedded, translate
from agentgym.config import lookup

AR = "actor_rollout_ref"
HW = "GPU placement: agentgym places its workers itself (trainer.n_gpus_per_node)"
BACKEND = "training backend details: agentgym trains with its own FSDP2 / data-parallel workers"
ROLL_ENVS = {"sokoban": "sokoban", "frozen_lake": "frozenlake"}  # ROLL env_type -> agentgym env
ENV_KWARGS = {  # the env_config keys each agentgym env takes under ROLL's names
    "sokoban": ("dim_room", "num_boxes", "max_steps", "search_depth", "format_penalty", "grid_lookup", "grid_vocab"),
    "frozenlake": (
        "size",
        "p",
        "is_slippery",
        "map_seed",
        "max_steps",
        "format_penalty",
        "grid_lookup",
        "grid_vocab",
        "env_instruction",
    ),
}
ENV_DEFAULTS = {  # ROLL's class defaults where agentgym's differ, so an env_config that omits them plays ROLL's env
    "sokoban": {"max_actions_per_turn": 1},  # ROLL reads one action per turn
    "frozenlake": {"is_slippery": True},
}
ANSWER_PATTERNS = ("<answer>(.*?)</answer>", r"^(.*)$")
THINK_NOTE = (
    "agentgym's envs read the last <answer>...</answer> of a reply; a <think>...</think> before it is "
    "allowed but not required (ROLL's think_action_pattern requires it)"
)
GROUPINGS = {
    "traj_group_id": "state",
    "state": "state",
    "tags": "inductive",
    "tag": "inductive",
    "inductive": "inductive",
    "batch": "batch",
}


def _lora_target(value: Any) -> Any:
    """ROLL's ``lora_target`` (``all-linear`` or ``q_proj,k_proj,...``) as agentgym's ``target_modules``."""
    if value is None or str(value).strip() in ("all-linear", "all_linear", "all"):
        return None
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value]
    return [part.strip() for part in str(value).split(",") if part.strip()]


def _scheduler(value: Any) -> str:
    return "cosine" if str(value) == "cosine" else "constant"


ROLL_KEYS: list[KeyMap] = [
    KeyMap("defaults", kind="ignore", note="Hydra defaults: interpolated values are translated where they are used"),
    KeyMap("hydra.*", kind="ignore", note="Hydra's own settings"),
    KeyMap("exp_name", "trainer.experiment_name"),
    KeyMap("seed", "trainer.seed"),
    KeyMap("max_steps", "trainer.total_training_steps"),
    KeyMap("save_steps", "trainer.save_freq"),
    KeyMap("eval_steps", "trainer.test_freq"),
    KeyMap("logging_steps", kind="ignore", note="metrics are logged every step"),
    KeyMap(
        "resume_from_checkpoint",
        "trainer.resume_mode",
        kind="derived",
        note="false -> disable; a path -> resume_path with trainer.resume_from_path",
    ),
    KeyMap("output_dir", kind="ignore", note="the run directory is checkpoint_config.output_dir"),
    KeyMap("checkpoint_config.output_dir", "trainer.default_local_dir"),
    KeyMap(
        "checkpoint_config.type",
        kind="ignore",
        note="checkpoints are files in the run directory",
        unless=("file_system",),
    ),
    KeyMap("logging_dir", kind="ignore", note="logs are in the run directory"),
    KeyMap("track_with", "trainer.logger", kind="derived", note="[console, jsonl] plus tensorboard or wandb"),
    KeyMap("tracker_kwargs.*", kind="ignore", note="tracker settings: wandb reads its own environment"),
    KeyMap("system_envs.*", kind="ignore", note="set environment variables in the shell"),
    KeyMap("render_save_dir", kind="ignore", note="trajectories are saved to <run dir>/samples.jsonl"),
    KeyMap("num_gpus_per_node", kind="ignore", note=HW),
    KeyMap(
        "rollout_batch_size",
        "data.train_batch_size",
        kind="derived",
        note="trajectories per step / train_env_manager.group_size",
    ),
    KeyMap("val_batch_size", "data.val_batch_size", kind="derived", note="trajectories / val_env_manager.group_size"),
    KeyMap(
        "sequence_length",
        "data.max_response_length",
        kind="derived",
        note="half to data.max_prompt_length, half to data.max_response_length",
    ),
    KeyMap(
        "max_tokens_per_step",
        f"{AR}.rollout.max_tokens_per_turn",
        kind="derived",
        note="the smallest of max_tokens_per_step (each env's too) and actor_infer.generating_args.max_new_tokens, "
        "as ROLL's env manager caps each turn",
    ),
    KeyMap(
        "default_history_length",
        kind="ignore",
        note="a history window (ROLL's StepEnvManager): agentgym trains each episode as one sequence holding "
        "its whole history",
    ),
    KeyMap("batch_adjust_mode", kind="ignore", note="batches are whole groups here: nothing to copy or delete"),
    KeyMap("step_reward_weight", "algorithm.gigpo.step_advantage_w"),
    KeyMap("episode_reward_weight", "algorithm.gigpo.episode_advantage_w"),
    KeyMap("step_reward_gamma", "algorithm.gamma"),
    KeyMap("max_actions_per_traj", kind="ignore", note="read through custom_envs.*.max_steps"),
    KeyMap("max_steps_per_traj", f"{AR}.rollout.multi_turn.max_assistant_turns"),
    KeyMap("*_format_penalty", kind="ignore", note="read through custom_envs.*.env_config.format_penalty"),
    KeyMap("*_pattern", kind="ignore", note="agentgym's envs parse <answer>...</answer> themselves"),
    KeyMap("*_template", kind="ignore", note="agentgym's envs write their own prompts"),
    KeyMap("env_manager_cls", kind="ignore", note="episodes are run by agentgym's rollout runner"),
    KeyMap("agent_runner_cls", kind="ignore", note="episodes are run by agentgym's rollout runner", unless=(None,)),
    KeyMap("advantage_clip", "algorithm.advantage_clip"),
    KeyMap("ppo_epochs", f"{AR}.actor.ppo_epochs"),
    KeyMap(
        "adv_estimator",
        "algorithm.adv_estimator",
        kind="derived",
        note="grpo / reinforce -> reinforce (the group baseline is reward_normalization); gae -> gae; gigpo -> gigpo "
        "(reward_normalization.method -> algorithm.gigpo.mode)",
    ),
    KeyMap("pg_clip", f"{AR}.actor.clip_ratio", kind="derived", note="clip_ratio, clip_ratio_low and clip_ratio_high"),
    KeyMap("dual_clip_loss", f"{AR}.actor.dual_clip_loss"),
    KeyMap("init_kl_coef", "algorithm.kl_ctrl.kl_coef"),
    KeyMap("add_token_level_kl", "algorithm.use_kl_in_reward"),
    KeyMap("kl_penalty", "algorithm.kl_penalty"),
    KeyMap("target_kl", "algorithm.kl_ctrl.target_kl", kind="derived", note="set: kl_ctrl.type=adaptive"),
    KeyMap("kl_horizon", "algorithm.kl_ctrl.horizon"),
    KeyMap("use_kl_loss", f"{AR}.actor.use_kl_loss"),
    KeyMap("kl_loss_coef", f"{AR}.actor.kl_loss_coef"),
    KeyMap("whiten_advantages", "algorithm.whiten_advantages"),
    KeyMap("whiten_rewards", kind="ignore", note="not supported: use reward_normalization", unless=(False,)),
    KeyMap("entropy_loss_coef", f"{AR}.actor.entropy_coeff"),
    KeyMap("max_grad_norm", f"{AR}.actor.grad_clip"),
    KeyMap("loss_agg_mode", f"{AR}.actor.loss_agg_mode"),
    KeyMap("lambd", "algorithm.lam"),
    KeyMap("gamma", "algorithm.gamma"),
    KeyMap("reward_clip", "algorithm.reward_clip"),
    KeyMap("reward_norm", "algorithm.reward_norm"),
    KeyMap("reward_shift", "algorithm.reward_shift"),
    KeyMap("reward_scale", "algorithm.reward_scale"),
    KeyMap("critic_warmup", "trainer.critic_warmup"),
    KeyMap("sft_loss_coef", f"{AR}.actor.sft_loss_coef"),
    KeyMap(
        "use_turn_scores", kind="ignore", note="turn rewards count unless reward shaping folds them in", unless=(False,)
    ),
    KeyMap("enable_response_mask", kind="ignore", note="observation tokens are always masked out", unless=(True,)),
    KeyMap("enable_think", kind="ignore", note="prompts are the env's; a think block is the model's choice"),
    KeyMap("action_sep", kind="ignore", note="agentgym's Sokoban separates actions with ||", unless=("||",)),
    KeyMap("special_token_list", kind="ignore", note="decoding keeps the tokens the model sampled"),
    KeyMap(
        "reward_normalization.grouping",
        "algorithm.reward_normalization.grouping",
        kind="derived",
        note="traj_group_id -> state, tags -> inductive, batch -> batch (gigpo: grouped by task itself)",
    ),
    KeyMap(
        "reward_normalization.method",
        "algorithm.reward_normalization.method",
        kind="derived",
        note="the same name; under gigpo algorithm.gigpo.mode (mean -> mean_norm, mean_std -> mean_std_norm)",
    ),
    KeyMap("reward_normalization.*", kind="ignore", note="only method and grouping are read"),
    KeyMap("pretrain", f"{AR}.model.path"),
    KeyMap("reward_pretrain", "critic.model.path"),
    KeyMap("actor_train.training_args.learning_rate", f"{AR}.actor.optim.lr"),
    KeyMap("actor_train.training_args.weight_decay", f"{AR}.actor.optim.weight_decay"),
    KeyMap("actor_train.training_args.warmup_steps", f"{AR}.actor.optim.lr_warmup_steps"),
    KeyMap("actor_train.training_args.lr_scheduler_type", f"{AR}.actor.optim.warmup_style", convert=_scheduler),
    KeyMap("actor_train.training_args.per_device_train_batch_size", f"{AR}.actor.ppo_micro_batch_size_per_gpu"),
    KeyMap(
        "actor_train.training_args.gradient_accumulation_steps",
        f"{AR}.actor.ppo_mini_batch_size",
        kind="derived",
        note="per_device_train_batch_size x gradient_accumulation_steps trajectories per optimizer step / group_size",
    ),
    KeyMap(
        "actor_train.model_args.disable_gradient_checkpointing",
        f"{AR}.model.enable_gradient_checkpointing",
        convert=lambda v: not v,
    ),
    KeyMap("critic.training_args.learning_rate", "critic.optim.lr"),
    KeyMap("actor_train.model_args.lora_rank", f"{AR}.model.lora_rank"),
    KeyMap("actor_train.model_args.lora_alpha", f"{AR}.model.lora_alpha"),
    KeyMap("actor_train.model_args.lora_target", f"{AR}.model.target_modules", convert=lambda v: _lora_target(v)),
    KeyMap(
        "actor_infer.model_args.lora_*",
        kind="derived",
        note="the servers get the actor's adapters: must agree with actor_train.model_args.lora_* (else noted)",
    ),
    KeyMap("*.model_args.lora_*", kind="ignore", note="LoRA is the actor's (actor_train.model_args.lora_*)"),
    KeyMap("*.model_args.*", kind="ignore", note="model loading details (dtype, attention kernel): agentgym's own"),
    KeyMap("*.training_args.*", kind="ignore", note=BACKEND),
    KeyMap("*.strategy_args.strategy_config.gpu_memory_utilization", f"{AR}.rollout.gpu_memory_utilization"),
    KeyMap(
        "actor_infer.strategy_args.strategy_name",
        f"{AR}.rollout.name",
        kind="derived",
        note="vllm / sglang (the embedded server where that engine is not installed)",
    ),
    KeyMap(
        "actor_infer.strategy_args.*",
        kind="ignore",
        note="engine internals agentgym does not pass (block size, "
        "load format): its servers load the model's own weights",
    ),
    KeyMap("*.strategy_args.*", kind="ignore", note=BACKEND),
    KeyMap("*.device_mapping", kind="ignore", note=HW),
    KeyMap("*.infer_batch_size", kind="ignore", note="log-prob passes use log_prob_micro_batch_size_per_gpu"),
    KeyMap("*.data_args.*", kind="ignore", note="the chat template is the tokenizer's"),
    KeyMap("*.worker_cls", kind="ignore", note="agentgym's own workers", unless=(None,)),
    KeyMap(
        "actor_infer.generating_args.max_new_tokens",
        f"{AR}.rollout.max_tokens_per_turn",
        kind="derived",
        note="with max_tokens_per_step: the smaller caps each turn",
    ),
    KeyMap("actor_infer.generating_args.top_p", f"{AR}.rollout.top_p"),
    KeyMap("actor_infer.generating_args.top_k", f"{AR}.rollout.top_k"),
    KeyMap("actor_infer.generating_args.temperature", f"{AR}.rollout.temperature"),
    KeyMap("actor_infer.generating_args.num_beams", kind="ignore", note="beam search is not supported", unless=(1,)),
    KeyMap(
        "actor_infer.generating_args.num_return_sequences",
        kind="ignore",
        note="ROLL forces 1; the group size is train_env_manager.group_size",
    ),
    KeyMap("train_env_manager.group_size", f"{AR}.rollout.n"),
    KeyMap("train_env_manager.tags", "env.tags"),
    KeyMap("train_env_manager.n_groups", "env.n_groups"),
    KeyMap("train_env_manager.num_groups_partition", "env.n_groups"),
    KeyMap("train_env_manager.max_traj_per_env", "env.max_traj_per_env"),
    KeyMap("val_env_manager.group_size", f"{AR}.rollout.val_kwargs.n"),
    KeyMap("val_env_manager.tags", "env.val_tags"),
    KeyMap("val_env_manager.n_groups", "env.val_n_groups"),
    KeyMap("val_env_manager.num_groups_partition", "env.val_n_groups"),
    KeyMap("*_env_manager.env_groups", kind="ignore", note="the sum of n_groups"),
    KeyMap("*_env_manager.num_env_groups", kind="ignore", note="the sum of n_groups"),
    KeyMap("*_env_manager.format_penalty", kind="ignore", note="read through custom_envs.*.env_config.format_penalty"),
    KeyMap("*_env_manager.max_env_num_per_worker", kind="ignore", note="env workers: env.executor"),
    KeyMap("*_env_manager.max_traj_per_env", kind="ignore", note="checked for training envs only"),
    KeyMap("*_env_manager.*", kind="ignore", note="env worker placement: agentgym's executors"),
    KeyMap("reference.*", kind="ignore", note="the reference model is the initial policy, loaded when a KL term is on"),
    KeyMap("critic.*", kind="ignore", note=BACKEND),
    KeyMap("custom_env.*", kind="ignore", note="env templates: read through custom_envs"),
    KeyMap(
        "custom_envs.*",
        "env.custom_envs",
        kind="derived",
        note="env_type -> env, env_config -> kwargs (the keys the env takes), max_steps -> max_turns",
    ),
]


def _custom_envs(tr: Translation, data: dict[str, Any]) -> None:
    envs = data.get("custom_envs") or {}
    used = set(lookup(data, "train_env_manager.tags", []) or []) | set(lookup(data, "val_env_manager.tags", []) or [])
    for tag, spec in envs.items():
        prefix = f"custom_envs.{tag}"
        if tag not in used:
            tr.dropped.append((prefix, "tag not used by train_env_manager or val_env_manager"))
            continue
        if not isinstance(spec, dict):
            tr.refused.append((prefix, f"cannot read the env spec {spec!r} (an interpolation into a file not given?)"))
            continue
        env_type = str(spec.get("env_type"))
        if env_type not in ROLL_ENVS:
            tr.refused.append(
                (
                    prefix,
                    f"env_type {env_type!r} has no agentgym env (known: {', '.join(ROLL_ENVS)}); "
                    f"register one (agentgym.register) and set env.custom_envs.{tag}.env",
                )
            )
            continue
        env = ROLL_ENVS[env_type]
        config = dict(spec.get("env_config") or {})
        kwargs = {k: v for k, v in config.items() if k in ENV_KWARGS[env]}
        for key, value in ENV_DEFAULTS[env].items():
            if key not in config:
                kwargs[key] = value
                tr.mapped.append(
                    (f"{prefix}.env_config (ROLL's default)", f"env.custom_envs.{tag}.kwargs.{key}", value)
                )
        for key in sorted(set(config) - set(kwargs)):
            where = f"{prefix}.env_config.{key}"
            if key == "action_pattern":
                pattern = str(config[key])
                tr.dropped.append(
                    (
                        where,
                        "agentgym's envs read <answer>...</answer> themselves"
                        if pattern in ANSWER_PATTERNS
                        else THINK_NOTE,
                    )
                )
            elif key in ("render_mode", "special_token_list"):
                tr.dropped.append((where, "text rendering; decoding keeps the tokens the model sampled"))
            else:
                tr.refused.append(
                    (where, f"agentgym's {env} env has no such setting (it takes {', '.join(ENV_KWARGS[env])})")
                )
        if "dim_room" in kwargs:
            kwargs["dim_room"] = list(kwargs["dim_room"])
        if "grid_lookup" in kwargs:
            kwargs["grid_lookup"] = {int(k): str(v) for k, v in dict(kwargs["grid_lookup"]).items()}
        if isinstance(kwargs.get("grid_vocab"), dict):  # pairs: a symbol such as "." cannot be a config key
            kwargs["grid_vocab"] = [[str(k), str(v)] for k, v in kwargs["grid_vocab"].items()]
        entry: dict[str, Any] = {"env": env, "kwargs": kwargs}
        turns = spec.get("max_steps", spec.get("max_actions_per_traj"))
        if turns is not None:
            entry["max_turns"] = int(turns)
        tr.set(f"env.custom_envs.{tag}", entry, prefix)
        if spec.get("history_length") is not None:
            tr.dropped.append(
                (
                    f"{prefix}.history_length",
                    "a history window (ROLL's StepEnvManager): agentgym trains "
                    "each episode as one sequence holding its whole history",
                )
            )
        handled = {
            "env_type",
            "env_config",
            "max_steps",
            "max_actions_per_traj",
            "max_tokens_per_step",
            "history_length",
        }
        for key in sorted(set(spec) - handled):
            tr.dropped.append((f"{prefix}.{key}", "episode plumbing agentgym does itself"))


def _turn_tokens(tr: Translation, data: dict[str, Any]) -> None:
    """ROLL caps a turn at min(max_tokens_per_step of the env, generating_args.max_new_tokens)."""
    caps: dict[str, int] = {}
    if data.get("max_tokens_per_step") is not None:
        caps["max_tokens_per_step"] = int(data["max_tokens_per_step"])
    new_tokens = lookup(data, "actor_infer.generating_args.max_new_tokens")
    if new_tokens is not None:
        caps["actor_infer.generating_args.max_new_tokens"] = int(new_tokens)
    used = set(lookup(data, "train_env_manager.tags", []) or []) | set(lookup(data, "val_env_manager.tags", []) or [])
    for tag, spec in (data.get("custom_envs") or {}).items():
        if tag in used and isinstance(spec, dict) and spec.get("max_tokens_per_step") is not None:
            caps[f"custom_envs.{tag}.max_tokens_per_step"] = int(spec["max_tokens_per_step"])
    if not caps:
        return
    smallest = min(caps.values())
    tr.set(f"{AR}.rollout.max_tokens_per_turn", smallest, " / ".join(caps) if len(caps) > 1 else next(iter(caps)))
    if len(set(caps.values())) > 1:
        tr.notes.append(
            "these caps on a turn's tokens differ: "
            + ", ".join(f"{k}={v}" for k, v in caps.items())
            + f"; ROLL generates at most the smallest, and so does agentgym "
            f"({AR}.rollout.max_tokens_per_turn={smallest}, one cap for every env)"
        )


def _lora(tr: Translation, data: dict[str, Any]) -> None:
    train = lookup(data, "actor_train.model_args") or {}
    infer = lookup(data, "actor_infer.model_args") or {}
    for key in ("lora_rank", "lora_alpha", "lora_target"):
        if key in infer and infer[key] != train.get(key):
            tr.notes.append(
                f"actor_infer.model_args.{key}={infer[key]!r} differs from actor_train's "
                f"{train.get(key)!r}: agentgym serves the adapters it trains (actor_train's)"
            )
    if int(train.get("lora_rank") or 0) > 0:
        tr.notes.append(
            f"LoRA: only adapters of rank {train['lora_rank']} train "
            f"({AR}.model.lora_rank; needs peft); the learning rate applies to them"
        )


def _derive(tr: Translation, data: dict[str, Any]) -> None:
    group = int(lookup(data, "train_env_manager.group_size", 1) or 1)
    val_group = int(lookup(data, "val_env_manager.group_size", 1) or 1)
    if "rollout_batch_size" in data:
        tasks = max(1, int(data["rollout_batch_size"]) // group)
        partition = lookup(data, "train_env_manager.n_groups") or lookup(data, "train_env_manager.num_groups_partition")
        if partition and sum(partition) != tasks:
            tr.notes.append(
                f"rollout_batch_size / group_size = {tasks} groups but the env manager's groups add up to "
                f"{sum(partition)}: data.train_batch_size follows the env manager"
            )
            tasks = int(sum(partition))
        tr.set("data.train_batch_size", tasks, "rollout_batch_size")
    if "val_batch_size" in data:
        val_tasks = max(1, int(data["val_batch_size"]) // val_group)
        partition = lookup(data, "val_env_manager.n_groups") or lookup(data, "val_env_manager.num_groups_partition")
        if partition and sum(partition) != val_tasks:
            val_tasks = int(sum(partition))
        tr.set("data.val_batch_size", val_tasks, "val_batch_size")
    if "sequence_length" in data:
        total = int(data["sequence_length"])
        tr.set("data.max_prompt_length", total // 2, "sequence_length")
        tr.set("data.max_response_length", total - total // 2, "sequence_length")
    per_device = lookup(data, "actor_train.training_args.per_device_train_batch_size")
    accumulate = lookup(data, "actor_train.training_args.gradient_accumulation_steps")
    if per_device and accumulate:
        tasks = tr.get("data.train_batch_size", 1)
        mini = max(1, int(per_device) * int(accumulate) // group)
        if tasks % mini:
            tr.notes.append(
                f"{per_device} x {accumulate} trajectories per optimizer step is {mini} tasks, which does "
                f"not divide data.train_batch_size={tasks}: one optimizer step per training step instead"
            )
            mini = tasks
        tr.set(
            f"{AR}.actor.ppo_mini_batch_size",
            min(mini, tasks),
            "actor_train.training_args.per_device_train_batch_size x gradient_accumulation_steps",
        )
    estimator = str(data.get("adv_estimator", "gae"))
    ours = {"gae": "gae", "gigpo": "gigpo"}.get(estimator, "reinforce")
    tr.set("algorithm.adv_estimator", ours, "adv_estimator")
    if ours == "reinforce":
        tr.notes.append(
            "ROLL's agentic grpo is REINFORCE on normalised rewards: agentgym's reinforce estimator with "
            "algorithm.reward_normalization (group mean/std per env state: grouping=state, method=mean_std)"
        )
    _normalisation(tr, data, ours)
    _turn_tokens(tr, data)
    _lora(tr, data)
    if "pg_clip" in data and data["pg_clip"] is not None:
        for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            tr.set(f"{AR}.actor.{key}", float(data["pg_clip"]), "pg_clip")
    if "dual_clip_loss" not in data:
        tr.set(f"{AR}.actor.dual_clip_loss", False, "dual_clip_loss (ROLL's default: false)")
    if data.get("target_kl") is not None:
        tr.set("algorithm.kl_ctrl.type", "adaptive", "target_kl")
        tr.set("algorithm.kl_ctrl.target_kl", float(data["target_kl"]), "target_kl")
    tracker = data.get("track_with")
    if tracker is not None:
        tr.set(
            "trainer.logger",
            ["console", "jsonl"] + ([str(tracker)] if tracker in ("tensorboard", "wandb") else []),
            "track_with",
        )
    resume = data.get("resume_from_checkpoint")
    if resume is not None:
        if resume:
            tr.set("trainer.resume_mode", "resume_path", "resume_from_checkpoint")
            tr.set("trainer.resume_from_path", str(resume), "resume_from_checkpoint")
        else:
            tr.set("trainer.resume_mode", "disable", "resume_from_checkpoint")
    engine_or_embedded(
        tr, lookup(data, "actor_infer.strategy_args.strategy_name"), "actor_infer.strategy_args.strategy_name"
    )
    if estimator == "gae" and "reward_pretrain" not in data:
        tr.notes.append("gae: the critic starts from the policy's weights (critic.model.path)")
    _custom_envs(tr, data)


def _normalisation(tr: Translation, data: dict[str, Any], estimator: str) -> None:
    method = lookup(data, "reward_normalization.method")
    grouping = lookup(data, "reward_normalization.grouping")
    if estimator == "gigpo":  # GiGPO normalises episode and step scores within their own groups
        if method is not None:
            mode = {"mean": "mean_norm", "mean_std": "mean_std_norm"}.get(str(method))
            if mode is None:
                tr.refused.append(
                    (
                        "reward_normalization.method",
                        f"{method!r}: gigpo normalises with mean or mean_std (algorithm.gigpo.mode)",
                    )
                )
            else:
                tr.set("algorithm.gigpo.mode", mode, "reward_normalization.method")
        return
    if grouping is not None:
        tr.set(
            "algorithm.reward_normalization.grouping",
            GROUPINGS.get(str(grouping), str(grouping)),
            "reward_normalization.grouping",
        )
    if method is not None:
        tr.set("algorithm.reward_normalization.method", str(method), "reward_normalization.method")


def translate_roll(data: dict[str, Any]) -> Translation:
    """A ROLL agentic config (a mapping) as agentgym's."""
    return translate("roll", data, ROLL_KEYS, _derive, skip=("custom_envs",))
