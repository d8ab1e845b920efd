"""A generation's tokens as they come: the text each adds, and a `TokenSink` to push them to
(the server's is `serve.streaming.TokenStream`), so the engine needs nothing of HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class TokenSink(Protocol):
    """Where a streamed generation's events go, one per new token."""

    def push(self, event: dict[str, Any]) -> bool:
        """Send one event; False once nobody reads any more: stop generating."""
        ...


class TextDelta:
    """The text each new token adds, by decoding the whole generation so far (a token can
    change how the bytes before it decode; text is only sent once it is stable)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.sent = ""

    def add(self, token: int) -> str:
        """The text that ``token`` adds to what was sent ("" while it is not yet stable)."""
        self.ids.append(token)
        text = self.decode(self.ids)
        if not text.startswith(self.sent) or text.endswith("\ufffd"):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta
