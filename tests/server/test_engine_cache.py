"""The engine's KV cache and prefix cache: what is reused, what is not, and that reuse never
changes a token's logprob (every check compares with a teacher-forced forward of the model)."""

from __future__ import annotations

import asyncio

import torch

from agentgym.model import load_causal_lm
from agentgym.server.engine import Engine
from agentgym.server.prefix_cache import PrefixIndex
from agentgym.server.running_batch import RunningBatch
from agentgym.server.sampling import GenerationParams


def teacher_forced(model, prompt, tokens):
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([list(prompt) + list(tokens)])).logits[0].float(), dim=-1)
    start = len(prompt) - 1
    return [logprobs[start + i, t].item() for i, t in enumerate(tokens)]


def assert_faithful(model, prompt, seq):
    assert seq.output_ids, "nothing was generated"
    expected = teacher_forced(model, prompt, seq.output_ids)
    assert max(abs(a - b) for a, b in zip(seq.logprobs, expected)) < 1e-4


def run(engine, prompts, n=1, **params):
    """Submit every prompt at once; the first sequence of each request."""

    async def go():
        requests = [
            engine.submit(p, GenerationParams(**{"max_tokens": 12, "ignore_eos": True, **params}), n=n) for p in prompts
        ]
        return [await r.done for r in requests]

    return asyncio.run(go())


def engine_for(model, tok, **kw):
    return Engine(load_causal_lm("tiny") if kw.pop("own_model", True) else model, tok, **kw).start()


# ---- the index ----------------------------------------------------------------------------------
def test_index_finds_the_longest_prefix_and_evicts_least_recent_first():
    index = PrefixIndex(slots=7, block=4)
    a = list(range(100, 140))
    index.add(3, a[:20], live=False)
    index.add(4, a[:33], live=False)
    index.add(5, [7] * 40, live=True)
    assert index.match(a) == (4, 33)
    assert index.match(a[:30] + [1, 2, 3, 4]) == (4, 30)  # shares 30 with the longer, 20 with the shorter
    assert index.match(a, limit=25) == (4, 25)
    assert index.match(a[:3]) == (None, 0)  # under one block: not worth a lookup
    assert index.match([1] + a) == (None, 0)
    assert sorted(index.free) == [0, 1, 2, 6]
    copies = []

    def copy(src, dst, n):
        copies.append((src, dst, n))

    index.relocate(4, range(0, 5), copy)  # to the free slot past the kept-out range
    assert copies == [(4, 6, 33)] and index.match(a) == (6, 33) and 4 in index.free
    index.add(4, [1] * 8, live=False)
    index.touch(3)  # least recently used now: 6, then 4, then 3
    assert index.oldest_cached() == 6 and index.oldest_cached(exclude=range(6, 7)) == 4
    index.relocate(3, range(0, 4), copy)  # no free slot past 3: over the least recently used entry
    assert copies[-1] == (3, 6, 20) and 3 in index.free and index.match(a) == (6, 20)
    index.relocate(5, range(0, 7), copy)  # nowhere outside: the entry is dropped
    assert 5 in index.free and copies[-1] == (3, 6, 20)
    index.clear()
    assert index.match(a) == (None, 0) and len(index.free) == 7


def test_a_hash_collision_is_not_a_match():
    index = PrefixIndex(slots=2, block=2)
    index.add(0, [1, 2, 3, 4], live=False)
    entry = index.entries[0]
    index._by_hash.setdefault(hash((0, 9, 9)), set()).add(0)  # forge a colliding first block
    assert entry.tokens[:2] != [9, 9]
    assert index.match([9, 9, 3, 4]) == (None, 0)


