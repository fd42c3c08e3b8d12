"""One TLS context for every httpx client agentgym makes."""

from __future__ import annotations

import functools
from typing import Any

import httpx


@functools.cache
def ssl_context() -> Any:
    """One TLS context for every httpx client agentgym makes: httpx builds a new one per client
    otherwise (~20 ms each; it was most of the time to push the tiny model's weights)."""
    return httpx.create_ssl_context()
