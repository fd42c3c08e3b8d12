"""The translators of ``agentgym config --from``: veRL, Claw-R1 and ChatLearn here; ROLL in ``roll.py``.

* veRL: a ``ppo_trainer.yaml``-shaped file (or a run's dumped config): keys ``train.yaml`` has map to
  themselves, the others go through ``verl.VERL_RULES`` (no effect / refused / alias).
* Claw-R1: veRL's config plus ``async_training.*``, the rollout pool and agent flows (mapped to the same keys,
  else refused).
* ChatLearn: ``runtime_args`` and ``models.{policy_trainer, ref_policy, policy, reward}`` of its GRPO
  templates (``template/grpo_fsdp.yaml``); batch sizes are counted in samples there, in tasks here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from agentgym.compat.translate import ANY, KeyMap, Translation, engine_or_embedded, translate
from agentgym.compat.verl import verl_key_policy
from agentgym.config import flatten, lookup
from agentgym.config_schema import TrainConfig, defaults
from agentgym.config_schema.keys import is_open

AR = "actor_rollout_ref"


@lru_cache(maxsize=1)
def schema() -> frozenset[str]:
    """Every leaf key of ``configs/train.yaml`` (the schema ``agentgym.config_schema.TrainConfig``)."""
    return frozenset(flatten(defaults(TrainConfig)))


def _open(key: str) -> bool:
    return is_open(key)


def _verl_key(tr: Translation, key: str, value: Any, system: str) -> None:
    if key in schema() or _open(key):
        tr.set(key, value, key)
        return
    verdict = verl_key_policy(key, value)
    if verdict is None:
        tr.refused.append((key, f"not a {system} key agentgym knows (a typo, or a newer key)"))
    elif verdict[0] == "alias":
        tr.set(verdict[1], value, key)
    elif verdict[0] == "ignore":
        tr.dropped.append((key, verdict[1]))
    else:
        tr.refused.append((key, verdict[1]))


def translate_verl(data: dict[str, Any], system: str = "verl", claw: bool = False) -> Translation:
    """A veRL config (a mapping) as agentgym's: every key accounted for."""
    tr = Translation(system)
    for key, value in flatten(data).items():
        if key == "defaults" or key.startswith("hydra."):
            tr.dropped.append((key, "Hydra's composition: give the composed config (or the values you set)"))
        elif claw and (row := _claw_row(key)) is not None:
            _apply_claw(tr, row, key, value)
        else:
            _verl_key(tr, key, value, system)
    _verl_values(tr)
    return tr


def _verl_values(tr: Translation) -> None:
    """veRL's spellings of agentgym values (``verl.VERL_VALUES``), and ``trainer.device: cuda`` (veRL's default,
    written in every veRL file) as ``auto``: the GPU when there is one, else the CPU."""
    from agentgym.compat.verl import verl_values

    for key, theirs, ours, why in verl_values(tr.get):
        tr.set(key, ours, key)
        tr.notes.append(f"{key}={theirs}: {why}")
    if tr.get("trainer.device") == "cuda":
        tr.set("trainer.device", "auto", "trainer.device")
        tr.notes.append(
            "trainer.device=cuda (veRL's default) -> auto: the GPU when there is one, else the CPU "
            "(set trainer.device=cuda to insist on a GPU)"
        )


CLAW_KEYS: list[KeyMap] = [
    KeyMap("async_training.*", kind="derived", note="agentgym's async_training.* keys (docs/async_training.md)"),
    KeyMap("rollout.nnodes", kind="derived", note="the rollout pool's nodes"),
    KeyMap("rollout.n_gpus_per_node", kind="derived", note="the rollout pool's devices per node"),
    KeyMap(
        "rollout.*",
        kind="ignore",
        note=f"Claw-R1's other rollout-pool settings: agentgym's servers are {AR}.rollout.num_servers / server_urls",
    ),
    KeyMap(f"{AR}.rollout.agent.default_agent_flow", kind="derived", note="what produces the trajectories"),
    KeyMap(f"{AR}.rollout.agent.agent_flow_config_path", kind="derived", note="named agent flows (_target_)"),
    KeyMap(f"{AR}.rollout.agent.*", kind="ignore", note="agent-flow workers: agentgym's gateway runs agents"),
]


