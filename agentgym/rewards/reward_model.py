"""veRL's reward model (``reward_model.enable=true``): a sequence-classification model scores each
finished trajectory.

What the model reads (``reward_model.model.input_tokenizer``, veRL's default: the policy's own path):

* set: the trajectory is decoded and re-rendered with the reward model's chat template, as veRL's
  ``_switch_chat_template`` does. The conversation up to the last reply (the env's prompt, every
  reply decoded from the sampled tokens by ``input_tokenizer``, the env's messages between them) goes
  through the reward model's tokenizer's ``apply_chat_template``; use it when the reward model's
  template or vocabulary differs from the policy's;
* ``null``: the policy's own tokens as sampled (the same tokenizer and template).

Rows longer than ``reward_model.max_length`` keep their first ``max_length`` tokens (veRL truncates
on the right) and are counted (``reward/rm_truncated``).

Which logit is the score (veRL's ``RewardModelWorker``): the model's one output (``num_labels=1``)
at the *last valid token* of the row (the last position its attention mask covers), read from the
per-token logits of the classification head. Hugging Face's own pooling takes the rightmost token
that is not the pad token instead, which is wrong for a reply that ended on the pad token; a model
without a per-token ``score`` head is scored one unpadded row at a time from its pooled output.

Rows go ``micro_batch_size_per_gpu`` at a time through ``RewardModelWorker``, in this process or, with
``trainer.use_ray``, in a Ray actor of its own. How the score meets the env's reward:
``agentgym.rewards.scored_source.apply_score`` (``reward_model.combine``).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from agentgym.config import ConfigError
from agentgym.rewards.scored_source import apply_score, refuse, scorable
from agentgym.types import Message, Trajectory


@dataclass(frozen=True)
class RewardModelSettings:
    path: str
    input_tokenizer: str | None
    micro_batch_size_per_gpu: int
    max_length: int | None
    combine: str
    use_ray: bool
    device: str = "cpu"

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> RewardModelSettings | None:
        """The settings of an enabled reward model, or None."""
        rm = cfg.reward_model
        if not rm.enable:
            return None
        if not rm.model.path:
            raise ConfigError(
                "reward_model.enable=true needs reward_model.model.path: a Hugging Face "
                "AutoModelForSequenceClassification directory (one output, num_labels=1)"
            )
        micro = rm.micro_batch_size_per_gpu or rm.micro_batch_size or 8
        if int(micro) < 1:
            raise ConfigError(f"reward_model.micro_batch_size_per_gpu must be positive, got {micro}")
        if rm.max_length is not None and int(rm.max_length) < 1:
            raise ConfigError(f"reward_model.max_length must be positive (or null), got {rm.max_length}")
        device = str(cfg.trainer.device)
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() and not cfg.trainer.use_ray else "cpu"
        return cls(
            str(rm.model.path),
            str(rm.model.input_tokenizer) if rm.model.input_tokenizer else None,
            int(micro),
            int(rm.max_length) if rm.max_length is not None else None,
            str(rm.combine),
            cfg.trainer.use_ray,
            device,
        )


# ---- what the reward model reads ------------------------------------------------------------------
def conversation(traj: Trajectory, input_tokenizer: Any) -> list[Message]:
    """The chat a trajectory is scored on: its messages up to the last reply, each reply decoded from
    the tokens the policy sampled (veRL: decode the response, drop the special tokens)."""
    if not traj.messages:
        raise ValueError(
            "this trajectory has no messages to re-render; set reward_model.model.input_tokenizer=null "
            "to score the policy's own tokens"
        )
    replies = [i for i, m in enumerate(traj.messages) if m.get("role") == "assistant"]
    if not replies:
        raise ValueError("this trajectory's messages hold no reply to score")
    chat = [dict(m) for m in traj.messages[: replies[-1] + 1]]
    if len(replies) == len(traj.turns):  # one reply per sampled turn: score what was sampled
        for index, turn in zip(replies, traj.turns, strict=True):
            chat[index] = {
                "role": "assistant",
                "content": input_tokenizer.decode(turn.response_ids, skip_special_tokens=True),
            }
    return chat  # type: ignore[return-value]


def rm_input_ids(traj: Trajectory, input_tokenizer: Any, rm_tokenizer: Any) -> list[int]:
    """The reward model's tokens for ``traj`` (see the module docstring), before truncation."""
    if input_tokenizer is None:
        return traj.token_ids()
    text = rm_tokenizer.apply_chat_template(
        conversation(traj, input_tokenizer), tokenize=False, add_generation_prompt=False
    )
    return list(rm_tokenizer(text, add_special_tokens=False)["input_ids"])


