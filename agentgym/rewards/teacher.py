"""On-policy distillation's teacher: its logprob of every token the student sampled (``distillation.*``).

The student samples as in any RL run; ``TeacherScorer`` then asks the teacher for the logprob of each
sampled token given the whole context before it (the env's prompt, earlier turns, the env's messages
between them: the trajectory's own token ids), and stores them in ``Turn.teacher_logprobs``. Only the
sampled tokens are scored; the context tokens are read, never scored. The trainer turns them into a
dense per-token advantage (``agentgym.trainer.distillation``). With ``distillation.topk`` > 0 the
teacher also returns its ``k`` most likely tokens and their logprobs at each of those positions
(``Turn.teacher_topk_ids`` / ``teacher_topk_logprobs``), for the top-k loss and the agreement metrics:
the worker reads them off the logits it computes anyway, vLLM is asked for ``prompt_logprobs=k``,
SGLang for ``top_logprobs_num=k``.

Where the teacher runs:

* ``distillation.teacher.path``: a model directory (or ``tiny``), loaded by a ``TeacherWorker`` that
  scores with one forward pass per micro-batch of ``micro_batch_size_per_gpu`` sequences, in this
  process or, with ``trainer.use_ray``, in a Ray actor of its own;
* ``distillation.teacher.server_urls``: running servers with the teacher loaded, asked for prompt
  logprobs: vLLM's ``/v1/completions`` with ``prompt_logprobs`` (``backend: vllm``) or SGLang's
  ``/generate`` with ``return_logprob`` and ``logprob_start_len=0`` (``backend: sglang``). Requests
  are spread over the URLs, ``concurrency`` at a time, retried like a judge's
  (``agentgym.rewards.endpoint``). agentgym's own embedded server does not return prompt logprobs:
  serve the teacher from a directory with ``path`` instead.

The teacher must read tokens exactly as the student writes them: the two tokenizers (the teacher's:
``teacher.tokenizer``, else ``teacher.path``) must have the same vocabulary, the same special tokens
and encode the same text the same way, or the run is refused before it starts. A trajectory the
teacher could not score (a server that kept failing) is kept out of training (``failed``) and counted
(``distill/teacher_errors``), never given made-up logprobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from agentgym.config import ConfigError
from agentgym.rewards.endpoint import Endpoint, EndpointError
from agentgym.rewards.scored_source import refuse, scorable
from agentgym.types import Trajectory

BACKENDS = ("vllm", "sglang")
PROBE = (
    "Teacher and student must share a tokenizer: héllo wörld 1,234.5 <answer>Up || Left</answer>\n"
    "######\n#_PX_#\n#__O_#\n ∑ 日本 \t tabs"
)


@dataclass(frozen=True)
class TeacherSettings:
    path: str | None
    server_urls: tuple[str, ...]
    backend: str
    model: str | None
    tokenizer: str | None
    micro_batch_size: int
    concurrency: int
    timeout: float
    max_retries: int
    use_ray: bool
    device: str = "cpu"
    topk: int = 0

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> TeacherSettings | None:
        d = cfg.distillation
        if not d.enable:
            return None
        t = d.teacher
        urls = tuple(str(u).rstrip("/") for u in (t.server_urls or ()))
        if bool(t.path) == bool(urls):
            raise ConfigError(
                "distillation.enable=true needs the teacher: distillation.teacher.path=DIR (a model "
                "scored in a worker here) or distillation.teacher.server_urls=[URL] (vLLM or SGLang "
                "servers with the teacher loaded), one of the two"
            )
        if urls and str(t.backend) not in BACKENDS:
            raise ConfigError(
                f"distillation.teacher.backend={t.backend!r}: teacher servers are asked for prompt "
                f"logprobs, which {', '.join(BACKENDS)} return (agentgym's embedded server does not: "
                "use distillation.teacher.path=DIR for a teacher served here)"
            )
        if urls and not t.tokenizer:
            raise ConfigError(
                "distillation.teacher.server_urls needs distillation.teacher.tokenizer (the teacher's "
                "model directory or hub name): agentgym checks it equals the student's before training"
            )
        topk = int(d.topk)
        if str(d.loss_mode) == "topk" and topk < 1:
            raise ConfigError(
                f"distillation.loss_mode=topk needs distillation.topk >= 1 (got {topk}): the KL is taken over "
                "the teacher's top-k tokens at each position"
            )
        if not 0.0 <= float(d.beta) <= 1.0:
            raise ConfigError(
                f"distillation.beta={d.beta}: GKD's beta lies in [0, 1] (1 reverse KL, 0 forward KL, between a "
                "generalized JSD)"
            )
        if float(d.beta) != 1.0 and str(d.loss_mode) != "topk":
            raise ConfigError(
                f"distillation.beta={d.beta} picks the divergence of the top-k loss: set "
                "distillation.loss_mode=topk, or leave beta at 1 (the sampled form estimates the reverse KL)"
            )
        device = str(cfg.trainer.device)
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() and not cfg.trainer.use_ray else "cpu"
        return cls(
            str(t.path) if t.path else None,
            urls,
            str(t.backend),
            str(t.model) if t.model else None,
            str(t.tokenizer) if t.tokenizer else None,
            int(t.micro_batch_size_per_gpu),
            int(t.concurrency),
            float(t.timeout),
            int(t.max_retries),
            cfg.trainer.use_ray,
            device,
            max(topk, 0),
        )


def tokenizer_difference(student: Any, teacher: Any) -> str | None:
    """How two tokenizers differ in a way that would mis-score tokens, or None when they agree."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    if sv != tv:
        only_s = sorted(set(sv) - set(tv))[:3]
        only_t = sorted(set(tv) - set(sv))[:3]
        moved = sorted(k for k in set(sv) & set(tv) if sv[k] != tv[k])[:3]
        return (
            f"their vocabularies differ ({len(sv)} vs {len(tv)} tokens; only the student's: {only_s}, only the "
            f"teacher's: {only_t}, different ids: {moved})"
        )
    if sorted(student.all_special_tokens) != sorted(teacher.all_special_tokens):
        return f"their special tokens differ: {student.all_special_tokens} vs {teacher.all_special_tokens}"
    s_ids = student(PROBE, add_special_tokens=False)["input_ids"]
    t_ids = teacher(PROBE, add_special_tokens=False)["input_ids"]
    if s_ids != t_ids:
        return "they encode the same text differently (normalizer or pre-tokenizer)"
    return None


