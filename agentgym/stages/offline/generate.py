"""``agentgym generate``: veRL's ``main_generation`` (keys of ``configs/generation.yaml``).

    agentgym generate data.path=test.parquet data.n_samples=4 data.output_path=out.parquet \\
        model.path=DIR rollout.temperature=1.0 rollout.response_length=256

Every prompt (``data.prompt_key``, chat messages) is rendered with the model's chat template and
sampled ``data.n_samples`` times from a policy server (the embedded one unless ``rollout.name`` or
``rollout.server_urls`` says otherwise); the rows are written to ``data.output_path`` with a
``responses`` column holding the decoded responses (special tokens removed, as veRL decodes them).
``rollout.do_sample=false`` is greedy decoding and needs ``data.n_samples=1``, as in veRL.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError
from agentgym.stages.config_command import config_file_of, hydra_arguments
from agentgym.stages.offline.common import load_offline_config, read_table, write_table


def check(cfg: DictConfig) -> None:
    data, rollout = cfg.data, cfg.rollout
    if not data.path or not data.output_path:
        raise ConfigError("agentgym generate needs data.path=ROWS.parquet and data.output_path=OUT.parquet")
    if data.n_samples < 1:
        raise ConfigError(f"data.n_samples must be at least 1, got {data.n_samples}")
    if (not rollout.do_sample or rollout.temperature == 0.0) and data.n_samples != 1:
        raise ConfigError(
            "greedy decoding (rollout.do_sample=false or rollout.temperature=0) gives the same response "
            f"every time: set data.n_samples=1 (got {data.n_samples})"
        )
    from agentgym.trainer.config import check_kv_cache_size

    check_kv_cache_size("rollout", rollout)


async def sample_all(cfg: DictConfig, rows: list[dict[str, Any]], client: Any, chat: Any) -> list[list[str]]:
    from agentgym.envs.data import as_messages
    from agentgym.progress import progress_bar
    from agentgym.types import SamplingParams

    data, rollout = cfg.data, cfg.rollout
    greedy = not rollout.do_sample
    sampling = SamplingParams(
        max_tokens=rollout.response_length,
        temperature=0.0 if greedy else rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
    )
    prompts = []
    for i, row in enumerate(rows):
        if data.prompt_key not in row:
            raise ConfigError(
                f"row {i} of {data.path} has no {data.prompt_key!r} column (data.prompt_key); columns: "
                f"{', '.join(sorted(row))}"
            )
        ids = chat.prompt_ids(as_messages(row[data.prompt_key], f"{data.path}:{i}"))
        if len(ids) > rollout.prompt_length:
            raise ConfigError(
                f"row {i} of {data.path}: the prompt has {len(ids)} tokens, more than "
                f"rollout.prompt_length={rollout.prompt_length}; raise it"
            )
        prompts.append(ids)
    n = data.n_samples
    out: list[list[str]] = [[""] * n for _ in rows]
    limit = asyncio.Semaphore(max(1, data.batch_size))
    bar = progress_bar(total=len(rows) * n, desc="generate", unit="response")

    async def one(i: int, k: int) -> None:
        async with limit:
            sample = await client.generate(prompts[i], sampling, session_id=f"gen-{i}")
        out[i][k] = chat.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        bar.update(1)

    try:
        await asyncio.gather(*(one(i, k) for i in range(len(rows)) for k in range(n)))
    finally:
        bar.close()
    return out


def generate(cfg: DictConfig) -> tuple[str, int]:
    """Run a generation config; returns the output path and the number of responses."""
    from agentgym.client import PolicyClient
    from agentgym.compat.engine_args import rollout_engine_kwargs
    from agentgym.model import load_tokenizer
    from agentgym.rollout.chat import ChatTokenizer

    check(cfg)
    rows = read_table(cfg.data.path)
    template_kwargs = OmegaConf.to_container(cfg.data.apply_chat_template_kwargs, resolve=True) or None
    chat = ChatTokenizer(load_tokenizer(cfg.model.path), template_kwargs=template_kwargs)
    rollout = cfg.rollout
    handle = None
    urls = list(rollout.server_urls)
    if not urls:
        from agentgym.server.launch import start_policy_server

        kwargs: dict[str, Any] = {
            "max_model_len": rollout.prompt_length + rollout.response_length,
            "kv_cache_memory_bytes": rollout.kv_cache_memory_bytes,
        }
        if rollout.name == "embedded":
            kwargs["max_batch_size"] = max(1, min(cfg.data.batch_size, 256))
        else:
            kwargs.update(
                gpu_memory_utilization=rollout.gpu_memory_utilization,
                tensor_parallel_size=rollout.tensor_model_parallel_size,
                **rollout_engine_kwargs(rollout),
            )
        handle = start_policy_server(rollout.name, cfg.model.path, port=0, **kwargs)
        urls = [handle.url]
    try:
        client = PolicyClient(urls, backend=rollout.name, model=handle.model if handle else None)

        async def run() -> list[list[str]]:
            try:
                return await sample_all(cfg, rows, client, chat)
            finally:
                await client.aclose()

        responses = asyncio.run(run())
    finally:
        if handle is not None:
            handle.stop()
    for row, texts in zip(rows, responses):
        row["responses"] = texts
    target = write_table(rows, cfg.data.output_path)
    return str(target), sum(len(r) for r in responses)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", "--config-file", default=None, help="a YAML config (default: configs/generation.yaml)"
    )
    hydra_arguments(parser, "with --config-path: the file DIR/NAME.yaml (Hydra's form)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="configs/generation.yaml keys: data.path=FILE data.output_path=OUT data.n_samples=N ...",
    )


def run(args: argparse.Namespace) -> int:
    """The ``agentgym generate`` subcommand."""
    from agentgym.trainer.workers import quiet_transformers

    quiet_transformers()
    try:
        cfg, ignored = load_offline_config(
            "generation.yaml", list(args.overrides or ()), config_file_of(args, "generation")
        )
        if cfg.rollout.server_urls and cfg.rollout.kv_cache_memory_bytes is not None:
            ignored["rollout.kv_cache_memory_bytes"] = "rollout.server_urls names running servers; agentgym starts none"
        for key, reason in sorted(ignored.items()):
            print(f"agentgym generate: warning: {key}: no effect ({reason})", file=sys.stderr)
        check(cfg)
        from agentgym.preflight import check_model

        check_model("model.path", cfg.model.path)
        started = time.perf_counter()
        path, count = generate(cfg)
    except ConfigError as exc:
        print(f"agentgym generate: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count} responses to {path} ({time.perf_counter() - started:.0f} s)", flush=True)
    return 0
