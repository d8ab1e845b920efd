"""Decontamination: remove training text that overlaps evaluation sets (MT-NLG style).

Megatron-Turing NLG (Smith et al. 2022, §3.1.3) removed from the training data every
13-gram that also occurs in a downstream task's evaluation data, cutting the matched span
plus 200 characters on each side and splitting the document there; a document split into
more than 10 pieces was dropped, and pieces shorter than 200 characters were dropped.
Both ``cut`` (that procedure) and ``drop`` (drop any document with an overlap) are here.

Evaluation text comes from any files or folders: ``.jsonl``/``.json`` (every string value
of every object), ``.tsv`` (every tab-separated field, so GLUE dev files work as they are),
``.csv`` (every field), anything else as plain text (every non-blank line). Each such
*segment* contributes its word 13-grams (words as in ``curate.text``); a segment shorter
than 13 words but at least ``min_words`` long (short GLUE sentences) contributes itself
whole, and matches only where it occurs whole. Matching is vectorized: each document's
n-gram hashes are looked up in sorted tables with ``np.searchsorted``.

Not done (MT-NLG also did it): ignoring 13-grams that occur in many training documents,
which needs a full pass over the corpus first.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from shoestring.prep.curate.blocks import Block, Drop
from shoestring.prep.curate.text import ngram_hashes_upto, word_hashes, word_spans
from shoestring.data.sources import Document
from shoestring.errors import ShoestringError

_WHERE = "curate.decontam"
_FILTER_MASK = (1 << 22) - 1  # 4 MiB prefilter: ~0.3% false positives per 10k eval n-grams


class EvalNgrams:
    """Sorted hash tables of evaluation n-grams, one per n-gram length, with their file."""

    def __init__(self, n: int = 13, min_words: int = 8) -> None:
        if not 1 <= min_words <= n:
            raise ValueError(f"min_words ({min_words}) must be between 1 and n ({n})")
        self.n = n
        self.min_words = min_words
        self.files: list[str] = []
        self._parts: dict[int, list[tuple[np.ndarray, int]]] = {}
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._filter = np.zeros(_FILTER_MASK + 1, dtype=bool)
        self.segments = 0

    @classmethod
    def from_paths(cls, paths: Iterable[str], n: int = 13, min_words: int = 8) -> EvalNgrams:
        """Read every evaluation file (folders recursively); errors name the file and line."""
        index = cls(n, min_words)
        for path in paths:
            for file in _expand(path):
                index.add_file(file)
        index.finalize()
        if index.size == 0:
            raise ShoestringError(
                f"the decontamination files have no text segment of {min_words} or more words",
                where=f"{_WHERE}: {', '.join(paths)}",
                fix="point at evaluation data (e.g. GLUE dev.tsv files), or lower "
                "curate.decontam_min_words",
            )
        return index

    @property
    def size(self) -> int:
        return sum(len(t) for t, _ in self.tables.values())

    def add_file(self, path: str) -> None:
        file_id = len(self.files)
        self.files.append(path)
        for segment in _segments(path):
            self.add_text(segment, file_id)

    def add_text(self, text: str, file_id: int = 0) -> None:
        wh = word_hashes(text)
        if len(wh) < self.min_words:
            return
        length = min(len(wh), self.n)
        grams = ngram_hashes_upto(wh, [length], mix=False)[length]
        self._parts.setdefault(length, []).append((grams, file_id))
        self.segments += 1

    def finalize(self) -> None:
        """Sort the collected hashes into lookup tables (call once, after the last add)."""
        for length, parts in self._parts.items():
            hashes = np.concatenate([h for h, _ in parts])
            ids = np.concatenate([np.full(len(h), f, dtype=np.uint32) for h, f in parts])
            order = np.argsort(hashes, kind="stable")
            self.tables[length] = (hashes[order], ids[order])
            self._filter[hashes & _FILTER_MASK] = True
        self._parts = {}

    def matches(self, wh: np.ndarray) -> list[tuple[int, int, int]]:
        """(first word, length in words, file id) of every evaluation n-gram found in ``wh``."""
        found: list[tuple[int, int, int]] = []
        grams_by_length = ngram_hashes_upto(wh, list(self.tables), mix=False)
        for length, (table, ids) in self.tables.items():
            grams = grams_by_length[length]
            if not len(grams):
                continue
            # A one-bit-per-slot filter rules out almost every n-gram with one lookup;
            # only the few that pass are binary-searched.
            maybe = np.flatnonzero(self._filter[grams & _FILTER_MASK])
            if not len(maybe):
                continue
            at = np.minimum(np.searchsorted(table, grams[maybe]), len(table) - 1)
            hit = np.flatnonzero(table[at] == grams[maybe])
            found.extend((int(maybe[p]), length, int(ids[at[p]])) for p in hit)
        found.sort()
        return found


class Decontaminate(Block):
    """Drop documents that overlap evaluation data, or cut the overlapping spans out."""

    name = "decontam"

    def __init__(
        self,
        index: EvalNgrams,
        mode: str = "cut",
        margin_chars: int = 200,
        max_pieces: int = 10,
        min_piece_chars: int = 200,
        keep_examples: int = 0,
    ) -> None:
        super().__init__(keep_examples)
        if mode not in ("cut", "drop"):
            raise ValueError(f"mode must be 'cut' or 'drop', got {mode!r}")
        self.index = index
        self.mode = mode
        self.margin = margin_chars
        self.max_pieces = max_pieces
        self.min_piece_chars = min_piece_chars
        self.cut_docs = self.spans_removed = self.chars_removed = 0

    def process(self, docs: Iterable[Document]) -> Iterator[Document]:
        stats = self.stats
        for doc in docs:
            stats.docs_in += 1
            wh = word_hashes(doc.text)
            found = self.index.matches(wh) if len(wh) else []
            if not found:
                stats.docs_out += 1
                yield doc
                continue
            if self.mode == "drop":
                self.record_drop(doc, Drop("contaminated", self._describe(doc.text, found)))
                continue
            pieces = self._cut(doc, found)
            if isinstance(pieces, Drop):
                self.record_drop(doc, pieces)
                continue
            stats.changed += 1
            stats.docs_out += len(pieces)
            yield from pieces

    def _cut(self, doc: Document, found: list[tuple[int, int, int]]) -> list[Document] | Drop:
        text = doc.text
        spans = word_spans(text)
        intervals: list[list[int]] = []
        for first, length, _ in found:
            lo = max(spans[first][0] - self.margin, 0)
            hi = min(spans[first + length - 1][1] + self.margin, len(text))
            if intervals and lo <= intervals[-1][1]:
                intervals[-1][1] = max(intervals[-1][1], hi)
            else:
                intervals.append([lo, hi])
        self.cut_docs += 1
        self.spans_removed += len(intervals)
        self.chars_removed += sum(hi - lo for lo, hi in intervals)
        bounds = [0] + [b for lo, hi in intervals for b in (lo, hi)] + [len(text)]
        pieces = [text[a:b].strip() for a, b in zip(bounds[::2], bounds[1::2])]
        pieces = [p for p in pieces if len(p) >= self.min_piece_chars]
        detail = self._describe(text, found)
        detail = f"; {detail}" if detail else ""
        if len(pieces) > self.max_pieces:
            return Drop(
                "too_many_pieces", f"{len(pieces)} pieces > {self.max_pieces} after cutting{detail}"
            )
        if not pieces:
            return Drop(
                "nothing_left", f"no piece of {self.min_piece_chars}+ characters left{detail}"
            )
        if len(pieces) == 1:
            return [replace(doc, text=pieces[0])]
        return [replace(doc, text=p, doc_id=f"{doc.doc_id}#{k}") for k, p in enumerate(pieces, 1)]

    def _describe(self, text: str, found: list[tuple[int, int, int]]) -> str:
        if not self.keep_examples:
            return ""
        first, length, file_id = found[0]
        spans = word_spans(text)
        snippet = text[spans[first][0] : spans[first + length - 1][1]]
        return (
            f"{len(found)} overlapping n-gram(s) with {self.index.files[file_id]}, "
            f"first: “{snippet[:200]}”"
        )

    def report(self) -> dict:
        return self.stats.to_dict() | {
            "mode": self.mode,
            "eval_ngrams": self.index.size,
            "eval_files": len(self.index.files),
            "docs_cut": self.cut_docs,
            "spans_removed": self.spans_removed,
            "chars_removed": self.chars_removed,
        }


# --- reading evaluation files ----------------------------------------------------------


def _expand(path: str) -> list[str]:
    p = Path(os.path.expanduser(path))
    if p.is_dir():
        files = sorted(
            str(f)
            for f in p.rglob("*")
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
        )
        if not files:
            raise ShoestringError("the folder has no files", where=f"{_WHERE}: {path}")
        return files
    if p.is_file():
        return [str(p)]
    raise ShoestringError(
        "no such file or folder",
        where=f"{_WHERE}: {path}",
        fix="point --decontam at evaluation files or folders (e.g. glue/SST-2/dev.tsv)",
    )


def _read_text(path: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ShoestringError(
            f"cannot read file ({e.strerror or e})", where=f"{_WHERE}: {path}"
        ) from None
    if b"\0" in data[:8192]:
        raise ShoestringError(
            "looks like a binary file, not text",
            where=f"{_WHERE}: {path}",
            fix="point at text evaluation files (.tsv, .csv, .jsonl, .txt)",
        )
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ShoestringError(
            f"not valid UTF-8 (byte offset {e.start})",
            where=f"{_WHERE}: {path}:{line}",
            fix="convert the file to UTF-8",
        ) from None


def _segments(path: str) -> Iterator[str]:
    text = _read_text(path)
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        for lineno, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ShoestringError(
                    f"malformed JSON ({e})",
                    where=f"{_WHERE}: {path}:{lineno}",
                    fix="evaluation .jsonl files need one JSON object per line",
                ) from None
            yield from _strings(obj)
    elif suffix == ".tsv":
        for line in text.split("\n"):
            yield from line.split("\t")
    elif suffix == ".csv":
        for row in csv.reader(io.StringIO(text)):
            yield from row
    else:
        yield from (line for line in text.split("\n") if line.strip())


def _strings(obj: object) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _strings(value)
