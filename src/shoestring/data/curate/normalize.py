"""Normalization and length limits: the first blocks, so every later rule sees clean text."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from shoestring.data.clean import clean_text
from shoestring.data.curate.blocks import Block, Drop
from shoestring.data.sources import Document
from shoestring.data.workers import batched, clean_texts

CLEAN_BATCH = 256


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


class Clean(Block):
    """Block ``clean``, prep's first: `clean_text` and ``data.min_chars`` in one pass (what
    ``Normalize`` and ``Length`` do for ``Curator.from_config(clean=True)``). Batches of texts
    are cleaned by ``map`` (a worker pool's ordered map; default: inline), in order."""

    name = "clean"

    def __init__(self, min_chars: int, map: Callable[..., Iterator[Any]] | None = None) -> None:
        super().__init__()
        self.min_chars = min_chars
        self.map = map

    def process(self, docs: Iterable[Document]) -> Iterator[Document]:
        pending: list[list[Document]] = []

        def texts() -> Iterator[list[str]]:
            for batch in batched(docs, CLEAN_BATCH):
                pending.append(batch)
                yield [d.text for d in batch]

        for cleaned in (self.map or map)(clean_texts, texts()):  # default: the builtin, inline
            for doc, text in zip(pending.pop(0), cleaned):
                self.stats.docs_in += 1
                if len(text) < self.min_chars:
                    self.record_drop(doc, Drop("too_short"))
                    continue
                self.stats.docs_out += 1
                yield replace(doc, text=text)

    def report(self) -> dict[str, Any]:
        return {**self.stats.to_dict(), "dropped": {"too_short": self.stats.dropped["too_short"]}}
