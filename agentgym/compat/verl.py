"""veRL's ``ppo_trainer.yaml`` in agentgym (read against veRL 0.9).

``VERL_RULES``: veRL keys that ``configs/train.yaml`` lacks, and what happens to each: accepted with
no effect (GPU performance knobs, things agentgym always does), refused with what to use instead
(features agentgym does not have), or an alias of an agentgym key. ``verl_key_policy`` is the
``KeyPolicy`` ``load_config`` composes with, so a veRL command line runs as written.

``VERL_DEFAULTS``: veRL's default for each key both have; ``train.yaml`` takes the same default
except for the keys in ``DEFAULT_EXCEPTIONS`` (each with its reason). ``tests/compat/test_compat_verl.py``
holds ``train.yaml`` to this, and ``docs/coming_from_verl.md`` is rendered from these tables.
"""

from __future__ import annotations

from typing import Any

from agentgym.compat.rules import Rule, Verdict, apply_rules

PERF = "a GPU performance setting; agentgym's result does not depend on it"
NO_LORA = "LoRA is for the actor only (actor_rollout_ref.model.lora_rank); the critic trains full weights"
PROFILER = "agentgym has no profiler hooks; timings are in the metrics (timing_s/*)"
AR = "actor_rollout_ref"
NOT_READ = "only read by veRL's own worker implementation"

