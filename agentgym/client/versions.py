"""The weight version each policy server holds, as far as this process knows.

A push that succeeds records the version it loaded (the weight adapters in
``agentgym.client.weights``, ``PolicyClient.update_weights_from_disk``, the gateway when it
resumes with a version); ``PolicyClient`` reports it for every sample from that server whose
response does not carry one. vLLM's completions carry none, so without this every vLLM
sample would say version 0 however often the weights moved; the embedded server and SGLang
report their own version, which wins. Servers are told apart by base URL.
"""

from __future__ import annotations

import threading

_versions: dict[str, int] = {}
_lock = threading.Lock()


def _key(url: str) -> str:
    return url.rstrip("/")


def record_weight_version(url: str, version: int) -> None:
    """The server at ``url`` now holds weights ``version`` (call once it has loaded them)."""
    with _lock:
        _versions[_key(url)] = int(version)


def known_weight_version(url: str, default: int = 0) -> int:
    """The version last recorded for the server at ``url`` (``default`` if none was)."""
    return _versions.get(_key(url), default)
