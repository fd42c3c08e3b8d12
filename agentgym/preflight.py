"""Everything ``agentgym train`` checks before it starts servers, Ray or workers, so a run that
cannot work fails in a second with what to do instead of a traceback minutes later.

``preflight(cfg, agent)``:

1. data files exist; veRL's ``data.*`` row options are applied (``data_prep.prepare_data``);
2. with ``data.train_files`` and no ``--env``, the env is chosen from the rows as veRL's
   ``main_ppo`` would: interaction rows (``multi_turn.interaction_config_path``) become
   interaction episodes, any other veRL rows the ``rows`` env, scored by their ``data_source``
   (GSM8K's rule, MATH's, ...) or by ``custom_reward_function``;
3. ``data.train_batch_size`` fits the rows;
4. the devices exist: ``trainer.device=cuda`` (or ``rollout.device=cuda``) on a machine without CUDA, or
   more GPU workers than GPUs, is refused here, never left to wait on a Ray bundle (``check_device``);
5. the rollout engine is installed (``rollout.name=vllm`` without vLLM names what works), and every
   optional package the config needs (peft, wandb, tensorboard, pyarrow, an env family's package) imports,
   with the command that installs it (``check_optional_packages``);
6. the model is reachable: a local directory, ``tiny``, or a hub name that is cached or whose
   hub answers (no 49 s of retries on an offline machine);
7. ``custom_reward_function`` loads;
8. every policy server given by URL (``actor_rollout_ref.rollout.server_urls``) answers ``/health``
   and serves the model named (``actor_rollout_ref.model.path``), before any stage (warm start)
   runs: a dead URL fails here, in seconds, not after the warm start.

Returns a ``Plan``: what it decided, for the status line.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError
from agentgym.rollout.data_prep import Prepared, data_sources, exists, plain, prepare_data

AR = "actor_rollout_ref"
PRIME_TIMEOUT_S = 300.0  # veRL's prime reward manager: seconds per scoring batch before a 0


@dataclass
class Plan:
    """What preflight decided."""

    steps: int | None = None  # training steps, when known before the env starts
    rows: int | None = None  # training rows (dataset runs)
    env_chosen: str | None = None  # why env.name was set, when preflight chose it
    prepared: dict[str, Prepared] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def check_files(cfg: DictConfig) -> None:
    for key in ("train_files", "val_files"):
        value = cfg.data[key]
        if value and not exists(value):
            raise ConfigError(
                f"data.{key}={plain(value)} does not exist; pass data.{key}=PATH (a .jsonl/.parquet "
                f"file or a directory holding train/test files)"
            )


def cuda_devices() -> int:
    """CUDA devices torch can see here (0 without CUDA or without a CUDA build of torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_device(cfg: DictConfig, devices: int | None = None) -> None:
    """``trainer.device`` / ``rollout.device`` against this machine, before any Ray request: asking Ray
    for GPU bundles it cannot have waits forever. ``devices``: CUDA devices here (default: torch's count)."""
    devices = cuda_devices() if devices is None else devices
    import torch

    build = f"torch {torch.__version__}"
    wants = {key: OmegaConf.select(cfg, key) for key in ("trainer.device", f"{AR}.rollout.device")}
    for key, value in wants.items():
        if str(value) == "cuda" and devices == 0:
            raise ConfigError(
                f"{key}=cuda but this machine has no CUDA device ({build}, torch.cuda.is_available() is False). "
                f"Set {key}={'auto' if key == 'trainer.device' else 'null'} (the GPU when there is one, else the CPU) "
                f"or {key}=cpu; on a GPU machine install a CUDA build of torch"
            )
    gpu = str(cfg.trainer.device) == "cuda" or (str(cfg.trainer.device) == "auto" and devices > 0)
    joins_cluster = OmegaConf.select(cfg, "ray_init.address") not in (None, "", "local")
    workers = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if gpu and not joins_cluster and cfg.trainer.nnodes == 1 and workers > devices:
        raise ConfigError(
            f"trainer.n_gpus_per_node={cfg.trainer.n_gpus_per_node} trainer workers need one GPU each, but this "
            f"machine has {devices}; set trainer.n_gpus_per_node={devices} (or join a Ray cluster that has the "
            f"GPUs: ray_init.address=auto)"
        )


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_packages(cfg: DictConfig) -> list[str]:
    """What the config needs that is not installed, each as ``"what needs it: install command"``."""
    need: list[tuple[str, str, str]] = []  # (module, the setting that needs it, install command)
    for name in cfg.trainer.logger:
        if name == "wandb":
            need.append(("wandb", "trainer.logger has wandb", "pip install wandb (or trainer.logger=[console,jsonl])"))
        elif name == "tensorboard":
            need.append(
                (
                    "tensorboard",
                    "trainer.logger has tensorboard",
                    "pip install tensorboard (or trainer.logger=[console,jsonl])",
                )
            )
    if cfg.actor_rollout_ref.model.lora_rank > 0:
        need.append(
            (
                "peft",
                f"{AR}.model.lora_rank={cfg.actor_rollout_ref.model.lora_rank}",
                "pip install peft (agentgym's core install has it: pip install -e .)",
            )
        )
    files = [plain(cfg.data.train_files), plain(cfg.data.val_files)]
    if any(".parquet" in str(f) for f in files if f):
        need.append(("pyarrow", "data files in Parquet", "pip install 'agentgym[parquet]' (or pyarrow)"))
    missing = [f"{why}: {command}" for module, why, command in need if not _importable(module)]
    for name in _env_names(cfg):
        if "/" not in name:
            continue
        from agentgym.registry import env_family

        try:
            family = env_family(name.split("/", 1)[0])
        except Exception:  # noqa: BLE001 - not a family: the env check names it
            continue
        if family.installed_version() is None:
            missing.append(f"env {name}: {family.install_hint()}")
    return missing


def _env_names(cfg: DictConfig) -> list[str]:
    names = [str(cfg.env.name)] if cfg.env.name else []
    for spec in (plain(cfg.env.custom_envs) or {}).values():
        if isinstance(spec, dict) and spec.get("env"):
            names.append(str(spec["env"]))
    return names


def check_optional_packages(cfg: DictConfig) -> None:
    """Every optional package the config needs, before any work (not a traceback in a Ray worker later)."""
    missing = missing_packages(cfg)
    if missing:
        raise ConfigError("the config needs packages that are not installed:\n  " + "\n  ".join(missing))


def check_engine(cfg: DictConfig) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name == "embedded" or rollout.server_urls:
        return
    from agentgym.server.launchers import MODULES, engine_available

    python = os.environ.get(f"AGENTGYM_{str(rollout.name).upper()}_PYTHON") or sys.executable
    if not engine_available(str(rollout.name), python):
        raise ConfigError(
            f"{AR}.rollout.name={rollout.name} needs {MODULES[rollout.name]!r}, which {python} cannot import. On a "
            f"machine with a GPU: pip install -e '.[{rollout.name}]' (or point AGENTGYM_{str(rollout.name).upper()}"
            f"_PYTHON at an interpreter that has it, or give running servers in {AR}.rollout.server_urls=[URL]). "
            f"Without it, use agentgym's own server: {AR}.rollout.name=embedded"
        )


def hub_reachable(timeout: float = 3.0) -> str | None:
    """None when the Hugging Face hub answers a TCP connection, else why not."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port} does not answer ({type(exc).__name__}: {exc})"


def check_model(key: str, path: str) -> None:
    """A model path is a built-in model (``tiny``, ``smollm2-135m`` with its package installed, a ``.gguf``
    file), a directory, or a hub name that is cached or reachable."""
    from agentgym.model import ModelUnavailable, is_builtin, is_smollm2, smollm2_gguf_file

    if is_smollm2(path):
        try:
            smollm2_gguf_file()
        except ModelUnavailable as exc:
            raise ConfigError(f"{key}={path}: {exc}") from None
    if is_builtin(path) or Path(os.path.expanduser(path)).is_dir():
        return
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1
    if looks_local:
        raise ConfigError(
            f"{key}={path} is not a directory; pass a Hugging Face model directory, a hub name (org/name) or tiny"
        )
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(path, "config.json"), str):
            return
    except Exception:  # noqa: BLE001 - a malformed name is reported below
        pass
    why = hub_reachable()
    if why is not None:
        raise ConfigError(
            f"{key}={path} is not a local directory and not in the Hugging Face cache, and the hub cannot be reached "
            f"from here ({why}). Pass a local model directory ({key}=/path/to/model, e.g. downloaded with "
            f"`huggingface-cli download {path} --local-dir DIR` where the hub is reachable), or {key}=tiny"
        )


SERVER_CHECK_TIMEOUT_S = 10.0


def served_models(url: str, timeout: float = SERVER_CHECK_TIMEOUT_S) -> list[str]:
    """The names ``url`` serves (ids and roots of its ``/v1/models``), once its ``/health`` answers
    200; a ``ConfigError`` naming the URL otherwise."""
    import httpx

    fix = f"start it, or fix {AR}.rollout.server_urls (or leave it empty to start servers here)"
    try:
        health = httpx.get(url.rstrip("/") + "/health", timeout=timeout)
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"the policy server {url} ({AR}.rollout.server_urls) does not answer: {type(exc).__name__}: {exc}; {fix}"
        ) from None
    if health.status_code != 200:
        raise ConfigError(
            f"the policy server {url} ({AR}.rollout.server_urls) answers GET /health with "
            f"{health.status_code}: {health.text[:200]}; {fix}"
        )
    try:
        cards = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"the policy server {url} ({AR}.rollout.server_urls) is up but GET /v1/models failed "
            f"({type(exc).__name__}: {exc}); is it an OpenAI-compatible server?"
        ) from None
    return [str(c[k]) for c in cards if isinstance(c, dict) for k in ("id", "root") if c.get(k)]


def check_servers(cfg: DictConfig) -> None:
    """Every server in ``rollout.server_urls`` is up and serves ``model.path`` (by name, root path
    or the path's last part, as a server started with ``--served-model-name`` reports it)."""
    model = str(cfg.actor_rollout_ref.model.path)
    wanted = {model, model.rstrip("/").rsplit("/", 1)[-1]}
    for url in cfg.actor_rollout_ref.rollout.server_urls or ():
        names = served_models(str(url))
        if not wanted & (set(names) | {n.rstrip("/").rsplit("/", 1)[-1] for n in names}):
            raise ConfigError(
                f"the policy server {url} ({AR}.rollout.server_urls) serves {sorted(set(names))}, not "
                f"{AR}.model.path={model}; point {AR}.rollout.server_urls at a server of that model, or "
                f"set {AR}.model.path to the model it serves"
            )


def check_reward_function(cfg: DictConfig) -> None:
    crf = cfg.custom_reward_function
    if not crf.path:
        return
    from agentgym.envs.rewards.by_source import load_compute_score

    try:
        load_compute_score(str(crf.path), str(crf.name or "compute_score"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def rows_env_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """The ``rows`` env's arguments from veRL's keys (custom reward function, prime's timeout)."""
    kwargs: dict[str, Any] = {}
    crf = cfg.custom_reward_function
    if crf.path:
        kwargs["custom_reward_function"] = {"path": str(crf.path), "name": str(crf.name or "compute_score")}
    if cfg.reward_model.reward_manager == "prime":
        kwargs["score_timeout"] = float((plain(cfg.reward_model.reward_kwargs) or {}).get("timeout", PRIME_TIMEOUT_S))
    return kwargs


def check_interactions(cfg: DictConfig) -> None:
    """veRL's interaction YAML builds (class paths resolved) before any work, not in an env worker later."""
    path = cfg.actor_rollout_ref.rollout.multi_turn.interaction_config_path
    if not path:
        return
    from agentgym.interactions.config import InteractionConfigError, load_interactions

    try:
        load_interactions(str(path))
    except (InteractionConfigError, OSError) as exc:
        raise ConfigError(f"{AR}.rollout.multi_turn.interaction_config_path={path}: {exc}") from None


def check_tool_rows(cfg: DictConfig, rows: list[dict[str, Any]]) -> None:
    """Rows made for veRL's tool rollouts (``extra_info.tools_kwargs``: per-row tool state and rewards, a
    system prompt naming those tools) are refused on the rows env, which offers agentgym's own tools only:
    trained as they are, the model would be told of tools that never answer and the tools' rewards lost."""
    if cfg.env.name != "rows":
        return
    for row in rows:
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        tools = extra.get("tools_kwargs") or {}
        if tools or extra.get("need_tools_kwargs"):
            names = ", ".join(map(str, tools)) or "(unnamed)"
            raise ConfigError(
                f"data.train_files has rows for veRL's tool rollouts (extra_info.tools_kwargs names {names}): "
                f"agentgym does not run veRL tool classes, so those tools and their rewards would be missing while "
                f"the prompt tells the model to call them. For GSM8K with tools use --env gsm8k_tool (calculator and "
                f"Python, scored by the final #### answer) with data.train_files of plain GSM8K rows; or write the "
                f"tool as an agentgym tool (docs/environments.md) and drop tools_kwargs from the rows"
            )


def choose_env(cfg: DictConfig, rows: list[dict[str, Any]]) -> str:
    """Set ``env.name`` (and its kwargs) for a veRL run over ``data.train_files``; returns why."""
    interaction = cfg.actor_rollout_ref.rollout.multi_turn.interaction_config_path
    if interaction:
        cfg.env.name = "gsm8k_interaction"
        cfg.env.kwargs = {
            **plain(cfg.env.kwargs),
            "interaction_config": str(interaction),
            "default_interaction": None,
            "system_prompt": None,
        }
        return f"interaction episodes ({AR}.rollout.multi_turn.interaction_config_path={interaction})"
    if rows and not all("prompt" in r for r in rows):
        if all("question" in r and "answer" in r for r in rows):
            cfg.env.name = "gsm8k"
            return "raw GSM8K rows (question, answer)"
        raise ConfigError(
            "data.train_files has rows without a 'prompt' column (veRL's format) and no --env was given: "
            "pass --env NAME for an env that reads them, or set data.prompt_key=COLUMN"
        )
    from agentgym.envs.rewards.by_source import has_rule

    sources = data_sources(rows)
    if not cfg.custom_reward_function.path:
        missing = [s for s in sources if not has_rule(s)]
        if missing:
            raise ConfigError(
                f"no built-in reward for data_source {', '.join(repr(m) for m in missing)} in data.train_files: pass "
                f"custom_reward_function.path=FILE.py (a compute_score(data_source, solution_str, ground_truth, "
                f"extra_info) function) or --env NAME"
            )
    cfg.env.name = "rows"
    scorer = (
        f"custom_reward_function {cfg.custom_reward_function.path}:{cfg.custom_reward_function.name}"
        if cfg.custom_reward_function.path
        else "the built-in rule"
    )
    return f"rows of data.train_files, data_source {', '.join(sources)} scored by {scorer}"


def preflight(cfg: DictConfig, agent: str | None = None, tokenizer: Any = None) -> Plan:
    """Run the checks (see the module docstring); may set ``env.name``, ``env.kwargs`` and the data
    paths in ``cfg``. Raises ``ConfigError`` saying what to do."""
    plan = Plan()
    check_files(cfg)
    check_device(cfg)
    check_engine(cfg)
    check_optional_packages(cfg)
    model_path = str(cfg.actor_rollout_ref.model.path)
    check_model(f"{AR}.model.path", model_path)
    if cfg.critic.enable and str(cfg.critic.model.path) != model_path:
        check_model("critic.model.path", str(cfg.critic.model.path))
    check_reward_function(cfg)
    check_servers(cfg)
    check_interactions(cfg)
    if cfg.data.train_files:
        chat = None
        if tokenizer is not None or model_path:
            from agentgym.model import load_tokenizer
            from agentgym.rollout.chat import ChatTokenizer

            chat = ChatTokenizer(
                tokenizer or load_tokenizer(model_path),
                template_kwargs=plain(cfg.data.apply_chat_template_kwargs) or None,
            )
        plan.prepared = prepare_data(cfg, chat)
        rows = plan.prepared["train"].rows
        plan.rows = len(rows)
        if not cfg.env.name and agent is None and not cfg.env.tags:
            plan.env_chosen = choose_env(cfg, rows)
        check_tool_rows(cfg, rows)
        if cfg.env.name == "rows":
            cfg.env.kwargs = {**plain(cfg.env.kwargs), **rows_env_kwargs(cfg)}
        batch = cfg.data.train_batch_size
        if plan.rows < batch:
            raise ConfigError(
                f"data.train_batch_size={batch} is larger than the {plan.rows} rows of data.train_files: a step takes "
                f"train_batch_size tasks; lower it (data.train_batch_size={plan.rows} or less, with "
                f"{AR}.actor.ppo_mini_batch_size at most that) or give more data"
            )
        for split in plan.prepared.values():
            plan.notes += [f"data ({split.split}): {note}" for note in split.notes]
        if cfg.data.val_batch_size is None and "val" in plan.prepared:  # veRL validates on every row
            cfg.data.val_batch_size = len(plan.prepared["val"].rows)
    if cfg.data.val_batch_size is None:
        cfg.data.val_batch_size = cfg.env.num_val_tasks
    if cfg.trainer.total_training_steps is not None:
        plan.steps = cfg.trainer.total_training_steps
    elif plan.rows is not None:
        plan.steps = plan.rows // cfg.data.train_batch_size * cfg.trainer.total_epochs
    return plan