VERL_RULES: list[Rule] = [
    Rule("*._target_", "ignore", "Hydra's instantiation target; agentgym builds its own objects"),
    # ---- aliases: veRL's other names for agentgym keys
    Rule("ray_kwargs.ray_init.*", "alias", ""),  # filled in by verl_key_policy
    Rule("ray_kwargs.timeline_json_file", "alias", "ray_init.timeline_json_file"),
    Rule("reward_manager.name", "alias", "reward_model.reward_manager"),
    Rule(f"{AR}.actor.optim.clip_grad", "alias", f"{AR}.actor.grad_clip"),
    Rule("critic.optim.clip_grad", "alias", "critic.grad_clip"),
    # ---- refused: features agentgym does not have
    Rule(
        f"{AR}.model.lora_adapter_path",
        "ignore",
        "training starts from fresh adapters; load a merged model as actor_rollout_ref.model.path instead",
        (None,),
    ),
    Rule(f"{AR}.model.exclude_modules", "ignore", "list the modules that get adapters in target_modules", (None,)),
    Rule("critic.model.lora_rank", "ignore", NO_LORA, (0,)),
    Rule("critic.model.lora_alpha", "ignore", NO_LORA),
    Rule("critic.model.target_modules", "ignore", NO_LORA),
    Rule("critic.model.exclude_modules", "ignore", NO_LORA),
    Rule("*.external_lib", "ignore", "agentgym imports no model library: use a model transformers loads", (None,)),
    Rule("*.override_config", "ignore", "model config overrides are not applied: edit the model's config.json", ({},)),
    Rule(
        "*.custom_chat_template",
        "ignore",
        "set the chat template in the model directory's tokenizer_config.json",
        (None,),
    ),
    Rule(
        "*.tokenizer_path",
        "ignore",
        "the tokenizer is read from the model path (actor_rollout_ref.model.path, "
        "critic.model.path); a tokenizer from elsewhere is not supported",
    ),
    Rule(f"{AR}.model.hf_config_path", "ignore", "the config is read from the model path", (None,)),
    Rule(
        f"{AR}.actor.ppo_micro_batch_size",
        "ignore",
        "the global micro-batch size is deprecated in veRL too: set ppo_micro_batch_size_per_gpu",
        (None,),
    ),
    Rule("critic.ppo_micro_batch_size", "ignore", "set critic.ppo_micro_batch_size_per_gpu", (None,)),
    Rule("*.log_prob_micro_batch_size", "ignore", "set log_prob_micro_batch_size_per_gpu", (None,)),
    Rule("critic.forward_micro_batch_size", "ignore", "set critic.forward_micro_batch_size_per_gpu", (None,)),
    Rule(f"{AR}.actor.optim.optimizer", "ignore", "agentgym's optimizer is AdamW", ("AdamW",)),
    Rule("critic.optim.optimizer", "ignore", "agentgym's optimizer is AdamW", ("AdamW",)),
    Rule("*.optim.override_optimizer_config", "ignore", "optimizer overrides are not applied", (None, {})),
    Rule(f"{AR}.rollout.ignore_eos", "ignore", "generation always stops at EOS", (False,)),
    Rule(f"{AR}.rollout.quantization", "ignore", "quantized rollout is not supported", (None,)),
    Rule(f"{AR}.rollout.over_sample_rate", "ignore", "over-sampling is not supported", (0, 0.0)),
    Rule(f"{AR}.rollout.skip_rollout", "ignore", "rollout dumps are not supported", (False,)),
    Rule(
        f"{AR}.rollout.multi_turn.tool_config_path",
        "ignore",
        "veRL tool classes (verl.tools.*) are not run, so the rows' tools_kwargs and the tools' rewards would be "
        "lost: agentgym's tools are registered (agentgym envs --all) and offered by tool envs (--env gsm8k_tool: "
        "calculator and Python, scored by the final #### answer)",
        (None,),
    ),
    Rule(
        f"{AR}.rollout.agent.agent_loop_config_path",
        "ignore",
        "agent loops are envs or --agent programs here; see docs/coming_from_verl.md",
        (None,),
    ),
    Rule(
        f"{AR}.rollout.agent.default_agent_loop",
        "ignore",
        "rows are single-turn episodes unless the env makes them multi-turn (per-row agent_name: tool_agent "
        "needs a tool env)",
        ("single_turn_agent",),
    ),
    Rule(
        f"{AR}.rollout.agent.custom_async_server.*",
        "ignore",
        "custom rollout servers: pass their URLs in actor_rollout_ref.rollout.server_urls",
        (None,),
    ),
    Rule("data.custom_cls.*", "ignore", "custom dataset classes are not loaded: write rows in veRL's format", (None,)),
    Rule("data.sampler.*", "ignore", "custom samplers are not loaded", (None,)),
    Rule("data.datagen.*", "ignore", "dynamic data generation is not supported", (None,)),
    Rule("data.tokenizer", "ignore", "the tokenizer is the model's", (None,)),
    Rule("data.validation_shuffle", "ignore", "validation rows are taken in order", (False,)),
    Rule("data.tool_config_path", "ignore", "veRL tool configs are not read", (None,)),
    Rule("reward_manager.source", "ignore", "reward managers are agentgym's own (naive | dapo | prime)", ("register",)),
    Rule(
        "reward_manager.module.*",
        "ignore",
        "custom reward managers are not loaded: use custom_reward_function",
        (None, "custom_reward_manager"),
    ),
    Rule(
        "reward_model.sandbox_fusion.url",
        "ignore",
        "sandbox fusion is not supported: score code in a custom_reward_function",
        (None,),
    ),
    Rule("algorithm.use_pf_ppo", "ignore", "PF-PPO is not supported", (False,)),
    Rule("algorithm.rollout_correction.rollout_rs", "ignore", "rollout rejection sampling is not supported", (None,)),
    Rule(
        "algorithm.rollout_correction.bypass_mode",
        "ignore",
        "bypass is rollout_correction.rollout_is=null with use_rollout_log_probs=true",
        (False,),
    ),
    Rule("trainer.default_hdfs_dir", "ignore", "HDFS upload is not supported: copy the run dir", (None,)),
    Rule("transfer_queue.enable", "ignore", "veRL's transfer queue is not needed here", (False,)),
    Rule("trainer.balance_batch", "ignore", "agentgym does not reorder rows across workers (a speed setting)"),
    Rule(f"{AR}.rollout.data_parallel_size", "ignore", PERF, (1,)),
    Rule(f"{AR}.rollout.expert_parallel_size", "ignore", PERF, (1,)),
    Rule(f"{AR}.rollout.pipeline_model_parallel_size", "ignore", PERF, (1,)),
    Rule("*.ulysses_sequence_parallel_size", "ignore", "no sequence parallelism: each sequence is on one worker", (1,)),
    # ---- ignored: performance knobs, things agentgym always does, veRL's own plumbing
    Rule("*.use_torch_compile", "ignore", PERF),
    Rule("*.use_fused_kernels", "ignore", PERF),
    Rule("*.fused_kernel_options.*", "ignore", PERF),
    Rule("*.use_liger", "ignore", PERF),
    Rule("*.tiled_mlp.*", "ignore", PERF),
    Rule("*.mtp.*", "ignore", PERF),
    Rule("*.mtp", "ignore", "multi-token prediction (MTP) is not supported; it is off unless mtp.enable is set"),
    Rule("*.enable_activation_offload", "ignore", PERF),
    Rule("*.entropy_from_logits_with_chunking", "ignore", PERF),
    Rule("*.entropy_checkpointing", "ignore", PERF),
    Rule("*.sum_pi_squared_checkpointing", "ignore", PERF),
    Rule("*.use_shm", "ignore", PERF),
    Rule("*.trust_remote_code", "ignore", "models are loaded with transformers' own classes"),
    Rule("*.fsdp_config.*", "ignore", "FSDP wrapping details: agentgym shards every decoder layer (FSDP2)"),
    Rule("*.use_remove_padding", "ignore", "set actor_rollout_ref.model.use_remove_padding (one switch for all)"),
    Rule(f"{AR}.actor.use_prefix_grouper", "ignore", PERF, (False,)),
    Rule(f"{AR}.actor.calculate_entropy", "ignore", "the entropy is always computed and logged (actor/entropy)"),
    Rule(f"{AR}.actor.calculate_sum_pi_squared", "ignore", "not logged here", (False,)),
    Rule(f"{AR}.actor.freeze_vision_tower", "ignore", "text models only"),
    Rule(f"{AR}.actor.tau_pos", "ignore", "SAPO is not a loss_mode here"),
    Rule(f"{AR}.actor.tau_neg", "ignore", "SAPO is not a loss_mode here"),
    Rule(
        f"{AR}.actor.policy_loss.*",
        "ignore",
        "only read by loss modes agentgym does not have (clip_cov, kl_cov, dro, ...)",
    ),
    Rule("*.data_loader_seed", "ignore", "mini-batch shuffling is seeded by trainer.seed"),
    Rule("*.rollout_n", "ignore", "mirrors actor_rollout_ref.rollout.n"),
    Rule("*.checkpoint.async_save", "ignore", "checkpoints are written synchronously"),
    Rule("*.profiler.*", "ignore", PROFILER),
    Rule("global_profiler.*", "ignore", PROFILER),
    Rule("*.router_replay.*", "ignore", "MoE router replay is not supported"),
    Rule(f"{AR}.ref.strategy", "ignore", "the reference model follows actor_rollout_ref.actor.strategy"),
    Rule("critic.strategy", "ignore", "the critic follows actor_rollout_ref.actor.strategy"),
    Rule("*.optim.optimizer_impl", "ignore", "torch.optim.AdamW"),
    Rule("*.optim.total_training_steps", "ignore", "set from trainer.total_training_steps"),
    Rule("*.log_prob_use_dynamic_bsz", "ignore", "log-prob passes use log_prob_micro_batch_size_per_gpu rows"),
    Rule("*.log_prob_max_token_len_per_gpu", "ignore", "log-prob passes use log_prob_micro_batch_size_per_gpu rows"),
    Rule("critic.forward_max_token_len_per_gpu", "ignore", "value passes use forward_micro_batch_size_per_gpu rows"),
    Rule("critic.shuffle", "ignore", "the critic's mini-batches follow actor_rollout_ref.actor.shuffle"),
    Rule("critic.enable_gradient_checkpointing", "ignore", PERF),
    Rule("critic.model.enable_gradient_checkpointing", "ignore", PERF),
    Rule(f"{AR}.nccl_timeout", "ignore", NOT_READ),
    Rule(f"{AR}.rollout.mode", "ignore", "rollouts are always asynchronous (many episodes in flight)"),
    Rule(f"{AR}.rollout.prompt_length", "ignore", "set from data.max_prompt_length"),
    Rule(f"{AR}.rollout.response_length", "ignore", "set from data.max_response_length"),
    Rule(
        f"{AR}.rollout.max_model_len",
        "ignore",
        "the servers' context is data.max_prompt_length + data.max_response_length",
    ),
    Rule(f"{AR}.rollout.cudagraph_capture_sizes", "ignore", PERF),
    Rule(f"{AR}.rollout.enable_prefix_caching", "ignore", PERF),
    Rule(f"{AR}.rollout.scheduling_policy", "ignore", PERF),
    Rule(f"{AR}.rollout.disable_log_stats", "ignore", PERF),
    Rule(f"{AR}.rollout.multi_stage_wake_up", "ignore", PERF),
    Rule(f"{AR}.rollout.layered_summon", "ignore", PERF),
    Rule(f"{AR}.rollout.skip_tokenizer_init", "ignore", NOT_READ),
    Rule(f"{AR}.rollout.skip_dump_dir", "ignore", NOT_READ),
    Rule(f"{AR}.rollout.enable_rollout_routing_replay", "ignore", "MoE router replay is not supported"),
    Rule(f"{AR}.rollout.calculate_log_probs", "ignore", "the servers always report logprobs"),
    Rule(f"{AR}.rollout.logprobs_mode", "ignore", "logprobs are log_softmax of the raw logits (no temperature)"),
    Rule(f"{AR}.rollout.agent.num_workers", "ignore", "concurrency is actor_rollout_ref.rollout.concurrency"),
    Rule(f"{AR}.rollout.checkpoint_engine.*", "ignore", "weights are pushed by agentgym's weight sync"),
    Rule(f"{AR}.rollout.trace.*", "ignore", "sampled trajectories are in <run dir>/samples.jsonl"),
    Rule(f"{AR}.rollout.prometheus.*", "ignore", PROFILER),
    Rule(f"{AR}.rollout.quantization_config_file", "ignore", "quantized rollout is not supported"),
    Rule(f"{AR}.rollout.multi_turn.enable", "ignore", "an env is multi-turn when it asks for more turns"),
    Rule(f"{AR}.rollout.multi_turn.max_parallel_calls", "ignore", "tool envs run every call of a turn"),
    Rule(f"{AR}.rollout.multi_turn.max_tool_response_length", "ignore", "tool envs bound their own replies"),
    Rule(f"{AR}.rollout.multi_turn.tool_response_truncate_side", "ignore", "tool envs bound their own replies"),
    Rule(
        f"{AR}.rollout.multi_turn.use_inference_chat_template",
        "ignore",
        "training uses exactly the tokens the servers sampled",
    ),
    Rule(
        f"{AR}.rollout.multi_turn.tokenization_sanity_check_mode",
        "ignore",
        "every episode's tokens are checked against a re-render (rollout/template_mismatch)",
    ),
    Rule(f"{AR}.rollout.multi_turn.format", "ignore", "tool calls are Hermes-format here", ("hermes",)),
    Rule(f"{AR}.rollout.multi_turn.num_repeat_rollouts", "ignore", NOT_READ),
    Rule("data.use_shm", "ignore", PERF),
    Rule("data.dataloader_num_workers", "ignore", "rows are read once, in this process"),
    Rule("data.image_patch_size", "ignore", "text models only"),
    Rule("data.image_key", "ignore", "text models only"),
    Rule("data.video_key", "ignore", "text models only"),
    Rule("data.return_multi_modal_inputs", "ignore", "text models only"),
    Rule("data.return_raw_input_ids", "ignore", "prompts are rendered by the rollout, not the data loader"),
    Rule("data.return_full_prompt", "ignore", "prompts are rendered by the rollout, not the data loader"),
    Rule("data.filter_overlong_prompts_workers", "ignore", "rows are filtered in this process"),
    Rule("data.seed", "ignore", "the data order is seeded by trainer.seed"),
    Rule("data.trust_remote_code", "ignore", "models are loaded with transformers' own classes"),
    Rule(
        "reward_model.strategy",
        "ignore",
        "the reward model runs in a worker of its own (a Ray actor with trainer.use_ray, else this process), unsharded",
    ),
    Rule("reward_model.use_dynamic_bsz", "ignore", "reward-model rows go micro_batch_size_per_gpu at a time"),
    Rule(
        "reward_model.forward_max_token_len_per_gpu",
        "ignore",
        "reward-model rows go micro_batch_size_per_gpu at a time",
    ),
    Rule("reward_model.launch_reward_fn_async", "ignore", "rewards are computed as each step's episodes finish"),
    Rule("reward_model.use_reward_loop", "ignore", "agentgym's reward model and judges are its own reward loop"),
    Rule("reward_model.num_workers", "ignore", "one reward-model worker scores each step's rows"),
    Rule(
        "reward_model.rollout.*",
        "refuse",
        "a generative reward model is a judge here: judge.enable=true "
        "judge.base_url=URL (any OpenAI-compatible endpoint, e.g. `agentgym serve` or vLLM), see docs/rewards.md",
    ),
    Rule("reward_model.enable_resource_pool", "ignore", "the reward model shares the trainer's resources"),
    Rule("reward_model.n_gpus_per_node", "ignore", "the reward model shares the trainer's resources"),
    Rule("reward_model.nnodes", "ignore", "the reward model shares the trainer's resources"),
    Rule(
        "reward_model.model.*",
        "ignore",
        "reward-model loading details: agentgym loads reward_model.model.path "
        "with transformers' AutoModelForSequenceClassification",
    ),
    Rule(
        "reward_model.*",
        "ignore",
        "a veRL reward-model setting agentgym does not read (docs/rewards.md lists the keys it does)",
    ),
    Rule("algorithm.pf_ppo.*", "ignore", "PF-PPO is not supported"),
    Rule(
        "algorithm.rollout_correction.*",
        "ignore",
        "rollout correction has rollout_is (token | sequence), "
        "rollout_is_threshold and rollout_is_batch_normalize here (docs/async_training.md)",
    ),
    Rule(
        "trainer.log_val_generations",
        "ignore",
        "validation samples go to <run dir>/samples.jsonl (trainer.log_samples)",
    ),
    Rule("trainer.rollout_data_dir", "ignore", "sampled trajectories are in <run dir>/samples.jsonl"),
    Rule("trainer.validation_data_dir", "ignore", "validation samples are in <run dir>/samples.jsonl"),
    Rule("trainer.esi_redundant_time", "ignore", NOT_READ),
    Rule("trainer.del_local_ckpt_after_load", "ignore", "checkpoints are kept (trainer.max_actor_ckpt_to_keep)"),
    Rule("trainer.ray_wait_register_center_timeout", "ignore", NOT_READ),
    Rule("trainer.use_legacy_worker_impl", "ignore", NOT_READ),
    Rule("transfer_queue.*", "ignore", "veRL's transfer queue is not needed here"),
]

