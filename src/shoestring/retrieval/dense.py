"""The dense index: an encoder's pooled embeddings in a ``faiss`` exact inner-product index.

Embeddings are the encoder's pooled last hidden states (its own pooling: mean for
shoestring's encoders, a sentence-transformers folder's own), L2-normalized (what ``serve``'s
``/v1/embed`` computes, by the same engine), so inner product is cosine similarity. ``IndexFlatIP`` is exhaustive: exact, and fast enough for the corpora this tool
trains on (a million passages × 256 dims is 1 GB and ~0.1 s a query on one core).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from shoestring.errors import ShoestringError
from shoestring.retrieval.deps import require
from shoestring.units import with_article

_FILE = "dense.faiss"
EMBED_BATCH = 32
EMBED_MAX_TOKENS = 512  # longer passages are cut (a 100-word passage is ~150 tokens)


def encoder_hash(path: Path) -> str:
    """sha256 of the encoder's weights (the model folder `artifacts.identify` finds: a run
    dir's ``final/``, an export, ...): what the index manifest records and checks."""
    from shoestring.artifacts import SERVABLE, identify
    from shoestring.fsutil import file_sha256

    weights = identify(path, want=SERVABLE, command="--encoder",
                       trained=True).model_dir / "model.safetensors"
    if not weights.is_file():
        raise ShoestringError("no model weights here (no model.safetensors)", where=str(path),
                              fix="give a trained encoder: a run dir (shoestring train -o) or "
                              "an export folder (shoestring export -o)")
    return file_sha256(weights)


class Embedder:
    """Texts → normalized float32 embeddings with a trained encoder (run dir or export)."""

    def __init__(self, path: str | Path) -> None:
        from shoestring.inference.engine import load_engine

        self.path = Path(path)
        self.hash = encoder_hash(self.path)
        self.engine = load_engine(self.path, max_length=EMBED_MAX_TOKENS, truncate=True)
        if "embed" not in self.engine.tasks:
            raise ShoestringError(
                f"this model is {with_article(self.engine.kind)}, which has no embeddings",
                where=str(self.path),
                fix="give an encoder (model.objective=mlm or contrastive) for the dense index")

    def embed(self, texts: list[str], batch: int = EMBED_BATCH,
              progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Embeddings of ``texts``, ``batch`` at a time; ``progress(done, total)`` after each
        batch (a dense index of a real corpus takes minutes on a CPU)."""
        out = [np.zeros((0, self.dim), np.float32)]
        for i in range(0, len(texts), batch):
            payloads = self.engine.prepare_embed(texts[i:i + batch], None, True, many=True)
            out.append(np.asarray(self.engine.run(("embed",), payloads), np.float32))
            if progress is not None:
                progress(min(i + batch, len(texts)), len(texts))
        return np.concatenate(out)

    @property
    def pooling(self) -> str:
        """How a vector is made, for the index manifest."""
        return f"{self.engine.pooling}, L2-normalized"

    @property
    def dim(self) -> int:
        return int(self.engine.meta["model"]["hidden_size"])


class DenseIndex:
    """Exact inner-product search over passage embeddings (row i is passage i)."""

    def __init__(self, index: object) -> None:
        self._index = index

    @classmethod
    def build(cls, vectors: np.ndarray) -> DenseIndex:
        faiss = require("faiss")

        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(np.ascontiguousarray(vectors, np.float32))
        return cls(index)

    @property
    def size(self) -> int:
        return int(self._index.ntotal)

    def save(self, folder: Path) -> None:
        faiss = require("faiss")

        faiss.write_index(self._index, str(folder / _FILE))

    @classmethod
    def load(cls, folder: Path) -> DenseIndex:
        faiss = require("faiss")

        return cls(faiss.read_index(str(folder / _FILE)))

    def search(self, vectors: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Per query vector, the ``k`` most similar (passage row, inner product)."""
        k = min(k, self.size)
        if k < 1:
            return [[] for _ in range(len(vectors))]
        scores, rows = self._index.search(np.ascontiguousarray(vectors, np.float32), k)
        return [[(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0]
                for rr, ss in zip(rows, scores)]
