"""The data that crosses every boundary in agentgym.

Messages and tool calls are plain dicts in OpenAI's chat format (so they go to any
OpenAI client untouched); a ``Trajectory`` is the token-exact record of one episode
that the trainer consumes, whatever produced it (a TextEnv rollout or a gateway session).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from typing_extensions import NotRequired


class FunctionCall(TypedDict):
    name: str
    arguments: str  # JSON text, as in OpenAI's API


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict):
    """One OpenAI chat message: ``{"role": ..., "content": ...}`` plus optional tool fields."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None
    tool_calls: NotRequired[list[ToolCall]]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


Action = str | Message
"""What a TextEnv's ``step`` takes: the assistant's reply as text or as a message dict."""

EpisodeStatus = Literal["ok", "truncated", "failed"]


@dataclass
class SamplingFields:
    """The sampling settings a caller's ``SamplingParams`` and the engine's
    ``agentgym.server.sampling.GenerationParams`` share, in OpenAI/vLLM names, declared once.

    ``top_logprobs``: how many alternatives to report per sampled token (the sampled one is always
    reported)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int = 0


@dataclass
class SamplingParams(SamplingFields):
    """Sampling settings for one generation, as a client asks for them.

    ``structured``: what the reply is constrained to (``agentgym.client.structured``: a JSON schema,
    forced tool calls, ...); the server compiles it into the engine's grammar.
    """

    structured: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def shaped_by(self) -> list[str]:
        """What besides temperature, top-k and top-p shapes the distribution tokens are drawn from
        (``Turn.shaped_by``): ``grammar``, ``logit_bias``, ``penalties``, ``min_tokens``."""
        out = []
        if self.structured is not None:
            out.append("grammar")
        if self.logit_bias:
            out.append("logit_bias")
        if self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0:
            out.append("penalties")
        if self.min_tokens > 0:
            out.append("min_tokens")
        return out


@dataclass
class TokenSample:
    """One generation as the policy server sampled it; ``top_logprobs``: per sampled token, the
    ``(token id, logprob)`` alternatives asked for (``SamplingParams.top_logprobs``)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: int = 0
    text: str = ""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