VERL_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024,
    "data.val_batch_size": None,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.shuffle": True,
    "data.prompt_key": "prompt",
    "data.reward_fn_key": "data_source",
    "data.return_raw_chat": True,
    "data.filter_overlong_prompts": False,
    "data.truncation": "error",
    "data.train_max_samples": -1,
    "data.val_max_samples": -1,
    f"{AR}.model.enable_gradient_checkpointing": True,
    f"{AR}.model.use_remove_padding": True,
    f"{AR}.model.lora_rank": 0,
    f"{AR}.model.lora_alpha": 16,
    f"{AR}.actor.optim.lr": 1e-6,
    f"{AR}.actor.optim.weight_decay": 0.01,
    f"{AR}.actor.optim.betas": [0.9, 0.999],
    f"{AR}.actor.optim.lr_warmup_steps": -1,
    f"{AR}.actor.optim.lr_warmup_steps_ratio": 0.0,
    f"{AR}.actor.optim.min_lr_ratio": 0.0,
    f"{AR}.actor.optim.num_cycles": 0.5,
    f"{AR}.actor.optim.warmup_style": None,
    f"{AR}.actor.optim.lr_scheduler_type": "constant",
    f"{AR}.actor.ppo_mini_batch_size": 256,
    f"{AR}.actor.ppo_micro_batch_size_per_gpu": None,
    f"{AR}.actor.use_dynamic_bsz": False,
    f"{AR}.actor.ppo_max_token_len_per_gpu": 16384,
    f"{AR}.actor.clip_ratio": 0.2,
    f"{AR}.actor.clip_ratio_low": 0.2,
    f"{AR}.actor.clip_ratio_high": 0.2,
    f"{AR}.actor.clip_ratio_c": 3.0,
    f"{AR}.actor.loss_agg_mode": "token-mean",
    f"{AR}.actor.loss_scale_factor": None,
    f"{AR}.actor.entropy_coeff": 0,
    f"{AR}.actor.use_kl_loss": False,
    f"{AR}.actor.kl_loss_coef": 0.001,
    f"{AR}.actor.kl_loss_type": "low_var_kl",
    f"{AR}.actor.ppo_epochs": 1,
    f"{AR}.actor.shuffle": False,
    f"{AR}.actor.grad_clip": 1.0,
    f"{AR}.actor.policy_loss.loss_mode": "vanilla",
    f"{AR}.actor.fsdp_config.param_offload": False,
    f"{AR}.actor.fsdp_config.optimizer_offload": False,
    f"{AR}.actor.fsdp_config.reshard_after_forward": True,
    f"{AR}.actor.checkpoint.save_contents": ["model", "optimizer", "extra"],
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": None,
    f"{AR}.ref.fsdp_config.param_offload": False,
    f"{AR}.rollout.n": 1,
    f"{AR}.rollout.temperature": 1.0,
    f"{AR}.rollout.top_k": -1,
    f"{AR}.rollout.top_p": 1,
    f"{AR}.rollout.do_sample": True,
    f"{AR}.rollout.dtype": "bfloat16",
    f"{AR}.rollout.gpu_memory_utilization": 0.5,
    f"{AR}.rollout.enforce_eager": False,
    f"{AR}.rollout.free_cache_engine": True,
    f"{AR}.rollout.tensor_model_parallel_size": 2,
    f"{AR}.rollout.max_num_batched_tokens": 8192,
    f"{AR}.rollout.max_num_seqs": 256,
    f"{AR}.rollout.enable_chunked_prefill": True,
    f"{AR}.rollout.load_format": "dummy",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": None,
    f"{AR}.rollout.multi_turn.max_assistant_turns": None,
    f"{AR}.rollout.multi_turn.max_user_turns": None,
    f"{AR}.rollout.multi_turn.interaction_config_path": None,
    f"{AR}.rollout.val_kwargs.top_k": -1,
    f"{AR}.rollout.val_kwargs.top_p": 1.0,
    f"{AR}.rollout.val_kwargs.temperature": 0,
    f"{AR}.rollout.val_kwargs.n": 1,
    f"{AR}.rollout.val_kwargs.do_sample": False,
    "critic.enable": None,
    "critic.optim.lr": 1e-5,
    "critic.optim.weight_decay": 0.01,
    "critic.ppo_micro_batch_size_per_gpu": None,
    "critic.ppo_max_token_len_per_gpu": 32768,
    "critic.cliprange_value": 0.5,
    "critic.grad_clip": 1.0,
    "critic.forward_micro_batch_size_per_gpu": None,
    "critic.model.fsdp_config.param_offload": False,
    "critic.model.fsdp_config.optimizer_offload": False,
    "reward_model.enable": False,
    "reward_model.reward_manager": "naive",
    "reward_model.max_length": None,
    "reward_model.micro_batch_size": None,
    "reward_model.micro_batch_size_per_gpu": None,
    "custom_reward_function.path": None,
    "custom_reward_function.name": "compute_score",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.adv_estimator": "gae",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.horizon": 10000,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "trainer.total_epochs": 30,
    "trainer.total_training_steps": None,
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
    "trainer.logger": ["console", "wandb"],
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.save_freq": -1,
    "trainer.resume_mode": "auto",
    "trainer.resume_from_path": None,
    "trainer.val_before_train": True,
    "trainer.val_only": False,
    "trainer.test_freq": -1,
    "trainer.critic_warmup": 0,
    "trainer.default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
    "trainer.max_actor_ckpt_to_keep": None,
    "trainer.max_critic_ckpt_to_keep": None,
    "trainer.device": "cuda",
    "ray_init.num_cpus": None,
    "ray_init.timeline_json_file": None,
}
"""veRL 0.9's defaults (``_generated_ppo_trainer.yaml``) for the keys agentgym shares."""

