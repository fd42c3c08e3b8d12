"""The built-in ``tiny`` model: a Qwen2-architecture causal LM with random weights.

Nothing is downloaded. The first use builds, in a few seconds:

* a byte-level BPE tokenizer trained on a few KB of text made here, with exactly Qwen2's
  normalizer (NFC) and pre-tokenizer (Qwen2's split regex, then ByteLevel without its own
  regex). ``AutoTokenizer`` rebuilds those two pieces for ``model_type=qwen2`` whatever was
  saved, so a tokenizer trained any other way would encode differently after a reload.
  Two changes to plain BPE make grid games learnable by a small model:
  - no merge joins two pieces made only of Sokoban board symbols (``BOARD_SYMBOLS``), so
    every board cell is one token and a cell's column is its position in the row;
  - the move words (``MOVE_WORDS``) are added tokens matched as whole words, so ``Up`` is
    the same token after ``>``, after a space or at a line start;
* a Qwen2.5-style chat template with tools (``chat_template.jinja`` beside this file);
* a 2-layer Qwen2 model (hidden 128, about 0.5M parameters) with weights drawn from a fixed
  seed: at a fixed CPU budget it learned Sokoban from demonstrations better than a 4-layer
  hidden-256 model, which is about 5x slower per token.

It is written atomically to ``$AGENTGYM_CACHE/<TINY_VERSION>`` (default ``~/.cache/agentgym``)
and loaded from there like any Hugging Face model directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

TINY_NAMES = ("tiny", "agentgym/tiny")
TINY_VERSION = "tiny-v2"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (non-special) tokens, as in Qwen2.5: they decode back to text, so tool calls and
# think blocks stay visible in the decoded response.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
VOCAB_SIZE = 640
BOARD_SYMBOLS = "#_OX√PS\n"
"""Sokoban's board characters (``sokoban_levels.Level.text``): never merged with one another."""
MOVE_WORDS = ("Up", "Down", "Left", "Right")
"""One token each wherever they stand as a word (added tokens with ``single_word``)."""
MODEL_CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTGYM_CACHE", Path.home() / ".cache" / "agentgym"))


def is_tiny(path: str | os.PathLike[str]) -> bool:
    return str(path) in TINY_NAMES


def tiny_model_path() -> Path:
    """The directory of the tiny model, built on first use."""
    target = cache_dir() / TINY_VERSION
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{TINY_VERSION}-", dir=target.parent))
    try:
        build_tiny_model(staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished first; theirs is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def training_corpus() -> list[str]:
    """A few KB of text that covers what the built-in envs and templates show the model."""
    lines = [
        "You are a helpful assistant. Think step by step and give the final answer.",
        'Let\'s think step by step and output the final answer after "####".',
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
        "How many clips did Natalia sell altogether in April and May? #### 72",
        "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
        "The answer is \\boxed{10}. 1,000 + 2,500 = 3,500 and 3/4 = 0.75",
        "You are playing Sokoban. Push every box X onto a target O (you push, never pull). "
        "Symbols: # wall, _ floor, P you, √ box on target, S you on target.",
        "Answer like <answer>Up || Left</answer>: at most 5 moves of Up, Down, Left, Right.",
        "Boxes: 2. Moves left: 15. Moves: Up (push), Left (blocked), Right. Reward: -0.1. "
        "Boxes on targets: 1/2. Solved! Every box is on a target. No moves left. The episode is over.",
        "Invalid reply: no <answer>...</answer> found. Nothing moved.",
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48 / 2"}}\n</tool_call>',
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(48 + 24)"}}\n</tool_call>',
        '<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>',
        "<tool_response>\n24\n</tool_response> <think>\nI should add them.\n</think>",
        '{"type": "function", "function": {"name": "move", "description": "Move the player", '
        '"parameters": {"type": "object", "properties": {"direction": {"type": "string", '
        '"enum": ["up", "down", "left", "right"]}}, "required": ["direction"]}}}',
        "# Tools\n\nYou may call functions. Signatures are within <tools></tools>:",
        "system user assistant tool",
    ]
    numbers = " ".join(str(i) for i in range(0, 200, 7))
    return lines * 4 + [numbers] * 4


def build_tokenizer():
    """Train the tiny BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS) - len(ADDED_TOKENS),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    tok.model = _without_board_merges(tok)
    template = (Path(__file__).with_name("chat_template.jinja")).read_text()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    wrapped.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    wrapped.add_tokens(ADDED_TOKENS)
    wrapped.add_tokens([AddedToken(word, single_word=True, normalized=False) for word in MOVE_WORDS])
    wrapped.chat_template = template
    return wrapped


def _without_board_merges(tok):
    """The trained BPE model minus every merge of two pieces that are both made only of board
    symbols, and minus what only such merges produced (so board text is one token per cell)."""
    from tokenizers import models, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    symbols = {byte_level.pre_tokenize_str(c)[0][0] for c in BOARD_SYMBOLS}

    def board_only(piece: str) -> bool:
        while piece:
            head = next((sym for sym in symbols if piece.startswith(sym)), None)
            if head is None:
                return False
            piece = piece[len(head) :]
        return True

    trained = json.loads(tok.to_str())["model"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda piece: trained["vocab"][piece])
    # A symbol of several bytes (√) must still become one token: its merges go first.
    merges = [(sym[:i], sym[i]) for sym in sorted(symbols) for i in range(1, len(sym))]
    have = set(alphabet) | {left + right for left, right in merges}
    for left, right in trained["merges"]:
        if left + right not in have and left in have and right in have and not (board_only(left) and board_only(right)):
            merges.append((left, right))
            have.add(left + right)
    order = alphabet + [left + right for left, right in merges]
    return models.BPE(
        vocab={piece: i for i, piece in enumerate(order)},
        merges=merges,
        unk_token=None,
        fuse_unk=False,
        byte_fallback=False,
    )


def build_tiny_model(directory: Path, seed: int = 0, **sizes: int) -> None:
    """Write the tokenizer, config, generation config and random weights to ``directory``.
    ``sizes`` override ``MODEL_CONFIG`` (e.g. ``num_hidden_layers=4``)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(directory)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **{**MODEL_CONFIG, **sizes},
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    GenerationConfig(
        eos_token_id=[config.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=config.pad_token_id,
    ).save_pretrained(directory)

    # The gotcha: prove that a reload encodes exactly like the tokenizer we trained.
    reloaded = AutoTokenizer.from_pretrained(directory)
    probe = (
        "\n".join(training_corpus()[:20]) + " héllo wörld ∑ 日本 √ 1,234.5\n\n  end "
        "<answer>Up || Left</answer>\n######\n#_PX_#\n#__O_#\n#√S__#\n######"
    )
    if reloaded(probe)["input_ids"] != tokenizer(probe)["input_ids"]:
        raise RuntimeError("tiny tokenizer encodes differently after save/load; this is a bug in agentgym")
    (directory / "agentgym.json").write_text(
        json.dumps({"preset": "tiny", "version": TINY_VERSION, "seed": seed, **sizes})
    )
