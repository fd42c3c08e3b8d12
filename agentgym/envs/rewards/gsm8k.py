"""GSM8K's rule-based score, with veRL's signature and defaults.

``compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0)``
behaves like ``verl.utils.reward_score.gsm8k.compute_score`` except that answers are compared
as numbers (``"72.0"`` matches ``"72"``), not as strings, and ``method`` may also be ``"boxed"``.
"""

from __future__ import annotations

from agentgym.envs.rewards.equivalence import answers_match
from agentgym.envs.rewards.extraction import extract_answer


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score one response against the reference answer.

    Returns ``score`` when the extracted answer matches ``ground_truth``, ``format_score`` when
    an answer was found but is wrong, and 0.0 when no answer could be extracted.
    """
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answers_match(answer, str(ground_truth)) else float(format_score)