MEMORY = "trades memory for speed; the trained result is the same"
DEFAULT_EXCEPTIONS: dict[str, str] = {
    f"{AR}.model.enable_gradient_checkpointing": f"off: {MEMORY} (CPU runs are faster without it)",
    f"{AR}.model.use_remove_padding": "off: on CPU, packing rows into one sequence costs more attention than the "
    "padding it saves; the trained result is the same",
    f"{AR}.actor.optim.warmup_style": "constant: agentgym's name for the schedule (veRL's newer name, "
    "lr_scheduler_type, wins when set)",
    f"{AR}.actor.optim.lr_scheduler_type": "null: falls back to warmup_style (constant), veRL's default",
    f"{AR}.actor.ppo_micro_batch_size_per_gpu": f"8: veRL requires it to be set; {MEMORY}",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": "null: the rollout's (16); veRL requires it to be set",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": f"16: veRL requires it to be set; {MEMORY}",
    f"{AR}.rollout.tensor_model_parallel_size": "1: hardware (GPUs per engine); 1 runs anywhere",
    f"{AR}.rollout.enable_chunked_prefill": "null: on, except vLLM on a CPU, whose engine dies on a seeded request "
    "prefilled in more than one step (docs/vllm_cpu.md)",
    f"{AR}.rollout.dtype": "null: the model's own dtype, so a float32 checkpoint is served in float32 and its "
    "logprobs match a float32 trainer's (docs/deploy.md, token fidelity by dtype)",
    "critic.ppo_micro_batch_size_per_gpu": "null: the actor's; veRL requires it to be set",
    "critic.forward_micro_batch_size_per_gpu": f"16: {MEMORY}",
    "trainer.project_name": "agentgym: names the output directory only",
    "trainer.experiment_name": "null: <env or agent>-<adv_estimator>; names the output directory only",
    "trainer.logger": "[console, jsonl]: wandb needs an account; metrics.jsonl is always written",
    "trainer.n_gpus_per_node": "1: hardware; set it to the GPUs you have",
    "trainer.default_local_dir": "null: outputs/<project_name>/<experiment_name>",
    "trainer.device": "auto: cuda when there is one, else cpu",
}


