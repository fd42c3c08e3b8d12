"""``agentgym eval data.path=FILE``'s configuration (``configs/evaluation.yaml`` is written from it), veRL's
``evaluation.yaml`` names (``verl.trainer.main_eval``)."""

from __future__ import annotations

from dataclasses import dataclass

from agentgym.config_schema.fields import section, setting

HEADER = """\
`agentgym eval data.path=FILE`: veRL's main_eval (verl/trainer/config/evaluation.yaml) with the same keys.
Scores every response of every row with the row's reward (its data source's rule, or
custom_reward_function) and prints the mean score per data source (test_score/<source>)."""


@dataclass
class EvaluationDataConfig:
    path: str | None = setting(None, "rows with responses (what `agentgym generate` writes)")
    response_key: str = setting("responses", "the column holding a row's responses (a list, or one string)")
    data_source_key: str = setting("data_source", "the column naming a row's data source (its built-in reward rule)")
    reward_model_key: str = setting("reward_model", "a column holding {ground_truth: ...}")


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = setting(None, "the Python file (null: the built-in rule of each row's data source)")
    name: str = setting("compute_score", "the function in it")


@dataclass
class EvaluationConfig:
    """``agentgym eval data.path=FILE``'s whole configuration (``configs/evaluation.yaml``)."""

    data: EvaluationDataConfig = section(EvaluationDataConfig, "the responses scored")
    custom_reward_function: CustomRewardFunctionConfig = section(
        CustomRewardFunctionConfig,
        "a Python file with compute_score(data_source, solution_str, ground_truth, extra_info)",
    )
