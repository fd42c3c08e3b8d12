"""The KV cache's memory budget (``kv_cache_memory_bytes``): the cache never outgrows it, requests
that do not fit beside the running ones wait (and come out token for token as without a budget),
one that could never fit fails at once with what to set, and re-laying the cache out moves every
kept key and value in place."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from agentgym.model import load_causal_lm
from agentgym.server.engine import Engine
from agentgym.server.kv_cache import SlotKVCache, column_bytes
from agentgym.server.prefix_cache import PrefixIndex
from agentgym.server.sampling import GenerationParams
from tests.server.test_engine_cache import assert_faithful

MAX_LEN = 256


def columns(model) -> int:
    return column_bytes(model.config, torch.float32)


class Peak:
    """The largest layout (bytes) the cache ever took, read at every re-layout."""

    def __init__(self, kv: SlotKVCache) -> None:
        self.bytes = kv.nbytes
        self.layouts = [(kv.slots, kv.width)]
        relayout = kv.relayout

        def watched(slots: int, width: int) -> None:
            relayout(slots, width)
            self.bytes = max(self.bytes, kv.nbytes, kv._finite * kv.storage.element_size())
            self.layouts.append((kv.slots, kv.width))

        kv.relayout = watched


def run(engine, prompts, max_tokens):
    async def go():
        params = [GenerationParams(max_tokens=m, ignore_eos=True, temperature=0.0) for m in max_tokens]
        requests = [engine.submit(p, q) for p, q in zip(prompts, params)]
        return [(await r.done)[0] for r in requests]

    return asyncio.run(go())


def prompts_of(count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(5, 600, (int(torch.randint(20, 120, (1,), generator=g)),), generator=g).tolist()
        for _ in range(count)
    ]


# ---- the cache itself -------------------------------------------------------------------------------------
@pytest.mark.parametrize("to", [(3, 129), (8, 33), (6, 65), (2, 257)])
def test_a_relayout_keeps_every_kept_column_in_place(model, to):
    budget = 8 * 65 * columns(model)
    kv = SlotKVCache(model.config, 8, MAX_LEN, torch.float32, "cpu", initial_width=64, budget=budget)
    assert (kv.slots, kv.width) == (8, 65)
    kv.storage.copy_(torch.randn(kv.storage.shape))
    before, buffer = kv.storage.clone(), kv._buffer.data_ptr()
    kv.relayout(*to)
    slots, width = min(8, to[0]), min(65, to[1])
    assert (kv.slots, kv.width) == to and kv.generation == 1
    assert torch.equal(kv.storage[:, :, :slots, :, :width], before[:, :, :slots, :, :width])
    assert kv._buffer.data_ptr() == buffer, "a CPU cache moves within its one buffer"
    assert kv.nbytes <= budget and torch.isfinite(kv.storage).all()


def test_a_layout_past_the_budget_is_refused(model):
    kv = SlotKVCache(model.config, 8, MAX_LEN, torch.float32, "cpu", initial_width=64, budget=4 * 257 * columns(model))
    assert kv.slots == 8 and kv.width == 65  # 8 x 65 columns fit 4 x 257
    with pytest.raises(ValueError, match="budget"):
        kv.relayout(5, 257)


def test_a_budget_below_one_full_length_sequence_is_refused_at_start(model, tok):
    with pytest.raises(ValueError, match="--kv-cache-memory-bytes"):
        Engine(model, tok, max_model_len=MAX_LEN, kv_cache_memory_bytes=MAX_LEN * columns(model))


def test_index_fit_moves_recent_entries_down_shortens_long_ones_and_drops_the_rest():
    index = PrefixIndex(slots=8, block=4)
    copies = []
    for slot, length in [(5, 10), (6, 30), (7, 12), (3, 8)]:
        index.add(slot, list(range(slot * 100, slot * 100 + length)), live=False)
    index.touch(5)  # 5 is now the most recently used of those past slot 4
    index.fit(slots=5, keep_from=2, length=20, copy=lambda s, d, n: copies.append((s, d, n)))
    # free slots in 2..4: 2 and 4 (3 is taken); 5 (most recent) and then 7 move; 6 is dropped
    assert copies == [(5, 2, 10), (7, 4, 12)]
    assert sorted(index.entries) == [2, 3, 4]
    assert index.entries[2].tokens == list(range(500, 510)) and index.free == {0, 1}
    index.fit(slots=5, keep_from=0, length=9, copy=lambda *a: None)
    assert sorted(len(e.tokens) for e in index.entries.values()) == [8, 9, 9]
    assert index.match(list(range(500, 509)) + [1]) == (2, 9)


# ---- the engine -------------------------------------------------------------------------------------------
def test_many_long_requests_in_a_small_budget_all_complete_within_it_token_for_token(model, tok):
    """24 requests at once in a budget of about 4 full-length sequences: fewer run at a time, the cache
    never passes the budget, and every greedy token (and its logprob) is what an unbounded engine gives."""
    prompts = prompts_of(24)
    max_tokens = [40 + 7 * (i % 9) for i in range(24)]
    budget = 4 * (MAX_LEN + 1) * columns(model)
    small = Engine(model, tok, max_model_len=MAX_LEN, max_batch_size=16, kv_cache_memory_bytes=budget)
    peak = Peak(small.kv)
    small.start()
    try:
        bounded = run(small, prompts, max_tokens)
        # the next turn of a conversation whose entry is still cached reuses it: re-layouts kept it intact
        kept = [i for i, p in enumerate(prompts) if any(e.tokens[: len(p)] == p for e in small.index.entries.values())]
        assert kept, "no prefix-cache entry survived within the budget"
        turn = prompts[kept[-1]] + bounded[kept[-1]].output_ids + [7]
        [second] = run(small, [turn], [30])
    finally:
        small.stop()
    assert small.kv.budget == budget and peak.bytes <= budget
    assert small.stats["max_batch"] < 16, "the budget held back no request"
    assert len({w for _, w in peak.layouts}) > 2, f"the width never moved: {peak.layouts}"
    assert second.cached_tokens > len(prompts[kept[-1]])
    assert_faithful(model, turn, second)
    big = Engine(load_causal_lm("tiny"), tok, max_model_len=MAX_LEN, max_batch_size=16).start()
    try:
        assert big.kv.budget >= 32 * (MAX_LEN + 1) * columns(model)
        free = run(big, prompts, max_tokens)
        [free_second] = run(big, [turn], [30])
    finally:
        big.stop()
    for a, b, m in zip(bounded, free, max_tokens):
        assert a.output_ids == b.output_ids and len(a.output_ids) == m
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert second.output_ids == free_second.output_ids


def test_padded_static_decode_stays_within_the_slots_a_budget_leaves(model, tok):
    """The bucketed decode the CUDA graphs replay pads 5 rows to 8; a budget of 5 full-length sequences
    leaves 5 slots at full width, so the padding stops at the last slot."""
    budget = 5 * (MAX_LEN + 1) * columns(model)
    engine = Engine(
        model, tok, max_model_len=MAX_LEN, max_batch_size=8, static_decode=True, kv_cache_memory_bytes=budget
    ).start()
    try:
        prompts = [list(range(10 + i, 130 + i)) for i in range(5)]
        seqs = run(engine, prompts, [120] * 5)
        assert engine.kv.slots == 5 and engine.stats["max_batch"] == 5
    finally:
        engine.stop()
    for p, seq in zip(prompts, seqs):
        assert len(seq.output_ids) == 120
        assert_faithful(model, p, seq)


def test_a_request_too_big_for_the_budget_alone_fails_at_once(model, tok):
    budget = 2 * (MAX_LEN + 1) * columns(model)
    engine = Engine(model, tok, max_model_len=MAX_LEN, kv_cache_memory_bytes=budget).start()
    try:

        async def go():
            big = engine.submit(list(range(5, 105)), GenerationParams(max_tokens=150), n=3)
            fits = engine.submit(list(range(5, 105)), GenerationParams(max_tokens=150, ignore_eos=True), n=2)
            return await asyncio.wait_for(big.done, 30), await asyncio.wait_for(fits.done, 60)

        big, fits = asyncio.run(go())
    finally:
        engine.stop()
    assert all(s.finish_reason == "abort" and "--kv-cache-memory-bytes" in s.error for s in big)
    assert [len(s.output_ids) for s in fits] == [150, 150]


def test_the_server_answers_400_naming_the_budget_flag(model, tok):
    from agentgym.server.handles import EmbeddedServerHandle

    budget = 2 * (MAX_LEN + 1) * columns(model)
    engine = Engine(load_causal_lm("tiny"), tok, max_model_len=MAX_LEN, kv_cache_memory_bytes=budget).start()
    handle = EmbeddedServerHandle(engine, port=0)
    try:
        body = {"model": "default", "prompt": list(range(5, 105)), "max_tokens": 150}
        r = httpx.post(f"{handle.url}/v1/completions", json={**body, "n": 3}, timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "max_tokens" and "--kv-cache-memory-bytes" in error["message"]
        ok = httpx.post(f"{handle.url}/v1/completions", json={**body, "n": 2}, timeout=60)
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
    finally:
        handle.stop()


# ---- the knob ---------------------------------------------------------------------------------------------
def test_budgets_are_read_as_vllm_reads_them():
    from agentgym.server.kv_cache import parse_bytes

    assert parse_bytes("4G") == 4 * 2**30 and parse_bytes("2.5g") == 2_500_000_000
    assert parse_bytes("512M") == 512 * 2**20 and parse_bytes(" 1000 ") == 1000 and parse_bytes(7) == 7
    with pytest.raises(ValueError, match="4G = 4 GiB"):
        parse_bytes("4 gigs")


def test_a_bad_size_on_the_command_line_is_a_usage_error(capsys):
    import argparse

    from agentgym.stages.serve_command import add_arguments

    parser = argparse.ArgumentParser(prog="agentgym serve")
    add_arguments(parser)
    assert parser.parse_args(["--kv-cache-memory-bytes", "4G"]).kv_cache_memory_bytes == 4 * 2**30
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--kv-cache-memory-bytes", "4 gigs"])
    assert exited.value.code == 2
    assert "not a number of bytes" in capsys.readouterr().err


def test_the_server_flag_and_the_config_key_reach_the_engine(tok):
    from agentgym.config import compose
    from agentgym.server.launch import create_engine

    engine = create_engine("tiny", max_model_len=MAX_LEN, kv_cache_memory_bytes="1M")
    try:
        assert engine.kv.budget == 2**20 and engine.kv.nbytes <= 2**20
    finally:
        engine.stop()
    from agentgym.trainer.rollout_servers import RolloutServers

    cfg = compose(
        overrides=[
            "actor_rollout_ref.model.path=tiny",
            "actor_rollout_ref.rollout.kv_cache_memory_bytes=3M",
            "data.max_prompt_length=200",
            "data.max_response_length=56",
        ]
    ).cfg
    servers = RolloutServers(cfg)
    try:
        assert servers.handles[0].engine.kv.budget == 3 * 2**20
    finally:
        servers.stop()


def test_the_default_budget_is_a_share_of_available_memory(model, monkeypatch):
    from agentgym.server import kv_cache

    monkeypatch.setattr(kv_cache, "available_memory", lambda device: 400 * 257 * columns(model))
    assert kv_cache.default_kv_cache_bytes(model.config, 200, 256, torch.float32, "cpu") == 100 * 257 * columns(model)
    # never more than every slot at full length takes, never less than one sequence needs
    assert kv_cache.default_kv_cache_bytes(model.config, 8, 256, torch.float32, "cpu") == 8 * 257 * columns(model)
    monkeypatch.setattr(kv_cache, "available_memory", lambda device: 0)
    assert kv_cache.default_kv_cache_bytes(model.config, 8, 256, torch.float32, "cpu") == 257 * columns(model)


def test_the_config_key_reaches_a_vllm_server_and_is_checked_before_anything_loads(monkeypatch):
    from types import SimpleNamespace

    from agentgym.config import ConfigError
    from agentgym.server import launch
    from agentgym.server.launchers import vllm_command
    from agentgym.trainer.config import load_config
    from agentgym.trainer.rollout_servers import RolloutServers

    cmd = vllm_command("/m", kv_cache_memory_bytes=2**31)
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(2**31)
    assert "--kv-cache-memory-bytes" not in vllm_command("/m")
    started: list[dict] = []

    def start_policy_server(backend, model, **kwargs):
        started.append({"backend": backend, **kwargs})
        return SimpleNamespace(url="http://127.0.0.1:9", model=model, stop=lambda: None)

    monkeypatch.setattr(launch, "start_policy_server", start_policy_server)
    cfg = load_config(
        overrides=["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.kv_cache_memory_bytes=2G"],
        warn=False,
    )
    RolloutServers(cfg).stop()
    assert started[0]["backend"] == "vllm" and started[0]["kv_cache_memory_bytes"] == "2G"
    with pytest.raises(ConfigError, match=r"kv_cache_memory_bytes='2 gigs'.*not a number of bytes"):
        load_config(overrides=["actor_rollout_ref.rollout.kv_cache_memory_bytes=2 gigs"], warn=False)
    with pytest.raises(ConfigError, match="SGLang takes no KV cache size.*gpu_memory_utilization"):
        load_config(
            overrides=["actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.kv_cache_memory_bytes=2G"],
            warn=False,
        )


def test_a_size_for_servers_agentgym_does_not_start_is_named_as_having_no_effect():
    from agentgym.trainer.config import compose_training, config_notes

    size = "actor_rollout_ref.rollout.kv_cache_memory_bytes=2G"
    running = compose_training(overrides=[size, "actor_rollout_ref.rollout.server_urls=[http://127.0.0.1:9]"])
    assert any("kv_cache_memory_bytes=2G: no effect" in note for note in config_notes(running))
    assert not any("kv_cache_memory_bytes" in note for note in config_notes(compose_training(overrides=[size])))
