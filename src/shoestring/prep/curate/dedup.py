"""Exact dedup: drop a document whose normalized text was seen before (first one kept).

The key is a 128-bit BLAKE2b digest of the text after the normalize block, so documents
that differ only in Unicode form, invisible characters or whitespace are duplicates too.
Memory is one set entry per distinct document (a 128-bit int and its set slot: 86 bytes
per document measured with tracemalloc over 200,000 keys by bench/dedup_rss.py), never the
text. With ``against`` (``--dedup-against``) a document whose key is in an earlier data
dir's index is dropped too (``duplicate_in_earlier_data``), looked up by binary search in
the memory-mapped index (``dedup_index``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from shoestring.prep.curate.blocks import Block, Drop
from shoestring.prep.curate.dedup_index import DedupIndex, save_exact
from shoestring.data.sources import Document


def text_key(text: str) -> int:
    """128-bit content key (collisions: ~1e-20 for a billion documents)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return int.from_bytes(digest, "little")


class ExactDedup(Block):
    """Keeps the first document of every distinct text (and none already in ``against``).

    ``index_dir``: where to write the kept keys (``exact.npy``) once the stream ends."""

    name = "exact_dedup"
    stateful = True

    def __init__(self, keep_examples: int = 0, against: Sequence[DedupIndex] = (),
                 index_dir: Path | None = None) -> None:
        super().__init__(keep_examples)
        self._seen: set[int] = set()
        # Only kept when examples are wanted: which document a duplicate repeats.
        self._first: dict[int, str] | None = {} if keep_examples else None
        self.against = list(against)
        self.against_dropped = [0] * len(self.against)
        self.index_dir = index_dir

    def apply(self, doc: Document) -> Document | Drop:
        key = text_key(doc.text)
        if key in self._seen:
            first = self._first.get(key, "?") if self._first is not None else "an earlier document"
            return Drop("duplicate", f"same text as {first}",
                        of=first if self._first is not None else "")
        for i, old in enumerate(self.against):
            if old.has_exact(key):
                self.against_dropped[i] += 1
                return Drop("duplicate_in_earlier_data", f"same text as a document of {old.path}")
        self._seen.add(key)
        if self._first is not None:
            self._first[key] = doc.doc_id
        return doc

    def process(self, docs: Iterable[Document]) -> Iterator[Document]:
        yield from super().process(docs)
        if self.index_dir is not None:
            save_exact(self.index_dir, self._seen, len(self._seen))

    def report(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"against": self.against_dropped} if self.against else {}
        return self.stats.to_dict() | {"distinct": len(self._seen)} | extra
