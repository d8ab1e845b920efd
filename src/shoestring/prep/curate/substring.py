"""Sub-document dedup: cut every span of ≥ ``min_span`` words that already occurred earlier.

Lee et al. 2022 ("Deduplicating Training Data Makes Language Models Better") remove exact
repeated substrings of ≥ 50 tokens with a suffix array over the whole token stream; whole-
document dedup (exact, MinHash) misses boilerplate, quoted passages and secrets that recur
inside otherwise different documents — the text extraction attacks recover most easily.

Tokens here are *words* (maximal runs of non-whitespace), not the final tokenizer's ids:
the tokenizer is trained after curation, so its ids do not exist yet, and a word split is
stable, language-agnostic and cuts only at whitespace. Two spans match when their words are
equal (whitespace between them may differ). A cut removes the later occurrence's bytes from
its first word up to the next kept word (its trailing whitespace included), so every kept
byte is the input's byte, in order: the output is the input minus the cut spans.

The match is the "longest previous factor" (LPF) definition: a word position ``p`` is cut
when the ``min_span`` words starting at ``p`` also start at some earlier position ``q < p``
(earlier in corpus order, possibly overlapping), never crossing a document boundary; it
covers ``[p, p + LPF[p])``. The first occurrence is kept. pydivsufsort computes the LPF array
from libdivsufsort's suffix array in C; everything else is numpy. (Grouping the suffix array's
LCP runs in numpy gives the same cut and was slower and larger: bench/privacy.py.)

Words become integer ids with ``pandas.factorize`` (a C hash table; twice as fast as a dict).

Memory: the block holds the corpus (it must see every document before it can keep any); its
peak above that is about 125 bytes per word, mostly the word lists while mapping them to ids
(docs/data.md has the measured growth). So it refuses a corpus of more than
``curate.substring_max_mb`` (200 MB of text, ~4 GB of memory) with a ``ShoestringError``
instead of running out of memory: a suffix array per bounded shard would silently miss the
repeats across shards, which is the point of the block.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from shoestring.prep.curate.blocks import EXCERPT_CHARS, Block, Drop, Example
from shoestring.data.sources import Document
from shoestring.errors import ShoestringError

_WORD = re.compile(r"\S+")
# Peak memory per MB of text, measured (bench/privacy.py dedup-speed, docs/data.md): ~18 MB
# above the loaded text, which is itself ~1-2 MB per MB in Python strings.
MB_PER_MB = 20


def word_ids(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(stream, words per text): every word as an int ≥ 1 (equal words, equal ids), each
    text followed by the separator 0. ``str.split()`` splits where ``\\S+`` does (both use
    Python's Unicode whitespace)."""
    import pandas as pd

    words = [t.split() for t in texts]
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    flat = np.empty(int(lengths.sum()), dtype=object)
    flat[:] = list(itertools.chain.from_iterable(words))
    codes = pd.factorize(flat)[0].astype(np.int32) + 1 if len(flat) else np.zeros(0, np.int32)
    stream = np.zeros(len(flat) + len(texts), dtype=np.int32)
    ends = np.cumsum(lengths + 1) - 1  # separator positions
    is_word = np.ones(len(stream), dtype=bool)
    is_word[ends] = False
    stream[is_word] = codes
    return stream, lengths


def check_installed() -> None:
    """The optional packages the block needs (the ``privacy`` extra), imported now: prep
    calls this before reading, so a missing one fails in a second, not after the read."""
    for package in ("pydivsufsort", "pandas"):
        try:
            __import__(package)
        except ImportError:
            raise ShoestringError(f"substring dedup needs the {package} package, which is not "
                                  "installed", where="--dedup substring",
                                  fix="pip install 'shoestring[privacy]' (or pick another "
                                  "--dedup: exact or fuzzy)") from None


def longest_previous_factor(stream: np.ndarray) -> np.ndarray:
    """``lpf[p]`` = the longest common prefix of the suffix at ``p`` with any earlier suffix
    (pydivsufsort: libdivsufsort's suffix array, then the LPF array)."""
    check_installed()
    from pydivsufsort import longest_previous_factor as lpf

    return np.asarray(lpf(stream), dtype=np.int64)


def find_repeats(texts: list[str], min_span: int) -> list[list[tuple[int, int]]]:
    """Per text, the (first word, end word) ranges that repeat an earlier span of
    ≥ ``min_span`` words: sorted and disjoint, what to cut."""
    if min_span < 1:
        raise ValueError("min_span must be at least 1")
    cut: list[list[tuple[int, int]]] = [[] for _ in texts]
    stream, lengths = word_ids(texts)
    if not lengths.sum():
        return cut
    starts = np.cumsum(lengths + 1) - (lengths + 1)
    pos = np.arange(len(stream))
    # A match never crosses a document end: clip it at the distance to the separator (the
    # earlier copy then ends at its own separator too, since the separators are equal).
    to_sep = np.repeat(starts + lengths, lengths + 1) - pos
    lpf = np.minimum(longest_previous_factor(stream), to_sep)
    # p starts a repeat when its first min_span words occurred earlier; it covers [p, p+lpf).
    reach = np.where(lpf >= min_span, pos + lpf, 0)
    covered = np.maximum.accumulate(reach) > pos
    edges = np.flatnonzero(np.diff(np.concatenate([[0], covered.astype(np.int8), [0]])))
    doc_of = np.searchsorted(starts, edges[0::2], side="right") - 1
    for d, lo, hi in zip(doc_of, edges[0::2], edges[1::2]):
        cut[d].append((int(lo - starts[d]), int(hi - starts[d])))
    return cut