VERL_VALUES: dict[str, dict[Any, tuple[Any, str]]] = {
    f"{AR}.rollout.name": {
        "hf": ("embedded", "veRL's Hugging Face rollout (transformers' generate) is agentgym's embedded server"),
        None: ("embedded", "no engine named (a dumped veRL config writes None): agentgym's embedded server"),
        "None": ("embedded", "no engine named (a dumped veRL config writes None): agentgym's embedded server"),
    },
}
"""veRL values of agentgym keys that agentgym spells another way: key -> {their value: (ours, why)}. Applied
when a config is loaded (``agentgym.trainer.config.compose_training``), each with a note."""


VERL_LEFT_NULL = (f"{AR}.actor.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu")
"""Sizes veRL's dumped configs leave null for the launch script to set (veRL refuses to run without them):
agentgym takes its own default, with a note."""


def verl_values(get: Any) -> list[tuple[str, Any, Any, str]]:
    """``(key, their value, ours, why)`` for each key whose value (``get(key)``) is a veRL spelling."""
    out = []
    for key, table in VERL_VALUES.items():
        value = get(key)
        for theirs, (ours, why) in table.items():
            if value == theirs and (theirs is not None or value is None):
                out.append((key, value, ours, why))
                break
    return out


def verl_key_policy(key: str, value: Any) -> Verdict | None:
    """What to do with veRL key ``key`` that ``train.yaml`` lacks (None: not a veRL key, a typo)."""
    if key.startswith("ray_kwargs.ray_init."):
        return ("alias", "ray_init." + key.removeprefix("ray_kwargs.ray_init."))
    return apply_rules(VERL_RULES, key, value)
