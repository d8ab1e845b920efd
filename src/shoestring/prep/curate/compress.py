"""Cramming's compressibility filter: drop documents the tokenizer cannot compress.

Geiping & Goldstein (2022, "Cramming", §4.4) drop documents whose tokens-per-character
ratio exceeds 0.3: text that splits into many short tokens (tables, code dumps, encoded
blobs, other languages than the tokenizer learned) teaches the model little per token of
budget. The ratio needs the *trained* tokenizer, so this is not a stream block: ``prep``
calls ``Compressibility.check_batch`` for each batch while it tokenizes, and the counts join
the other blocks' in the manifest.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from shoestring.config import CurateConfig
from shoestring.prep.curate.blocks import Block, Drop
from shoestring.data.sources import Document
from shoestring.units import counted


class Compressibility(Block):
    """Keeps documents with ``n_tokens / n_chars <= max_ratio``; counts like any block."""

    name = "compressibility"

    def __init__(self, max_ratio: float = 0.3, keep_examples: int = 0) -> None:
        super().__init__(keep_examples)
        self.max_ratio = max_ratio

    @classmethod
    def from_config(cls, cfg: CurateConfig, median: float | None = None) -> Compressibility | None:
        """The check ``cfg`` asks for (``filters=gopher`` and a ratio set), else None.

        ``median``: the median tokens/characters of the training documents (`median_ratio`);
        with ``curate.compress_relative`` the threshold is the larger of
        ``compress_max_ratio`` and ``compress_relative × median``.

        Cheap to build, so each encode stage (a Ray task) can have its own.
        """
        threshold = threshold_for(cfg, median)
        if threshold is None:
            return None
        return cls(threshold, cfg.explain)

    def check_batch(
        self,
        n_tokens: Sequence[int] | np.ndarray,
        n_chars: Sequence[int] | np.ndarray,
        docs: Sequence[Document] | None = None,
    ) -> np.ndarray:
        """Count a batch of tokenized documents; the boolean keep-mask. ``docs`` (optional)
        are only used as the ``--explain`` examples of the dropped ones."""
        tokens = np.asarray(n_tokens, dtype=np.float64)
        ratio = tokens / np.maximum(np.asarray(n_chars, dtype=np.float64), 1.0)
        keep = ratio <= self.max_ratio
        self.stats.docs_in += len(keep)
        self.stats.docs_out += int(keep.sum())
        for i in np.flatnonzero(~keep):
            doc = docs[i] if docs is not None else Document(text="", source="", doc_id=f"#{i}")
            detail = (
                f"{counted(int(tokens[i]), 'token')} / {counted(int(n_chars[i]), 'character')} = "
                f"{ratio[i]:.3f} > {self.max_ratio}"
            )
            self.record_drop(doc, Drop("ratio_too_high", detail))
        return keep

    def report(self) -> dict:
        return {**super().report(), "max_ratio": round(self.max_ratio, 4)}

    def apply(self, doc: Document) -> Document | Drop:  # pragma: no cover - not a stream block
        raise TypeError("compressibility needs token counts: call check_batch(n_tokens, n_chars)")


# The reference sample: the training documents with the smallest content hashes, up to
# this many characters (the same documents whatever their order or the executor).
REFERENCE_CHARS = 1 << 21


def threshold_for(cfg: CurateConfig, median: float | None) -> float | None:
    """The tokens/characters ratio above which a document is dropped (None: off)."""
    if cfg.filters != "gopher":
        return None
    floor = cfg.compress_max_ratio
    if cfg.compress_relative is None or median is None:
        return floor
    return max(floor or 0.0, cfg.compress_relative * median)


def needs_median(cfg: CurateConfig | None) -> bool:
    """Whether the threshold depends on the corpus (so prep measures `median_ratio`)."""
    return cfg is not None and cfg.filters == "gopher" and cfg.compress_relative is not None


def reference_sample(texts: Iterable[str], max_chars: int = REFERENCE_CHARS) -> list[str]:
    """The texts with the smallest content hashes, until they hold ``max_chars`` characters
    (bounded memory: about ``max_chars`` plus one text)."""
    heap: list[tuple[int, str]] = []  # (-hash, text): the largest hash on top
    chars = 0
    for text in texts:
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                                 person=b"compress-ref").digest()
        key = int.from_bytes(digest, "little")
        if heap and chars >= max_chars and key >= -heap[0][0]:
            continue
        heapq.heappush(heap, (-key, text))
        chars += len(text)
        while len(heap) > 1 and chars - len(heap[0][1]) >= max_chars:
            chars -= len(heapq.heappop(heap)[1])
    return [text for _, text in sorted(heap, reverse=True)]


def median_ratio(tokenizer: Any, texts: Iterable[str]) -> float | None:
    """The median tokens/characters of the reference sample of ``texts`` (None if empty)."""
    sample = [t for t in reference_sample(texts) if t]
    if not sample:
        return None
    encodings = tokenizer.encode_batch(sample, add_special_tokens=False)
    ratios = [len(e.ids) / len(t) for e, t in zip(encodings, sample)]
    return round(float(np.median(ratios)), 6)