@dataclass
class Turn:
    """One model turn of an episode.

    ``prompt_ids`` are the tokens added to the context before this generation: the whole
    rendered prompt on the first turn, then only the delta (the env/tool messages and the
    generation prompt). They are never trained on (loss mask 0). ``response_ids`` are the
    tokens the server sampled (loss mask 1) with the ``logprobs`` it reported for them.
    ``reward`` is the turn-level reward the env gave for this turn's action.

    ``state_key`` names the env state the model answered in (the env's ``info["state_key"]``, else a
    hash of the observation it had just read): turns of one task with equal keys faced the same state,
    which is what turn-level credit (``algorithm.adv_estimator=gigpo``) compares. ``metrics`` holds the
    env's facts about this turn (its step ``info``: ``format_error``, ``well_formed``, ``moves``, ...) and
    ``cut`` (1.0 when the reply hit the token cap).

    ``weight_version`` is the policy version that sampled the turn's first token. A turn whose
    generation was interrupted by a weight update and resumed on the new weights (asynchronous
    training with ``partial_rollout``) spans versions: ``token_versions`` then holds one version
    per response token; empty means every token has ``weight_version`` (``versions()``).

    ``shaped_by`` names what besides temperature, top-k and top-p shaped the distribution the
    response was drawn from (``SamplingParams.shaped_by``: ``grammar`` for a forced tool call or
    JSON output, ``logit_bias``, ``penalties``, ``min_tokens``). The ``logprobs`` are still the
    model's own distribution (a teacher-forced pass recomputes them); the tokens were drawn from the
    shaped one. Such turns are trained like any other (docs/openai_api.md, "Logprobs and training").

    ``teacher_logprobs``: on-policy distillation's teacher's logprob of each response token, given the
    whole context before it (``agentgym.rewards.teacher``); empty when no teacher scored the turn.
    ``teacher_topk_ids`` / ``teacher_topk_logprobs``: with ``distillation.topk`` > 0, the teacher's ``k``
    most likely tokens at each response position (most likely first) and their logprobs; empty otherwise.

    ``new_context``: ``prompt_ids`` is the *whole* context this turn was sampled from, not a delta after
    the previous turn's tokens: a context policy (``actor_rollout_ref.rollout.multi_turn.context_policy``:
    a history window or a summary) dropped or rewrote earlier turns, or a gateway agent rewrote its
    messages. Such a turn starts a new *segment* (``Trajectory.segments``): a token sequence of its own,
    trained as a batch row of its own (docs/long_horizon.md). The first turn always starts one.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    reward: float = 0.0
    weight_version: int = 0
    finish_reason: str = "stop"
    observation: list[Message] = field(default_factory=list)
    response_text: str = ""
    token_versions: list[int] = field(default_factory=list)
    state_key: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    shaped_by: list[str] = field(default_factory=list)
    teacher_logprobs: list[float] = field(default_factory=list)
    teacher_topk_ids: list[list[int]] = field(default_factory=list)
    teacher_topk_logprobs: list[list[float]] = field(default_factory=list)
    new_context: bool = False

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.response_ids):
            raise ValueError(
                f"a Turn needs one logprob per response token: got {len(self.logprobs)} logprobs "
                f"for {len(self.response_ids)} tokens"
            )
        if self.token_versions and len(self.token_versions) != len(self.response_ids):
            raise ValueError(
                f"token_versions holds one version per response token (or none): got "
                f"{len(self.token_versions)} for {len(self.response_ids)} tokens"
            )
        if self.teacher_logprobs and len(self.teacher_logprobs) != len(self.response_ids):
            raise ValueError(
                f"teacher_logprobs holds one logprob per response token (or none): got "
                f"{len(self.teacher_logprobs)} for {len(self.response_ids)} tokens"
            )
        if self.teacher_topk_ids and not (
            len(self.teacher_topk_ids) == len(self.teacher_topk_logprobs) == len(self.response_ids)
        ):
            raise ValueError(
                "teacher_topk_ids and teacher_topk_logprobs hold one row per response token (or none): got "
                f"{len(self.teacher_topk_ids)} and {len(self.teacher_topk_logprobs)} "
                f"for {len(self.response_ids)} tokens"
            )

    def versions(self) -> list[int]:
        """The policy version that sampled each response token."""
        return list(self.token_versions) if self.token_versions else [self.weight_version] * len(self.response_ids)


@dataclass
class Trajectory:
    """The token-exact record of one episode.

    Turn rewards stay on their turns and the trajectory-level ``outcome_reward`` is kept
    apart, so the algorithm decides how to combine them (see ``token_rewards``).
    ``group_id`` names the task: episodes with the same task share it (GRPO groups).
    """

    turns: list[Turn] = field(default_factory=list)
    outcome_reward: float = 0.0
    env_id: str = ""
    group_id: str = ""
    seed: int | None = None
    status: EpisodeStatus = "ok"
    failure: str | None = None
    data_source: str = ""
    messages: list[Message] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    task: dict[str, Any] = field(default_factory=dict)

    # ---- token views -------------------------------------------------------------------
    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def trainable(self) -> bool:
        """Failed episodes are kept for inspection but never trained on."""
        return self.status != "failed" and bool(self.turns)

    @property
    def success(self) -> bool:
        """Whether the episode solved its task, the one rule every success rate uses (training's,
        ``agentgym eval``'s, the held-out table's, dynamic sampling's ``acc``): a failed episode never
        did; otherwise the env's own verdict where it gave one (``info["success"]``, kept as
        ``metrics["success"]``), else a positive outcome reward."""
        if self.status == "failed":
            return False
        if "success" in self.metrics:
            return self.metrics["success"] > 0
        return self.outcome_reward > 0

    def token_ids(self) -> list[int]:
        """The whole sequence: every turn's prompt delta then its sampled tokens."""
        ids: list[int] = []
        for turn in self.turns:
            ids.extend(turn.prompt_ids)
            ids.extend(turn.response_ids)
        return ids

    def loss_mask(self) -> list[int]:
        """1 on sampled tokens, 0 on everything the model only read."""
        mask: list[int] = []
        for turn in self.turns:
            mask.extend([0] * len(turn.prompt_ids))
            mask.extend([1] * len(turn.response_ids))
        return mask

    def token_logprobs(self) -> list[float]:
        """The server's logprobs on sampled tokens, 0.0 on read-only tokens."""
        out: list[float] = []
        for turn in self.turns:
            out.extend([0.0] * len(turn.prompt_ids))
            out.extend(turn.logprobs)
        return out

    def token_rewards(self, turn_reward_coef: float = 1.0, outcome_reward_coef: float = 1.0) -> list[float]:
        """Rewards placed on tokens: each turn's reward on the last token it sampled, the
        outcome reward on the last sampled token of the episode. A turn that sampled nothing
        passes its reward on to the next sampled token (or back to the last one)."""
        rewards = [0.0] * sum(len(t.prompt_ids) + len(t.response_ids) for t in self.turns)
        pos = 0
        carry = 0.0
        last = -1
        for turn in self.turns:
            pos += len(turn.prompt_ids)
            carry += turn_reward_coef * turn.reward
            if turn.response_ids:
                pos += len(turn.response_ids)
                last = pos - 1
                rewards[last] += carry
                carry = 0.0
        if last >= 0:
            rewards[last] += carry + outcome_reward_coef * self.outcome_reward
        return rewards

    # ---- segments: the token sequences a trajectory is made of --------------------------
    def segment_starts(self) -> list[int]:
        """The turns that start a token sequence: the first, and every ``Turn.new_context`` turn."""
        return [k for k, turn in enumerate(self.turns) if k == 0 or turn.new_context]

    @property
    def single_sequence(self) -> bool:
        """Whether every turn extends one growing token sequence (no turn after the first starts a new
        context): ``token_ids()`` is then what the server saw on the last turn."""
        return len(self.segment_starts()) <= 1

    def segments(self, step_wise: bool = False) -> list[tuple[int, int]]:
        """``(first turn, end turn)`` of each token sequence to train as one sample: the runs of turns
        that extend one context; with ``step_wise`` every turn on its own."""
        if step_wise:
            return [(k, k + 1) for k in range(len(self.turns))]
        starts = self.segment_starts()
        return [(s, e) for s, e in zip(starts, starts[1:] + [len(self.turns)])]

    def turn_context(self, k: int) -> list[int]:
        """The whole context turn ``k`` was sampled from (its prompt): the tokens the server was sent."""
        start = max(s for s in self.segment_starts() if s <= k)
        ids: list[int] = []
        for turn in self.turns[start:k]:
            ids.extend(turn.prompt_ids)
            ids.extend(turn.response_ids)
        ids.extend(self.turns[k].prompt_ids)
        return ids

    def segment_lengths(self) -> list[int]:
        """The tokens of each token sequence (``segments()``): its whole first prompt, its replies and the
        observations between them. One per trajectory for a single sequence (``len(token_ids())``)."""
        lengths = self.context_lengths()
        out = []
        for first, end in self.segments():
            rest = sum(len(t.prompt_ids) + len(t.response_ids) for t in self.turns[first + 1 : end])
            out.append(lengths[first] + len(self.turns[first].response_ids) + rest)
        return out

    def context_lengths(self) -> list[int]:
        """The length of each turn's whole prompt (``len(turn_context(k))`` for every k, in one pass)."""
        out: list[int] = []
        context = 0
        for k, turn in enumerate(self.turns):
            context = len(turn.prompt_ids) if k == 0 or turn.new_context else context + len(turn.prompt_ids)
            out.append(context)
            context += len(turn.response_ids)
        return out

    def processed_tokens(self) -> int:
        """Tokens the policy server processed over the episode (each turn's whole prompt plus its reply),
        before any prefix cache: what a long-horizon episode costs to roll out."""
        return sum(self.context_lengths()) + sum(len(t.response_ids) for t in self.turns)

    def sampled_versions(self) -> list[int]:
        """The policy version of every sampled token, in order (see ``Turn.versions``)."""
        return [v for turn in self.turns for v in turn.versions()]

    def oldest_version(self) -> int | None:
        """The oldest policy version among the sampled tokens (None: nothing sampled): what the
        version lag of a trained trajectory is measured from."""
        versions = [min(t.versions(), default=t.weight_version) for t in self.turns if t.response_ids]
        return min(versions) if versions else None

    def prompt_length(self) -> int:
        """Tokens before the first sampled token (the first turn's prompt)."""
        return len(self.turns[0].prompt_ids) if self.turns else 0

    def response_length(self) -> int:
        """Tokens from the first sampled token to the end (multi-turn 'response'); for a trajectory of several
        token sequences (``segments``), the sum of each one's tokens after its first prompt."""
        if self.single_sequence:
            return len(self.token_ids()) - self.prompt_length()
        lengths = self.context_lengths()
        return sum(n - lengths[first] for n, (first, _) in zip(self.segment_lengths(), self.segments()))

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.turns) + self.outcome_reward

    # ---- storage -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        data["turns"] = [Turn(**t) for t in data.get("turns", [])]
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))
