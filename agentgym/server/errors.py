"""OpenAI-shaped errors for the HTTP apps (the embedded server and the gateway).

Every error is ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status:
malformed JSON and invalid fields are a 400 (not FastAPI's 422), an unknown route a 404 that names
the API and every path it serves (read from the app's routes when it is asked, so routes added
later are listed, and win: this is an exception handler, not a catch-all route), a method the path
does not take a 405 naming the ones it does, and an unexpected exception a 500 that leaves the
server up.

``json_object`` is the one door for a request body: besides malformed JSON it answers 400 for
what Python's ``json`` accepts but nothing downstream should see — ``NaN``/``Infinity``, integers
over 4300 digits, nesting deeper than ``MAX_JSON_DEPTH``, and strings holding a lone surrogate
(``"\ud800"``: valid JSON, but not encodable, so tokenizers and templates fail on it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentgym.client.structured import ConstraintError
from agentgym.server.openai_types import ErrorInfo, ErrorResponse

ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
}


class APIError(Exception):
    """Answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


def validation_message(exc: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """``(message, param)`` for the first error pydantic reports, ``param`` as a dotted path."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, ConstraintError):
        return f"{cause.param}: {cause}", cause.param
    param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    return f"{param + ': ' if param else ''}{first.get('msg')}", param


MAX_JSON_DEPTH = 64
"""How deeply a request body may nest arrays and objects (OpenAI requests need about 8)."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; send a finite number")


def json_object(raw: bytes, required: bool = True, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """The request body as a JSON object, or an ``APIError`` 400 saying what is wrong with it."""
    if not raw.strip():
        if required:
            raise APIError(400, "the request needs a JSON body")
        return {}
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise APIError(400, f"the request body nests deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity, over-long integers
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_json_values(data, max_depth)
    return data


def check_json_values(data: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """An ``APIError`` 400 if ``data`` nests deeper than ``max_depth`` or holds a string that is not
    valid Unicode (a lone surrogate); walks the tree without recursion."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > max_depth:
            raise APIError(400, f"the request body nests deeper than {max_depth} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key)
                stack.append((item, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in value)


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(
            400,
            f"the request holds a string that is not valid Unicode ({exc.reason} at "
            f"character {exc.start}: a lone UTF-16 surrogate such as \\ud800); send UTF-8 text",
        ) from None


def validate(model: type, data: dict[str, Any]) -> Any:
    """``model.model_validate(data)``, a validation failure as an ``APIError`` 400 naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from None


DOCS = "docs/openai_api.md"
IGNORED_METHODS = frozenset({"HEAD", "OPTIONS"})


def served_routes(app: FastAPI) -> list[tuple[str, str]]:
    """``(methods, path)`` of every route ``app`` serves now, OpenAI's ``/v1`` ones first."""
    out = []
    for route in app.routes:
        methods = sorted(set(getattr(route, "methods", None) or ()) - IGNORED_METHODS)
        path = getattr(route, "path", None)
        if methods and path:
            out.append(("/".join(methods), path))
    return sorted(out, key=lambda r: "/v1/" not in r[1])


def path_methods(app: FastAPI, scope: dict[str, Any]) -> list[str]:
    """The methods ``app``'s routes take at this request's path (none: the path is not served)."""
    from starlette.routing import Match

    out: set[str] = set()
    for route in app.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            out |= set(getattr(route, "methods", None) or ()) - IGNORED_METHODS
    return sorted(out)


def unserved_message(
    what: str, method: str, path: str, routes: list[tuple[str, str]], takes: list[str], hint: str | None = None
) -> tuple[int, str, str]:
    """``(status, message, code)`` for a request to a path ``what`` does not serve (404) or with a method
    it does not take there (405; ``takes``: the ones it does): the message lists what ``what`` serves
    and where it is documented."""
    if takes:
        return 405, f"{what}: {path} takes {', '.join(takes)}, not {method} (see {DOCS})", "method_not_allowed"
    listing = ", ".join(f"{m} {p}" for m, p in routes)
    return (
        404,
        f"{what} does not serve {method} {path}. It serves: {listing}. "
        f"{hint + ' ' if hint else ''}See {DOCS} for what each takes.",
        "unknown_url",
    )


def install_error_handlers(
    app: FastAPI,
    internal_type: str = "internal_error",
    on_internal: Callable[[Exception], None] | None = None,
    what: str = "this agentgym server",
    unserved: Callable[[Request], tuple[int, str, str]] | None = None,
    shape: Callable[[str], Callable[..., JSONResponse] | None] | None = None,
) -> None:
    """Answer every error ``app`` raises in OpenAI's shape. ``on_internal`` sees each unexpected one.
    ``what`` names the API in the answer to an unknown path; ``unserved`` (request -> ``(status,
    message, code)``) replaces that answer (default: ``unserved_message`` over ``app``'s routes).
    ``shape`` (path -> an ``error_response`` or None) gives an unknown path under another API its
    own error shape (Anthropic's ``/v1/messages/...``: ``agentgym.server.anthropic_api.error_shape``)."""

    def no_route(request: Request) -> JSONResponse:
        if unserved is not None:
            status, message, code = unserved(request)
        else:
            takes = path_methods(app, request.scope)
            status, message, code = unserved_message(what, request.method, request.url.path, served_routes(app), takes)
        respond = (shape(request.url.path) if shape is not None else None) or error_response
        return respond(status, message, ERROR_TYPES.get(status, "invalid_request_error"), code=code)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if (exc.status_code, exc.detail) in ((404, "Not Found"), (405, "Method Not Allowed")):
            return no_route(request)  # the router's own: no route for this path (or method)
        return error_response(
            exc.status_code, str(exc.detail), ERROR_TYPES.get(exc.status_code, "invalid_request_error")
        )

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        if on_internal is not None:
            on_internal(exc)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", internal_type)
