"""Documents → passages: consecutive windows of ``words`` words, with source and offset.

A document's passages partition its text: passage i is ``text[offset_i:offset_i+1]`` (the
first starts at 0, the last ends at the end), so every character belongs to exactly one
passage and joining a document's passages gives the document back. Windows start at word
starts, so no word is cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

from shoestring.data.readers import Document

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Passage:
    """One retrievable unit: ``text`` is ``document.text[offset:offset + len(text)]``."""

    source: str  # the file / builtin / hf name the document came from
    doc_id: str  # the document's id within its source (line, row, topic)
    offset: int  # character offset of the passage in its document
    text: str

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def cite(self) -> str:
        """Where it came from, as shown beside it: ``doc_id@offset`` (readers' document ids
        start with their file: ``path:line``), else ``source#doc_id@offset``."""
        if self.doc_id.startswith(self.source):
            return f"{self.doc_id}@{self.offset}"
        return f"{self.source}#{self.doc_id}@{self.offset}"


def split_document(doc: Document, words: int) -> list[Passage]:
    """The passages of one document (none for a document without words)."""
    if words < 1:
        raise ValueError(f"passage size must be at least 1 word, got {words}")
    starts = [m.start() for m in _WORD.finditer(doc.text)][::words]
    if not starts:
        return []
    bounds = [0, *starts[1:], len(doc.text)]
    return [Passage(doc.source, doc.doc_id, a, doc.text[a:b]) for a, b in zip(bounds, bounds[1:])]


def split_documents(docs: Iterable[Document], words: int) -> Iterator[Passage]:
    """Every passage of every document, in document order."""
    for doc in docs:
        yield from split_document(doc, words)
