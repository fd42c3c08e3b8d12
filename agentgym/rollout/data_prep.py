"""veRL's ``data.*`` row handling, done once before training: the rows the envs then read.

For ``data.train_files`` / ``data.val_files`` in veRL's row format (a chat ``prompt`` per row):

* ``data.prompt_key``: the column holding the prompt (renamed to ``prompt``);
* ``data.reward_fn_key``: the column that names the row's reward (copied to ``data_source``);
* ``data.train_max_samples`` / ``val_max_samples``: keep only the first N rows;
* prompts longer than ``data.max_prompt_length`` tokens (rendered with the chat template and the
  generation prompt, as the rollout renders them): dropped with ``data.filter_overlong_prompts``;
  else by ``data.truncation``: ``error`` stops here naming the rows, ``left`` / ``right`` /
  ``middle`` cut tokens from the start / end / middle of the longest message's content until the
  prompt fits (veRL cuts the rendered token ids; agentgym keeps the template's own tokens whole).

When anything changes, the rows are written to ``<run dir>/data/<split>.jsonl`` and the config
points there, so every env reads the same prepared rows. Raw rows without a prompt column (GSM8K's
``question``/``answer``) are left to their env.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError

SPLITS = (("train", "train_files", "train_max_samples"), ("val", "val_files", "val_max_samples"))


@dataclass
class Prepared:
    """What preparation did to one split's rows."""

    split: str
    rows: list[dict[str, Any]]
    path: str | None = None  # the prepared file, when rows changed
    dropped: int = 0
    truncated: int = 0
    notes: list[str] = field(default_factory=list)


def plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def read_split(files: Any, split: str) -> list[dict[str, Any]]:
    """Every row of ``files`` (a file, a directory holding ``<split>.*``, or a list)."""
    from agentgym.envs.data import DataError, read_rows, resolve_data_files

    try:
        paths = resolve_data_files(plain(files), split)
        return [row for path in paths for row in read_rows(path)]
    except DataError as exc:
        raise ConfigError(str(exc)) from None


def prompt_tokens(chat: Any, prompt: Any) -> int:
    """Tokens of ``prompt`` rendered with the generation prompt (what the first turn sends)."""
    from agentgym.envs.data import as_messages

    return len(chat.prompt_ids(as_messages(prompt, "row")))


def fits(chat: Any, prompt: Any, limit: int) -> bool:
    """Whether the rendered prompt has at most ``limit`` tokens; without tokenizing when its text has
    at most ``limit`` bytes (no token is shorter than a byte)."""
    from agentgym.envs.data import as_messages

    text = chat.render(as_messages(prompt, "row"), add_generation_prompt=True)
    return len(text.encode("utf-8")) <= limit or prompt_tokens(chat, prompt) <= limit


def cut(text_ids: list[int], keep: int, side: str) -> list[int]:
    """``keep`` of ``text_ids``: ``left`` keeps the end, ``right`` the start, ``middle`` both ends."""
    if keep >= len(text_ids):
        return text_ids
    keep = max(0, keep)
    if side == "left":
        return text_ids[len(text_ids) - keep :]
    if side == "right":
        return text_ids[:keep]
    head = keep // 2
    return text_ids[:head] + text_ids[len(text_ids) - (keep - head) :]


def truncate_prompt(chat: Any, prompt: list[dict[str, Any]], limit: int, side: str) -> list[dict[str, Any]]:
    """The prompt with its longest message's content cut (by ``side``) until it renders in ``limit`` tokens."""
    messages = [dict(m) for m in prompt]
    longest = max(range(len(messages)), key=lambda i: len(str(messages[i].get("content") or "")))
    ids = chat.encode(str(messages[longest].get("content") or ""))
    over = prompt_tokens(chat, messages) - limit
    keep = len(ids) - over
    while keep >= 0:
        messages[longest]["content"] = chat.decode(cut(ids, keep, side))
        if prompt_tokens(chat, messages) <= limit:
            return messages
        keep -= max(1, (prompt_tokens(chat, messages) - limit))
    raise ConfigError(
        f"a prompt cannot be cut to data.max_prompt_length={limit} tokens: its template alone is "
        f"longer; raise data.max_prompt_length"
    )


