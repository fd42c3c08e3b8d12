"""An OpenAI-compatible HTTP endpoint that reward sources call: a judge's chat completions, a
teacher's prompt logprobs.

``Endpoint.post`` keeps at most ``concurrency`` requests in flight, gives each ``timeout`` seconds, and
retries ``max_retries`` times (with backoff) when a request times out, cannot connect, or is answered
429 or 5xx; then it raises ``EndpointError`` saying what failed where. Any other 4xx is the endpoint
refusing the request and is raised at once (retrying cannot help). The key, when there is one, is
read from an environment variable and sent as ``Authorization: Bearer``; it never enters a config.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any
from urllib.parse import urlsplit

from agentgym.config import ConfigError


class EndpointError(RuntimeError):
    """No usable answer after the retries (``status``: the last HTTP status; None: no answer at all)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def api_key_from_env(variable: str | None, what: str) -> str | None:
    """The key in environment variable ``variable`` (None: no key)."""
    if not variable:
        return None
    key = os.environ.get(str(variable))
    if not key:
        raise ConfigError(
            f"{what}.api_key_env={variable} names an environment variable that is not set; "
            f"export {variable}=<key> (or set {what}.api_key_env=null for an endpoint without a key)"
        )
    return key


def v1_url(base_url: str) -> str:
    """``http://host:port`` -> ``http://host:port/v1``; a URL with a path is kept as given."""
    url = str(base_url).rstrip("/")
    return url if urlsplit(url).path not in ("", "/") else url + "/v1"


class Endpoint:
    """Calls to one OpenAI-compatible base URL (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        concurrency: int = 8,
        backoff: float = 0.5,
    ) -> None:
        import httpx

        self.base_url = str(base_url).rstrip("/")
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.timeout = float(timeout)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.timeout),
            limits=httpx.Limits(max_connections=max(1, int(concurrency))),
        )
        self.slots = asyncio.Semaphore(max(1, int(concurrency)))
        self.requests = 0  # requests sent, retries included

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", path, payload)

    async def get(self, path: str) -> dict[str, Any]:
        return await self._request("GET", path, None)

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        import httpx

        url = f"{self.base_url}/{path.lstrip('/')}"
        last, status = "", None
        for attempt in range(self.max_retries + 1):
            async with self.slots:
                self.requests += 1
                try:
                    answer = await self.http.request(method, url, json=payload)
                except httpx.TimeoutException:
                    last, status = f"no answer within {self.timeout:g} s", None
                except httpx.TransportError as exc:
                    last, status = f"{type(exc).__name__}: {exc}", None
                else:
                    if answer.status_code < 400:
                        try:
                            return answer.json()
                        except ValueError:
                            last, status = f"HTTP {answer.status_code} with a body that is not JSON", answer.status_code
                    elif answer.status_code < 500 and answer.status_code != 429:
                        raise EndpointError(
                            f"{url} refused the request ({answer.status_code}): {answer.text[:300]}", answer.status_code
                        )
                    else:
                        last, status = f"HTTP {answer.status_code}: {answer.text[:200]}", answer.status_code
            if attempt < self.max_retries:
                await asyncio.sleep(min(self.backoff * 2**attempt, 10.0) * (0.5 + random.random()))
        raise EndpointError(f"{url}: no usable answer after {self.max_retries + 1} attempts; last: {last}", status)

    async def first_model(self) -> str:
        """The first model the endpoint lists in ``/models``."""
        cards = (await self.get("models")).get("data") or []
        names = [c.get("id") for c in cards if isinstance(c, dict) and c.get("id")]
        if not names:
            raise EndpointError(f"{self.base_url}/models lists no model; name one (the judge or teacher's model key)")
        return str(names[0])

    async def aclose(self) -> None:
        await self.http.aclose()
