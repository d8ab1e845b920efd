"""Every error a model request can meet, as the answer it gets: one table for both paths.

A request reaches a model endpoint either through the fast path (`fastpath`, the common
case) or through FastAPI (`app`: bodies the fast path does not take on itself). Both turn an
exception into status, body and headers here, so the same error gets the same answer
whichever path it took:

401/404/500 ``HTTPException`` (FastAPI's 400 for a body it cannot parse is a 422, as for
any body that is not JSON) · 413/429 `Refused` (with Retry-After on 429) · 422
`InputError` · 429 `QueueFull` · 503 `BatcherClosed` (shutting down) and `ModelUnavailable`
· 504 `Timeout` · 499 `ClientGone` (only ever seen in metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.exceptions import HTTPException

from shoestring.serve.batcher import BatcherClosed, QueueFull
from shoestring.inference.engine import InputError
from shoestring.serve.metrics import ServeMetrics
from shoestring.serve.routing import ModelUnavailable
from shoestring.serve.security import Refused

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