# ---- reuse across turns and samples --------------------------------------------------------------
def test_the_next_turn_prefills_only_its_new_tokens(model, tok):
    engine = engine_for(model, tok, max_batch_size=8)
    try:
        prompts = [list(range(5, 5 + k)) for k in (20, 33, 48)]
        first = [seqs[0] for seqs in run(engine, prompts)]
        for p, seq in zip(prompts, first):
            assert_faithful(model, p, seq)
        before = dict(engine.stats)
        second_prompts = [p + s.output_ids + [9, 10, 11] for p, s in zip(prompts, first)]
        second = [seqs[0] for seqs in run(engine, second_prompts)]
        for p, seq in zip(second_prompts, second):
            # everything the first turn fed through the model: its prompt and all but its last token
            assert seq.cached_tokens == len(p) - 4
            assert_faithful(model, p, seq)
        saved = engine.stats["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
        assert saved == sum(len(p) - 4 for p in second_prompts)
        assert engine.stats["prefill_tokens"] - before["prefill_tokens"] == 4 * len(second_prompts)
    finally:
        engine.stop()


def test_samples_of_one_prompt_share_one_prefill(model, tok):
    engine = engine_for(model, tok, max_batch_size=8)
    try:
        prompt = list(range(40, 70))
        # n = 3 in one request, plus two separate requests with the same prompt (a group sent one by one)
        results = run(engine, [prompt, prompt, prompt], n=1) + run(engine, [prompt], n=3)
        seqs = [s for r in results for s in r]
        for seq in seqs:
            assert_faithful(model, prompt, seq)
        assert engine.stats["shared_prefill_tokens"] >= 4 * len(prompt)
        assert len({tuple(s.output_ids) for s in seqs}) > 1  # each sample draws its own tokens
    finally:
        engine.stop()


def test_without_the_prefix_cache_the_same_seeded_tokens_come_out(model, tok):
    prompts = [list(range(5, 30)), list(range(50, 90))]
    outs = {}
    for slots in (None, 0):
        engine = engine_for(model, tok, max_batch_size=4, prefix_cache_slots=slots)
        try:
            first = [s[0] for s in run(engine, prompts, seed=11)]
            nxt = [p + s.output_ids + [3] for p, s in zip(prompts, first)]
            outs[slots] = [s[0].output_ids for s in run(engine, nxt, seed=12)]
            assert (engine.stats["prefix_cache_hit_tokens"] > 0) == (slots is None)
        finally:
            engine.stop()
    assert outs[None] == outs[0]


def test_more_conversations_than_cache_slots_stay_correct(model, tok):
    """Four cache slots for eight conversations: entries are evicted, least recently used first,
    and conversations whose entry is gone are prefilled whole - never from someone else's cache.
    (The second turns come most recent first: in first-finished-first order every one would find
    its entry just evicted, as any least-recently-used cache does on a cycle longer than itself.)"""
    engine = engine_for(model, tok, max_batch_size=2, prefix_cache_slots=4)
    try:
        prompts = [[i + 3] * 3 + list(range(100 + 10 * i, 120 + 10 * i)) for i in range(8)]
        first = [s[0] for s in run(engine, prompts)]
        nxt = [p + s.output_ids for p, s in zip(prompts, first)][::-1]
        second = [s[0] for s in run(engine, nxt)]
        hits = [s.cached_tokens for s in second]
        for p, seq in zip(nxt, second):
            assert_faithful(model, p, seq)
        assert 0 < sum(1 for h in hits if h) <= 4 + 2  # the cache slots and the running slots
        assert all(h in (0, len(p) - 1) for h, p in zip(hits, nxt))
    finally:
        engine.stop()


def test_a_weight_update_empties_the_prefix_cache(model, tok):
    engine = engine_for(model, tok, max_batch_size=4)
    try:
        prompt = list(range(7, 40))
        [[first]] = run(engine, [prompt])
        gen = torch.Generator().manual_seed(3)
        new = {
            k: v + 0.1 * torch.randn(v.shape, generator=gen)
            for k, v in engine.model.state_dict().items()
            if k != "lm_head.weight"
        }
        assert engine.update_weights(new, 5).result(timeout=30) == 5
        nxt = prompt + first.output_ids
        [[second]] = run(engine, [nxt])
        assert second.cached_tokens == 0 and second.weight_version == 5
        new_model = load_causal_lm("tiny")
        new_model.load_state_dict(new, strict=False)
        assert_faithful(new_model, nxt, second)
    finally:
        engine.stop()


def test_sequences_outgrow_the_first_cache_width(model, tok):
    engine = engine_for(model, tok, max_batch_size=2)
    try:
        width = engine.kv.width
        prompt = list(range(5, 5 + width - 10))
        [[seq]] = run(engine, [prompt], max_tokens=40)
        assert engine.kv.width > width and len(seq.output_ids) == 40
        assert_faithful(model, prompt, seq)
    finally:
        engine.stop()


def test_padded_static_decode_leaves_cached_entries_intact(model, tok):
    """The bucketed decode CUDA graphs replay, run eagerly: padding rows write only to the scratch
    column, so the finished entries sitting in the padded slots still serve exact prefixes."""
    engine = engine_for(model, tok, max_batch_size=8, static_decode=True)
    try:
        assert engine.graphs is not None and not engine.graphs.capture
        prompts = [list(range(20 + 7 * i, 45 + 7 * i)) for i in range(5)]
        first = [s[0] for s in run(engine, prompts)]
        # three continue (batch of 3: padded to 4, over a slot that holds a finished entry)
        nxt = [p + s.output_ids + [4] for p, s in zip(prompts[:3], first[:3])]
        second = [s[0] for s in run(engine, nxt, max_tokens=20)]
        for p, seq in zip(nxt, second):
            assert seq.cached_tokens > 0
            assert_faithful(model, p, seq)
        late = [p + s.output_ids + [5] for p, s in zip(prompts[3:], first[3:])]
        for p, seq in zip(late, [s[0] for s in run(engine, late)]):
            assert seq.cached_tokens == len(p) - 2
            assert_faithful(model, p, seq)
    finally:
        engine.stop()


def test_decode_steps_touch_no_sequence_from_python(model, tok, monkeypatch):
    """Per-token work is tensor work: a sequence's tokens are read into Python when it finishes,
    not at every step (streaming, stop strings and top logprobs excepted)."""
    reads = []
    original = RunningBatch.tokens_of
    monkeypatch.setattr(RunningBatch, "tokens_of", lambda self, row: reads.append(row) or original(self, row))
    engine = engine_for(model, tok, max_batch_size=16)
    try:
        results = run(engine, [list(range(5, 25))] * 16, max_tokens=48)
        assert all(len(s[0].output_ids) == 48 for s in results)
        assert engine.stats["steps"] >= 47
        assert len(reads) <= 3 * 16, f"{len(reads)} reads of a sequence's tokens for 16 sequences"
    finally:
        engine.stop()
