"""What the embedded server takes from a request, and who may steer it.

``ServerLimits`` holds the bounds (``agentgym serve`` flags of the same names):

* ``max_body_bytes``: the largest JSON body (413 beyond it; weight uploads to
  ``/update_weights_from_tensor`` are bounded by ``max_weights_bytes`` instead);
* ``max_prompt_chars``: the longest prompt text, before the chat template and after it, checked
  before anything is tokenized (default: 32 characters per token of the context, far more than
  any prompt that fits; tokenizing 10 MB of text took the tiny model's tokenizer 36 s of CPU);
* ``allow_client_chat_template``: whether a request may bring its own Jinja template in
  ``chat_template_kwargs.chat_template`` (off: rendering a client's template is running a
  client's program);
* ``max_pause_s``: a ``/pause_generation`` nobody resumes ends by itself after this long.

Control endpoints (pause, resume, weight updates) need ``Authorization: Bearer <admin key>``
and a JSON body (``Content-Type: application/json``; a safetensors upload:
``application/octet-stream``), so no web page can post to them: a browser sends neither that
header nor those content types across origins without asking first.
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from agentgym.server.errors import APIError

ADMIN_KEY_ENV = "AGENTGYM_SERVER_ADMIN_KEY"
"""The environment variable a policy server (and a client of one) reads its admin key from."""


@dataclass
class ServerLimits:
    """The embedded server's request bounds (see the module docstring)."""

    max_body_bytes: int = 16 << 20
    max_weights_bytes: int | None = None  # None: no bound on an admin's safetensors upload
    max_prompt_chars: int | None = None  # None: 32 characters per token of max_model_len
    allow_client_chat_template: bool = False
    max_pause_s: float = 300.0

    def prompt_chars(self, max_model_len: int) -> int:
        return int(self.max_prompt_chars) if self.max_prompt_chars else 32 * int(max_model_len)


def new_admin_key() -> str:
    return f"sk-agentgym-admin-{secrets.token_urlsafe(24)}"


def admin_key_from_env() -> str | None:
    return os.environ.get(ADMIN_KEY_ENV) or None


def bearer(request: Request) -> str | None:
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def require_admin(request: Request, admin_key: str, content_type: str = "application/json") -> None:
    """401 without the admin key; 415 unless the body is declared as ``content_type``."""
    given = bearer(request)
    if given is None or not hmac.compare_digest(given.encode(), admin_key.encode()):
        raise APIError(
            401,
            "this control endpoint needs the server's admin key (Authorization: Bearer <key>); "
            f"`agentgym serve` prints it at start, or set it with --admin-key / ${ADMIN_KEY_ENV}",
            "authentication_error",
            code="invalid_api_key",
        )
    declared = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if declared != content_type:
        raise APIError(
            415,
            f"send the body as Content-Type: {content_type} (got {declared or 'none'})",
            code="unsupported_media_type",
        )


async def read_body(request: Request, max_bytes: int | None) -> bytes:
    """The whole body, or a 413 as soon as it is known to be over ``max_bytes``."""
    if max_bytes is None:
        return await request.body()
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(
            413,
            f"the request body is {declared} bytes; this server takes at most {max_bytes} (--max-body-bytes)",
            code="request_too_large",
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise APIError(
                413, f"the request body is over {max_bytes} bytes (--max-body-bytes)", code="request_too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def text_chars(value: Any) -> int:
    """How many characters the strings in a JSON value hold, together (keys included)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total