def _claw_row(key: str) -> KeyMap | None:
    from agentgym.compat.translate import first_match

    return first_match(CLAW_KEYS, key)


def _apply_claw(tr: Translation, row: KeyMap, key: str, value: Any) -> None:
    if row.kind == "map":
        tr.set(str(row.target), value, key)
    elif row.kind == "derived":  # the same key here, when train.yaml has it
        if key in schema():
            tr.set(key, value, key)
        else:
            tr.refused.append((key, f"agentgym has no such key ({row.note}; see configs/train.yaml)"))
    elif row.unless is not ANY and value not in tuple(row.unless):  # type: ignore[arg-type]
        tr.refused.append((key, f"{value!r}: {row.note}"))
    else:
        tr.dropped.append((key, row.note))


def translate_claw_r1(data: dict[str, Any]) -> Translation:
    return translate_verl(data, "claw-r1", claw=True)


# ---- ChatLearn ------------------------------------------------------------------------------------

RT = "runtime_args"
PT = "models.policy_trainer"
PO = "models.policy"
ENGINE_NOTE = "engine memory: the embedded server has no such knob; vLLM / SGLang take free_cache_engine"

CHATLEARN_KEYS: list[KeyMap] = [
    KeyMap(f"{RT}.exp_name", "trainer.experiment_name"),
    KeyMap(f"{RT}.output_dir", "trainer.default_local_dir"),
    KeyMap(f"{RT}.data_path", "data.train_files"),
    KeyMap(f"{RT}.eval_data_path", "data.val_files"),
    KeyMap(f"{RT}.data_checkpoint_path", kind="ignore", note="the data order is saved in the checkpoints"),
    KeyMap(f"{RT}.num_episode", "trainer.total_training_steps"),
    KeyMap(
        f"{RT}.sample_per_episode",
        "data.train_batch_size",
        kind="derived",
        note="samples per episode / num_inference_per_prompt",
    ),
    KeyMap(
        f"{RT}.train_global_batch_size",
        f"{AR}.actor.ppo_mini_batch_size",
        kind="derived",
        note="samples per optimizer step / num_inference_per_prompt",
    ),
    KeyMap(f"{RT}.train_micro_batch_size", f"{AR}.actor.ppo_micro_batch_size_per_gpu"),
    KeyMap(f"{RT}.num_inference_per_prompt", f"{AR}.rollout.n"),
    KeyMap(f"{RT}.save_episode_interval", "trainer.save_freq"),
    KeyMap(f"{RT}.eval_episode_interval", "trainer.test_freq"),
    KeyMap(f"{RT}.enable_eval_before_training", "trainer.val_before_train"),
    KeyMap(f"{RT}.data_shuffle", "data.shuffle"),
    KeyMap(f"{RT}.data_rerank", kind="ignore", note="rows are taken in a seeded shuffled order"),
    KeyMap(f"{RT}.max_replay_episode", kind="ignore", note="no replay buffer: each step trains on its own rollouts"),
    KeyMap(
        f"{RT}.train_backend",
        kind="ignore",
        note="agentgym trains with FSDP2 on GPUs, data parallel on CPU",
        unless=("fsdp",),
    ),
    KeyMap(
        f"{RT}.rollout_backend",
        f"{AR}.rollout.name",
        kind="derived",
        note="vllm / sglang (the embedded server where that engine is not installed)",
    ),
    KeyMap(
        f"{RT}.use_partial_rollout", kind="ignore", note="partial rollouts need asynchronous training", unless=(False,)
    ),
    KeyMap(f"{RT}.colocation", kind="ignore", note="agentgym places its workers itself"),
    KeyMap(
        f"{RT}.log_args_dict.enable_wandb",
        "trainer.logger",
        convert=lambda on: ["console", "jsonl", "wandb"] if on else ["console", "jsonl"],
    ),
    KeyMap(f"{RT}.log_args_dict.wandb_project", "trainer.project_name"),
    KeyMap(f"{RT}.log_args_dict.*", kind="ignore", note="logs are in the run directory; wandb reads its environment"),
    KeyMap(f"{PT}.free_gpu_memory.offload_weights", f"{AR}.actor.fsdp_config.param_offload"),
    KeyMap(f"{PT}.free_gpu_memory.offload_optimizer_states", f"{AR}.actor.fsdp_config.optimizer_offload"),
    KeyMap(
        f"{PT}.free_gpu_memory.free_grad_buffers",
        kind="ignore",
        note="Megatron's gradient buffers: FSDP2 frees gradients after each step",
    ),
    KeyMap(f"{PT}.optimizer.lr", f"{AR}.actor.optim.lr"),
    KeyMap(f"{PT}.optimizer.clip_grad", f"{AR}.actor.grad_clip"),
    KeyMap(f"{PT}.optimizer.*", kind="ignore", note="AdamW with agentgym's defaults (actor.optim.*)"),
    KeyMap(
        f"{PT}.packing",
        f"{AR}.model.use_remove_padding",
        kind="derived",
        note="rows packed into token-budget micro-batches (with actor.use_dynamic_bsz)",
    ),
    KeyMap(
        f"{PT}.max_token_in_packing",
        f"{AR}.actor.ppo_max_token_len_per_gpu",
        kind="derived",
        note="the token budget of a packed micro-batch (when packing)",
    ),
    KeyMap(f"{PT}.load", f"{AR}.model.path"),
    KeyMap(f"{PT}.gradient_checkpointing", f"{AR}.model.enable_gradient_checkpointing"),
    KeyMap(f"{PT}.pos_clip_ratio", f"{AR}.actor.clip_ratio_high"),
    KeyMap(f"{PT}.neg_clip_ratio", f"{AR}.actor.clip_ratio_low"),
    KeyMap(f"{PT}.entropy_coef", f"{AR}.actor.entropy_coeff"),
    KeyMap(f"{PT}.kl_coef", f"{AR}.actor.kl_loss_coef", kind="derived", note="> 0: use_kl_loss with that coefficient"),
    KeyMap(f"{PT}.save_hf", "trainer.save_hf_model"),
    KeyMap(f"{PT}.train_micro_batch_size", f"{AR}.actor.ppo_micro_batch_size_per_gpu"),
    KeyMap("models.ref_policy.free_gpu_memory.offload_weights", f"{AR}.ref.fsdp_config.param_offload"),
    KeyMap(f"{PO}.free_gpu_memory.offload_weights", f"{AR}.rollout.free_cache_engine"),
    KeyMap(f"{PO}.enforce_eager", f"{AR}.rollout.enforce_eager"),
    KeyMap(f"{PO}.tensor_model_parallel_size", f"{AR}.rollout.tensor_model_parallel_size"),
    KeyMap(f"{PO}.gpu_memory_utilization", f"{AR}.rollout.gpu_memory_utilization"),
    KeyMap(f"{PO}.num_inference_per_prompt", f"{AR}.rollout.n"),
    KeyMap(f"{PO}.max_prompt_tokens_length", "data.max_prompt_length"),
    KeyMap(f"{PO}.max_response_tokens_length", "data.max_response_length"),
    KeyMap(f"{PO}.temperature", f"{AR}.rollout.temperature"),
    KeyMap(f"{PO}.top_p", f"{AR}.rollout.top_p"),
    KeyMap(f"{PO}.top_k", f"{AR}.rollout.top_k"),
    KeyMap(
        f"{PO}.eval_temperature",
        f"{AR}.rollout.val_kwargs.temperature",
        kind="derived",
        note="> 0 also sets val_kwargs.do_sample=true",
    ),
    KeyMap(f"{PO}.eval_top_p", f"{AR}.rollout.val_kwargs.top_p"),
    KeyMap(f"{PO}.eval_top_k", f"{AR}.rollout.val_kwargs.top_k"),
    KeyMap(f"{PO}.enable_thinking", "data.apply_chat_template_kwargs.enable_thinking"),
    KeyMap(f"{PO}.vllm_prompt_key", "data.prompt_key"),
    KeyMap(f"{PO}.vllm_input_ids_key", kind="ignore", note="prompts are rendered by the rollout"),
    KeyMap(
        f"{PO}.enable_stage_resume", kind="ignore", note="a run resumes from its latest checkpoint", unless=(False,)
    ),
    KeyMap("models.*.load", kind="ignore", note="every role uses actor_rollout_ref.model.path"),
    KeyMap("models.*.free_gpu_memory.*", kind="ignore", note=ENGINE_NOTE),
    KeyMap("models.reward.*", kind="ignore", note="rule rewards by data_source (or custom_reward_function)"),
    KeyMap("models.partial_rollout_manager.*", kind="ignore", note="partial rollouts need asynchronous training"),
    KeyMap("models.rollout_manager.*", kind="ignore", note="the rollout is agentgym's runner"),
    KeyMap(
        "models.*",
        kind="ignore",
        note="placement and kernel settings (GPUs per role, FSDP size, meta init, "
        "grouped GEMM, generation batch): agentgym's own",
    ),
]


