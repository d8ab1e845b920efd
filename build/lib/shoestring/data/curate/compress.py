"""Cramming's compressibility filter: drop documents the tokenizer cannot compress.

Geiping & Goldstein (2022, "Cramming", §4.4) drop documents whose tokens-per-character
ratio exceeds 0.3: text that splits into many short tokens (tables, code dumps, encoded
blobs, other languages than the tokenizer learned) teaches the model little per token of
budget. The ratio needs the *trained* tokenizer, so this is not a stream block: ``prep``
calls ``Compressibility.check`` for each document while it tokenizes, and the counts join
the other blocks' in the manifest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shoestring.config import CurateConfig
from shoestring.data.curate.blocks import Block, Drop
from shoestring.data.sources import Document


class Compressibility(Block):
    """Keeps documents with ``n_tokens / n_chars <= max_ratio``; counts like any block."""

    name = "compressibility"

    def __init__(self, max_ratio: float = 0.3, keep_examples: int = 0) -> None:
        super().__init__(keep_examples)
        self.max_ratio = max_ratio

    @classmethod
    def from_config(cls, cfg: CurateConfig) -> Compressibility | None:
        """The check ``cfg`` asks for (``filters=gopher`` and a ratio set), else None.

        Cheap to build, so an encode stage (or each worker) can have its own and the counts
        be merged with ``stats.merge(other.report())``.
        """
        if cfg.filters != "gopher" or cfg.compress_max_ratio is None:
            return None
        return cls(cfg.compress_max_ratio, cfg.explain)

    def check_batch(
        self,
        n_tokens: Sequence[int] | np.ndarray,
        n_chars: Sequence[int] | np.ndarray,
        docs: Sequence[Document] | None = None,
    ) -> np.ndarray:
        """``check`` for a batch at once: a boolean keep-mask."""
        tokens = np.asarray(n_tokens, dtype=np.float64)
        ratio = tokens / np.maximum(np.asarray(n_chars, dtype=np.float64), 1.0)
        keep = ratio <= self.max_ratio
        self.stats.docs_in += len(keep)
        self.stats.docs_out += int(keep.sum())
        for i in np.flatnonzero(~keep):
            doc = docs[i] if docs is not None else Document(text="", source="", doc_id=f"#{i}")
            detail = (
                f"{int(tokens[i])} tokens / {int(n_chars[i])} characters = "
                f"{ratio[i]:.3f} > {self.max_ratio}"
            )
            self.record_drop(doc, Drop("ratio_too_high", detail))
        return keep

    def check(self, n_tokens: int, n_chars: int, doc: Document | None = None) -> bool:
        """Count one tokenized document; True if it is kept.

        ``doc`` (optional) is only used as the ``--explain`` example when it is dropped.
        """
        self.stats.docs_in += 1
        ratio = n_tokens / max(n_chars, 1)
        if ratio <= self.max_ratio:
            self.stats.docs_out += 1
            return True
        drop = Drop(
            "ratio_too_high",
            f"{n_tokens} tokens / {n_chars} characters = {ratio:.3f} > {self.max_ratio}",
        )
        self.record_drop(doc or Document(text="", source="", doc_id="?"), drop)
        return False

    def apply(self, doc: Document) -> Document | Drop:  # pragma: no cover - not a stream block
        raise TypeError("compressibility needs token counts: call check(n_tokens, n_chars)")
