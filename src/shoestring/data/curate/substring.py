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

The match is the "longest previous factor" definition: a word position ``p`` is cut when the
``min_span`` words starting at ``p`` also start at some earlier position ``q < p`` (earlier in
corpus order, possibly overlapping), never crossing a document boundary. The first occurrence
is kept. With the suffix array (pydivsufsort, libdivsufsort's SA-IS) and its LCP array
(Kasai), suffixes that share their first ``min_span`` words are one contiguous run of the
array; in each run every position but the smallest is a repeat. All steps are numpy.

Memory: the block holds the corpus (it must see every document before it can keep any) plus
about 40 bytes per word (word starts, ids, suffix and LCP arrays); docs/data.md has the
measured growth.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoestring.data.curate.blocks import EXCERPT_CHARS, Block, Drop, Example
from shoestring.data.sources import Document
from shoestring.errors import ShoestringError

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Spans:
    """The repeated word spans of a corpus: per document, (first word, end word) pairs cut."""

    cut: list[list[tuple[int, int]]]  # per document, sorted disjoint word ranges
    first: list[list[int]]  # per cut range: the document index holding the earlier copy


def word_starts(text: str) -> np.ndarray:
    """Character offsets where each word starts."""
    return np.fromiter((m.start() for m in _WORD.finditer(text)), dtype=np.int64)


def suffix_array(stream: np.ndarray) -> np.ndarray:
    """The suffix array of an integer sequence (pydivsufsort)."""
    try:
        from pydivsufsort import divsufsort
    except ImportError:
        raise ShoestringError("substring dedup needs the pydivsufsort package",
                              where="--dedup substring",
                              fix="pip install 'shoestring[privacy]'") from None
    return np.asarray(divsufsort(stream), dtype=np.int64)


def lcp_array(stream: np.ndarray, sa: np.ndarray) -> np.ndarray:
    """``lcp[i]`` = common prefix length of suffixes ``sa[i]`` and ``sa[i-1]`` (``lcp[0]`` = 0)."""
    from pydivsufsort import kasai

    lcp = np.asarray(kasai(stream, sa), dtype=np.int64)  # lcp[i]: sa[i] vs sa[i+1]
    return np.concatenate([[0], lcp[:-1]])


def find_repeats(texts: list[str], min_span: int) -> Spans:
    """Word ranges of each text that repeat an earlier span of ≥ ``min_span`` words."""
    if min_span < 1:
        raise ValueError("min_span must be at least 1")
    vocab: dict[str, int] = {}
    ids_per_doc = [
        np.fromiter((vocab.setdefault(w, len(vocab) + 1) for w in _WORD.findall(t)),
                    dtype=np.int64)
        for t in texts
    ]
    # One stream, each document followed by the separator 0; a match never crosses it
    # because matches are clipped at the distance to the next separator.
    lengths = np.array([len(a) for a in ids_per_doc], dtype=np.int64)
    doc_of_token = np.repeat(np.arange(len(texts)), lengths + 1)
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]) if len(texts) else np.zeros(0, np.int64)
    stream = (np.concatenate([np.append(a, 0) for a in ids_per_doc]) if texts
              else np.zeros(0, np.int64))
    cut: list[list[tuple[int, int]]] = [[] for _ in texts]
    first: list[list[int]] = [[] for _ in texts]
    if len(stream) == 0:
        return Spans(cut, first)
    dtype = np.int32 if len(vocab) < 2**31 - 1 else np.int64
    stream = stream.astype(dtype)
    sa = suffix_array(stream)
    lcp = lcp_array(stream, sa)
    ends = starts + lengths  # separator positions
    to_sep = ends[doc_of_token] - np.arange(len(stream))  # words left in the document
    # Suffixes sharing ≥ min_span words with their predecessor continue its run.
    share = np.minimum(lcp, np.minimum(to_sep[sa], np.concatenate([[0], to_sep[sa[:-1]]])))
    joined = share >= min_span
    run_id = np.cumsum(~joined)
    # The earliest position of each run is the first occurrence: keep it, cut the rest.
    run_first = np.full(run_id[-1] + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(run_first, run_id, sa)
    repeat = sa != run_first[run_id]
    rep_pos = sa[repeat]
    rep_src = run_first[run_id[repeat]]
    if len(rep_pos) == 0:
        return Spans(cut, first)
    order = np.argsort(rep_pos)
    rep_pos, rep_src = rep_pos[order], rep_src[order]
    # Coverage: each repeated position cuts [p, p + min_span); merge into ranges.
    delta = np.zeros(len(stream) + 1, dtype=np.int64)
    np.add.at(delta, rep_pos, 1)
    np.add.at(delta, rep_pos + min_span, -1)
    covered = np.cumsum(delta[:-1]) > 0
    edges = np.flatnonzero(np.diff(np.concatenate([[0], covered.astype(np.int8), [0]])))
    for lo, hi in zip(edges[0::2], edges[1::2]):
        d = int(doc_of_token[lo])
        src = rep_src[np.searchsorted(rep_pos, lo)]
        cut[d].append((int(lo - starts[d]), int(hi - starts[d])))
        first[d].append(int(doc_of_token[src]))
    return Spans(cut, first)


def cut_text(text: str, ranges: list[tuple[int, int]]) -> tuple[str, list[str]]:
    """``text`` without the word ``ranges`` (each with its trailing whitespace); also the cut
    pieces, so the caller can count bytes and show examples."""
    if not ranges:
        return text, []
    starts = word_starts(text)
    bounds = np.append(starts, len(text))
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

    def __init__(self, min_span: int = 50, keep_examples: int = 0) -> None:
        super().__init__(keep_examples)
        self.min_span = min_span
        self.spans: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def process(self, docs: Iterable[Document]) -> Iterator[Document]:
        held = list(docs)
        self.stats.docs_in += len(held)
        found = find_repeats([d.text for d in held], self.min_span)
        for doc, ranges, firsts in zip(held, found.cut, found.first):
            if not ranges:
                self.stats.docs_out += 1
                yield doc
                continue
            text, pieces = cut_text(doc.text, ranges)
            self.spans[doc.source] += len(pieces)
            self.bytes[doc.source] += sum(len(p.encode("utf-8", "surrogatepass")) for p in pieces)
            self._remember(doc, ranges, pieces, firsts, held)
            if not text.strip():
                self.record_drop(doc, Drop("all_repeated", "every word is in an earlier span"))
                continue
            self.stats.changed += 1
            self.stats.docs_out += 1
            yield Document(text, doc.source, doc.doc_id)

    def _remember(self, doc: Document, ranges: list[tuple[int, int]], pieces: list[str],
                  firsts: list[int], held: list[Document]) -> None:
        kept = self.examples.setdefault("repeated_span", []) if self.keep_examples else []
        for (lo, hi), piece, src in zip(ranges, pieces, firsts):
            if len(kept) >= self.keep_examples:
                return
            kept.append(Example(
                doc_id=doc.doc_id, reason="repeated_span",
                detail=f"{hi - lo:,} words also in {held[src].doc_id}",
                excerpt=piece[:EXCERPT_CHARS], chars=len(piece)))

    def report(self) -> dict[str, Any]:
        return self.stats.to_dict() | {
            "min_span_words": self.min_span,
            "spans_removed": sum(self.spans.values()),
            "bytes_removed": sum(self.bytes.values()),
            "by_source": {s: {"spans_removed": self.spans[s], "bytes_removed": self.bytes[s]}
                          for s in sorted(self.spans)},
        }
