"""SFT on demonstrations under a context policy: each reply is a row whose prompt is the windowed context
RL will show it, every reply trained once, no dropped turn in any prompt."""

from __future__ import annotations

from agentgym.rollout import ChatTokenizer
from agentgym.stages.sft_data import to_trajectory
from agentgym.trainer.batch import build_batch
from tests.support.long_horizon import TOK


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "TASK"}]
    for k in range(turns):
        messages += [{"role": "assistant", "content": f"reply-{k}"}, {"role": "user", "content": f"obs-{k}"}]
    return messages[:-1]  # ends on the last reply


def test_windowed_demo_trains_each_reply_once_on_its_window():
    chat = ChatTokenizer(TOK)
    full = to_trajectory(conversation(6), chat)
    windowed = to_trajectory(conversation(6), chat, context_policy="window", context_window=2)
    assert full.single_sequence and [t.new_context for t in windowed.turns] == [False] * 3 + [True] * 3
    assert [t.response_ids for t in windowed.turns] == [t.response_ids for t in full.turns]
    batch, skipped = build_batch([windowed], pad_token_id=0)
    assert not skipped and len(batch) == 4  # turns 0-2 share a sequence, then one row per windowed reply
    assert batch["response_mask"].sum().item() == sum(len(t.response_ids) for t in full.turns)  # each once
    for k in range(3, 6):
        prompt = TOK.decode(windowed.turn_context(k))
        assert "TASK" in prompt and f"reply-{k - 1}<" in prompt and f"reply-{k - 3}<" not in prompt
    assert max(windowed.segment_lengths()) < len(full.token_ids())
