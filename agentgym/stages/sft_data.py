"""Chat data for supervised fine-tuning, tokenized exactly as a rollout would be.

A row is a conversation: ``data.messages_key`` (default ``messages``) holds OpenAI chat
messages, optionally with the tool schemas the model saw under ``data.tools_key``; or, veRL's
single-turn form, ``data.prompt_key`` / ``data.response_key`` (a prompt string or message list,
and the reply). ``agentgym demos`` writes the first form.

Each conversation becomes a ``Trajectory`` the same way the rollout runner builds one from an
episode (``agentgym.rollout.chat``): the first prompt is the template rendered up to the first
assistant message with the generation prompt (mask 0); each assistant message is the tokens a
model generates to write it, closing token included (mask 1); the messages between assistant
messages are token deltas (mask 0). So the loss falls on every assistant turn of a multi-turn
episode and nothing else, and a model trained here sees at RL time exactly the sequences it
was trained on.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentgym.rollout.chat import ChatTokenizer, tools_key
from agentgym.rollout.context import History, Summarizer, check_policy
from agentgym.types import Message, Trajectory, Turn


class SFTDataError(ValueError):
    """Data that cannot be trained on; the message names the file, the row and the fix."""


def read_rows(files: str | Sequence[str]) -> list[dict[str, Any]]:
    """Rows of one or more .jsonl / .json / .parquet files (a directory: every such file in it)."""
    paths: list[Path] = []
    for f in [files] if isinstance(files, (str, Path)) else list(files):
        p = Path(f)
        if p.is_dir():
            paths += sorted(q for q in p.iterdir() if q.suffix in (".jsonl", ".json", ".parquet"))
        elif p.is_file():
            paths.append(p)
        else:
            raise SFTDataError(
                f"no data at {p}: pass data.train_files=<.jsonl/.parquet file or directory> "
                f"(e.g. written by `agentgym demos --env sokoban -o demos.jsonl`)"
            )
    rows: list[dict[str, Any]] = []
    for p in paths:
        if p.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise SFTDataError(f"{p} is Parquet, which needs pyarrow: pip install 'agentgym[parquet]'") from None
            rows += pq.read_table(p).to_pylist()
            continue
        from agentgym.envs.data import DataError, json_rows

        try:
            numbered = json_rows(p)
        except DataError as exc:
            raise SFTDataError(str(exc)) from None
        for where, row in numbered:
            if not isinstance(row, dict):
                raise SFTDataError(f"{p} {where} is not a JSON object")
            row.setdefault("_where", f"{p} {where}")
            rows.append(row)
    if not rows:
        raise SFTDataError(f"no rows in {', '.join(map(str, paths)) or files}")
    return rows


def conversation(
    row: dict[str, Any],
    messages_key: str | None = "messages",
    prompt_key: str | None = None,
    response_key: str | None = None,
    prompt_dict_keys: Sequence[str] | None = None,
    response_dict_keys: Sequence[str] | None = None,
) -> list[Message]:
    """The row's messages: ``row[messages_key]``, or a prompt and a response (veRL's SFT keys; a column
    holding a mapping is read at ``prompt_dict_keys`` / ``response_dict_keys``)."""
    where = row.get("_where", "a row")
    if prompt_key or response_key:
        if not (prompt_key and response_key) or prompt_key not in row or response_key not in row:
            raise SFTDataError(
                f"{where}: data.prompt_key and data.response_key must both name columns of the "
                f"row (it has {sorted(k for k in row if k != '_where')})"
            )
        prompt = _field(row, prompt_key, prompt_dict_keys, "prompt", where)
        response = _field(row, response_key, response_dict_keys, "response", where)
        if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
            messages = list(prompt)
        elif isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            raise SFTDataError(
                _not_text(where, "prompt", prompt_key, prompt_dict_keys, prompt, "or a list of chat messages")
            )
        if not isinstance(response, str):
            raise SFTDataError(_not_text(where, "response", response_key, response_dict_keys, response, ""))
        return messages + [{"role": "assistant", "content": response}]
    messages = row.get(messages_key or "messages")
    if isinstance(messages, str):  # Parquet files often keep nested data as JSON text
        with contextlib.suppress(ValueError):
            messages = json.loads(messages)
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise SFTDataError(
            f"{where}: data.messages_key={messages_key!r} must hold a list of chat messages; set "
            f"data.messages_key, or data.prompt_key and data.response_key "
            f"(the row has {sorted(k for k in row if k != '_where')})"
        )
    return messages


def _field(row: dict[str, Any], key: str, dict_keys: Sequence[str] | None, which: str, where: str) -> Any:
    """``row[key]``, then down ``dict_keys`` (veRL's ``prompt_dict_keys``: a path into a mapping)."""
    value = row[key]
    for k, part in enumerate(dict_keys or ()):
        if isinstance(value, str):  # Parquet files often keep nested data as JSON text
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        if not isinstance(value, dict) or part not in value:
            path = ".".join([key, *list(dict_keys or ())[:k]])
            have = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise SFTDataError(f"{where}: data.{which}_dict_keys names {part!r} under {path}, which holds {have}")
        value = value[part]
    return value


def _not_text(where: str, which: str, key: str, dict_keys: Sequence[str] | None, value: Any, also: str) -> str:
    """The refusal of a prompt or response column that does not hold text: it is never stringified."""
    path = ".".join([key, *list(dict_keys or ())])
    if isinstance(value, dict):
        hint = (
            f"; pick the text inside it with data.{which}_dict_keys=[{next(iter(value), 'KEY')}] "
            f"(its keys: {', '.join(map(str, value))})"
        )
    else:
        hint = f"; point data.{which}_key at a column that holds text"
    return (
        f"{where}: the {which} at {path} is a {type(value).__name__}, not text {also}".rstrip()
        + f" (agentgym never trains on str() of it){hint}"
    )


def to_trajectory(
    messages: Sequence[Message],
    chat: ChatTokenizer,
    tools: Sequence[dict[str, Any]] | None = None,
    where: str = "a row",
    group_id: str = "",
    context_policy: str = "full",
    context_window: int = 4,
    summarize: Summarizer | None = None,
) -> Trajectory:
    """One conversation as a trajectory whose loss mask is 1 exactly on the assistant tokens.

    ``context_policy`` / ``context_window``: each reply's prompt as the rollout runner builds it under that
    policy (``agentgym.rollout.context``): a reply whose window left older turns out gets a prompt of its
    own (``Turn.new_context``), so SFT trains each reply once, on the context RL will show it."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None:
        raise SFTDataError(
            f"{where}: the conversation has no assistant message, so nothing to learn from; "
            f"every row needs at least one reply"
        )
    if first == 0:
        raise SFTDataError(f"{where}: the conversation starts with an assistant message; it needs a prompt first")
    check_policy(context_policy, context_window)
    tkey = tools_key(tools)
    traj = Trajectory(group_id=group_id, messages=list(messages), data_source="sft")
    delta = chat.prompt_ids(messages[:first], tools, tkey=tkey)
    history = History()
    history.observe(messages[:first])
    pending: list[Message] = []
    for message in messages[first:]:
        if message.get("role") != "assistant":
            pending.append(message)
            continue
        history.observe(pending)
        windowed = history.prompt(context_policy, context_window, summarize) if traj.turns else None
        if windowed is not None:
            delta = chat.prompt_ids(windowed, tools, tkey=tkey)
        elif pending:
            delta = chat.delta_ids(pending, tools, traj.turns[-1].response_ids[-1], tkey=tkey)
        pending = []
        ids = chat.assistant_ids(message, tools)
        traj.turns.append(
            Turn(
                prompt_ids=list(delta),
                response_ids=ids,
                logprobs=[0.0] * len(ids),
                observation=[],
                response_text=chat.decode(ids),
                new_context=windowed is not None,
            )
        )
        history.reply(message)
    return traj


def load_sft_trajectories(
    files: str | Sequence[str],
    chat: ChatTokenizer,
    *,
    messages_key: str | None = "messages",
    prompt_key: str | None = None,
    response_key: str | None = None,
    prompt_dict_keys: Sequence[str] | None = None,
    response_dict_keys: Sequence[str] | None = None,
    tools_key_name: str | None = "tools",
    max_length: int | None = None,
    truncation: str = "error",
    expect_env: str | None = None,
    max_samples: int = -1,
    context_policy: str = "full",
    context_window: int = 4,
    summarize: Summarizer | None = None,
) -> tuple[list[Trajectory], int]:
    """The data's conversations as trajectories, and how many were left out as too long
    (``truncation=error`` refuses the data instead; veRL's ``data.truncation``).

    ``expect_env``: refuse rows whose ``env`` field names another environment (demos written for
    a different env would train the policy on the wrong task)."""
    rows = read_rows(files)
    if max_samples >= 0:  # veRL's data.train_max_samples
        rows = rows[:max_samples]
    out: list[Trajectory] = []
    too_long = 0
    for row in rows:
        where = str(row.get("_where", "a row"))
        env = row.get("env")
        if expect_env and env and str(env) != expect_env:
            raise SFTDataError(
                f"{where}: these demonstrations are for env {env!r}, not {expect_env!r}; write "
                f"demos for this env with `agentgym demos --env {expect_env} -o FILE`"
            )
        tools = row.get(tools_key_name) if tools_key_name else None
        if isinstance(tools, str):
            tools = json.loads(tools)
        messages = conversation(row, messages_key, prompt_key, response_key, prompt_dict_keys, response_dict_keys)
        traj = to_trajectory(
            messages,
            chat,
            tools or None,
            where,
            group_id=f"sft-{len(out)}",
            context_policy=context_policy,
            context_window=context_window,
            summarize=summarize,
        )
        length = max(traj.segment_lengths())  # the longest training row it makes
        if max_length is not None and length > max_length:
            if truncation == "error":
                raise SFTDataError(
                    f"{where}: {length} tokens > data.max_length={max_length}; raise data.max_length "
                    f"or set data.truncation=skip to leave such rows out"
                )
            too_long += 1
            continue
        out.append(traj)
    if not out:
        raise SFTDataError(f"every row is longer than data.max_length={max_length}; raise it")
    return out, too_long


def iter_batches(
    items: Sequence[Any], batch_size: int, seed: int, epoch: int, shuffle: bool = True
) -> Iterable[list[Any]]:
    """``items`` in batches of ``batch_size`` (the last incomplete one dropped), order seeded per epoch."""
    import random

    order = list(range(len(items)))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    for start in range(0, len(order) - batch_size + 1, batch_size):
        yield [items[i] for i in order[start : start + batch_size]]
