"""LLM judges: a model behind any OpenAI-compatible endpoint (``agentgym serve``, vLLM, a hosted API)
scores trajectories (``judge.*``; what it reads and answers: ``agentgym.rewards.judge_prompts``).

``JudgeScorer`` asks the judge about a step's trajectories (``judge.mode``: ``pointwise``, one request
per trajectory; ``group``, one per task's group), at most ``judge.concurrency`` requests at a time,
each with ``judge.timeout`` seconds and ``judge.max_retries`` retries (``agentgym.rewards.endpoint``).
A parsed score becomes the trajectory's reward (``judge.combine``, ``scored_source.apply_score``).

What never happens is a score of 0 made up for an answer the judge did not give:

* an answer that does not parse is counted (``reward/judge_unparsed``) and the trajectory (pointwise)
  or its whole group (group mode: the scores are relative, so the group gets no advantage) is kept
  out of training: marked ``failed`` with the judge's answer in ``failure``, kept in samples;
* a request that still fails after its retries (timeouts, 5xx) is counted (``reward/judge_errors``)
  and treated the same way; the step goes on with the trajectories that were judged.

So a judge that fails on most trajectories shows as failed episodes, and past
``trainer.max_failed_episode_frac`` stops the run saying why, instead of training on made-up scores.

Answers are cached by a hash of everything that decides them (endpoint, model, messages, sampling) in
``<run dir>/judge_cache.jsonl`` (``judge.cache``): a resumed run, or a trajectory seen twice, costs
no second request (``reward/judge_cache_hits``). Unparsed answers are cached too, errors are not.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError
from agentgym.rewards.endpoint import Endpoint, EndpointError, api_key_from_env, v1_url
from agentgym.rewards.judge_prompts import group_messages, parse_group, parse_pointwise, pointwise_messages
from agentgym.rewards.scored_source import apply_score, refuse, scorable
from agentgym.types import Trajectory

MODES = ("pointwise", "group")


@dataclass(frozen=True)
class JudgeSettings:
    base_url: str
    mode: str = "pointwise"
    model: str | None = None
    api_key: str | None = None
    prompt_template: str | None = None
    low: float = 0.0
    high: float = 10.0
    temperature: float = 0.0
    max_tokens: int = 512
    concurrency: int = 8
    timeout: float = 60.0
    max_retries: int = 3
    combine: str = "replace"
    backoff: float = 0.5  # seconds before the first retry (doubling, jittered)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"judge.mode={self.mode!r} is not one of {', '.join(MODES)}")
        if not self.high > self.low:
            raise ConfigError(f"judge.score_range=[{self.low:g}, {self.high:g}] needs its high end above its low end")

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> JudgeSettings | None:
        """The settings of an enabled judge (``judge.*``), or None."""
        j = cfg.judge
        if not j.enable:
            return None
        if not j.base_url:
            raise ConfigError(
                "judge.enable=true needs judge.base_url: the judge's OpenAI-compatible endpoint, e.g. "
                "http://127.0.0.1:8000/v1 (agentgym serve --model DIR --port 8000) or a hosted API"
            )
        template = None
        if j.prompt_template:
            path = Path(str(j.prompt_template))
            if not path.is_file():
                raise ConfigError(f"judge.prompt_template={path} is not a file")
            template = path.read_text()
        low, high = (float(x) for x in OmegaConf.to_container(j.score_range))  # type: ignore[union-attr]
        return cls(
            v1_url(str(j.base_url)),
            str(j.mode),
            str(j.model) if j.model else None,
            api_key_from_env(j.api_key_env, "judge"),
            template,
            low,
            high,
            float(j.temperature),
            int(j.max_tokens),
            int(j.concurrency),
            float(j.timeout),
            int(j.max_retries),
            str(j.combine),
        )


class AnswerCache:
    """Judge answers by content hash, in memory and (with a path) in a JSONL file that survives the run."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.answers: dict[str, str] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self.answers[str(row["key"])] = str(row["answer"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a crash: that answer is asked again

    @staticmethod
    def key(request: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def get(self, key: str) -> str | None:
        return self.answers.get(key)

    def put(self, key: str, answer: str) -> None:
        self.answers[key] = answer
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({"key": key, "answer": answer}, ensure_ascii=False) + "\n")


