"""vLLM and SGLang as policy servers: their command lines, start-up, and weight-update adapters."""

from __future__ import annotations

from typing import Any

import httpx


class EmbeddedWeights:
    """Weight updates on agentgym's embedded server (SGLang's route names)."""

    def __init__(self, timeout: float = 600.0) -> None:
        self.timeout = timeout

    def update_from_disk(self, url: str, path: str, version: int) -> dict[str, Any]:
        r = httpx.post(url + "/update_weights_from_disk", json={"model_path": path, "weight_version": str(version)},
                       timeout=self.timeout)
        body = r.json()
        if r.status_code >= 400 or not body.get("success", False):
            raise RuntimeError(f"{url}/update_weights_from_disk failed ({r.status_code}): {body}")
        return body
