"""Prep's clean block (normalization and ``data.min_chars``) and the ``curate.max_chars`` limit."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from shoestring.prep.curate.blocks import Block, Drop
from shoestring.data.sources import Document
from shoestring.prep.workers import batched, clean_texts

CLEAN_BATCH = 256


class Length(Block):
    """Drop documents longer than ``curate.max_chars`` characters (the short ones never get
    here: prep's `Clean` block applies ``data.min_chars``)."""

    name = "length"

    def __init__(self, max_chars: int, keep_examples: int = 0) -> None:
        super().__init__(keep_examples)
        self.max_chars = max_chars

    def apply(self, doc: Document) -> Document | Drop:
        n = len(doc.text)
        if n > self.max_chars:
            return Drop("too_long", f"{n:,} characters > curate.max_chars={self.max_chars:,}")
        return doc


class Clean(Block):
    """Block ``clean``, prep's first: `clean_text` (NFKC, invisible and control characters
    removed, whitespace collapsed) and ``data.min_chars`` in one pass, so every later rule sees
    clean text. Batches of texts are cleaned by ``map`` (a worker pool's ordered map; default:
    inline), in order."""

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
