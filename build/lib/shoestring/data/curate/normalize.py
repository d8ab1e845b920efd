"""Normalization and length limits: the first blocks, so every later rule sees clean text."""

from __future__ import annotations

from dataclasses import replace

from shoestring.data.clean import clean_text
from shoestring.data.curate.blocks import Block, Drop
from shoestring.data.sources import Document


class Normalize(Block):
    """NFKC, invisible and control characters removed, whitespace collapsed (``clean_text``).

    Never drops: an empty result is left to ``Length``, which names the reason.
    """

    name = "normalize"

    def apply(self, doc: Document) -> Document | Drop:
        text = clean_text(doc.text)
        return doc if text == doc.text else replace(doc, text=text)


class Length(Block):
    """Drop documents shorter than ``min_chars`` or longer than ``max_chars`` characters."""

    name = "length"

    def __init__(
        self, min_chars: int = 1, max_chars: int | None = None, keep_examples: int = 0
    ) -> None:
        super().__init__(keep_examples)
        self.min_chars = min_chars
        self.max_chars = max_chars

    def apply(self, doc: Document) -> Document | Drop:
        n = len(doc.text)
        if n < self.min_chars:
            return Drop("too_short", f"{n} characters < data.min_chars={self.min_chars}")
        if self.max_chars is not None and n > self.max_chars:
            return Drop("too_long", f"{n:,} characters > curate.max_chars={self.max_chars:,}")
        return doc
