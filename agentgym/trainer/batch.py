"""Trajectories -> padded tensors, and how a batch is cut into mini- and micro-batches.

One row per trajectory. The whole sequence (every turn's prompt delta, then its sampled
tokens) is right-padded to ``T`` in ``input_ids`` / ``attention_mask``. The *response
region* (everything from the first sampled token, veRL's ``responses``) is also laid out
on its own, right-padded to ``R``: ``responses``, ``response_mask`` (1 on sampled tokens; 0 on
the observation tokens between turns and on padding), ``rollout_log_probs`` and
``token_level_scores`` (turn and outcome rewards on tokens, ``Trajectory.token_rewards``) and
``turn_index`` (the turn each sampled token belongs to, -1 elsewhere).
``prompt_lengths[i]`` says where row i's response region starts in ``input_ids``.

Micro-batches (``micro_batches``): a worker's share of a mini-batch is cut into micro-batches of
``ppo_micro_batch_size_per_gpu`` rows, or, with ``use_dynamic_bsz``, by token budget
(``ppo_max_token_len_per_gpu``): rows sorted by length are packed first-fit so that each micro-batch's
cost stays within the budget. The cost of a micro-batch is its rows times its longest row (each is
padded to that length), or with ``use_remove_padding`` (rows packed into one sequence, see
``packing.py``) the sum of its rows' lengths. Which rows share a micro-batch never changes the
loss: every micro-batch's loss is its share of the global mini-batch loss.

Several rows per trajectory (docs/long_horizon.md): with ``step_wise`` (``trainer.step_wise_training``)
each turn is a row of its own, its prompt the whole context that turn was sampled from; a trajectory
whose turns do not extend one sequence (``Turn.new_context``: a history window, a summary, an agent
that rewrote its messages) gets a row per sequence even without it. ``Batch.episodes`` (``EpisodeMap``)
then maps every row's sampled tokens into a one-row-per-episode view, where the advantages are computed.

A trajectory that cannot be trained on (failed, empty, or longer than
``data.max_prompt_length`` / ``data.max_response_length``) keeps its row with
``response_mask`` all 0 and ``valid`` False, so batch shapes and group sizes stay as
configured; it never gets gradient and is left out of every statistic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentgym.trainer import algos
from agentgym.types import Trajectory

Tensors = dict[str, torch.Tensor]


@dataclass
class Batch:
    """Row-aligned tensors plus ``uid`` (the group id of each row, veRL's ``index``) and
    ``step_keys`` (each row's ``Turn.state_key`` per turn, for turn-level credit).

    ``episodes``: when a trajectory is trained as several rows (step-wise samples, or turns that start
    a new context), where each row's response tokens sit in the one-row-per-episode view the advantage
    estimators run on (``EpisodeMap``); None when every trajectory is one row."""

    tensors: Tensors
    uid: list[str] = field(default_factory=list)
    step_keys: list[list[str]] = field(default_factory=list)
    episodes: EpisodeMap | None = None

    def __len__(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if value.shape[0] != len(self):
            raise ValueError(f"{key} has {value.shape[0]} rows for a batch of {len(self)}")
        self.tensors[key] = value

    def select(self, rows: Sequence[int] | torch.Tensor) -> Batch:
        index = torch.as_tensor(rows, dtype=torch.long)
        uid = [self.uid[i] for i in index.tolist()] if self.uid else []
        keys = [self.step_keys[i] for i in index.tolist()] if self.step_keys else []
        tensors = {k: v.index_select(0, index) for k, v in self.tensors.items()}
        return Batch(tensors, uid, keys, self.episodes)


@dataclass
class EpisodeMap:
    """Rows -> episodes, for trajectories trained as several rows (docs/long_horizon.md).

    The *episode view* has one row per trajectory (in the order given to ``build_batch``) holding its
    sampled tokens only, every turn's in order (``length`` columns): the same sampled tokens, rewards
    and turn numbers as one row per episode, without the observation tokens between turns (which no
    estimator reads: GAE passes over them, the others sum rewards). ``position`` (the batch tensor
    ``episode_position``) says for each row's response token where it sits in the view, flattened
    (``episode * length + column``), -1 on observation tokens and padding. Advantages computed on the
    view go back to every row that holds one of the episode's turns (``scatter``), so the episode's
    advantage (and, with GiGPO, each turn's own) reaches every turn's sample."""

    count: int
    length: int
    uid: list[str]
    step_keys: list[list[str]]
    turn_index: torch.Tensor  # (count, length): the turn of each sampled token, -1 past the episode's end

    def gather(self, position: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Row-layout ``values`` (rows, R) -> the episode view (count, length); 0 where no row has a token."""
        out = torch.zeros(self.count * self.length, dtype=values.dtype)
        where = position >= 0
        out[position[where]] = values[where]
        return out.view(self.count, max(self.length, 0))

    def scatter(self, position: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
        """Episode-view ``view`` (count, length) -> the row layout of ``position``; 0 off sampled tokens."""
        flat = view.reshape(-1)
        if flat.numel() == 0:
            return torch.zeros(position.shape, dtype=view.dtype)
        picked = flat[position.clamp(min=0)]
        return torch.where(position >= 0, picked, torch.zeros_like(picked))

    def view_mask(self) -> torch.Tensor:
        """1 on every sampled token of the view."""
        return (self.turn_index >= 0).to(torch.float32)


def episode_rows(batch: Batch) -> torch.Tensor | None:
    """Each row's episode (its index among the trajectories given to ``build_batch``), -1 for a row with no
    sampled token of any (padding, a skipped trajectory); None when every trajectory is one row."""
    if batch.episodes is None:
        return None
    position = batch["episode_position"]
    length = max(batch.episodes.length, 1)
    return torch.where(position >= 0, position // length, torch.full_like(position, -1)).max(dim=-1).values


def skip_reason(traj: Trajectory, max_prompt_length: int, max_response_length: int) -> str | None:
    """Why a trajectory is not trained on as one row, or None when it is."""
    if not traj.trainable:
        return "failed" if traj.status == "failed" else "empty"
    if traj.prompt_length() == 0:
        return "no_prompt"
    if traj.prompt_length() > max_prompt_length:
        return "prompt_too_long"
    if traj.response_length() > max_response_length:
        return "response_too_long"
    if not any(traj.loss_mask()):
        return "no_sampled_tokens"
    return None


def sample_skip_reason(
    traj: Trajectory, segments: Sequence[tuple[int, int]], max_prompt_length: int, max_response_length: int
) -> str | None:
    """Why a trajectory trained as several rows (``segments``) is not trained on, or None. Each row may
    hold ``max_prompt_length + max_response_length`` tokens (the budget one row per episode had), its
    response region (from its first sampled token) at most ``max_response_length``; one row over the
    limits leaves the whole episode out, so no turn trains without the others."""
    if not traj.trainable:
        return "failed" if traj.status == "failed" else "empty"
    if not any(turn.response_ids for turn in traj.turns):
        return "no_sampled_tokens"
    for first, end in segments:
        prompt = len(traj.turn_context(first))
        if prompt == 0:
            return "no_prompt"
        region = sum(len(t.response_ids) + len(t.prompt_ids) for t in traj.turns[first:end]) - len(
            traj.turns[first].prompt_ids
        )
        if region > max_response_length:
            return "response_too_long"
        if prompt + region > max_prompt_length + max_response_length:
            return "sample_too_long"
    return None


Row = tuple[list[int], int, list[int], list[float], list[float], list[int], list[int]]


def _episode_rows(
    traj: Trajectory, segments: Sequence[tuple[int, int]], rewards: list[float], episode: int, length: int
) -> list[Row]:
    """One row per segment: its whole context, then its turns' sampled tokens (mask 1) and the observation
    deltas between them (mask 0); each sampled token's place in the episode view."""
    offsets = []  # where each turn's prompt delta starts in the trajectory's concatenated tokens
    pos = 0
    sampled_before = []
    sampled = 0
    for turn in traj.turns:
        offsets.append(pos)
        pos += len(turn.prompt_ids) + len(turn.response_ids)
        sampled_before.append(sampled)
        sampled += len(turn.response_ids)
    rows: list[Row] = []
    for first, end in segments:
        context = traj.turn_context(first)
        ids = list(context)
        mask: list[int] = []
        logprobs: list[float] = []
        token_rewards: list[float] = []
        turns: list[int] = []
        where: list[int] = []
        for k in range(first, end):
            turn = traj.turns[k]
            if k > first:
                n = len(turn.prompt_ids)
                ids.extend(turn.prompt_ids)
                mask += [0] * n
                logprobs += [0.0] * n
                token_rewards += [0.0] * n
                turns += [-1] * n
                where += [-1] * n
            start = offsets[k] + len(turn.prompt_ids)
            n = len(turn.response_ids)
            ids.extend(turn.response_ids)
            mask += [1] * n
            logprobs += list(turn.logprobs)
            token_rewards += rewards[start : start + n]
            turns += [k] * n
            where += [episode * length + sampled_before[k] + j for j in range(n)]
        rows.append((ids, len(context), mask, logprobs, token_rewards, turns, where))
    return rows


def build_batch(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    turn_reward_coef: float = 1.0,
    outcome_reward_coef: float = 1.0,
    max_prompt_length: int = 1 << 30,
    max_response_length: int = 1 << 30,
    step_wise: bool = False,
) -> tuple[Batch, dict[str, int]]:
    """The padded batch and a count of the trajectories left out of training, by reason.

    One row per trajectory, except where a trajectory is made of several token sequences (turns with
    ``Turn.new_context``: a context policy or a rewritten agent context) or ``step_wise`` is set
    (``trainer.step_wise_training``): then one row per sequence, or per turn, each with the whole prompt
    that turn saw, and ``Batch.episodes`` maps the rows back to their episodes."""
    if not trajectories:
        raise ValueError("build_batch needs at least one trajectory")
    split = step_wise or any(not t.single_sequence for t in trajectories)
    length = max((sum(len(t.response_ids) for t in traj.turns) for traj in trajectories), default=0) if split else 0
    rows: list[Row] = []
    uid: list[str] = []
    step_keys: list[list[str]] = []
    skipped: dict[str, int] = {}
    episode_uid: list[str] = []
    episode_keys: list[list[str]] = []
    episode_turns = torch.full((len(trajectories), length), -1, dtype=torch.long)
    for i, traj in enumerate(trajectories):
        segments = traj.segments(step_wise) if split else [(0, len(traj.turns))]
        if split:
            reason = sample_skip_reason(traj, segments, max_prompt_length, max_response_length)
        else:
            reason = skip_reason(traj, max_prompt_length, max_response_length)
        if reason is None:
            group = traj.group_id or f"traj-{i}"
            keys = [turn.state_key for turn in traj.turns]
            rewards = traj.token_rewards(turn_reward_coef, outcome_reward_coef)
            if split:
                new = _episode_rows(traj, segments, rewards, i, length)
                column = 0
                for k, turn in enumerate(traj.turns):
                    episode_turns[i, column : column + len(turn.response_ids)] = k
                    column += len(turn.response_ids)
            else:
                ids, start = traj.token_ids(), traj.prompt_length()
                mask = traj.loss_mask()[start:]
                new = [
                    (ids, start, mask, traj.token_logprobs()[start:], rewards[start:], turn_numbers(traj)[start:], [])
                ]
            rows.extend(new)
            uid.extend([group] * len(new))
            step_keys.extend([keys] * len(new))
            episode_uid.append(group)
            episode_keys.append(keys)
        else:
            skipped[reason] = skipped.get(reason, 0) + 1
            ids = traj.token_ids()[: max_prompt_length + max_response_length] or [pad_token_id]
            start = min(max(traj.prompt_length(), 1), len(ids))
            if start == len(ids):
                ids = ids + [pad_token_id]
            n = len(ids) - start
            rows.append((ids, start, [0] * n, [0.0] * n, [0.0] * n, [-1] * n, [-1] * n if split else []))
            uid.append(f"skipped-{i}")  # a group of its own: it must not shift others' baselines
            step_keys.append([])
            episode_uid.append(f"skipped-{i}")
            episode_keys.append([])

    batch_size = len(rows)
    seq_len = max(len(r[0]) for r in rows)
    resp_len = max(len(r[0]) - r[1] for r in rows)
    input_ids = torch.full((batch_size, seq_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, seq_len), dtype=torch.long)
    responses = torch.full((batch_size, resp_len), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((batch_size, resp_len), dtype=torch.float32)
    rollout_log_probs = torch.zeros((batch_size, resp_len), dtype=torch.float32)
    prompt_lengths = torch.zeros(batch_size, dtype=torch.long)
    turn_index = torch.full((batch_size, resp_len), -1, dtype=torch.long)
    position = torch.full((batch_size, resp_len), -1, dtype=torch.long)
    reward_rows: list[list[float]] = []
    for i, (ids, start, mask, logprobs, rewards, turns, where) in enumerate(rows):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids)
        attention_mask[i, :n] = 1
        prompt_lengths[i] = start
        responses[i, : n - start] = torch.tensor(ids[start:])
        response_mask[i, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
        rollout_log_probs[i, : len(logprobs)] = torch.tensor(logprobs, dtype=torch.float32)
        turn_index[i, : len(turns)] = torch.tensor(turns, dtype=torch.long)
        if where:
            position[i, : len(where)] = torch.tensor(where, dtype=torch.long)
        reward_rows.append(rewards)
    token_level_scores = algos.token_level_scores_from_rewards(reward_rows, response_mask)
    valid = response_mask.sum(-1) > 0
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "prompt_lengths": prompt_lengths,
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs,
        "token_level_scores": token_level_scores,
        "turn_index": turn_index,
        "valid": valid,
    }
    episodes = None
    if split:
        tensors["episode_position"] = position
        episodes = EpisodeMap(len(trajectories), length, episode_uid, episode_keys, episode_turns)
    return Batch(tensors, uid, step_keys, episodes), skipped


def turn_numbers(traj: Trajectory) -> list[int]:
    """Over the whole sequence: the turn (0-based) each sampled token belongs to, -1 on read-only tokens."""
    out: list[int] = []
    for k, turn in enumerate(traj.turns):
        out.extend([-1] * len(turn.prompt_ids))
        out.extend([k] * len(turn.response_ids))
    return out


def add_pad_rows(batch: Batch, count: int) -> Batch:
    """Append ``count`` copies of row 0 with nothing to learn from (``response_mask`` 0,
    ``valid`` False); they fill worker shares so every rank runs the same passes."""
    if count <= 0:
        return batch
    pad = batch.select([0] * count)
    for key in ("response_mask", "token_level_scores", "advantages", "returns", "token_level_rewards"):
        if key in pad.tensors:
            pad.tensors[key] = torch.zeros_like(pad.tensors[key])
    if "episode_position" in pad.tensors:  # a pad row holds no episode's tokens
        pad.tensors["episode_position"] = torch.full_like(pad.tensors["episode_position"], -1)
    pad.tensors["valid"] = torch.zeros_like(pad.tensors["valid"])
    tensors = {k: torch.cat([batch.tensors[k], pad.tensors[k]]) for k in batch.tensors}
    return Batch(
        tensors,
        batch.uid + [f"pad-{i}" for i in range(count)] if batch.uid else [],
        batch.step_keys + [[] for _ in range(count)] if batch.step_keys else [],
        batch.episodes,
    )


def rank_shards(rows: int, world_size: int) -> list[list[int]]:
    """The rows each rank holds: ``world_size`` contiguous, equal shares (after ``pad_for_workers``)."""
    return [list(range(r * rows // world_size, (r + 1) * rows // world_size)) for r in range(world_size)]


def pad_for_workers(batch: Batch, world_size: int, num_mini_batches: Sequence[int]) -> tuple[Batch, list[int]]:
    """Pad so the rows split evenly over ``world_size`` ranks, and so that every mini-batch
    (for each count in ``num_mini_batches``) can be topped up to a multiple of ``world_size``.
    Returns the padded batch and the pad rows' indices."""
    rows = len(batch)
    need = 0
    for count in num_mini_batches:
        for size in (len(part) for part in even_splits(range(rows), count)):
            need = max(need, (-size) % world_size)
    extra = need
    while (rows + extra) % world_size:
        extra += 1
    return add_pad_rows(batch, extra), list(range(rows, rows + extra))


def even_splits(items: Sequence[int], parts: int) -> list[list[int]]:
    """``items`` cut into ``parts`` contiguous pieces whose sizes differ by at most one."""
    items = list(items)
    size, rest = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        end = start + size + (1 if p < rest else 0)
        out.append(items[start:end])
        start = end
    return out


def update_plan(
    response_mask: torch.Tensor,
    rows: int,
    pad_rows: Sequence[int],
    num_mini_batches: int,
    epochs: int,
    world_size: int,
    shuffle: bool = False,
    seed: int = 0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    row_episodes: torch.Tensor | None = None,
) -> list[list[dict[str, Any]]]:
    """For each rank, the optimizer steps it takes part in: ``epochs * num_mini_batches``
    entries of ``{"rows": its share of the mini-batch, "global": agg_loss's global counts}``.

    The first ``rows`` rows are cut into mini-batches (shuffled per epoch when ``shuffle``);
    a mini-batch is topped up with pad rows to a multiple of ``world_size`` and rank r takes
    its r-th slice. Mini-batches are therefore the same whatever the number of ranks, and the
    counts in ``global`` (the whole mini-batch's ``batch_num_tokens`` and
    ``global_batch_size``) make each rank's loss its share of the global mini-batch loss;
    averaging gradients over the ``dp_size`` ranks then gives the one-rank step.

    ``row_episodes`` (``episode_rows``: each row's episode, -1 for none), when trajectories span several
    rows: ``seq-mean-token-sum`` and ``seq-mean-token-sum-norm`` then count *episodes* in
    ``global_batch_size``, so an episode's token sum (over all its rows) is one sequence's, exactly as with
    one row per episode. ``seq-mean-token-mean`` keeps counting rows (a row's mean does not add up to its
    episode's): each sample weighs the same.
    """
    generator = torch.Generator().manual_seed(seed)
    plans: list[list[dict[str, Any]]] = [[] for _ in range(world_size)]
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator).tolist() if shuffle else list(range(rows))
        for mini in even_splits(order, num_mini_batches):
            mini_mask = response_mask[mini]
            info: dict[str, Any] = {
                "dp_size": world_size,
                "batch_num_tokens": float(mini_mask.sum().clamp(min=1)),
                "global_batch_size": float((mini_mask.sum(-1) > 0).sum().clamp(min=1)),
            }
            if row_episodes is not None and loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
                held = row_episodes[mini][(mini_mask.sum(-1) > 0) & (row_episodes[mini] >= 0)]
                info["global_batch_size"] = float(max(1, len(set(held.tolist()))))
            if loss_agg_mode == "seq-mean-token-sum-norm" and loss_scale_factor is not None:
                info["loss_scale_factor"] = float(loss_scale_factor)
            short = (-len(mini)) % world_size
            if short > len(pad_rows):
                raise ValueError(f"a mini-batch of {len(mini)} rows needs {short} pad rows, got {len(pad_rows)}")
            for rank, share in enumerate(even_splits(mini + list(pad_rows[:short]), world_size)):
                plans[rank].append({"rows": share, "global": info})
    return plans


def micro_batch_cost(lengths: Sequence[int], packed: bool) -> int:
    """Tokens a micro-batch of rows with these lengths computes: the packed sum, or rows x longest."""
    if not lengths:
        return 0
    return int(sum(lengths)) if packed else int(max(lengths)) * len(lengths)


def micro_batches(
    rows: Sequence[int],
    lengths: Sequence[int] | torch.Tensor,
    size: int,
    max_tokens: int | None = None,
    packed: bool = False,
    count: int | None = None,
) -> list[list[int]]:
    """``rows`` cut into micro-batches: ``size`` rows each in order, or with ``max_tokens`` (veRL's
    ``use_dynamic_bsz``) by token budget. ``lengths[r]``: row r's tokens (``attention_mask`` sum).

    By budget: rows longest first, each into the first micro-batch whose cost
    (``micro_batch_cost``) stays within ``max_tokens``, else a new one; a row longer than the budget
    gets a micro-batch of its own. ``count``: split the largest micro-batches until there are that
    many (every rank of a sharded model must run the same number of passes)."""
    rows = list(rows)
    if max_tokens is None:
        return [rows[i : i + size] for i in range(0, len(rows), max(1, size))] or [[]]
    length = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    bins: list[list[int]] = []
    for row in sorted(rows, key=lambda r: -length[r]):
        for micro in bins:
            if micro_batch_cost([length[r] for r in micro] + [length[row]], packed) <= max_tokens:
                micro.append(row)
                break
        else:
            bins.append([row])
    bins = bins or [[]]
    while count is not None and len(bins) < count:
        largest = max(range(len(bins)), key=lambda i: len(bins[i]))
        if len(bins[largest]) < 2:
            raise ValueError(f"cannot make {count} micro-batches of {len(rows)} rows")
        half = len(bins[largest]) // 2
        bins[largest : largest + 1] = [bins[largest][:half], bins[largest][half:]]
    return bins


def padding_report(
    rows: Sequence[int], lengths: Sequence[int] | torch.Tensor, micros: list[list[int]], packed: bool = False
) -> dict[str, float]:
    """Real tokens, computed tokens and the padding share of a micro-batch plan (for benchmarks and metrics)."""
    length = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    real = sum(length[r] for r in rows)
    computed = sum(micro_batch_cost([length[r] for r in m], packed) for m in micros)
    return {
        "tokens": float(real),
        "computed_tokens": float(computed),
        "micro_batches": float(len(micros)),
        "padding_frac": (computed - real) / computed if computed else 0.0,
    }
