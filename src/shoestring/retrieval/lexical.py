"""The lexical index: BM25 (Lucene's variant) over passages, by the ``bm25s`` library.

Text is lower-cased and split into word tokens of two or more characters, English stopwords
dropped (``bm25s.tokenize``'s defaults), no stemming (it would need one more package).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shoestring.retrieval.deps import require

_DIR = "bm25"


def _tokens(texts: list[str]) -> list[list[str]]:
    bm25s = require("bm25s")

    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class LexicalIndex:
    """BM25 over a fixed list of passages (row i of the index is passage i)."""

    def __init__(self, retriever: object, size: int) -> None:
        self._bm25 = retriever
        self.size = size

    @classmethod
    def build(cls, texts: list[str]) -> LexicalIndex:
        bm25s = require("bm25s")

        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False),
                        show_progress=False)
        return cls(retriever, len(texts))

    def save(self, folder: Path) -> None:
        self._bm25.save(str(folder / _DIR), show_progress=False)

    @classmethod
    def load(cls, folder: Path, size: int) -> LexicalIndex:
        bm25s = require("bm25s")

        return cls(bm25s.BM25.load(str(folder / _DIR), show_progress=False), size)

    def search(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """Per query, up to ``k`` (passage row, score) best first; passages sharing no term
        with the query (score 0) are not returned."""
        k = min(k, self.size)
        if k < 1:
            return [[] for _ in queries]
        rows, scores = self._bm25.retrieve(_tokens(queries), k=k, show_progress=False,
                                           n_threads=1)
        return [[(int(r), float(s)) for r, s in zip(rr, ss) if s > 0]
                for rr, ss in zip(np.asarray(rows), np.asarray(scores))]
