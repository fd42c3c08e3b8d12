"""``agentgym generate``'s configuration (``configs/generation.yaml`` is written from it), veRL's
``generation.yaml`` names (``verl.trainer.main_generation``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentgym.config_schema.fields import section, setting

HEADER = """\
`agentgym generate`: veRL's main_generation (verl/trainer/config/generation.yaml) with the same keys.
Samples data.n_samples responses for every prompt of data.path and writes the rows with a
`responses` column (a list of n strings) to data.output_path.
  agentgym generate data.path=test.parquet data.n_samples=4 data.output_path=out.parquet model.path=DIR"""


@dataclass
class GenerationDataConfig:
    path: str | None = setting(None, "rows with a chat prompt (.parquet / .jsonl, veRL format)")
    prompt_key: str = setting("prompt", "the column holding a row's chat prompt (a list of messages)")
    n_samples: int = setting(5, "responses per prompt")
    output_path: str | None = setting(None, "where the rows go, with `responses` (.parquet or .jsonl)")
    batch_size: int = setting(128, "prompts in flight at once")
    apply_chat_template_kwargs: dict[str, Any] = setting(
        {}, "extra chat-template variables (e.g. {enable_thinking: false})"
    )


@dataclass
class GenerationModelConfig:
    path: str = setting("tiny", "'tiny', a Hugging Face model directory or hub name")


@dataclass
class GenerationRolloutConfig:
    name: Literal["embedded", "vllm", "sglang"] = setting(
        "embedded", "the policy server (started unless server_urls): embedded | vllm | sglang"
    )
    temperature: float = setting(1.0, "sampling temperature")
    top_k: int = setting(50, "sample among the k likeliest tokens (-1: all)")
    top_p: float = setting(0.7, "nucleus sampling: keep the smallest set of tokens with this mass")
    do_sample: bool = setting(True, "false: greedy (then n_samples must be 1, as in veRL)")
    prompt_length: int = setting(1536, "a longer prompt is an error naming its row")
    response_length: int = setting(512, "new tokens per response")
    server_urls: list[str] = setting([], "running servers to use instead of starting one")
    dtype: str | None = setting("bfloat16", "vllm / sglang: the weights' dtype (null: the model's own)")
    gpu_memory_utilization: float = setting(0.5, "vllm / sglang: the share of GPU memory the engine takes")
    kv_cache_memory_bytes: str | None = setting(
        None,
        "embedded and vllm: the KV cache's memory, bytes or 4G (GiB) / 4g (GB) as vLLM's --kv-cache-memory-bytes; "
        "null: the engine's default (embedded: a quarter of the memory available at start; docs/vllm_cpu.md). "
        "sglang: refused (it sizes its cache by gpu_memory_utilization)",
    )
    tensor_model_parallel_size: int = setting(1, "vllm / sglang: GPUs per engine")
    enforce_eager: bool = setting(True, "vllm / sglang: no CUDA graphs")
    free_cache_engine: bool = setting(True, "veRL's key, accepted for its configs: no effect here")
    load_format: str = setting("auto", "vllm / sglang: how the engine loads the weights (dummy: as auto)")
    max_num_batched_tokens: int = setting(8192, "vllm / sglang: most tokens in one engine batch")
    max_num_seqs: int = setting(1024, "vllm / sglang: most sequences in one engine batch")
    enable_chunked_prefill: bool | None = setting(
        None,
        "vllm / sglang: split long prompts' prefill into chunks; null: yes, except vLLM on a CPU, where a "
        "seeded request crashes chunked prefill (agentgym/client/vllm_cpu.py)",
    )
    engine_kwargs: dict[str, Any] = setting(
        {"vllm": {}, "sglang": {}}, "vllm / sglang: extra engine flags, e.g. {vllm: {swap_space: 4}}"
    )


@dataclass
class GenerationConfig:
    """``agentgym generate``'s whole configuration (``configs/generation.yaml``)."""

    data: GenerationDataConfig = section(GenerationDataConfig, "the prompts, and where the responses go")
    model: GenerationModelConfig = section(GenerationModelConfig, "the model sampled")
    rollout: GenerationRolloutConfig = section(
        GenerationRolloutConfig, "the policy server and its sampling (vllm / sglang: the keys passed to the engine)"
    )
