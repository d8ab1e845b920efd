"""Every error a model request can meet, as the answer it gets: one table for both paths.

A request reaches a model endpoint either through the fast path (`fastpath`, the common
case) or through FastAPI (`app`: bodies the fast path does not take on itself). Both turn an
exception into status, body and headers here, so the same error gets the same answer
whichever path it took:

401/404/500 ``HTTPException`` (FastAPI's 400 for a body it cannot parse is a 422, as for
any body that is not JSON) · 413/429 `Refused` (with Retry-After on 429) · 422
`InputError` · 429 `QueueFull` · 503 `BatcherClosed` (shutting down) and `ModelUnavailable`
· 504 `Timeout` · 499 `ClientGone` (only ever seen in metrics).

A route that speaks another protocol answers its errors in that protocol's shape: OpenAI's
``/v1/embeddings`` as ``{"error": {"message", "type", "param", "code"}}`` (`openai_error`).
The fast path applies the shape to the answer it builds; `ShapedErrors` applies it to
whatever the ASGI layers answer on that route (their 401, 408, 413, 429, FastAPI's 422), so
both paths give the same answer there too. (``/v1/rerank`` answers in the ``{"detail": ...}``
shape Jina's API uses, which is the server's own.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


from starlette.exceptions import HTTPException

from shoestring.serve.batcher import BatcherClosed, QueueFull
from shoestring.serve.encoding import dumps
from shoestring.inference.engine import InputError
from shoestring.serve.prometheus import ServeMetrics
from shoestring.serve.routing import ModelUnavailable
from shoestring.serve.security import ASGIApp, Message, Receive, Refused, Scope, Send

CLIENT_CLOSED = 499  # nginx's code for "client closed the request"; only ever seen in metrics


class Timeout(Exception):
    """No answer within ``--request-timeout``."""


class ClientGone(Exception):
    """The client disconnected while its request waited."""


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def refusal_answer(e: Refused) -> Answer:
    return Answer(e.status, e.body(), {k.decode(): v.decode() for k, v in e.headers()})


def not_json(cause: BaseException) -> Answer:
    """422 for a body Python's JSON parser gave up on (FastAPI's own answer is 400): nested
    deeper than the parser recurses (RecursionError), or bytes that are not text."""
    why = ("it is nested too deeply" if isinstance(cause, RecursionError)
           else f"{type(cause).__name__}: {cause}")
    return Answer(422, {"detail": [{"type": "json_invalid", "loc": ["body"],
                                    "msg": f"the body is not JSON this server can read: {why}"}]})


def error_answer(e: BaseException, metrics: ServeMetrics, timeout_s: float) -> Answer | None:
    """The answer to ``e`` (None: not a request error; a bug, answered 500 by the server)."""
    if isinstance(e, InputError):
        return Answer(422, {"detail": [{"type": "value_error", "loc": list(e.loc),
                                        "msg": e.message}]})
    if isinstance(e, Refused):
        return refusal_answer(e)
    if isinstance(e, QueueFull):
        metrics.refused.labels(limit="max_queue").inc()
        return refusal_answer(Refused(429, f"{e}; retry after 1 s", "max_queue", e.capacity))
    if isinstance(e, HTTPException):
        if e.status_code == 400 and e.__cause__ is not None:  # FastAPI could not parse the body
            return not_json(e.__cause__)
        return Answer(e.status_code, {"detail": e.detail}, dict(e.headers or {}))
    if isinstance(e, ModelUnavailable):
        return Answer(503, {"detail": e.message, "model": e.model})
    if isinstance(e, BatcherClosed):
        return Answer(503, {"detail": "the server is shutting down; retry on another replica"},
                      {"Retry-After": "1", "Connection": "close"})
    if isinstance(e, Timeout):
        return Answer(504, {"detail": f"no answer within {timeout_s:g} s (--request-timeout); "
                            "the server is overloaded"})
    if isinstance(e, ClientGone):
        return Answer(CLIENT_CLOSED, {"detail": "client disconnected"})
    return None


# --- other protocols' error shapes -------------------------------------------------------------

Shape = Callable[[int, Any], "tuple[int, Any]"]  # (status, native body) → (status, body)

# What each refused limit is in OpenAI's shape: (the request field it is about, or None).
_LIMIT_PARAMS = {"max_client_batch": "input", "max_body_bytes": None, "body_timeout": None,
                 "max_concurrent_requests": None, "max_queue": "input"}
_OPENAI_FIELDS = {"inputs": "input", "input_ids": "input"}  # /v1/embed's names → OpenAI's


def _where(loc: list) -> str:
    """A validation error's place as OpenAI names it: ``input[3]``, ``dimensions``."""
    parts = [p for p in loc if p != "body"]
    if not parts or isinstance(parts[0], int):  # the body itself (an int: where JSON broke)
        return ""
    out = _OPENAI_FIELDS.get(str(parts[0]), str(parts[0]))
    for p in parts[1:]:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def openai_error(status: int, body: Any) -> tuple[int, dict]:
    """A native error answer in OpenAI's shape: ``{"error": {"message", "type", "param",
    "code"}}``. A bad request (the server's own 422) is OpenAI's 400; ``param`` is the
    request field at fault (``input``, ``model``, ``dimensions``), ``code`` what OpenAI's
    clients switch on: ``model_not_found`` (404), ``invalid_api_key`` (401), or the refused
    limit's name (413/429, as the native body's ``limit``)."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    param = code = None
    if isinstance(detail, list):  # validation errors, each with loc and msg
        places = [_where(list(e.get("loc") or ())) for e in detail]
        message = "; ".join(f"{w}: {e.get('msg')}" if w else str(e.get("msg"))
                            for w, e in zip(places, detail))
        param = next((w.split("[")[0] for w in places if w), None)
        status = 400 if status == 422 else status
    else:
        message = str(detail)
        if isinstance(body, dict) and "limit" in body:
            code, param = body["limit"], _LIMIT_PARAMS.get(body["limit"])
        elif status == 401:
            code = "invalid_api_key"
        elif status == 404:
            code, param = "model_not_found", "model"
        elif isinstance(body, dict) and "model" in body:
            code, param = "model_unavailable", "model"
        elif status == 504:
            code = "timeout"
    kind = ("server_error" if status >= 500 else "rate_limit_error" if status == 429
            else "invalid_request_error")
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ShapedErrors:
    """ASGI middleware: an error answer (status ≥ 400) on a route in ``shapes`` is rewritten
    in that route's protocol shape, whichever layer answered it. Only those routes' errors
    are held and rewritten; every other answer passes as it was sent."""

    def __init__(self, app: ASGIApp, shapes: dict[str, Shape]) -> None:
        self.app, self.shapes = app, shapes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shape = self.shapes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if shape is None:
            return await self.app(scope, receive, send)
        start: Message | None = None
        chunks: list[bytes] = []

        async def shaped_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            status, content = shape(start["status"], _read(b"".join(chunks)))
            data = _write(content)
            headers = [(k, v) for k, v in start.get("headers", ())
                       if k.lower() not in (b"content-length", b"content-type")]
            await send({"type": "http.response.start", "status": status, "headers": [
                *headers, (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})

        await self.app(scope, receive, shaped_send)


def _read(data: bytes) -> Any:
    """An error body as sent: JSON (the standard library's parser: an escaped lone surrogate
    in an echoed input reads back), or its text."""
    try:
        return json.loads(data)
    except ValueError:
        return {"detail": data.decode("utf-8", "replace")}


def _write(content: Any) -> bytes:
    try:
        return dumps(content)
    except TypeError:  # a lone surrogate: not UTF-8, so written escaped
        return json.dumps(content, separators=(",", ":")).encode("ascii")
