"""The fake vLLM's ``vllm.platforms.current_platform``: its ``device_type`` is ``$FAKE_VLLM_DEVICE``
(default ``cuda``), what ``agentgym.server.launchers.engine_device`` asks."""

import os


class _Platform:
    device_type = os.environ.get("FAKE_VLLM_DEVICE", "cuda")


current_platform = _Platform()
