"""The policy and value model's sections of ``agentgym train``'s configuration: ``actor_rollout_ref``
(the model, its training, the reference policy, the servers that sample from it) and ``critic``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentgym.config_schema.fields import section, setting

# ---- actor_rollout_ref ------------------------------------------------------------------------


@dataclass
class ModelConfig:
    path: str = setting("tiny", "'tiny' (built in), a Hugging Face model directory or hub name")
    enable_gradient_checkpointing: bool = setting(False, "veRL: true (memory for speed; the result is the same)")
    use_remove_padding: bool = setting(False, "pack each micro-batch's rows into one sequence (no padding); veRL: true")
    dtype: str = setting("float32", "training dtype of the weights (bf16 on GPU: set fsdp_config.param_dtype)")
    lora_rank: int = setting(
        0,
        "> 0: train LoRA adapters of this rank only (peft, in the core install); the reference policy is the "
        "base with adapters off; pushes and checkpoints hold adapters",
    )
    lora_alpha: int = setting(16, "adapter scale = lora_alpha / lora_rank")
    target_modules: Any = setting(
        None,
        "modules that get adapters: null (veRL's all-linear: every linear layer but the head) or a list",
    )
    lora_export_merged: bool = setting(
        False,
        "trainer.save_hf_model with LoRA: false writes peft's adapter directory, true the base model with "
        "the adapters merged in",
    )


@dataclass
class OptimConfig:
    lr: float = setting(1.0e-6, "learning rate (AdamW)")
    weight_decay: float = setting(0.01, "AdamW's decoupled weight decay")
    betas: list[float] = setting([0.9, 0.999], "AdamW's beta1, beta2")
    eps: float = setting(1.0e-8, "AdamW's epsilon")
    lr_warmup_steps: int = setting(-1, "linear warm-up steps; > 0 wins over the ratio")
    lr_warmup_steps_ratio: float = setting(0.0, "warm-up as a share of the total training steps")
    warmup_style: Literal["constant", "cosine"] = setting("constant", "constant | cosine (after warm-up)")
    lr_scheduler_type: Literal["constant", "cosine"] | None = setting(
        None, "veRL's newer name for warmup_style; wins when set"
    )
    min_lr_ratio: float = setting(0.0, "cosine: the final lr as a share of lr")
    num_cycles: float = setting(0.5, "cosine: half-waves over the decay (0.5: one fall from lr to min)")


@dataclass
class PolicyLossConfig:
    loss_mode: str = setting(
        "vanilla", "vanilla | gspo | gpg (no ratio, no clip) | topr (ROLL's Tapered Off-Policy REINFORCE)"
    )
    topr_positive_weight: float = setting(1.0, "topr: weight of the successful trajectories' (score > 0) term")
    topr_negative_weight: float = setting(1.0, "topr: weight of the others' (truncated importance weight) term")


@dataclass
class ActorFsdpConfig:
    param_dtype: str = setting("bfloat16", "FSDP2 mixed precision on GPU (compute dtype)")
    reduce_dtype: str = setting("float32", "FSDP2 mixed precision on GPU: the dtype gradients are reduced in")
    reshard_after_forward: bool = setting(True, "FSDP2: free the gathered parameters after the forward")
    param_offload: bool = setting(False, "FSDP2: parameters on the CPU between uses (no effect without a GPU)")
    optimizer_offload: bool = setting(False, "optimizer state on the CPU (no effect without a GPU)")


@dataclass
class CheckpointConfig:
    save_contents: list[str] = setting(
        ["model", "optimizer", "extra"], "what a checkpoint holds: model | optimizer | extra (lr schedule, rng)"
    )
    load_contents: list[str] | None = setting(None, "what a resume reads (null: save_contents)")


@dataclass
class ActorConfig:
    strategy: Literal["auto", "fsdp2", "dp", "fsdp"] = setting(
        "auto", "auto | fsdp2 | dp | fsdp. auto: FSDP2 on CUDA, data-parallel all-reduce over gloo on CPU"
    )
    optim: OptimConfig = section(OptimConfig, "the actor's optimizer and learning-rate schedule")
    ppo_mini_batch_size: int | None = setting(
        256,
        "tasks per optimizer step (x rollout.n trajectories), split over the workers (null: data.train_batch_size)",
    )
    ppo_micro_batch_size_per_gpu: int | None = setting(
        8, "trajectories per forward/backward on one worker (veRL: must be set)"
    )
    use_dynamic_bsz: bool = setting(False, "micro-batches by token budget instead of row count")
    ppo_max_token_len_per_gpu: int = setting(16384, "use_dynamic_bsz: most tokens in one micro-batch on one worker")
    ppo_epochs: int = setting(1, "passes over the step's batch")
    shuffle: bool = setting(False, "shuffle trajectories into mini-batches (seeded by trainer.seed and step)")
    clip_ratio: float = setting(0.2, "no effect while clip_ratio_low and clip_ratio_high are set (as in veRL)")
    clip_ratio_low: float | None = setting(0.2, "PPO's lower clip: ratio >= 1 - clip_ratio_low (null: clip_ratio)")
    clip_ratio_high: float | None = setting(0.2, "PPO's upper clip: ratio <= 1 + clip_ratio_high (null: clip_ratio)")
    clip_ratio_c: float = setting(3.0, "dual-clip bound for negative advantages")
    dual_clip_loss: bool = setting(True, "veRL always dual-clips; ROLL's switch (its default: false)")
    loss_agg_mode: str = setting(
        "token-mean",
        "token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm",
    )
    loss_scale_factor: float | None = setting(
        None, "seq-mean-token-sum-norm's divisor (null: data.max_response_length)"
    )
    entropy_coeff: float = setting(0.0, "weight of the entropy bonus in the actor's loss")
    use_kl_loss: bool = setting(False, "KL to the reference policy as a loss term (needs the ref worker)")
    kl_loss_coef: float = setting(0.001, "use_kl_loss: weight of the KL term")
    kl_loss_type: str = setting(
        "low_var_kl", "kl (k1) | abs | mse (k2) | low_var_kl (k3), '+' suffix: straight-through k2 gradient"
    )
    sft_loss_coef: float = setting(
        0.0, "an SFT (log-likelihood) loss on the successful trajectories (score > 0), weighted"
    )
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, "the policy loss (veRL's policy_loss section)")
    grad_clip: float = setting(1.0, "clip the gradient's global norm to this")
    use_rollout_log_probs: bool = setting(
        False, "use the servers' logprobs as old log-probs instead of recomputing them"
    )
    log_prob_micro_batch_size_per_gpu: int | None = setting(
        None, "null: actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
    )
    fsdp_config: ActorFsdpConfig = section(ActorFsdpConfig, "FSDP2 settings (GPU)")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "what the actor's checkpoints hold")


@dataclass
class RefFsdpConfig:
    param_offload: bool = setting(False, "the reference model's parameters on the CPU between uses (GPU only)")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = setting(
        None, "null: actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
    )
    fsdp_config: RefFsdpConfig = section(RefFsdpConfig, "FSDP2 settings of the reference model (GPU)")


@dataclass
class MultiTurnConfig:
    max_assistant_turns: int | None = setting(None, "null: the env's own max_turns")
    max_user_turns: int | None = setting(None, "most env/interaction replies per episode (null: no limit)")
    interaction_config_path: str | None = setting(
        None, "veRL interaction YAML: dataset rows become interaction episodes"
    )
    context_policy: Literal["full", "window", "compact"] = setting(
        "full",
        "what each turn's prompt holds: full (the whole history) | window (the task and the last "
        "context_window turns) | compact (the task, the env's summary of the older turns, the last "
        "context_window turns); window and compact train per-turn samples. docs/long_horizon.md",
    )
    context_window: int = setting(4, "window / compact: the most recent turns kept word for word")


@dataclass
class AgentFlowConfig:
    default_agent_flow: str | None = setting(
        None,
        "env (the TextEnv runner on env.name) | a name in agent_flow_config_path | package.module:function "
        "(a black-box agent through the gateway); null: env",
    )
    agent_flow_config_path: str | None = setting(
        None, "YAML list of {name, _target_: package.module:function or .Class, kwargs...}"
    )


@dataclass
class ValKwargsConfig:
    temperature: float = setting(0.0, "validation sampling temperature")
    top_p: float = setting(1.0, "validation nucleus sampling: keep the smallest set of tokens with this mass")
    top_k: int = setting(-1, "validation: sample among the k likeliest tokens (-1: all)")
    n: int = setting(1, "validation trajectories per task")
    do_sample: bool = setting(False, "false: greedy decoding (temperature 0)")


@dataclass
class RolloutConfig:
    name: Literal["embedded", "vllm", "sglang"] = setting("embedded", "embedded | vllm | sglang (see configs/server/)")
    n: int = setting(1, "trajectories per task (the GRPO group size)")
    temperature: float = setting(1.0, "sampling temperature")
    top_p: float = setting(1.0, "nucleus sampling: keep the smallest set of tokens with this mass")
    top_k: int = setting(-1, "sample among the k likeliest tokens (-1: all)")
    do_sample: bool = setting(True, "false: greedy decoding (temperature 0)")
    max_tokens_per_turn: int | None = setting(None, "null: data.max_response_length")
    log_prob_micro_batch_size_per_gpu: int | None = setting(
        16, "trajectories per forward when computing old log-probs (veRL: must be set)"
    )
    concurrency: int = setting(64, "episodes in flight at once")
    server_urls: list[str] = setting([], "existing policy servers; empty: start num_servers of our own")
    server_admin_key: str | None = setting(
        None,
        "their admin key (weight updates); null: $AGENTGYM_SERVER_ADMIN_KEY. Servers we start get a new one",
    )
    num_servers: int = setting(1, "policy servers the trainer starts (without server_urls)")
    device: str | None = setting(None, "embedded servers: cpu | cuda (null: cuda when available)")
    gpu_memory_utilization: float = setting(0.5, "vllm / sglang servers")
    kv_cache_memory_bytes: str | None = setting(
        None,
        "embedded and vllm: the KV cache's memory, bytes or 4G (GiB) / 4g (GB) as vLLM's --kv-cache-memory-bytes; "
        "null: the engine's default (embedded: a quarter of the memory available at start; docs/vllm_cpu.md). "
        "sglang: refused (it sizes its cache by gpu_memory_utilization)",
    )
    tensor_model_parallel_size: int = setting(1, "veRL: 2 (hardware; set it to your GPUs per engine)")
    dtype: Literal["float32", "bfloat16", "float16"] | None = setting(
        None,
        "vllm / sglang: float32 | bfloat16 | float16; null: the model's own (torch_dtype in its config.json), "
        "so its logprobs match the trainer's (docs/deploy.md, token fidelity)",
    )
    enforce_eager: bool = setting(False, "vllm / sglang: no CUDA graphs")
    free_cache_engine: bool = setting(True, "release the KV cache between rollouts (vLLM sleep mode)")
    max_num_seqs: int = setting(256, "vllm / sglang: most sequences in one engine batch")
    max_num_batched_tokens: int = setting(8192, "vllm / sglang: most tokens in one engine batch")
    enable_chunked_prefill: bool | None = setting(
        None,
        "vllm / sglang: split long prompts' prefill into chunks; null: yes, except vLLM on a CPU, where a "
        "seeded request crashes chunked prefill (agentgym/client/vllm_cpu.py)",
    )
    load_format: str = setting("dummy", "dummy (veRL's default) starts from the model's own weights here")
    engine_kwargs: dict[str, Any] = setting(
        {"vllm": {}, "sglang": {}}, "extra engine flags, e.g. {vllm: {swap_space: 4}}"
    )
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, "episode length limits, veRL interactions")
    sampling_seed: int | None = setting(
        None, "seed each request from (this, task seed, sample, turn): reproducible rollouts"
    )
    agent: AgentFlowConfig = section(
        AgentFlowConfig, "what produces the trajectories (Claw-R1's agent flows), sync and async alike"
    )
    val_kwargs: ValKwargsConfig = section(ValKwargsConfig, "validation sampling (greedy by default)")


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = setting(
        True,
        "true: rollout and training take turns on one pool (the synchronous trainer); false: separate pools "
        "working at once (the asynchronous trainer, async_training.*: agentgym train --async)",
    )
    model: ModelConfig = section(ModelConfig, "the policy model")
    actor: ActorConfig = section(ActorConfig, "the policy's training")
    ref: RefConfig = section(RefConfig, "the reference policy (loaded when a KL term needs it)")
    rollout: RolloutConfig = section(RolloutConfig, "the policy servers and their sampling")


# ---- critic ---------------------------------------------------------------------------------------


@dataclass
class CriticFsdpConfig:
    param_offload: bool = setting(False, "the critic's parameters on the CPU between uses (GPU only)")
    optimizer_offload: bool = setting(False, "the critic's optimizer state on the CPU (GPU only)")


@dataclass
class CriticModelConfig:
    path: str | None = setting(None, "null: actor_rollout_ref.model.path (a value head on the same architecture)")
    fsdp_config: CriticFsdpConfig = section(CriticFsdpConfig, "FSDP2 settings of the critic (GPU)")


@dataclass
class CriticConfig:
    enable: bool | None = setting(None, "null: on exactly when algorithm.adv_estimator is gae")
    model: CriticModelConfig = section(CriticModelConfig, "the value model")
    optim: OptimConfig = section(OptimConfig, "the critic's optimizer and learning-rate schedule", lr=1.0e-5)
    ppo_mini_batch_size: int | None = setting(None, "null: the actor's")
    ppo_micro_batch_size_per_gpu: int | None = setting(None, "null: the actor's")
    use_dynamic_bsz: bool | None = setting(None, "null: the actor's")
    ppo_max_token_len_per_gpu: int = setting(32768, "use_dynamic_bsz: most tokens in one micro-batch on one worker")
    ppo_epochs: int | None = setting(None, "null: the actor's")
    cliprange_value: float = setting(0.5, "clip the new values to the old ones +- this")
    loss_agg_mode: str | None = setting(None, "null: the actor's")
    grad_clip: float = setting(1.0, "clip the critic's gradient global norm to this")
    forward_micro_batch_size_per_gpu: int | None = setting(
        16, "trajectories per forward when computing values (veRL: must be set)"
    )
    checkpoint: CheckpointConfig = section(CheckpointConfig, "what the critic's checkpoints hold")
