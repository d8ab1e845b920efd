"""Exact dedup: drop a document whose normalized text was seen before (first one kept).

The key is a 128-bit BLAKE2b digest of the text after the normalize block, so documents
that differ only in Unicode form, invisible characters or whitespace are duplicates too.
Memory is one set entry per distinct document (about 100 bytes), never the text.
"""

from __future__ import annotations

import hashlib

from shoestring.data.curate.blocks import Block, Drop
from shoestring.data.sources import Document


def text_key(text: str) -> int:
    """128-bit content key (collisions: ~1e-20 for a billion documents)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return int.from_bytes(digest, "little")


class ExactDedup(Block):
    """Keeps the first document of every distinct text."""

    name = "exact_dedup"
    stateful = True

    def __init__(self, keep_examples: int = 0) -> None:
        super().__init__(keep_examples)
        self._seen: set[int] = set()
        # Only kept when examples are wanted: which document a duplicate repeats.
        self._first: dict[int, str] | None = {} if keep_examples else None

    def apply(self, doc: Document) -> Document | Drop:
        key = text_key(doc.text)
        if key in self._seen:
            first = self._first.get(key, "?") if self._first is not None else "an earlier document"
            return Drop("duplicate", f"same text as {first}")
        self._seen.add(key)
        if self._first is not None:
            self._first[key] = doc.doc_id
        return doc

    def report(self) -> dict:
        return self.stats.to_dict() | {"distinct": len(self._seen)}
