"""A tiny reward model built here, with weights set by hand so that what it prefers is known exactly.

``build_tiny_reward_model(directory, prefer=DIGITS)`` writes a one-layer ``Qwen2ForSequenceClassification``
(``num_labels=1``) on the built-in tiny tokenizer. Its score at the last token of a sequence is

    score = scale * f / sqrt(1 + f**2),   f = the share of the sequence's tokens that are preferred

(0 without one, rising with every one): the attention has zero queries and keys, so it averages over
the whole prefix a value that is 1 on the preferred tokens and 0 elsewhere, and the head reads that
average back after the final norm. Nothing is trained and nothing is downloaded, so tests and the
docs/rewards.md's example get the same model everywhere. ``chat_template`` gives it a template of its own (to
exercise ``reward_model.model.input_tokenizer``'s re-rendering).

``prefer``: texts of one token each (default: the ten digits, so on ``arithmetic`` it prefers replies
that are numbers).

    python -m agentgym.rewards.tiny_rm DIR [--prefer 0 1 2 ...] [--chat-template FILE]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

HIDDEN = 64
HEADS = 4
KV_HEADS = 2
DIGITS = tuple("0123456789")


def preferred_ids(tokenizer: object, prefer: str | Sequence[str]) -> list[int]:
    """The token ids of ``prefer`` (each text must be one token)."""
    out = []
    for text in [prefer] if isinstance(prefer, str) else prefer:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens in the tiny vocabulary; prefer texts of one token each")
        out.append(int(ids[0]))
    return out


def expected_score(ids: list[int], preferred: list[int], scale: float = 10.0) -> float:
    """What the model scores a sequence of token ids (the formula in the module docstring)."""
    share = sum(i in preferred for i in ids) / len(ids)
    return scale * share / math.sqrt(1.0 + share * share)


def build_tiny_reward_model(
    directory: str | Path,
    prefer: str | Sequence[str] = DIGITS,
    chat_template: str | None = None,
    scale: float = 10.0,
    seed: int = 0,
) -> Path:
    """Write the reward model to ``directory`` (see the module docstring); returns the directory."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    from agentgym.model import tiny_model_path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(directory)
    target = preferred_ids(tokenizer, prefer)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=4096,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
        root = math.sqrt(HIDDEN)
        with torch.no_grad():
            for param in model.parameters():
                param.zero_()
            embed = torch.randn(len(tokenizer), HIDDEN)
            embed[:, :2] = 0.0  # coordinate 0 carries the average, 1 marks the preferred tokens
            embed *= root / embed.norm(dim=-1, keepdim=True)  # every row: root mean square 1
            for token in target:
                embed[token] = 0.0
                embed[token, 1] = root
            model.model.embed_tokens.weight.copy_(embed)
            layer = model.model.layers[0]
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
            layer.self_attn.v_proj.weight[0, 1] = 1.0 / root  # kv head 0, dim 0: 1 on a preferred token
            layer.self_attn.o_proj.weight[0, 0] = root  # head 0 (reads kv head 0), dim 0 -> coordinate 0
            model.model.norm.weight.fill_(1.0)
            model.score.weight[0, 0] = scale / root
    model.save_pretrained(directory)
    (directory / "agentgym.json").write_text(
        json.dumps(
            {
                "preset": "tiny_reward_model",
                "prefer": [prefer] if isinstance(prefer, str) else list(prefer),
                "preferred_ids": target,
                "scale": scale,
            }
        )
    )
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentgym.rewards.tiny_rm", description=__doc__.split("\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--prefer", nargs="+", default=list(DIGITS), help="texts of one token each it prefers")
    parser.add_argument("--chat-template", default=None, help="a Jinja chat template file of its own")
    args = parser.parse_args(argv)
    template = Path(args.chat_template).read_text() if args.chat_template else None
    out = build_tiny_reward_model(args.directory, args.prefer, template)
    print(f"wrote a tiny reward model preferring {' '.join(args.prefer)} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
