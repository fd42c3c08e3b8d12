"""``agentgym view TRAJECTORIES.jsonl -o view.html``: a self-contained page of episodes.

The page needs no server and no network: the episodes and the script are inside it. One card
per episode (env, seed, status, rewards, success, length); each turn shows the tokens the model
read (the chat template's prompt and the env's messages: never trained on, marked as such)
and the tokens it generated, each shaded by the probability the policy gave it
(``exp(logprob)``; pale = unlikely), with the turn's reward, finish reason and the weight
version that generated it. Filters: env, status, reward range, length range, text.

Reads anything with trajectories in it: ``agentgym rollout --out`` files (.jsonl, .parquet),
a run's ``samples.jsonl`` (trajectories with ``step`` and ``split``), gateway dumps. Token
text needs the tokenizer that made the ids (``--model``, default ``tiny``); with another
tokenizer the page shows each turn's decoded text instead.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).with_name("viewer.html")


def load_records(path: str | os.PathLike[str], limit: int | None = None) -> list[dict[str, Any]]:
    """Trajectory dicts from a .jsonl (any extra keys kept) or .parquet file; bad lines skipped."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no trajectory file at {p}")
    if p.suffix.lower() in (".parquet", ".pq"):
        from agentgym.rollout.storage import read_trajectories

        records = [t.to_dict() for t in read_trajectories(p)]
    else:
        records = []
        with open(p, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("turns"), list):
                    records.append(row)
    if not records:
        raise ValueError(
            f"{p} holds no trajectories (expected JSONL lines with a 'turns' list, "
            f"as written by agentgym rollout --out or the trainer's samples.jsonl)"
        )
    return records[:limit] if limit else records


class TokenText:
    """Token id -> its text, from a tokenizer (None when the ids do not fit it)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.size = len(tokenizer) if tokenizer is not None else 0
        self.cache: dict[int, str] = {}

    def fits(self, ids: Iterable[int]) -> bool:
        return self.tokenizer is not None and all(isinstance(i, int) and 0 <= i < self.size for i in ids)

    def piece(self, token_id: int) -> str:
        if token_id not in self.cache:
            self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self.cache[token_id]

    def text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False) if ids else ""


def episode(record: dict[str, Any], tokens: TokenText, index: int) -> dict[str, Any]:
    """What the page needs of one trajectory (compact keys, token pieces decoded here)."""
    turns = []
    all_ids = [i for t in record.get("turns", []) for i in (t.get("prompt_ids", []) + t.get("response_ids", []))]
    by_token = tokens.fits(all_ids)
    for t in record.get("turns", []):
        response_ids = list(t.get("response_ids") or [])
        logprobs = list(t.get("logprobs") or [])
        prompt_ids = list(t.get("prompt_ids") or [])
        turn: dict[str, Any] = {
            "reward": float(t.get("reward", 0.0) or 0.0),
            "version": t.get("weight_version", 0),
            "finish": t.get("finish_reason", ""),
            "n_prompt": len(prompt_ids),
            "n_gen": len(response_ids),
        }
        if by_token:
            turn["context"] = tokens.text(prompt_ids)
            turn["gen"] = [[tokens.piece(i), round(float(lp), 4)] for i, lp in zip(response_ids, logprobs)]
        else:
            turn["context"] = "\n".join(
                f"[{m.get('role')}] {m.get('content') or ''}" for m in t.get("observation") or [] if isinstance(m, dict)
            )
            turn["text"] = t.get("response_text") or ""
            turn["mean_logprob"] = (sum(logprobs) / len(logprobs)) if logprobs else None
        turns.append(turn)
    metrics = record.get("metrics") or {}
    length = sum(t["n_prompt"] + t["n_gen"] for t in turns)
    total = sum(t["reward"] for t in turns) + float(record.get("outcome_reward", 0.0) or 0.0)
    success = metrics.get("success")
    return {
        "i": index,
        "env": record.get("env_id") or record.get("data_source") or "?",
        "seed": record.get("seed"),
        "group": record.get("group_id", ""),
        "status": record.get("status", "ok"),
        "failure": record.get("failure"),
        "outcome": float(record.get("outcome_reward", 0.0) or 0.0),
        "reward": round(total, 6),
        "success": None if success is None else bool(success),
        "length": length,
        "step": record.get("step"),
        "split": record.get("split"),
        "tokens": by_token,
        "turns": turns,
    }


def render(records: Sequence[dict[str, Any]], tokenizer: Any = None, title: str = "agentgym trajectories") -> str:
    """The whole page as one HTML string."""
    tokens = TokenText(tokenizer)
    episodes = [episode(r, tokens, i) for i, r in enumerate(records)]
    data = json.dumps(episodes, ensure_ascii=False, allow_nan=False, default=_finite)
    data = data.replace("</", "<\\/")  # the JSON sits inside a <script> element
    page = TEMPLATE.read_text(encoding="utf-8")
    return page.replace("__TITLE__", html.escape(title)).replace("__DATA__", data)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        metavar="TRAJECTORIES",
        help=".jsonl/.parquet trajectories (agentgym rollout --out, a run's samples.jsonl)",
    )
    parser.add_argument("-o", "--output", default=None, help="HTML file to write (default: beside the input)")
    parser.add_argument("--model", default="tiny", help="the tokenizer that made the token ids (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=2000, help="at most this many episodes (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    """``agentgym view TRAJECTORIES [-o view.html] [--model tiny] [--limit N]``."""
    import sys

    try:
        records = load_records(args.path, args.limit)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"agentgym view: {exc}", file=sys.stderr)
        return 2
    tokenizer = None
    if args.model:
        try:
            from agentgym.model import load_tokenizer

            tokenizer = load_tokenizer(args.model)
        except (OSError, ValueError) as exc:
            print(f"agentgym view: showing decoded text, not tokens ({exc})", file=sys.stderr)
    output = Path(args.output or Path(args.path).with_suffix(".html"))
    output.write_text(render(records, tokenizer, title=f"agentgym: {Path(args.path).name}"), encoding="utf-8")
    print(f"wrote {output} ({len(records)} episodes); open it in a browser")
    return 0
