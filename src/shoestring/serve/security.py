"""What keeps a server safe to run: an API key check and the limits that refuse work.

Every refusal for a limit answers with a JSON body naming the limit and its value
(``{"detail": ..., "limit": "max_body_bytes", "value": 1048576}``), as TEI does: 413 for a
body over ``--max-body-bytes`` or more inputs than ``--max-client-batch``, 429 with
``Retry-After`` for a server at ``--max-concurrent-requests`` (or a full queue), 408 for a
body that did not arrive within ``--body-timeout``.

The key is compared in constant time (``hmac.compare_digest`` on fixed-length digests, so not
even its length leaks through timing), on an API request's headers before it takes a
concurrency slot (`Admission`). The body limit is an ASGI middleware in front of the app, so
an oversized body is refused before it is parsed (413), whether it declares its length or
arrives chunked, and a body that does not arrive in time is refused too (408).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DRAIN_FACTOR = 16  # a refused body is read (and dropped) up to this many times the limit
CLOSE = (b"connection", b"close")
MISSING_KEY = "missing or wrong API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


class ApiKey:
    """Checks ``Authorization: Bearer KEY`` or ``X-API-Key: KEY`` against the server's key."""

    def __init__(self, key: str) -> None:
        self._digest = _digest(key)

    def check(self, headers: Any) -> bool:
        """``headers``: a mapping with ``get`` (Starlette's ``Headers``)."""
        return self._matches(headers.get("x-api-key"), headers.get("authorization", ""))

    def check_raw(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """The same check on an ASGI scope's raw header list (lower-case names)."""
        key, auth = None, ""
        for name, value in headers:
            if name == b"x-api-key" and key is None:
                key = value.decode("latin-1")
            elif name == b"authorization" and not auth:
                auth = value.decode("latin-1")
        return self._matches(key, auth)

    def _matches(self, key: str | None, auth: str) -> bool:
        # An empty X-API-Key is no key: it must not hide a valid Authorization: Bearer.
        given = (key or "").strip() or None
        if given is None:
            scheme, _, token = auth.partition(" ")
            given = token.strip() if scheme.lower() == "bearer" else None
        if not given:
            return False
        return hmac.compare_digest(_digest(given), self._digest)


async def send_json(send: Send, status: int, body: dict,
                    headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that gives ``body`` first, then whatever the server sends (disconnects)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class _BodyWait:
    """The deadline of one body being read: when it passes, the reading task is cancelled
    (what ``asyncio.timeout`` does, which needs Python 3.11). One timer per request, and none
    left once the body is in."""

    __slots__ = ("task", "timer", "expired")

    def __init__(self, timeout_s: float) -> None:
        self.task, self.expired = asyncio.current_task(), False
        self.timer = asyncio.get_running_loop().call_later(timeout_s, self.expire)

    def expire(self) -> None:
        if not self.expired and self.task is not None:
            self.expired = True
            self.timer.cancel()
            self.task.cancel()

    def caught(self) -> bool:
        """After a CancelledError: whether it was this deadline's (else it is re-raised)."""
        if self.expired and hasattr(self.task, "uncancel"):
            self.task.uncancel()
        return self.expired


class BodyLimit:
    """ASGI middleware: the whole body is read here, within limits, before the app sees it.

    * A declared ``Content-Length`` over ``max_bytes`` gets 413 at once, unread (a client that
      sends headers and no body is not waited for).
    * A body that does not arrive within ``timeout_s`` of its headers gets 408 (nginx's
      ``client_body_timeout``): a client that sends headers and then its body slowly, or not
      at all, holds its request (and its `RequestGate` slot) that long at most.
    * A chunked body that passes the limit gets 413 as soon as it does.

    Every refusal closes the connection: the rest of the body was not read, so the next
    bytes on it would not be a request. The body read is replayed to the app, and later
    ``receive`` calls go to the server, so disconnects are still seen.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 15.0) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s
        self._waiting: set[_BodyWait] = set()

    def refusal(self, status: int) -> dict:
        if status == 408:
            return {"detail": f"the request body did not arrive within {self.timeout_s:g} s "
                    "(--body-timeout): send the body with its headers",
                    "limit": "body_timeout", "value": self.timeout_s}
        return {"detail": f"request body is over this server's limit of {self.max_bytes} bytes "
                "(--max-body-bytes): send fewer or shorter inputs per request",
                "limit": "max_body_bytes", "value": self.max_bytes}

    def stop_waiting(self) -> None:
        """On shutdown: every body still awaited gets its 408 now, so the drain does not wait
        on slow clients."""
        for wait in list(self._waiting):
            wait.expire()

    async def _read(self, receive: Receive) -> bytes | int | None:
        """The body; or 413 (over the limit); or None (the client went away mid-body).

        A chunked body over the limit is read on (and dropped, up to ``DRAIN_FACTOR`` times the
        limit) before the 413: that client is still sending, and closing on unread data resets
        the connection, so the client would see a reset instead of the 413 that says why."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            more = message.get("more_body", False)
            if size > self.max_bytes:
                if not more or size > DRAIN_FACTOR * self.max_bytes:
                    return 413
                continue
            chunks.append(chunk)
            if not more:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                return await send_json(send, 400, {"detail": "Content-Length is not a number"},
                                       [CLOSE])
            if declared > self.max_bytes:
                return await send_json(send, 413, self.refusal(413), [CLOSE])
        wait = _BodyWait(self.timeout_s)
        self._waiting.add(wait)
        try:
            body = await self._read(receive)
        except asyncio.CancelledError:
            if not wait.caught():
                raise
            body = 408
        finally:
            wait.timer.cancel()
            self._waiting.discard(wait)
        if isinstance(body, bytes):
            await self.app(scope, replay(body, receive), send)
        elif body is not None:
            await send_json(send, body, self.refusal(body), [CLOSE])


class Refused(Exception):
    """A request refused for a limit: its status, and the limit's name and value."""

    def __init__(self, status: int, message: str, limit: str, value: int) -> None:
        super().__init__(message)
        self.status, self.message, self.limit, self.value = status, message, limit, value

    def body(self) -> dict:
        return {"detail": self.message, "limit": self.limit, "value": self.value}

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", b"1")] if self.status == 429 else []


class RequestGate:
    """How many API requests are being handled, against ``--max-concurrent-requests``."""

    def __init__(self, max_requests: int, on_refuse: Callable[[], None] = lambda: None) -> None:
        self.max_requests, self.active, self.on_refuse = max_requests, 0, on_refuse


class Admission:
    """ASGI middleware in front of every API request (a POST under ``/v1/``): the API key
    first, then a `RequestGate` slot, both before the body is read.

    A missing or wrong key is answered 401 at once, so a client without the key never holds a
    slot; beyond ``gate.max_requests`` requests at once the answer is 429 with ``Retry-After``
    (TEI's overload answer). A slot is given back however its request ends: answered,
    refused, timed out (`BodyLimit`'s 408), cancelled or failed."""

    def __init__(self, app: ASGIApp, gate: RequestGate, api_key: ApiKey | None = None) -> None:
        self.app, self.gate, self.api_key = app, gate, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or scope.get("method") != "POST" or not path.startswith("/v1/"):
            return await self.app(scope, receive, send)
        if self.api_key is not None and not self.api_key.check_raw(scope["headers"]):
            return await send_json(send, 401, {"detail": MISSING_KEY},
                                   [(b"www-authenticate", b"Bearer"), CLOSE])
        gate = self.gate
        if gate.active >= gate.max_requests:
            gate.on_refuse()
            e = Refused(429, f"the server is handling its limit of {gate.max_requests} requests "
                        "(--max-concurrent-requests); retry after 1 s", "max_concurrent_requests",
                        gate.max_requests)
            return await send_json(send, 429, e.body(), e.headers())
        gate.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            gate.active -= 1
