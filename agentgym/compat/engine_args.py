"""veRL's rollout engine keys as vLLM / SGLang command-line flags, for the servers the trainer starts.

``actor_rollout_ref.rollout.{dtype, enforce_eager, max_num_seqs, max_num_batched_tokens,
enable_chunked_prefill, load_format, engine_kwargs}`` become flags of ``vllm.entrypoints.openai.
api_server`` or ``sglang.launch_server`` (``engine_server_kwargs``). Two keys differ in meaning:

* ``load_format: dummy`` (veRL's default) makes veRL's engine start with random weights that the
  trainer overwrites before the first rollout; agentgym's servers serve the model from the start,
  so ``dummy`` is passed as the engine's default (``auto``); any other format is passed through.
* ``free_cache_engine`` (release the KV cache while the trainer trains) needs the trainer to put the
  engine to sleep and wake it, which agentgym's weight sync does not do yet: it has no effect
  (documented in docs/coming_from_verl.md).

The embedded server has none of these knobs; ``config_notes`` warns when they are set for it.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def extra_flags(options: dict[str, Any]) -> list[str]:
    """``{"swap_space": 4, "disable_log_requests": True}`` -> ``["--swap-space", "4", "--disable-log-requests"]``."""
    flags: list[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        if value is True:
            flags.append(_flag(key))
        elif isinstance(value, (dict, list)):
            import json

            flags += [_flag(key), json.dumps(value)]
        else:
            flags += [_flag(key), str(value)]
    return flags


def vllm_flags(rollout: DictConfig) -> list[str]:
    flags = [
        "--max-num-seqs",
        str(rollout.max_num_seqs),
        "--max-num-batched-tokens",
        str(rollout.max_num_batched_tokens),
    ]
    if rollout.enable_chunked_prefill is not None:  # null: the launcher's choice (off for vLLM on a CPU)
        flags.append("--enable-chunked-prefill" if rollout.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if rollout.enforce_eager:
        flags.append("--enforce-eager")
    if rollout.load_format and rollout.load_format != "dummy":
        flags += ["--load-format", str(rollout.load_format)]
    return flags


def sglang_flags(rollout: DictConfig) -> list[str]:
    flags = ["--max-running-requests", str(rollout.max_num_seqs)]
    chunked = rollout.enable_chunked_prefill is not False  # null: SGLang's default, on
    flags += ["--chunked-prefill-size", str(rollout.max_num_batched_tokens if chunked else -1)]
    if rollout.enforce_eager:
        flags.append("--disable-cuda-graph")
    if rollout.load_format and rollout.load_format != "dummy":
        flags += ["--load-format", str(rollout.load_format)]
    return flags


def engine_server_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """Keyword arguments for ``agentgym.server.launchers.start_engine_server`` (``dtype``, ``extra_args``)
    from the training config's rollout section; ``{}`` for the embedded server."""
    return rollout_engine_kwargs(cfg.actor_rollout_ref.rollout)


def rollout_engine_kwargs(rollout: DictConfig) -> dict[str, Any]:
    """``engine_server_kwargs`` for a rollout section (``generation.yaml``'s ``rollout`` too)."""
    engine = str(rollout.name)
    if engine not in ("vllm", "sglang"):
        return {}
    own = OmegaConf.to_container(rollout.engine_kwargs, resolve=True) or {}
    flags = (vllm_flags if engine == "vllm" else sglang_flags)(rollout) + extra_flags(dict(own.get(engine) or {}))
    return {"dtype": str(rollout.dtype) if rollout.dtype else None, "extra_args": flags}
