"""Dataset rows for dataset-backed envs: read JSONL / JSON / Parquet, in raw or veRL format.

Two row formats are understood:

* **veRL's RL format** (what ``examples/data_preprocess/*.py`` writes)::

      {"data_source": "openai/gsm8k",
       "prompt": [{"role": "user", "content": "..."}],
       "reward_model": {"style": "rule", "ground_truth": "72"},
       "extra_info": {"index": 0, "interaction_kwargs": {"name": "gsm8k", ...}}}

* **raw question/answer rows** (e.g. GSM8K's own ``{"question": ..., "answer": "... #### 72"}``),
  turned into a task by a converter the env supplies (see ``agentgym.envs.gsm8k.gsm8k_task``).

``data_files`` is a file, a directory holding ``<split>.parquet`` / ``<split>.jsonl``, or a list
of either. Parquet needs ``pyarrow`` (``pip install 'agentgym[parquet]'``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.types import Message

SUFFIXES = (".parquet", ".jsonl", ".json")


class DataError(ValueError):
    """A data file is missing, unreadable, or lacks a column a task needs."""


@dataclass
class Task:
    """One dataset row, ready for an env: the opening messages and what to score against."""

    prompt: list[Message]
    ground_truth: str | None
    data_source: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    index: int = 0
    where: str = ""  # "path:row" for error messages and info


Converter = Callable[[dict[str, Any], str], Task]
"""``(row, where) -> Task``; raises DataError naming ``where`` and the missing column."""


def resolve_data_files(data_files: str | Path | Sequence[str | Path] | None, split: str = "train") -> list[Path]:
    """The files to read: each path as given, a directory replaced by its ``<split>.*`` file.

    Raises DataError when nothing is given, a path does not exist, or a directory has no
    ``<split>.parquet`` / ``<split>.jsonl`` / ``<split>.json``.
    """
    if data_files is None or (isinstance(data_files, (list, tuple)) and not data_files):
        raise DataError(
            "no data files given: pass data_files= (a .jsonl/.parquet file, a list of them, "
            "or a directory holding <split>.jsonl / <split>.parquet)"
        )
    paths = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
    out: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = [path / f"{split}{suffix}" for suffix in SUFFIXES if (path / f"{split}{suffix}").is_file()]
            if not found:
                raise DataError(
                    f"data directory {path} has no {split}.parquet, {split}.jsonl or {split}.json "
                    f"(split={split!r}); pass a file or another split"
                )
            out.append(found[0])
        elif path.is_file():
            out.append(path)
        else:
            raise DataError(f"data file not found: {path}; pass data_files= with an existing .jsonl/.parquet path")
    return out


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of one ``.parquet`` file or one JSON file, as plain dicts. A JSON file is read by its
    content, whatever its extension: a list of objects, or JSON lines (one object per line: what
    ``datasets.Dataset.to_json`` writes, which ChatLearn's preprocessing names ``train.json``)."""
    path = Path(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    return [row for _, row in json_rows(path)]


def json_rows(path: Path) -> list[tuple[str, Any]]:
    """``(where, row)`` of a JSON file holding a list of rows (where: ``"row K"``) or JSON lines (``"line N"``)."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: a JSON list of rows that does not parse ({exc})") from None
        if not isinstance(rows, list):
            raise DataError(f"{path}: a JSON data file holds a list of rows or one JSON object per line")
        return [(f"row {k}", row) for k, row in enumerate(rows)]
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((f"line {lineno}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{path}:{lineno}: not valid JSON ({exc.msg}); a data file holds a JSON list of rows or "
                f"one JSON object per line"
            ) from None
    return out


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            f"reading {path} needs pyarrow: pip install 'agentgym[parquet]' (or pyarrow), or convert the file to .jsonl"
        ) from None
    return pq.read_table(path).to_pylist()


_CACHE: dict[tuple[Any, ...], list[Task]] = {}
_CACHE_SIZE = 8
_CACHE_LOCK = threading.Lock()


def load_tasks(data_files: str | Path | Sequence[str | Path] | None, split: str, convert: Converter) -> list[Task]:
    """Read every row of every file and convert it; ``Task.index`` counts across files.

    Results are cached per (files, their mtimes and sizes, converter), so many envs over the
    same data share one list of tasks; treat the returned tasks as read-only.
    """
    paths = resolve_data_files(data_files, split)
    key = (tuple((str(p.resolve()), p.stat().st_mtime_ns, p.stat().st_size) for p in paths), convert)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        return list(cached)
    tasks: list[Task] = []
    for path in paths:
        for row_number, row in enumerate(read_rows(path)):
            if not isinstance(row, dict):
                raise DataError(f"{path} row {row_number}: expected an object, got {type(row).__name__}")
            task = convert(row, f"{path}:{row_number}")
            task.index = len(tasks)
            tasks.append(task)
    if not tasks:
        raise DataError(f"no rows in {', '.join(str(p) for p in paths)}; give a file with at least one row")
    with _CACHE_LOCK:
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = tasks
    return list(tasks)


def is_verl_row(row: dict[str, Any]) -> bool:
    """A row in veRL's RL format carries its chat ``prompt``."""
    return "prompt" in row


def column(row: dict[str, Any], dotted: str, where: str, hint: str = "") -> Any:
    """``row["a"]["b"]`` for ``dotted="a.b"``; DataError naming ``where`` and the column if absent."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            raise DataError(f"{where}: missing column {dotted!r}" + (f" ({hint})" if hint else ""))
        value = value[part]
    return value


def verl_task(row: dict[str, Any], where: str) -> Task:
    """A veRL-format row: ``prompt`` (chat list or a string) and ``reward_model.ground_truth``."""
    hint = "veRL rows need 'prompt' and 'reward_model.ground_truth'"
    prompt = column(row, "prompt", where, hint)
    ground_truth = column(row, "reward_model.ground_truth", where, hint)
    return Task(
        prompt=as_messages(prompt, where),
        ground_truth=str(ground_truth),
        data_source=str(row.get("data_source") or ""),
        extra_info=dict(row.get("extra_info") or {}),
        where=where,
    )


def as_messages(prompt: Any, where: str) -> list[Message]:
    """A row's prompt as chat messages: a string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Iterable) and not isinstance(prompt, dict):
        messages = [dict(m) for m in prompt]
        if messages and all(isinstance(m.get("role"), str) and "content" in m for m in messages):
            # parquet structs fill absent keys with None: drop them, keep content
            return [{k: v for k, v in m.items() if v is not None or k == "content"} for m in messages]  # type: ignore[misc]
    raise DataError(f"{where}: 'prompt' must be a string or a list of {{role, content}} messages")


def choose_index(num_tasks: int, seed: int | None, options: dict[str, Any] | None, draw: Callable[[int], int]) -> int:
    """Which row an episode uses: ``options["index"]`` if given, else ``seed % num_tasks`` (so
    seeds 0..N-1 walk the dataset), else ``draw(num_tasks)`` (the env's own RNG)."""
    if options and options.get("index") is not None:
        index = int(options["index"])
        if not 0 <= index < num_tasks:
            raise IndexError(
                f"options['index']={index} is out of range: the dataset has {num_tasks} rows (0..{num_tasks - 1})"
            )
        return index
    if seed is not None:
        return int(seed) % num_tasks
    return int(draw(num_tasks))