def prepare_split(cfg: DictConfig, split: str, files: Any, max_samples: int, chat: Any) -> Prepared:
    data = cfg.data
    rows = read_split(files, split)
    prepared = Prepared(split, rows)
    changed = False
    if max_samples > 0 and len(rows) > max_samples:
        rows = rows[:max_samples]
        changed = True
        prepared.notes.append(f"first {max_samples} rows (data.{split}_max_samples)")
    key = str(data.prompt_key)
    if key != "prompt":
        missing = [i for i, r in enumerate(rows) if key not in r]
        if missing:
            raise ConfigError(
                f"data.prompt_key={key}: row {missing[0]} of {files} has no {key!r} column "
                f"(columns: {', '.join(sorted(rows[missing[0]]))})"
            )
        rows = [{**{k: v for k, v in r.items() if k != key}, "prompt": r[key]} for r in rows]
        changed = True
    source_key = str(data.reward_fn_key)
    if source_key != "data_source":
        rows = [{**r, "data_source": r.get(source_key)} for r in rows]
        changed = True
    if chat is not None and rows and all("prompt" in r for r in rows):
        limit = int(data.max_prompt_length)
        long_rows = [i for i, r in enumerate(rows) if not fits(chat, r["prompt"], limit)]
        if long_rows and data.filter_overlong_prompts:
            keep = set(range(len(rows))) - set(long_rows)
            rows = [r for i, r in enumerate(rows) if i in keep]
            prepared.dropped = len(long_rows)
            changed = True
            prepared.notes.append(
                f"{len(long_rows)} rows dropped: prompt over data.max_prompt_length={limit} "
                f"tokens (data.filter_overlong_prompts)"
            )
        elif long_rows and data.truncation == "error":
            first = long_rows[0]
            raise ConfigError(
                f"{len(long_rows)} of {len(rows)} {split} rows have prompts longer than data.max_prompt_length={limit} "
                f"tokens (row {first}: {prompt_tokens(chat, rows[first]['prompt'])} tokens). Set "
                f"data.filter_overlong_prompts=true to drop them, "
                f"data.truncation=left|right|middle to cut them, or raise data.max_prompt_length"
            )
        elif long_rows:
            from agentgym.envs.data import as_messages

            for i in long_rows:
                rows[i] = {
                    **rows[i],
                    "prompt": truncate_prompt(chat, as_messages(rows[i]["prompt"], "row"), limit, str(data.truncation)),
                }
            prepared.truncated = len(long_rows)
            changed = True
            prepared.notes.append(f"{len(long_rows)} prompts cut to {limit} tokens (data.truncation={data.truncation})")
    prepared.rows = rows
    if not rows:
        raise ConfigError(
            f"no {split} rows left in {files} after filtering; raise data.max_prompt_length or give other data"
        )
    if changed:
        target = Path(str(cfg.trainer.default_local_dir)) / "data" / f"{split}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False, default=_jsonable) + "\n")
        prepared.path = str(target)
    return prepared


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def prepare_data(cfg: DictConfig, chat: Any = None) -> dict[str, Prepared]:
    """Prepare ``data.train_files`` and ``data.val_files`` (see the module docstring); the config is
    pointed at the prepared files. ``chat``: a ``ChatTokenizer`` for the prompt-length checks
    (None: no length checks)."""
    out: dict[str, Prepared] = {}
    for split, key, samples_key in SPLITS:
        files = cfg.data[key]
        if not files:
            continue
        prepared = prepare_split(cfg, split, files, cfg.data[samples_key], chat)
        if prepared.path is not None:
            cfg.data[key] = prepared.path
        out[split] = prepared
    return out


def data_sources(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The distinct ``data_source`` values of ``rows`` (veRL rows carry one each)."""
    return sorted({str(r.get("data_source") or "") for r in rows})


def exists(value: Any) -> bool:
    files = plain(value)
    paths = [files] if isinstance(files, (str, os.PathLike)) else list(files or [])
    return all("://" in str(p) or os.path.exists(str(p)) for p in paths)
