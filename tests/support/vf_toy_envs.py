"""Small verifiers environments built with the real verifiers package (no hub data): the
``vf/tests.support.vf_toy_envs`` env of tests/envs/adapters/test_adapters_verifiers.py. ``kind`` picks one:

* ``single``: a ``SingleTurnEnv`` of sums; the rubric rewards the exact answer in ``<answer>``
  tags (weight 1) and, at weight 0.5, an answer that is a number at all.
* ``tools``: a ``ToolEnv`` with an ``add(a, b)`` tool; reward 1 when the final reply holds the sum.
* ``multi``: a ``MultiTurnEnv`` guessing game; the env answers "higher"/"lower" until the guess
  is right or 3 turns have passed; reward 1 for a right guess.
"""

from __future__ import annotations

import re

import verifiers as vf
from datasets import Dataset


def _rows(n: int) -> list[dict]:
    return [
        {
            "question": f"What is {i} + {2 * i + 1}? Answer in <answer></answer> tags.",
            "answer": str(3 * i + 1),
            "info": {"a": i, "b": 2 * i + 1},
        }
        for i in range(n)
    ]


def answer_of(text: str) -> str | None:
    found = re.findall(r"<answer>\s*(.*?)\s*</answer>", text or "", flags=re.DOTALL)
    return found[-1] if found else None


def exact(completion, answer) -> float:
    text = completion[-1].content if completion else ""
    return 1.0 if answer_of(text) == answer else 0.0


def is_number(completion) -> float:
    text = completion[-1].content if completion else ""
    return 1.0 if re.fullmatch(r"-?\d+", answer_of(text) or "") else 0.0


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return int(a) + int(b)


def contains_sum(completion, answer) -> float:
    text = completion[-1].content if completion else ""
    return 1.0 if answer in (text or "") else 0.0


class GuessEnv(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        guess = answer_of(messages[-1].content or "")
        target = state["answer"]
        if guess == target:
            state["final_env_response"] = [vf.UserMessage(content="correct")]
            return [vf.UserMessage(content="correct")]
        hint = "higher" if (guess or "0").lstrip("-").isdigit() and int(guess) < int(target) else "lower"
        return [vf.UserMessage(content=f"no, {hint}")]


def guessed(completion, answer) -> float:
    for message in completion:
        if message.role == "assistant" and answer_of(message.content or "") == answer:
            return 1.0
    return 0.0


def load_environment(kind: str = "single", n: int = 8) -> vf.Environment:
    dataset = Dataset.from_list(_rows(n))
    if kind == "single":
        rubric = vf.Rubric(funcs=[exact, is_number], weights=[1.0, 0.5])
        return vf.SingleTurnEnv(dataset=dataset, system_prompt="Add the numbers.", rubric=rubric)
    if kind == "tools":
        rubric = vf.Rubric(funcs=[contains_sum], weights=[1.0])
        return vf.ToolEnv(dataset=dataset, tools=[add], max_turns=4, system_prompt="Use the add tool.", rubric=rubric)
    if kind == "multi":
        rubric = vf.Rubric(funcs=[guessed], weights=[1.0])
        return GuessEnv(dataset=dataset, max_turns=3, system_prompt="Guess the sum.", rubric=rubric)
    raise ValueError(f"kind must be single, tools or multi, got {kind!r}")
