"""Fixtures shared by tests/compat/test_compat_*.py: GSM8K-style parquet in veRL's row format, and veRL's
GSM8K quickstart command line (docs/start/quickstart.rst) with a local model path."""

from __future__ import annotations

import random
from pathlib import Path

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def gsm8k_rows(count: int, seed: int, split: str) -> list[dict]:
    """Rows as veRL's examples/data_preprocess/gsm8k.py writes them (small arithmetic questions)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        question = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "answer": f"{a} + {b} = {a + b} #### {a + b}",
                    "question": question,
                },
            }
        )
    return rows


def write_gsm8k_parquet(directory: Path, train_rows: int = 64, test_rows: int = 16) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(gsm8k_rows(train_rows, 0, "train")), directory / "train.parquet")
    pq.write_table(pa.Table.from_pylist(gsm8k_rows(test_rows, 1, "test")), directory / "test.parquet")
    return directory


def quickstart_command(data: Path, model: str) -> list[str]:
    """veRL's PPO quickstart, word for word but for the command name, the model path and
    rollout.name (vLLM is not on a CPU machine; the error for it says to use embedded)."""
    return [
        f"data.train_files={data}/train.parquet",
        f"data.val_files={data}/test.parquet",
        "data.train_batch_size=256",
        "data.max_prompt_length=512",
        "data.max_response_length=512",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=embedded",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-5",
        f"critic.model.path={model}",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=console",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=10",
        "trainer.test_freq=10",
        "trainer.total_epochs=15",
    ]


def with_overrides(command: list[str], *extra: str) -> list[str]:
    """``command`` with ``extra`` overrides replacing the same keys."""
    keys = {e.split("=", 1)[0] for e in extra}
    return [c for c in command if c.split("=", 1)[0] not in keys] + list(extra)