def check_tokenizers(student_path: str, teacher_path: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's (see ``tokenizer_difference``)."""
    from agentgym.model import load_tokenizer

    difference = tokenizer_difference(load_tokenizer(student_path), load_tokenizer(teacher_path))
    if difference is not None:
        raise ConfigError(
            f"the teacher ({teacher_path}) and the student ({student_path}) do not share a tokenizer: "
            f"{difference}. On-policy distillation scores the student's own token ids with the "
            "teacher, so both must use the same tokenizer; pick a teacher of the student's family"
        )


def sampled_positions(traj: Trajectory) -> list[list[int]]:
    """For each turn, the positions of its sampled tokens in ``traj.token_ids()``."""
    out, offset = [], 0
    for turn in traj.turns:
        offset += len(turn.prompt_ids)
        out.append(list(range(offset, offset + len(turn.response_ids))))
        offset += len(turn.response_ids)
    return out


@dataclass
class TeacherScores:
    """The teacher's answer for one sequence: its logprob of each asked-for token, and with ``topk`` > 0
    its ``k`` most likely tokens at each of those positions (most likely first) and their logprobs."""

    logprobs: list[float]
    topk_ids: list[list[int]]
    topk_logprobs: list[list[float]]


class TeacherWorker:
    """Holds the teacher model; ``scores(rows, positions, topk)``: for each row of token ids, the log-prob
    of the token at each given position given the tokens before it (and the ``topk`` most likely tokens
    there, from the same full-vocabulary distribution)."""

    def __init__(self, path: str, micro_batch_size: int, device: str = "cpu", threads: int | None = None) -> None:
        import torch

        from agentgym.model import load_causal_lm

        if threads:
            torch.set_num_threads(threads)
        self.model = load_causal_lm(path, "float32", device)
        self.device = device
        self.micro_batch_size = max(1, int(micro_batch_size))

    def ready(self) -> bool:
        return True

    def logprobs(self, rows: list[list[int]], positions: list[list[int]]) -> list[list[float]]:
        return [s.logprobs for s in self.scores(rows, positions, 0)]

    def scores(self, rows: list[list[int]], positions: list[list[int]], topk: int = 0) -> list[TeacherScores]:
        import torch

        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # similar lengths share a micro-batch
        results: dict[int, TeacherScores] = {}
        with torch.no_grad():
            for start in range(0, len(order), self.micro_batch_size):
                chunk = order[start : start + self.micro_batch_size]
                width = max(len(rows[i]) for i in chunk)
                ids = torch.zeros((len(chunk), width), dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for k, i in enumerate(chunk):
                    ids[k, : len(rows[i])] = torch.tensor(rows[i])
                    mask[k, : len(rows[i])] = 1
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
                logp = torch.log_softmax(logits.float(), dim=-1)
                for k, i in enumerate(chunk):
                    pos = torch.tensor(positions[i], dtype=torch.long, device=logp.device)
                    if pos.numel() == 0:
                        results[i] = TeacherScores([], [], [])
                        continue
                    tokens = ids[k].to(logp.device)[pos]
                    at = logp[k, pos - 1]
                    sampled = at.gather(-1, tokens[:, None]).squeeze(-1).tolist()
                    if topk > 0:
                        values, top = at.topk(min(topk, at.shape[-1]), dim=-1)
                        results[i] = TeacherScores(sampled, top.tolist(), values.tolist())
                    else:
                        results[i] = TeacherScores(sampled, [], [])
        return [results[i] for i in range(len(rows))]


class TeacherScorer:
    """Fills ``Turn.teacher_logprobs`` for a step's trajectories (a ``Scorer`` for ``ScoredSource``)."""

    def __init__(self, settings: TeacherSettings, student_path: str) -> None:
        self.settings = settings
        check_tokenizers(student_path, settings.tokenizer or settings.path or "")
        self.worker: Any = None
        self.endpoints: list[Endpoint] = []
        self._next = itertools.count()

    # ---- the teacher in a worker ----------------------------------------------------------------
    def _worker(self) -> Any:
        if self.worker is None:
            s = self.settings
            if s.use_ray:
                import ray

                self.worker = ray.remote(TeacherWorker).options(num_cpus=0).remote(s.path, s.micro_batch_size, "cpu", 1)
            else:
                self.worker = TeacherWorker(str(s.path), s.micro_batch_size, s.device)
        return self.worker

    async def _local(self, rows: list[list[int]], positions: list[list[int]]) -> list[TeacherScores]:
        worker = self._worker()
        k = self.settings.topk
        if self.settings.use_ray:
            return await worker.scores.remote(rows, positions, k)
        return await asyncio.to_thread(worker.scores, rows, positions, k)

    # ---- the teacher on servers -----------------------------------------------------------------
    def _endpoint(self) -> Endpoint:
        s = self.settings
        if not self.endpoints:
            per = max(1, s.concurrency // len(s.server_urls))
            self.endpoints = [
                Endpoint(url + ("/v1" if s.backend == "vllm" else ""), None, s.timeout, s.max_retries, per)
                for url in s.server_urls
            ]
        return self.endpoints[next(self._next) % len(self.endpoints)]

    async def _remote(self, ids: list[int], positions: list[int]) -> TeacherScores:
        s = self.settings
        k = s.topk
        endpoint = self._endpoint()
        if s.backend == "vllm":
            # prompt_logprobs=k: each position's k most likely tokens, plus the prompt's own token
            payload: dict[str, Any] = {"prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}
            if s.model:
                payload["model"] = s.model
            body = await endpoint.post("completions", payload)
            try:
                table = body["choices"][0]["prompt_logprobs"]
                sampled = [float(_vllm_logprob(table[p], ids[p])) for p in positions]
                tops = [_vllm_top(table[p], k) for p in positions] if k else []
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise EndpointError(
                    f"{endpoint.base_url}/completions gave no prompt logprob for a sampled token "
                    f"({type(exc).__name__}: {exc}); is it a vLLM server?"
                ) from None
            return TeacherScores(sampled, [t[0] for t in tops], [t[1] for t in tops])
        request: dict[str, Any] = {
            "input_ids": ids,
            "return_logprob": True,
            "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        }
        if k:
            request["top_logprobs_num"] = k
        body = await endpoint.post("generate", request)
        try:
            table = body["meta_info"]["input_token_logprobs"]
            out = []
            for p in positions:
                value, token = table[p][0], table[p][1]
                if int(token) != ids[p]:
                    raise ValueError(f"position {p} holds token {token}, not {ids[p]}")
                out.append(float(value))
            tops = []
            if k:
                top_table = body["meta_info"]["input_top_logprobs"]
                for p in positions:
                    entries = sorted(top_table[p], key=lambda e: -float(e[0]))[:k]
                    if len(entries) < k:
                        raise ValueError(f"position {p} has {len(entries)} top logprobs, not {k}")
                    tops.append(([int(e[1]) for e in entries], [float(e[0]) for e in entries]))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EndpointError(
                f"{endpoint.base_url}/generate gave no input logprob for a sampled token "
                f"({type(exc).__name__}: {exc}); is it an SGLang server?"
            ) from None
        return TeacherScores(out, [t[0] for t in tops], [t[1] for t in tops])

    # ---- scoring ----------------------------------------------------------------------------------
    async def score(self, trajectories: list[Trajectory]) -> dict[str, float]:
        todo = [t for t in trajectories if scorable(t)]
        if not todo:
            return {}
        turn_positions = [sampled_positions(t) for t in todo]
        flat = [[p for turn in tp for p in turn] for tp in turn_positions]
        rows = [t.token_ids() for t in todo]
        errors = 0
        if self.settings.path:
            results: list[TeacherScores | None] = list(await self._local(rows, flat))
        else:
            answers = await asyncio.gather(
                *(self._remote(r, f) for r, f in zip(rows, flat, strict=True)), return_exceptions=True
            )
            results = []
            for traj, answer in zip(todo, answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, EndpointError):
                        raise answer
                    errors += 1
                    refuse(traj, f"teacher: {answer}")
                    results.append(None)
                else:
                    results.append(answer)
        for traj, positions, values in zip(todo, turn_positions, results, strict=True):
            if values is None:
                continue
            k = 0
            for turn, turn_pos in zip(traj.turns, positions, strict=True):
                end = k + len(turn_pos)
                turn.teacher_logprobs = list(values.logprobs[k:end])
                turn.teacher_topk_ids = [list(row) for row in values.topk_ids[k:end]]
                turn.teacher_topk_logprobs = [list(row) for row in values.topk_logprobs[k:end]]
                k = end
        return {"distill/teacher_scored": float(len(todo) - errors), "distill/teacher_errors": float(errors)}

    async def aclose(self) -> None:
        for endpoint in self.endpoints:
            with contextlib.suppress(Exception):
                await endpoint.aclose()
        if self.settings.use_ray and self.worker is not None:
            import ray

            with contextlib.suppress(Exception):
                ray.kill(self.worker)
        self.worker = None


def _vllm_logprob(entry: Any, token: int) -> float:
    """vLLM's prompt_logprobs entry (``{token_id: {"logprob": x, ...}}``) for ``token``."""
    item = entry[str(token)] if str(token) in entry else entry[token]
    return float(item["logprob"] if isinstance(item, dict) else item)


def _vllm_top(entry: Any, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` most likely tokens of a vLLM prompt_logprobs entry and their logprobs, most likely first."""
    items = sorted(
        ((int(t), float(v["logprob"] if isinstance(v, dict) else v)) for t, v in entry.items()), key=lambda x: -x[1]
    )[:k]
    if len(items) < k:
        raise ValueError(f"{len(items)} prompt logprobs at a position, not {k}: is prompt_logprobs capped?")
    return [t for t, _ in items], [v for _, v in items]
