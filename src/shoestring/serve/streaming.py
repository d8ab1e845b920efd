"""Server-sent events for ``/v1/generate`` with ``"stream": true``.

A streamed generation is one batcher job of its own (its key is unique, so it never shares
a call). The engine hands each new token to a `TokenStream` (its `inference.tokens.TokenSink`)
on the batcher's thread; the stream passes it to the event loop, where the response writes it
as an SSE ``data:`` line. When the client disconnects, Starlette cancels the response; the stream is stopped, and the
engine's next token callback sees that and ends generation there, so a gone client costs at
most one more decoding step.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

_ids = itertools.count()


class TokenStream:
    """Events of one streamed generation, from the worker thread to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.id = next(_ids)
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self._stopped = threading.Event()

    def push(self, event: dict[str, Any]) -> bool:
        """Send one event (worker thread); False once the client has gone: stop generating."""
        if self._stopped.is_set():
            return False
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop closed
            return False
        return True

    def stop(self) -> None:
        self._stopped.set()


def sse(data: Any) -> bytes:
    """One server-sent event carrying ``data`` as JSON (or a bare string like ``[DONE]``)."""
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {body}\n\n".encode()


async def events(stream: TokenStream, result: asyncio.Future) -> AsyncIterator[bytes]:
    """The SSE body: a ``token`` event per token, then the final result, then ``[DONE]``."""
    try:
        while True:
            getter = asyncio.ensure_future(stream.queue.get())
            done, _ = await asyncio.wait({getter, result}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield sse(getter.result())
                continue
            getter.cancel()
            while not stream.queue.empty():
                yield sse(stream.queue.get_nowait())
            exc = result.exception()
            if exc is not None:
                yield sse({"error": f"{type(exc).__name__}: {exc}"})
            else:
                yield sse({"done": True, **result.result()})
            yield sse("[DONE]")
            return
    finally:
        stream.stop()  # a disconnect cancels this generator: generation stops at the next token
