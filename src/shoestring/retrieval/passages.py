"""Documents → passages: consecutive windows of ``words`` words, with source and offset.

A document's passages partition its text: passage i is ``text[offset_i:offset_i+1]`` (the
first starts at 0, the last ends at the end), so every character belongs to exactly one
passage and joining a document's passages gives the document back. Windows start at word
starts, so no word is cut.

A passage must carry content to be worth returning: a window shorter than
``MIN_PASSAGE_WORDS`` at a document's end joins the window before it, and a document that is
only headings (WikiText's ``= = History = =``, markdown's ``# History``: a paragraph of their
own when text is split at blank lines) gives no passage. Otherwise a search for "history"
filled its results with 15-character headings (issue 52). A short document that is not a
heading is kept whole: a one-line answer ("Yes, at 12 volts.") is content.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

from shoestring.data.readers import Document

_WORD = re.compile(r"\S+")
# A heading line: WikiText ``= Title =`` / ``= = Section = =``, or markdown ``# Title``.
_HEADING = re.compile(r"\s*(=.*=|#{1,6}(\s.*)?)\s*")
MIN_PASSAGE_WORDS = 8  # fewer words are no answer to a query (the cap: the passage size)


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


def is_heading(text: str) -> bool:
    """Whether every non-blank line of ``text`` is a heading (and there is one)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return bool(lines) and all(_HEADING.fullmatch(line) for line in lines)


def split_document(doc: Document, words: int) -> list[Passage]:
    """The passages of one document: none for a document of headings only (or no words); a
    last window shorter than ``min(MIN_PASSAGE_WORDS, words)`` joins the one before."""
    if words < 1:
        raise ValueError(f"passage size must be at least 1 word, got {words}")
    at = [m.start() for m in _WORD.finditer(doc.text)]
    least = min(MIN_PASSAGE_WORDS, words)
    if not at or is_heading(doc.text):
        return []
    starts = at[::words]
    if len(starts) > 1 and len(at) - (len(starts) - 1) * words < least:
        starts.pop()  # the short tail stays with the window before it
    bounds = [0, *starts[1:], len(doc.text)]
    return [Passage(doc.source, doc.doc_id, a, doc.text[a:b]) for a, b in zip(bounds, bounds[1:])]


def split_documents(docs: Iterable[Document], words: int) -> Iterator[Passage]:
    """Every passage of every document, in document order."""
    for doc in docs:
        yield from split_document(doc, words)
