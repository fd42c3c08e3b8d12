"""``MultiEnvSource``: several envs in one run, by tag (ROLL's ``train_env_manager`` / ``val_env_manager``).

Each tag of ``env.tags`` is an entry of ``env.custom_envs``: ``{env: NAME, kwargs: {...},
max_turns: N}``. A step runs ``n_groups`` task groups of each tag (``env.n_groups``, or
``data.train_batch_size`` split evenly), each group ``rollout.n`` episodes of one task (ROLL's
``group_size``: same env config and seed within a group). Every trajectory's ``data_source`` is its
tag, so the trainer's metrics are reported per tag (``<tag>/reward/mean``, ``val/<tag>/...``) and
ROLL's ``reward_normalization.grouping=inductive`` normalises within a tag. Validation runs
``env.val_tags`` / ``env.val_n_groups`` the same way (default: the training tags, ``data.val_batch_size``
groups), greedy by default (``rollout.val_kwargs``).

Tasks: a generated env takes consecutive seeds (tag k from ``env.train_seed_start + k * 10**7``); a
dataset env walks its rows epoch by epoch (``TaskSampler``). ROLL's ``max_traj_per_env`` is checked
(at least the trajectories one env instance must produce per step) and otherwise has no effect:
agentgym's env instances are pooled per episode, not pinned to a group.
"""

from __future__ import annotations

import asyncio
from typing import Any

from omegaconf import DictConfig

from agentgym.rollout.env_groups import env_table, tag_shares
from agentgym.rollout.sources import TaskSampler, TrajectorySource
from agentgym.types import Trajectory

TAG_SEED_STRIDE = 10**7


class MultiEnvSource(TrajectorySource):
    """A trajectory source over the tags of ``env.tags`` (see the module docstring)."""

    def __init__(self, cfg: DictConfig, client: Any, tokenizer: Any) -> None:
        from agentgym.rollout.runner import RolloutConfig, RolloutRunner

        self.cfg = cfg
        rollout = cfg.actor_rollout_ref.rollout
        self.table = env_table(cfg)
        self.tags = list(cfg.env.tags)
        self.shares = tag_shares(self.tags, list(cfg.env.n_groups or []), cfg.data.train_batch_size, "")
        self.val_tags = list(cfg.env.val_tags or []) or self.tags
        self.val_shares = tag_shares(self.val_tags, list(cfg.env.val_n_groups or []), cfg.data.val_batch_size, "val_")
        common = {
            "max_tokens": int(rollout.max_tokens_per_turn),
            "prompt_length": cfg.data.max_prompt_length,
            "response_length": cfg.data.max_response_length,
            "max_concurrency": int(rollout.concurrency),
            "env_executor": cfg.env.executor,
            "env_timeout": cfg.env.timeout,
            "env_workers": cfg.env.workers,
            "worker_env_executor": cfg.env.worker_executor,
            "env_urls": list(cfg.env.urls or ()),
            "context_policy": rollout.multi_turn.context_policy,
            "context_window": rollout.multi_turn.context_window,
        }
        val = rollout.val_kwargs
        self.runners: dict[str, Any] = {}
        self.val_runners: dict[str, Any] = {}
        for tag in dict.fromkeys(self.tags + self.val_tags):
            spec = self.table[tag]
            turns = spec.get("max_turns", rollout.multi_turn.max_assistant_turns)
            kwargs = dict(spec.get("kwargs") or {})
            train_config = RolloutConfig(
                n=int(rollout.n),
                temperature=float(rollout.temperature),
                top_p=float(rollout.top_p),
                top_k=int(rollout.top_k),
                max_turns=turns,
                **common,
            )
            val_config = RolloutConfig(
                n=int(val.n),
                temperature=float(val.temperature),
                top_p=float(val.top_p),
                top_k=int(val.top_k),
                max_turns=turns,
                **common,
            )
            self.runners[tag] = RolloutRunner(str(spec["env"]), client, tokenizer, train_config, env_kwargs=kwargs)
            self.val_runners[tag] = RolloutRunner(
                str(spec["env"]),
                client,
                tokenizer,
                val_config,
                env_kwargs={**kwargs, **dict(spec.get("val_kwargs") or {})},
            )
        self.samplers: dict[str, Any] = {}
        self._pending: dict[str, Any] = {}
        self.last_metrics: dict[str, float] = {}

    async def _sampler(self, tag: str, index: int) -> Any:
        if tag not in self.samplers:
            info = await self.runners[tag].env_info()
            sampler = TaskSampler(
                info.get("num_tasks"),
                self.shares[index],
                seed=self.cfg.trainer.seed,
                shuffle=self.cfg.data.shuffle,
                seed_start=self.cfg.env.train_seed_start + index * TAG_SEED_STRIDE,
            )
            if tag in self._pending:
                sampler.load_state_dict(self._pending[tag])
            self.samplers[tag] = sampler
        return self.samplers[tag]

    async def _run(self, runners: dict[str, Any], tags: list[str], tasks: list[list[Any]]) -> list[Trajectory]:
        results = await asyncio.gather(*(runners[tag].run(t) for tag, t in zip(tags, tasks) if t))
        out: list[Trajectory] = []
        metrics: dict[str, float] = {}
        for tag, result in zip([t for t, k in zip(tags, tasks) if k], results):
            for traj in result.trajectories:
                traj.data_source = tag
            out.extend(result.trajectories)
            for key in ("template_mismatch", "throughput/episodes_per_s"):
                if key in result.metrics:
                    metrics[key] = metrics.get(key, 0.0) + float(result.metrics[key])
        self.last_metrics = metrics
        return out

    async def collect(self, step: int) -> list[Trajectory]:
        from agentgym.rollout.runner import Task

        tasks = []
        for index, tag in enumerate(self.tags):
            sampler = await self._sampler(tag, index)
            tasks.append([Task(seed=t["seed"], index=t.get("index")) for t in sampler.next_batch()])
        return await self._run(self.runners, self.tags, tasks)

    async def validate(self) -> list[Trajectory]:
        from agentgym.rollout.runner import Task

        tasks = []
        for index, (tag, count) in enumerate(zip(self.val_tags, self.val_shares)):
            info = await self.val_runners[tag].env_info()
            if info.get("num_tasks") is None:
                start = self.cfg.env.val_seed_start + index * TAG_SEED_STRIDE
                tasks.append([Task(seed=start + i) for i in range(count)])
            else:
                tasks.append([Task(seed=i, index=i) for i in range(min(count, int(info["num_tasks"])))])
        return await self._run(self.val_runners, self.val_tags, tasks)

    def state_dict(self) -> dict[str, Any]:
        return {tag: s.state_dict() for tag, s in self.samplers.items()} | {
            tag: state for tag, state in self._pending.items() if tag not in self.samplers
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for tag, sampler_state in (state or {}).items():
            if tag in self.samplers:
                self.samplers[tag].load_state_dict(sampler_state)
            else:
                self._pending[tag] = dict(sampler_state)

    async def aclose(self) -> None:
        for runner in list(self.runners.values()) + list(self.val_runners.values()):
            await runner.aclose()
