"""Warnings about a training config: keys that nothing reads and keys that have no effect under the
chosen settings (``critic.*`` under GRPO, ``clip_ratio`` while both bounds are set, engine knobs for
the embedded server, ...). ``load_config`` logs each once; the run goes on.

Each check is a small function ``(composition) -> str | None``; the explicit keys are the ones the
user wrote (``--config`` file, overrides), so a default never warns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from omegaconf import OmegaConf

from agentgym.config import Composition

AR = "actor_rollout_ref"
ENGINE_KEYS = (
    "gpu_memory_utilization",
    "tensor_model_parallel_size",
    "dtype",
    "enforce_eager",
    "free_cache_engine",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "load_format",
    "engine_kwargs",
)


def _set(comp: Composition, prefix: str) -> list[str]:
    """The explicit keys under ``prefix`` (``"critic."``) or equal to it."""
    return sorted(k for k in comp.explicit if k == prefix or k.startswith(prefix))


def _listed(keys: Iterable[str]) -> str:
    keys = list(keys)
    return ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")


def added_keys(comp: Composition) -> str | None:
    if not comp.added:
        return None
    keys = _listed(f"+{k}" for k in sorted(comp.added))
    return (
        f"{keys}: nothing in agentgym reads {'this key' if len(comp.added) == 1 else 'these keys'} "
        f"(kept in the run's config.yaml only); check the name against configs/train.yaml"
    )


def ignored_keys(comp: Composition) -> str | None:
    if not comp.ignored:
        return None
    lines = [f"{key}: {reason}" for key, reason in sorted(comp.ignored.items())]
    return f"{len(lines)} key(s) accepted with no effect in agentgym:\n    " + "\n    ".join(lines)


def critic_without_gae(comp: Composition) -> str | None:
    cfg = comp.cfg
    if cfg.critic.enable:
        return None
    keys = [k for k in _set(comp, "critic.") if k != "critic.enable"]
    if not keys:
        return None
    return (
        f"{_listed(keys)}: no effect, algorithm.adv_estimator={cfg.algorithm.adv_estimator} trains no critic "
        f"(set algorithm.adv_estimator=gae for PPO with a critic)"
    )


def clip_ratio_shadowed(comp: Composition) -> str | None:
    actor = comp.cfg.actor_rollout_ref.actor
    if f"{AR}.actor.clip_ratio" not in comp.explicit or actor.clip_ratio_low is None or actor.clip_ratio_high is None:
        return None
    return (
        f"{AR}.actor.clip_ratio={actor.clip_ratio}: no effect while clip_ratio_low ({actor.clip_ratio_low}) and "
        f"clip_ratio_high ({actor.clip_ratio_high}) are set, as in veRL; set those (or null them to follow "
        f"clip_ratio)"
    )


def engine_keys_for_embedded(comp: Composition) -> str | None:
    rollout = comp.cfg.actor_rollout_ref.rollout
    if rollout.name != "embedded":
        return None
    keys = [k for k in comp.explicit if any(k.startswith(f"{AR}.rollout.{name}") for name in ENGINE_KEYS)]
    if not keys:
        return None
    return (
        f"{_listed(sorted(keys))}: no effect, these go to vLLM / SGLang and "
        f"{AR}.rollout.name=embedded (agentgym's own server)"
    )


def sizes_for_servers_not_started(comp: Composition) -> str | None:
    rollout = comp.cfg.actor_rollout_ref.rollout
    key = f"{AR}.rollout.kv_cache_memory_bytes"
    if not rollout.server_urls or key not in comp.explicit:
        return None
    return (
        f"{key}={rollout.kv_cache_memory_bytes}: no effect, {AR}.rollout.server_urls names running servers and "
        "agentgym starts none; give the size where they start (agentgym serve --kv-cache-memory-bytes)"
    )


def kl_settings_unused(comp: Composition) -> str | None:
    cfg = comp.cfg
    out = []
    if not cfg.algorithm.use_kl_in_reward:
        out += _set(comp, "algorithm.kl_ctrl.") + _set(comp, "algorithm.kl_penalty")
    if not cfg.actor_rollout_ref.actor.use_kl_loss:
        out += [k for k in comp.explicit if k in (f"{AR}.actor.kl_loss_coef", f"{AR}.actor.kl_loss_type")]
    if not out:
        return None
    return (
        f"{_listed(sorted(out))}: no effect, algorithm.use_kl_in_reward="
        f"{str(cfg.algorithm.use_kl_in_reward).lower()} and {AR}.actor.use_kl_loss="
        f"{str(cfg.actor_rollout_ref.actor.use_kl_loss).lower()}"
    )


def gspo_aggregation(comp: Composition) -> str | None:
    actor = comp.cfg.actor_rollout_ref.actor
    if actor.policy_loss.loss_mode != "gspo" or actor.loss_agg_mode == "seq-mean-token-mean":
        return None
    return (
        f"policy_loss.loss_mode=gspo aggregates its policy loss seq-mean-token-mean whatever "
        f"{AR}.actor.loss_agg_mode says (as veRL's compute_policy_loss_gspo does); loss_agg_mode="
        f"{actor.loss_agg_mode} applies to the entropy and KL terms only"
    )


def greedy_temperature(comp: Composition) -> str | None:
    out = []
    for prefix in (f"{AR}.rollout", f"{AR}.rollout.val_kwargs"):
        if f"{prefix}.temperature" in comp.explicit and not OmegaConf.select(comp.cfg, f"{prefix}.do_sample"):
            out.append(f"{prefix}.temperature")
    if not out:
        return None
    return f"{_listed(out)}: no effect, do_sample=false decodes greedily"


def micro_batch_with_dynamic_bsz(comp: Composition) -> str | None:
    out = [
        f"{s}.ppo_micro_batch_size_per_gpu"
        for s, on in ((f"{AR}.actor", comp.cfg.actor_rollout_ref.actor), ("critic", comp.cfg.critic))
        if on.use_dynamic_bsz and f"{s}.ppo_micro_batch_size_per_gpu" in comp.explicit
    ]
    if not out:
        return None
    return f"{_listed(out)}: no effect, use_dynamic_bsz=true cuts micro-batches by ppo_max_token_len_per_gpu"


def raw_chat(comp: Composition) -> str | None:
    if comp.cfg.data.return_raw_chat:
        return None
    return (
        "data.return_raw_chat=false: no effect, agentgym always renders prompts from the chat messages "
        "(what veRL's multi-turn rollout needs it for)"
    )


def critic_warmup_without_critic(comp: Composition) -> str | None:
    cfg = comp.cfg
    if cfg.trainer.critic_warmup > 0 and not cfg.critic.enable:
        return f"trainer.critic_warmup={cfg.trainer.critic_warmup}: no effect, there is no critic"
    return None


def offload_without_gpu(comp: Composition) -> str | None:
    keys = [
        k for k in comp.explicit if k.endswith(("param_offload", "optimizer_offload")) and OmegaConf.select(comp.cfg, k)
    ]
    if not keys:
        return None
    import torch

    if comp.cfg.trainer.device == "cuda" or (comp.cfg.trainer.device == "auto" and torch.cuda.is_available()):
        return None
    return f"{_listed(sorted(keys))}: no effect without a GPU (the weights and optimizer are already in CPU memory)"


CHECKS: list[Callable[[Composition], str | None]] = [
    added_keys,
    ignored_keys,
    critic_without_gae,
    clip_ratio_shadowed,
    engine_keys_for_embedded,
    sizes_for_servers_not_started,
    kl_settings_unused,
    gspo_aggregation,
    greedy_temperature,
    micro_batch_with_dynamic_bsz,
    raw_chat,
    critic_warmup_without_critic,
    offload_without_gpu,
]


def notes(comp: Composition) -> list[str]:
    """Every warning that applies, in a fixed order."""
    return list(comp.notes) + [note for check in CHECKS if (note := check(comp))]