def earlier_copy(texts: list[str], doc: int, span: str) -> int | None:
    """The first document before ``doc`` holding ``span``'s words, or None when the earlier
    copy is in ``doc`` itself (for --explain only: a plain scan)."""
    needle = f" {' '.join(span.split())} "
    for i in range(doc):
        if needle in f" {' '.join(texts[i].split())} ":
            return i
    return None


def cut_text(text: str, ranges: list[tuple[int, int]]) -> tuple[str, list[str]]:
    """``text`` without the word ``ranges`` (each with its trailing whitespace); also the cut
    pieces, so the caller can count bytes and show examples."""
    if not ranges:
        return text, []
    starts = np.fromiter((m.start() for m in _WORD.finditer(text)), dtype=np.int64)
    bounds = np.append(starts, len(text))  # where each word starts, then the end
    kept, pieces, at = [], [], 0
    for lo, hi in ranges:
        a, b = int(bounds[lo]), int(bounds[hi])
        kept.append(text[at:a])
        pieces.append(text[a:b])
        at = b
    kept.append(text[at:])
    return "".join(kept), pieces


class SubstringDedup(Block):
    """Removes repeated spans of ≥ ``min_span`` words (the first occurrence is kept).

    Holds every document until the stream ends (a suffix array needs the whole corpus),
    then yields them in input order; a document left empty is dropped (``all_repeated``).
    The report adds ``spans_removed``, ``bytes_removed`` and both per source.
    """

    name = "substring_dedup"
    stateful = True

    def __init__(self, min_span: int = 50, keep_examples: int = 0,
                 max_mb: float = 200.0) -> None:
        super().__init__(keep_examples)
        self.min_span = min_span
        self.max_mb = max_mb
        self.spans: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def process(self, docs: Iterable[Document]) -> Iterator[Document]:
        held = self._hold(docs)
        self.stats.docs_in += len(held)
        texts = [d.text for d in held]
        found = find_repeats(texts, self.min_span)
        for i, (doc, ranges) in enumerate(zip(held, found)):
            if not ranges:
                self.stats.docs_out += 1
                yield doc
                continue
            text, pieces = cut_text(doc.text, ranges)
            self.spans[doc.source] += len(pieces)
            self.bytes[doc.source] += sum(len(p.encode("utf-8", "surrogatepass")) for p in pieces)
            self._remember(i, ranges, pieces, texts, held)
            if not text.strip():
                self.record_drop(doc, Drop("all_repeated", "every word is in an earlier span"))
                continue
            self.stats.changed += 1
            self.stats.docs_out += 1
            yield replace(doc, text=text)

    def _hold(self, docs: Iterable[Document]) -> list[Document]:
        """Every document, or a ``ShoestringError`` as soon as the text passes ``max_mb``
        (before the suffix array is built: that is what needs ~20 MB per MB)."""
        held: list[Document] = []
        chars = 0
        limit = self.max_mb * 1e6
        for doc in docs:
            held.append(doc)
            chars += len(doc.text)
            if chars > limit:
                raise ShoestringError(
                    f"substring dedup holds the whole corpus and its suffix array, about "
                    f"{MB_PER_MB} MB of memory per MB of text; this corpus passed "
                    f"curate.substring_max_mb = {self.max_mb:g} MB (at document {len(held):,}, "
                    f"{doc.doc_id}), so it would need more than "
                    f"{MB_PER_MB * self.max_mb / 1000:.1f} GB",
                    where="--dedup substring",
                    fix="use --dedup fuzzy (bounded memory) for a corpus this size, split the "
                    "corpus and prep the parts (repeats across parts are then not cut), or, "
                    "with the memory free, raise --set curate.substring_max_mb=MB")
        return held

    def _remember(self, i: int, ranges: list[tuple[int, int]], pieces: list[str],
                  texts: list[str], held: list[Document]) -> None:
        """Keep the first cut spans as --explain examples, naming where the earlier copy is."""
        kept = self.examples.setdefault("repeated_span", []) if self.keep_examples else []
        for (lo, hi), piece in zip(ranges, pieces):
            if len(kept) >= self.keep_examples:
                return
            src = earlier_copy(texts, i, piece)
            where = "earlier in the same document" if src is None else held[src].doc_id
            kept.append(Example(
                doc_id=held[i].doc_id, reason="repeated_span",
                detail=f"{hi - lo:,} words also in {where}",
                excerpt=piece[:EXCERPT_CHARS], chars=len(piece)))

    def report(self) -> dict[str, Any]:
        return self.stats.to_dict() | {
            "min_span_words": self.min_span,
            "spans_removed": sum(self.spans.values()),
            "bytes_removed": sum(self.bytes.values()),
            "by_source": {s: {"spans_removed": self.spans[s], "bytes_removed": self.bytes[s]}
                          for s in sorted(self.spans)},
        }
