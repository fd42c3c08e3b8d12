"""Padding saved by token-budget micro-batches and sequence packing on a long-tail batch.

    python benchmarks/packing.py                 # 64 rows, 1 in 8 long; prints a table
    python benchmarks/packing.py --rows 128 --budget 4096 --no-time

A long-tail batch (most rows short, a few long: typical of RL responses) is cut into micro-batches
three ways, as the trainer would:

* fixed: ``ppo_micro_batch_size_per_gpu`` rows each, in batch order (each padded to its longest row);
* dynamic: ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` (rows by length, first fit; padded);
* packed: ``use_dynamic_bsz`` + ``use_remove_padding`` (ChatLearn's ``packing`` with
  ``max_token_in_packing``): each micro-batch's rows in one sequence, no padding.

For each it prints the real tokens, the tokens computed (real + padding), the padding share and
the micro-batch count, and (unless ``--no-time``) the seconds of one forward+backward pass over
the whole batch with the built-in tiny model on this machine's CPU.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from agentgym.trainer.batch import build_batch, micro_batches, padding_report
from agentgym.trainer.forward import policy_forward, select_rows
from agentgym.types import Trajectory, Turn


def long_tail_batch(
    rows: int, seed: int, long_every: int, short: tuple[int, int], long: tuple[int, int]
) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        prompt = [rng.randrange(3, 600) for _ in range(rng.randrange(20, 60))]
        low, high = long if i % long_every == 0 else short
        response = [rng.randrange(3, 600) for _ in range(rng.randrange(low, high))]
        out.append(
            Trajectory(
                turns=[Turn(prompt_ids=prompt, response_ids=response, logprobs=[-6.0] * len(response))],
                outcome_reward=float(rng.random() < 0.5),
                group_id=f"g{i // 8}",
            )
        )
    return out


def time_plan(model, tensors, micros, packed: bool, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        for micro_rows in micros:
            micro = select_rows(tensors, micro_rows, "cpu")
            log_prob, _ = policy_forward(model, micro, packed=packed)
            (log_prob * micro["response_mask"]).sum().backward()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--long-every", type=int, default=8, help="one row in this many is long")
    parser.add_argument("--micro", type=int, default=8, help="ppo_micro_batch_size_per_gpu for the fixed plan")
    parser.add_argument("--budget", type=int, default=2048, help="ppo_max_token_len_per_gpu / max_token_in_packing")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-time", action="store_true", help="only count tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    batch, _ = build_batch(long_tail_batch(args.rows, args.seed, args.long_every, (8, 48), (400, 700)), pad_token_id=0)
    tensors = batch.tensors
    lengths = tensors["attention_mask"].sum(-1)
    rows = list(range(len(batch)))
    plans = {
        "fixed": (micro_batches(rows, lengths, args.micro), False),
        "dynamic": (micro_batches(rows, lengths, 0, args.budget), False),
        "packed": (micro_batches(rows, lengths, 0, args.budget, packed=True), True),
    }
    model = None
    if not args.no_time:
        from agentgym.model import load_causal_lm

        torch.manual_seed(0)
        torch.set_num_threads(max(1, torch.get_num_threads()))
        model = load_causal_lm("tiny").train()
    print(
        f"long-tail batch: {args.rows} rows, lengths {int(lengths.min())}..{int(lengths.max())} tokens "
        f"(median {int(lengths.median())}), {int(lengths.sum())} real tokens; fixed micro-batches of "
        f"{args.micro} rows, token budget {args.budget}"
    )
    header = f"{'plan':<8} {'micro-batches':>13} {'computed tokens':>16} {'padding':>8} {'saved vs fixed':>15}"
    print(header + ("" if args.no_time else f" {'fwd+bwd s':>10}"))
    fixed_computed = None
    for name, (micros, packed) in plans.items():
        report = padding_report(rows, lengths, micros, packed)
        fixed_computed = fixed_computed or report["computed_tokens"]
        saved = 1 - report["computed_tokens"] / fixed_computed
        line = (
            f"{name:<8} {int(report['micro_batches']):>13} {int(report['computed_tokens']):>16} "
            f"{report['padding_frac']:>8.1%} {saved:>15.1%}"
        )
        if model is not None:
            line += f" {time_plan(model, tensors, micros, packed, args.repeats):>10.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
