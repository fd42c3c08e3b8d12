"""Trainer-side reward sources: what scores a trajectory besides its env (docs/rewards.md).

Each wraps a trajectory source and changes the trajectories it collects before the trainer sees them:

* veRL's reward managers (``reward_model.reward_manager``, ``managers.py``). In veRL a reward manager
  turns a batch of decoded responses into token rewards; here the env scores each episode (the
  ``rows`` env with veRL's ``compute_score`` signature, see ``agentgym.envs.rewards.by_source``), and
  the managers' differences are kept where they live: ``naive``, each response scored by
  ``compute_score`` (the env does exactly that); ``prime``, the same scores, each computed in a worker
  process with a time limit (a score past it is 0: the ``rows`` env's ``score_timeout``); ``dapo``, the
  same scores plus DAPO's overlong penalty (``reward_model.reward_kwargs.overlong_buffer_cfg``:
  ``enable``, ``len``, ``penalty_factor``, ``log``; ``max_resp_len``, default
  ``data.max_response_length``): a response longer than ``max_resp_len - len`` tokens loses
  ``(length - (max_resp_len - len)) / len * penalty_factor``, never gains;
* veRL's reward model (``reward_model.enable``, ``reward_model.py``): a sequence-classification model's
  score;
* an LLM judge on any OpenAI-compatible endpoint (``judge.*``, ``judge.py``): pointwise or RULER-style
  group scores;
* a per-turn fact the env reports as each turn's reward (``algorithm.turn_reward_from``,
  ``turn_facts.py``), e.g. Sokoban's ``format_reward``, leaving the env's own rewards and text alone;
* on-policy distillation's teacher (``distillation.*``, ``teacher.py``): the teacher's logprob of every
  sampled token, which the trainer turns into a per-token advantage.

``reward_sources(cfg, source)`` puts the configured ones around a source (``trainer.run.wrap_source``).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from agentgym.rewards.managers import OverlongBuffer, OverlongPenaltySource, reward_manager_source
from agentgym.rewards.scored_source import ScoredSource, apply_score

__all__ = [
    "OverlongBuffer",
    "OverlongPenaltySource",
    "ScoredSource",
    "apply_score",
    "reward_manager_source",
    "reward_sources",
]


def reward_sources(cfg: DictConfig, source: Any) -> Any:
    """``source`` with the configured reward sources around it, innermost first: a reward model or a
    judge; veRL's reward manager (not with a reward model or judge that replaces the env's score: veRL's
    managers return the reward model's scores untouched); a distillation teacher."""
    from agentgym.rewards.judge import judge_scorer
    from agentgym.rewards.reward_model import RewardModelScorer, RewardModelSettings
    from agentgym.rewards.teacher import TeacherScorer, TeacherSettings

    rm = RewardModelSettings.from_cfg(cfg)
    judge = judge_scorer(cfg)
    replaced = False
    if rm is not None:
        source = ScoredSource(source, RewardModelScorer(rm), "reward_model")
        replaced = rm.combine == "replace"
    if judge is not None:
        source = ScoredSource(source, judge, "judge")
        replaced = replaced or judge.settings.combine == "replace"
    if not replaced:
        source = reward_manager_source(cfg, source)
    fact = cfg.algorithm.get("turn_reward_from")
    if fact:
        from agentgym.rewards.turn_facts import TurnFactScorer

        source = ScoredSource(source, TurnFactScorer(str(fact)), "turn_fact")
    teacher = TeacherSettings.from_cfg(cfg)
    if teacher is not None:
        source = ScoredSource(source, TeacherScorer(teacher, str(cfg.actor_rollout_ref.model.path)), "teacher")
    return source