def _derive_chatlearn(tr: Translation, data: dict[str, Any]) -> None:
    n = int(lookup(data, f"{RT}.num_inference_per_prompt") or lookup(data, f"{PO}.num_inference_per_prompt") or 1)
    samples = lookup(data, f"{RT}.sample_per_episode")
    if samples:
        tr.set("data.train_batch_size", max(1, int(samples) // n), f"{RT}.sample_per_episode")
    global_batch = lookup(data, f"{RT}.train_global_batch_size")
    if global_batch:
        tasks = tr.get("data.train_batch_size", 1)
        mini = max(1, int(global_batch) // n)
        if tasks % mini or mini > tasks:
            tr.notes.append(
                f"train_global_batch_size is {mini} prompts, which does not divide "
                f"data.train_batch_size={tasks}: one optimizer step per training step instead"
            )
            mini = tasks
        tr.set(f"{AR}.actor.ppo_mini_batch_size", mini, f"{RT}.train_global_batch_size")
    if lookup(data, f"{PT}.packing"):
        tr.set(f"{AR}.model.use_remove_padding", True, f"{PT}.packing")
        tr.set(f"{AR}.actor.use_dynamic_bsz", True, f"{PT}.packing")
        budget = lookup(data, f"{PT}.max_token_in_packing")
        if budget:
            tr.set(f"{AR}.actor.ppo_max_token_len_per_gpu", int(budget), f"{PT}.max_token_in_packing")
    else:
        for key in ("packing", "max_token_in_packing"):
            if lookup(data, f"{PT}.{key}") is not None:
                tr.dropped.append((f"{PT}.{key}", "packing is off"))
    kl = lookup(data, f"{PT}.kl_coef")
    if kl is not None:
        tr.set(f"{AR}.actor.use_kl_loss", float(kl) > 0, f"{PT}.kl_coef")
        if float(kl) > 0:
            tr.set(f"{AR}.actor.kl_loss_coef", float(kl), f"{PT}.kl_coef")
    eval_temperature = lookup(data, f"{PO}.eval_temperature")
    if eval_temperature is not None:
        tr.set(f"{AR}.rollout.val_kwargs.temperature", float(eval_temperature), f"{PO}.eval_temperature")
        tr.set(f"{AR}.rollout.val_kwargs.do_sample", float(eval_temperature) > 0, f"{PO}.eval_temperature")
    tr.set("algorithm.adv_estimator", "grpo", "ChatLearn's GRPO templates (group-normalised outcome advantages)")
    engine_or_embedded(tr, lookup(data, f"{RT}.rollout_backend"), f"{RT}.rollout_backend")


def translate_chatlearn(data: dict[str, Any]) -> Translation:
    return translate("chatlearn", data, CHATLEARN_KEYS, _derive_chatlearn)


TRANSLATORS = {"verl": translate_verl, "claw-r1": translate_claw_r1, "chatlearn": translate_chatlearn}
