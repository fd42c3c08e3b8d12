"""Trainer-side reward sources: what scores a trajectory besides its env.

veRL's reward managers (``reward_model.reward_manager``) on agentgym's trajectories.

In veRL a reward manager turns a batch of decoded responses into token rewards. In agentgym the
env scores each episode (the ``rows`` env with veRL's ``compute_score`` signature, see
``agentgym.envs.rewards.by_source``); the managers' differences are kept where they live:

* ``naive``: each response scored by ``compute_score`` (the env does exactly that);
* ``prime``: the same scores, each computed in a worker process with a time limit; a score that
  runs past it is 0 (the ``rows`` env's ``score_timeout``, set by preflight);
* ``dapo``: the same scores plus DAPO's overlong penalty (``reward_model.reward_kwargs.
  overlong_buffer_cfg``: ``enable``, ``len``, ``penalty_factor``, ``log``; ``max_resp_len``, default
  ``data.max_response_length``): a response longer than ``max_resp_len - len`` tokens loses
  ``(length - (max_resp_len - len)) / len * penalty_factor``, never gains. ``OverlongPenaltySource``
  applies it to each collected trajectory's outcome reward, which is where the trainer puts a
  trajectory's score.
"""

from agentgym.rewards.managers import OverlongBuffer, OverlongPenaltySource, reward_manager_source

__all__ = ["OverlongBuffer", "OverlongPenaltySource", "reward_manager_source"]