class JudgeScorer:
    """Scores trajectories with the judge (a ``Scorer`` for ``ScoredSource``; also used by ``agentgym eval``)."""

    def __init__(self, settings: JudgeSettings, cache_path: Path | None = None) -> None:
        self.settings = settings
        self.endpoint = Endpoint(
            settings.base_url,
            settings.api_key,
            settings.timeout,
            settings.max_retries,
            settings.concurrency,
            settings.backoff,
        )
        self.cache = AnswerCache(cache_path)
        self.model = settings.model
        self._model_lock = asyncio.Lock()

    async def _model(self) -> str:
        async with self._model_lock:
            if self.model is None:
                self.model = await self.endpoint.first_model()
        return self.model

    async def ask(self, messages: list[dict[str, str]], counts: dict[str, float]) -> str:
        """The judge's answer to ``messages`` (from the cache when it was asked before)."""
        s = self.settings
        request = {
            "model": await self._model(),
            "messages": messages,
            "temperature": s.temperature,
            "max_tokens": s.max_tokens,
        }
        key = AnswerCache.key({"url": s.base_url, **request})
        cached = self.cache.get(key)
        if cached is not None:
            counts["reward/judge_cache_hits"] += 1
            return cached
        counts["reward/judge_calls"] += 1
        body = await self.endpoint.post("chat/completions", request)
        try:
            answer = body["choices"][0]["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EndpointError(
                f"{s.base_url}/chat/completions answered without choices[0].message: {json.dumps(body)[:300]}"
            ) from None
        self.cache.put(key, str(answer))
        return str(answer)

    async def _judge_one(self, traj: Trajectory, counts: dict[str, float], scores: list[float]) -> None:
        s = self.settings
        try:
            answer = await self.ask(pointwise_messages(traj, s.prompt_template, s.low, s.high), counts)
        except EndpointError as exc:
            counts["reward/judge_errors"] += 1
            counts["reward/judge_dropped"] += 1
            refuse(traj, f"judge: {exc}")
            return
        value = parse_pointwise(answer, s.low, s.high)
        if value is None:
            counts["reward/judge_unparsed"] += 1
            counts["reward/judge_dropped"] += 1
            refuse(traj, f"judge: unparsed answer (no 'SCORE: x' in {s.low:g}..{s.high:g}): {answer[-300:]!r}")
            return
        scores.append(value)
        apply_score(traj, value, s.combine)

    async def _judge_group(self, group: Sequence[Trajectory], counts: dict[str, float], scores: list[float]) -> None:
        s = self.settings
        try:
            answer = await self.ask(group_messages(group, s.prompt_template), counts)
        except EndpointError as exc:
            counts["reward/judge_errors"] += 1
            counts["reward/judge_dropped"] += len(group)
            for traj in group:
                refuse(traj, f"judge (group of {len(group)}): {exc}")
            return
        values = parse_group(answer, len(group))
        if values is None:
            counts["reward/judge_unparsed"] += 1
            counts["reward/judge_dropped"] += len(group)
            for traj in group:
                refuse(
                    traj,
                    f"judge: unparsed group answer (no JSON score for each of {len(group)} attempts): "
                    f"{answer[-300:]!r}",
                )
            return
        for traj, value in zip(group, values, strict=True):
            scores.append(value)
            apply_score(traj, value, s.combine)

    async def score(self, trajectories: list[Trajectory]) -> dict[str, float]:
        counts = dict.fromkeys(
            (
                "reward/judge_calls",
                "reward/judge_cache_hits",
                "reward/judge_unparsed",
                "reward/judge_errors",
                "reward/judge_dropped",
            ),
            0.0,
        )
        todo = [t for t in trajectories if scorable(t)]
        scores: list[float] = []
        if self.settings.mode == "pointwise":
            jobs = [self._judge_one(t, counts, scores) for t in todo]
        else:
            groups: dict[str, list[Trajectory]] = {}
            for i, traj in enumerate(todo):
                groups.setdefault(traj.group_id or f"traj-{i}", []).append(traj)
            jobs = [self._judge_group(g, counts, scores) for g in groups.values()]
        await asyncio.gather(*jobs)
        if scores:
            counts["reward/judge_score/mean"] = sum(scores) / len(scores)
        return counts

    async def aclose(self) -> None:
        await self.endpoint.aclose()


def judge_scorer(cfg: DictConfig) -> JudgeScorer | None:
    """The training run's judge (``judge.*``), caching in the run dir; None when ``judge.enable`` is off."""
    settings = JudgeSettings.from_cfg(cfg)
    if settings is None:
        return None
    cache = Path(str(cfg.trainer.default_local_dir)) / "judge_cache.jsonl" if cfg.judge.cache else None
    return JudgeScorer(settings, cache)


def judge_report(
    settings: JudgeSettings, model: str | None, trajectories: Sequence[Trajectory], counts: dict[str, float]
) -> str:
    """What ``agentgym eval --judge-url`` prints: how many episodes the judge scored, their mean score
    (overall and per data source), and the answers it could not use."""
    judged = [t for t in trajectories if "model_score" in t.metrics]
    lines = [
        f"judge ({settings.mode}, {model or '?'} at {settings.base_url}): {len(judged)} of {len(trajectories)} "
        f"episodes judged, unparsed answers {int(counts.get('reward/judge_unparsed', 0))}, failed requests "
        f"{int(counts.get('reward/judge_errors', 0))}, from cache {int(counts.get('reward/judge_cache_hits', 0))}"
    ]
    by_source: dict[str, list[float]] = {}
    for t in judged:
        by_source.setdefault(t.data_source or t.env_id or "unknown", []).append(t.metrics["model_score"])
    for source, values in sorted(by_source.items()):
        lines.append(f"  {source}: judge score {sum(values) / len(values):.3f} over {len(values)} episodes")
    return "\n".join(lines)


def eval_judge(
    base_url: str,
    mode: str = "pointwise",
    model: str | None = None,
    api_key_env: str | None = None,
    prompt_template: str | None = None,
    timeout: float = 60.0,
    concurrency: int = 8,
) -> Any:
    """``agentgym eval --judge-url``: an ``after`` hook for the eval command that judges copies of the
    episodes (the env's table stays the env's) and prints ``judge_report``."""
    import copy

    template = Path(prompt_template).read_text() if prompt_template else None
    settings = JudgeSettings(
        v1_url(base_url),
        mode,
        model,
        api_key_from_env(api_key_env, "judge"),
        template,
        timeout=timeout,
        concurrency=concurrency,
    )

    async def after(trajectories: list[Trajectory]) -> None:
        scorer = JudgeScorer(settings)
        try:
            judged = copy.deepcopy(list(trajectories))
            counts = await scorer.score(judged)
            print(judge_report(settings, scorer.model, judged, counts))
        finally:
            await scorer.aclose()

    return after
