"""GSM8K: grade-school maths word problems, one question and one scored answer.

    env = agentgym.make("gsm8k", data_files="data/gsm8k/test.jsonl")
    messages, info = env.reset(options={"index": 0})
    _, reward, terminated, _, info = env.step("... #### 18")
    info["outcome_reward"]  # 1.0

Rows are raw GSM8K (``question``, ``answer`` ending in ``#### N``) or veRL's RL format
(``prompt``, ``reward_model.ground_truth``, ``data_source``, ``extra_info``); see
``agentgym.envs.data``. The score is ``agentgym.envs.rewards.compute_score``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.envs.base import TextEnv, reply_text
from agentgym.envs.data import (
    DataError,
    Task,
    choose_index,
    column,
    is_verl_row,
    load_tasks,
    verl_task,
)
from agentgym.envs.rewards import answers_match, compute_score, extract_answer, ground_truth_from_gsm8k_answer
from agentgym.types import Action, Message

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
"""Appended to each raw question, as veRL's ``examples/data_preprocess/gsm8k.py`` does."""

DataFiles = str | Path | Sequence[str | Path] | None


def gsm8k_prompt(question: str) -> list[Message]:
    """The opening message for a raw GSM8K question."""
    return [{"role": "user", "content": f"{question} {INSTRUCTION}"}]


def gsm8k_task(row: dict[str, Any], where: str) -> Task:
    """A raw GSM8K row or a veRL-format row as a ``Task``; DataError names the missing column."""
    if is_verl_row(row):
        return verl_task(row, where)
    hint = "raw GSM8K rows need 'question' and 'answer'; veRL rows need 'prompt' and 'reward_model.ground_truth'"
    question = str(column(row, "question", where, hint))
    answer = str(column(row, "answer", where, hint))
    try:
        ground_truth = ground_truth_from_gsm8k_answer(answer)
    except ValueError as exc:
        raise DataError(f"{where}: column 'answer': {exc}") from None
    return Task(
        prompt=gsm8k_prompt(question),
        ground_truth=ground_truth,
        data_source=str(row.get("data_source") or DATA_SOURCE),
        extra_info={"question": question, "answer": answer},
        where=where,
    )


class Gsm8kEnv(TextEnv):
    """GSM8K maths word problems: one answer after '####', scored by rule (needs data_files=)."""

    max_turns = 1

    def __init__(
        self,
        data_files: DataFiles = None,
        split: str = "train",
        method: str = "strict",
        format_score: float = 0.0,
        score: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        """``data_files``: a .jsonl/.parquet file, a directory with ``<split>.jsonl``/``.parquet``,
        or a list (veRL's ``data.train_files`` / ``data.val_files``). ``method``, ``format_score``
        and ``score`` go to ``compute_score``. Raises DataError on a missing file or column."""
        super().__init__(render_mode=render_mode)
        extract_answer("", method)  # fail now on an unknown method
        self.split = split
        self.method = method
        self.format_score = format_score
        self.score = score
        self.tasks = load_tasks(data_files, split, gsm8k_task)
        self.task: Task | None = None
        self._done = True
        self._last_reply = ""

    def num_tasks(self) -> int:
        return len(self.tasks)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pick a row (``options={"index": i}``, else ``seed % num_tasks()``, else at random) and
        return its prompt. ``info``: ``index``, ``data_source``, ``split``."""
        super().reset(seed=seed)
        index = choose_index(len(self.tasks), seed, options, lambda n: int(self.np_random.integers(n)))
        self.task = self.tasks[index]
        self._done = False
        self._last_reply = ""
        return [dict(m) for m in self.task.prompt], self._task_info()  # type: ignore[misc]

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Score the answer. Returns no new messages, turn reward 0.0, ``terminated=True``;
        ``info["outcome_reward"]`` is the score and ``info["success"]`` whether it was right."""
        if self.task is None or self._done:
            raise RuntimeError("call reset() before step(): the episode has ended")
        text = reply_text(action)
        self._last_reply = text
        self._done = True
        outcome = compute_score(text, self.task.ground_truth or "", self.method, self.format_score, self.score)
        answer = extract_answer(text, self.method)
        info = {
            **self._task_info(),
            "outcome_reward": outcome,
            "success": answers_match(answer, self.task.ground_truth),
            "answer": answer,
            "ground_truth": self.task.ground_truth,
            "metrics": {"score": outcome, "answer_found": float(answer is not None)},
        }
        return [], 0.0, True, False, info

    def expert_action(self) -> str | None:
        """The reference solution: the row's GSM8K answer (its reasoning, then ``#### N``), or
        just ``#### <ground truth>`` for rows without one; None once the question is answered."""
        if self.task is None or self._done:
            return None
        answer = self.task.extra_info.get("answer")
        if isinstance(answer, str) and "####" in answer:
            return answer
        return f"#### {self.task.ground_truth}"

    def _task_info(self) -> dict[str, Any]:
        assert self.task is not None
        return {"index": self.task.index, "data_source": self.task.data_source, "split": self.split}

    def render(self) -> str | None:
        if self.task is None:
            return None
        lines = [f"[{m['role']}] {m['content']}" for m in self.task.prompt]
        if self._done:
            lines.append(f"[assistant] {self._last_reply}")
            lines.append(f"(reference answer: {self.task.ground_truth})")
        return "\n".join(lines)