# ---- the worker ---------------------------------------------------------------------------------
class RewardModelWorker:
    """Holds the reward model; ``score(rows)`` returns one float per row of token ids."""

    def __init__(self, path: str, micro_batch_size: int, device: str = "cpu", threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        from agentgym.model import resolve_model_path

        if threads:
            torch.set_num_threads(threads)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(resolve_model_path(path), dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"reward_model.model.path={path!r} is not a sequence-classification model transformers can load: {exc}"
            ) from exc
        if int(model.config.num_labels) != 1:
            raise ConfigError(
                f"the reward model at {path} has num_labels={model.config.num_labels}; a reward model "
                "has one output (num_labels=1), its score"
            )
        self.model = model.to(device).eval()
        self.device = device
        self.micro_batch_size = int(micro_batch_size)
        pad = model.config.pad_token_id
        self.pad_token_id = int(pad if pad is not None else 0)

    def ready(self) -> bool:
        return True

    def score(self, rows: list[list[int]]) -> list[float]:
        import torch

        out: list[float] = []
        with torch.no_grad():
            for start in range(0, len(rows), self.micro_batch_size):
                out.extend(self._score_micro_batch(rows[start : start + self.micro_batch_size]))
        return out

    def _score_micro_batch(self, rows: list[list[int]]) -> list[float]:
        import torch

        head = getattr(self.model, "score", None)
        base = getattr(self.model, self.model.base_model_prefix, None)
        if head is None or base is None:
            return [float(self.model(input_ids=torch.tensor([r], device=self.device)).logits[0, 0]) for r in rows]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = head(hidden).squeeze(-1).float()  # (rows, width): the score at every position
        last = mask.sum(-1) - 1  # right padding: the last valid token
        return logits[torch.arange(len(rows), device=logits.device), last].tolist()


# ---- the scorer ---------------------------------------------------------------------------------
class RewardModelScorer:
    """Scores a step's trajectories with the reward model (a ``Scorer`` for ``ScoredSource``)."""

    def __init__(self, settings: RewardModelSettings) -> None:
        from agentgym.model import load_tokenizer

        self.settings = settings
        self.input_tokenizer = load_tokenizer(settings.input_tokenizer) if settings.input_tokenizer else None
        self.rm_tokenizer = self._rm_tokenizer() if self.input_tokenizer is not None else None
        self.worker: Any = None

    def _rm_tokenizer(self) -> Any:
        from agentgym.model import load_tokenizer

        try:
            return load_tokenizer(self.settings.path)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"reward_model.model.input_tokenizer={self.settings.input_tokenizer} asks to "
                f"re-render each trajectory with the reward model's chat template, but: {exc}. Set "
                "reward_model.model.input_tokenizer=null to score the policy's own tokens"
            ) from exc

    def _worker(self) -> Any:
        if self.worker is None:
            s = self.settings
            if s.use_ray:
                import ray

                remote = ray.remote(RewardModelWorker).options(num_cpus=0)
                self.worker = remote.remote(s.path, s.micro_batch_size_per_gpu, "cpu", 1)
            else:
                self.worker = RewardModelWorker(s.path, s.micro_batch_size_per_gpu, s.device)
        return self.worker

    async def _call(self, rows: list[list[int]]) -> list[float]:
        worker = self._worker()
        if self.settings.use_ray:
            return await worker.score.remote(rows)
        return await asyncio.to_thread(worker.score, rows)

    def inputs(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], list[list[int]], int]:
        """The trajectories the model can read, their rows, and how many rows were cut to ``max_length``.
        One it cannot read (no messages to re-render) is kept out of training, saying why."""
        kept, rows, cut = [], [], 0
        limit = self.settings.max_length
        for traj in trajectories:
            try:
                ids = rm_input_ids(traj, self.input_tokenizer, self.rm_tokenizer)
            except ValueError as exc:
                refuse(traj, f"reward model: {exc}")
                continue
            if limit is not None and len(ids) > limit:
                ids, cut = ids[:limit], cut + 1
            kept.append(traj)
            rows.append(ids)
        return kept, rows, cut

    async def score(self, trajectories: list[Trajectory]) -> dict[str, float]:
        todo = [t for t in trajectories if scorable(t)]
        if not todo:
            return {}
        kept, rows, cut = self.inputs(todo)
        scores = await self._call(rows) if rows else []
        for traj, value in zip(kept, scores, strict=True):
            apply_score(traj, value, self.settings.combine)
        out = {
            "reward/rm_scored": float(len(kept)),
            "reward/rm_truncated": float(cut),
            "reward/rm_unreadable": float(len(todo) - len(kept)),
        }
        if scores:
            out["reward/rm_score/mean"] = sum(scores) / len(scores)
        return out

    async def aclose(self) -> None:
        if self.settings.use_ray and self.worker is not None:
            import ray

            with contextlib.suppress(Exception):
                ray.kill(self.worker)
        self.worker = None
