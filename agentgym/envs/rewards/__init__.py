"""Rule-based rewards: final-answer extraction, numeric equivalence and veRL-style ``compute_score``.

from agentgym.envs.rewards import compute_score
compute_score("... #### 72", "72")            # 1.0
compute_score("so it is 72.", "72", method="flexible")  # 1.0
"""

from agentgym.envs.rewards.equivalence import answers_match, parse_number
from agentgym.envs.rewards.extraction import (
    METHODS,
    extract_answer,
    extract_boxed,
    extract_flexible,
    extract_strict,
    ground_truth_from_gsm8k_answer,
)
from agentgym.envs.rewards.gsm8k import compute_score

__all__ = [
    "METHODS",
    "answers_match",
    "compute_score",
    "extract_answer",
    "extract_boxed",
    "extract_flexible",
    "extract_strict",
    "ground_truth_from_gsm8k_answer",
    "parse_number",
]
