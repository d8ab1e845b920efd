"""The model endpoints' common case as plain ASGI, in front of FastAPI.

On a GPU the event loop's CPU per request is what bounds requests per second, and most of
it went to FastAPI's per-request machinery (its middleware stack, routing, dependency
solving, parsing the body to Python objects and validating them in a second pass, encoding
the answer) and to tokenizing: bench/serve_cpu.py measured the event loop at 0.75 ms per
``/v1/embed`` request before this path and 0.18 ms with it. So a POST to a model endpoint is
answered here: the body read once, parsed and validated in one pass by pydantic's Rust JSON parser
(``model_validate_json``) against the same request model FastAPI documents, then the same
`handlers.Api` method FastAPI's route would call, and the answer written with orjson
(`encoding`). The API key was checked before (`security.Admission`: 401 before a request
takes a slot or its body is read), and the body was read within its limits (`BodyLimit`).

Whatever this path does not take on itself goes to FastAPI unchanged, with the body replayed:
a body that does not validate (FastAPI answers its 422, naming the field, in its own
format), and streamed generation. Errors after
validation are answered from the table both paths share (`answers`). The stages of every
request it answers are timed (`stages`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from shoestring.serve.answers import error_answer
from shoestring.serve.encoding import dumps
from shoestring.serve.handlers import Api
from shoestring.serve.security import ASGIApp, Receive, Scope, Send, replay
from shoestring.inference.stages import START, Laps

Handler = Callable[[Any, Receive, Laps], Awaitable[Any]]
_JSON = (b"content-type", b"application/json")


@dataclass(frozen=True)
class Route:
    """A model endpoint: its task (the stage metrics' label), body model and handler, and
    which valid bodies FastAPI answers instead (a streamed generation)."""

    task: str
    model: type[BaseModel]
    handle: Handler
    hand_on: Callable[[Any], bool] | None = None


class FastPath:
    """ASGI middleware answering POSTs to ``routes`` itself; everything else goes to ``app``."""

    def __init__(self, app: ASGIApp, api: Api, routes: dict[str, Route]) -> None:
        self.app, self.api, self.routes = app, api, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        cpu = time.thread_time()  # the body is replayed by BodyLimit: no wait before parsing
        body = await _read_body(receive)
        if body is None:  # the client went away before its body arrived
            return
        api = self.api
        try:  # the API key was checked in front (`security.Admission`)
            request = route.model.model_validate_json(body)
        except ValidationError:
            request = None
        if request is None or (route.hand_on is not None and route.hand_on(request)):
            return await self.app(scope, replay(body, receive), send)
        laps = Laps(api.metrics.stages, route.task, scope.get(START), cpu)
        laps.lap("parse")
        headers: dict[str, str] = {}
        try:
            content, status = await route.handle(request, receive, laps), 200
        except Exception as e:
            answer = error_answer(e, api.metrics, api.settings.request_timeout_s)
            if answer is None:
                raise
            content, status, headers = answer.body, answer.status, answer.headers
            laps.skip()
        data = dumps(content)
        laps.lap("serialize")
        raw = [_JSON, (b"content-length", str(len(data)).encode())]
        raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": data})
        laps.lap("send")


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body (one message when `security.BodyLimit` is in front)."""
    message = await receive()
    if message["type"] != "http.request":
        return None
    if not message.get("more_body", False):
        return message.get("body", b"")
    chunks = [message.get("body", b"")]
    while message.get("more_body", False):
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
    return b"".join(chunks)
