"""What keeps a server safe to run: an API key check and the limits that refuse work.

Every refusal for a limit answers with a JSON body naming the limit and its value
(``{"detail": ..., "limit": "max_body_bytes", "value": 1048576}``), as TEI does: 413 for a
body over ``--max-body-bytes`` or more inputs than ``--max-client-batch``, 429 with
``Retry-After`` for a server at ``--max-concurrent-requests`` (or a full queue).

The key is compared in constant time (``hmac.compare_digest`` on fixed-length digests, so not
even its length leaks through timing). The body limit is an ASGI middleware in front of
everything else, so an oversized body is refused before it is parsed (413), whether it
declares its length or arrives chunked.
"""

from __future__ import annotations

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
        given = key
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


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` get 413 before the app sees them.

    A declared ``Content-Length`` over the limit is refused at once, unread. Otherwise the body
    is read here (stopping as soon as it passes the limit) and replayed to the app; later
    ``receive`` calls go to the server, so disconnects are still seen.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> dict:
        return {"detail": f"request body is over this server's limit of {self.max_bytes} bytes "
                "(--max-body-bytes): send fewer or shorter inputs per request",
                "limit": "max_body_bytes", "value": self.max_bytes}

    async def _refuse(self, receive: Receive, send: Send, read: int = 0) -> None:
        """413. The unread body is read and dropped first (up to ``DRAIN_FACTOR`` times the
        limit, nothing kept): closing on a client still sending resets the connection, and
        the client would see a reset instead of the 413 that says why."""
        while read <= DRAIN_FACTOR * self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            read += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await send_json(send, 413, self._too_large(), [(b"connection", b"close")])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                return await send_json(send, 400, {"detail": "Content-Length is not a number"})
            if declared > self.max_bytes:
                return await self._refuse(receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away mid-body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    return await self._refuse(receive, send, size)
                return await send_json(send, 413, self._too_large(), [(b"connection", b"close")])
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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


class ConcurrencyLimit:
    """ASGI middleware: beyond ``gate.max_requests`` POSTs under ``/v1/`` at once, answer 429
    with ``Retry-After`` at once, before the body is read (TEI's overload answer)."""

    def __init__(self, app: ASGIApp, gate: RequestGate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or scope.get("method") != "POST" or not path.startswith("/v1/"):
            return await self.app(scope, receive, send)
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
