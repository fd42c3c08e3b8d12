"""What an exported model directory remembers of how it was trained: ``agentgym_run.json``.

``agentgym train`` writes it beside the weights of ``<run dir>/huggingface`` (``trainer.save_hf_model``)::

    {"agentgym_version": "0.1.0", "step": 60, "run_dir": "/abs/outputs/agentgym/sokoban-gigpo",
     "env": {"name": "sokoban", "kwargs": {...}, "val_kwargs": {...}, "eval_kwargs": {...},
             "val_seed_start": 1000000},
     "rollout": {"max_assistant_turns": 3, "max_tokens_per_turn": 56, "temperature": 1.0, ...,
                 "val_kwargs": {"temperature": 0.0, ...}},
     "data": {"max_prompt_length": 512, "max_response_length": 512, "apply_chat_template_kwargs": {}},
     "model": {"start": "<the model RL started from>", "export": "full" | "lora_adapter" | "lora_merged",
               "base": "<LoRA: the model the adapters sit on>", "lora": {"rank": 8, ...}}}

``eval_kwargs`` are the arguments the run scored its policy with (``env.kwargs`` with
``env.val_kwargs`` over them, as the held-out table does): ``agentgym eval --model DIR`` warns when
the env arguments it is given differ from them, and ``agentgym eval --run`` reads the run's whole
config instead (``agentgym.stages.from_run``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

FILE = "agentgym_run.json"


def agentgym_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentgym")
    except PackageNotFoundError:
        return "unknown"


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _absolute(path: str) -> str:
    from agentgym.model.tiny import is_tiny

    return str(Path(path).resolve()) if not is_tiny(path) and Path(path).exists() else path


def training_record(cfg: DictConfig, step: int) -> dict[str, Any]:
    """The record of a run at ``step`` (see the module's docstring)."""
    rollout = cfg.actor_rollout_ref.rollout
    model = cfg.actor_rollout_ref.model
    kwargs = _plain(cfg.env.kwargs) or {}
    val_kwargs = _plain(cfg.env.val_kwargs) or {}
    lora_rank = model.lora_rank
    start = _absolute(str(model.path))
    record: dict[str, Any] = {
        "agentgym_version": agentgym_version(),
        "step": int(step),
        "run_dir": str(Path(str(cfg.trainer.default_local_dir)).resolve()),
        "env": {
            "name": cfg.env.name,
            "kwargs": kwargs,
            "val_kwargs": val_kwargs,
            "eval_kwargs": {**kwargs, **val_kwargs},
            "val_seed_start": cfg.env.val_seed_start,
        },
        "rollout": {
            "max_assistant_turns": rollout.multi_turn.max_assistant_turns,
            "max_tokens_per_turn": rollout.max_tokens_per_turn,
            "temperature": rollout.temperature,
            "top_p": rollout.top_p,
            "top_k": rollout.top_k,
            "do_sample": rollout.do_sample,
            "n": rollout.n,
            "val_kwargs": _plain(rollout.val_kwargs),
        },
        "data": {
            "max_prompt_length": cfg.data.max_prompt_length,
            "max_response_length": cfg.data.max_response_length,
            "apply_chat_template_kwargs": _plain(cfg.data.apply_chat_template_kwargs) or {},
        },
        "model": {"start": start, "export": "full"},
    }
    if lora_rank > 0:
        record["model"].update(
            export="lora_merged" if model.lora_export_merged else "lora_adapter",
            base=start,
            lora={"rank": lora_rank, "alpha": model.lora_alpha, "target_modules": _plain(model.target_modules)},
        )
    return record


def write_training_record(directory: str | Path, cfg: DictConfig, step: int) -> Path:
    """Write ``agentgym_run.json`` into the exported model ``directory``."""
    target = Path(directory) / FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(FILE + ".tmp")
    tmp.write_text(json.dumps(training_record(cfg, step), indent=1, default=str))
    tmp.replace(target)
    return target


def read_training_record(directory: str | Path) -> dict[str, Any] | None:
    """The record in a model ``directory``; None when there is none or it is unreadable."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
