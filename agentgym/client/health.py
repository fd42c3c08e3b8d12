"""Waiting for a server to come up: the one ``/health`` polling loop."""

from __future__ import annotations

import time
from typing import Any


def wait_healthy(url: str, give_up: Any = lambda: False, timeout: float = 120.0, interval: float = 0.1) -> bool:
    """Poll ``url/health`` until it answers 200 (True), or ``give_up()`` is true or ``timeout``
    seconds pass (False: the caller says which went wrong, and how)."""
    import httpx

    deadline = time.monotonic() + timeout
    while not give_up():
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return False
