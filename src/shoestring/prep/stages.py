"""The work of prep's stages after the read, written once: every executor calls these.

An executor decides only where and when each runs — the local one in this process and its
worker pool (``prep/local.py``), the Ray one in Ray tasks (``prep/ray/remote.py``) — so both
build the same bytes by construction. Tokenizer: `train_on_sample`; encode: `encode`; pack:
`pack_shard` (its rows framed by `frame_rows`), the split's record `pack_record` (its
sources' parts: `source_split`). The read stage shares its blocks (``curate/``) and writer
(``driver.Split``); what truly differs between executors is dedup's shuffle (``prep/ray/``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from shoestring.config import DataConfig
from shoestring.data.mixture import source_ranges, source_weights
from shoestring.data.shards import shard_intact, write_shard
from shoestring.data.sources import Document
from shoestring.families.spec import CLS, SEP
from shoestring.errors import ShoestringError
from shoestring.families import FamilySpec
from shoestring.prep.packing import doc_offsets
from shoestring.prep.tokenizer_training import tokenizer_sample, train_tokenizer
from shoestring.prep.workers import batched, encode_texts
from shoestring.units import counted

ENCODE_BATCH = 1024
# Encodings cost ~150 bytes per token until converted: cap a batch at ~512K characters.
ENCODE_CHARS = 1 << 19
NO_COUNTS = {"documents": 0, "kept_documents": 0, "tokens": 0, "document_tokens": 0}

Map = Callable[..., Iterator[Any]]  # (fn, items, *args) -> fn(item, *args) each, in order


def train_on_sample(texts: Callable[[], Iterable[str]], max_chars: int, total_chars: int,
                    kind: str, family: FamilySpec, vocab_size: int, lowercase: bool,
                    length: int | None = None) -> tuple[Any, dict[str, int]]:
    """The ``kind`` tokenizer trained on the training documents ``texts()`` or their sample
    (`tokenizer_sample`), and the manifest's record of the sample."""
    seen = {"documents": 0, "characters": 0}

    def sample() -> Iterator[str]:  # read once, or twice (WordPiece): count one pass
        seen["documents"] = seen["characters"] = 0
        for text in tokenizer_sample(texts(), max_chars, total_chars):
            seen["documents"] += 1
            seen["characters"] += len(text)
            yield text

    tok = train_tokenizer(sample, kind, family, vocab_size, lowercase, length=length)
    return tok, {**seen, "max_characters": max_chars, "of_characters": total_chars}


def encode(records: Iterable[tuple[str, str | None]], tokenize: Map, tokenizer: Any,
           sep_id: int, dtype: np.dtype, counts: dict, compress: Any = None,
           bounds: np.ndarray | None = None
           ) -> Iterator[tuple[np.ndarray, np.ndarray, dict, list[str]]]:
    """Documents (text, id) of a split → per batch: its tokens (each document followed by
    ``sep_id``), its documents' ends in the split's stream, the split's counts after it
    (``counts``: before; `NO_COUNTS` when fresh) and its texts. ``tokenize``: the executor's
    ordered map (`Map`) of `encode_texts` over the batches; ``compress``: the
    compressibility filter, run here in order (a dropped document leaves no token); with
    ``bounds`` (a mixture's cumulative documents per source) ``source_documents`` too."""
    ids: list[str | None] = []  # the ids of the batch being gathered
    pending: deque[tuple[list[str], list[str | None]]] = deque()  # batches in flight

    def texts() -> Iterator[str]:
        for text, doc_id in records:
            ids.append(doc_id)
            yield text

    def batches() -> Iterator[list[str]]:
        for batch in batched(texts(), ENCODE_BATCH, ENCODE_CHARS):  # reads no further
            pending.append((batch, ids[:]))
            ids.clear()
            yield batch

    for flat, lengths in tokenize(encode_texts, batches(), tokenizer, sep_id):
        batch, batch_ids = pending.popleft()
        keep = None if compress is None else _compressible(compress, batch, lengths, batch_ids)
        if keep is not None and not keep.all():
            flat = flat[np.repeat(keep, lengths + 1)]
            lengths = lengths[keep]
        per_source = {}
        if bounds is not None:
            at = np.arange(counts["documents"], counts["documents"] + len(batch))
            src = np.searchsorted(bounds, at, side="right")
            per_source = {"source_documents": (np.asarray(counts["source_documents"]) + np.bincount(
                src if keep is None else src[keep], minlength=len(bounds))).tolist()}
        ends = counts["tokens"] + np.cumsum(lengths + 1, dtype=np.int64)
        counts = {**counts, "documents": counts["documents"] + len(batch),
                  "kept_documents": counts["kept_documents"] + len(lengths),
                  "tokens": int(counts["tokens"] + flat.size),
                  "document_tokens": int(counts["document_tokens"] + lengths.sum()),
                  **per_source}
        yield flat.astype(dtype, copy=False), ends, counts, batch


def _compressible(compress: Any, texts: list[str], lengths: np.ndarray,
                  ids: list[str | None]) -> np.ndarray:
    """The compressibility filter's keep-mask of a batch (with ``--explain``, the dropped
    texts are its examples, named by their spooled ``file:line`` ids)."""
    docs = None
    if compress.keep_examples:
        seen = compress.stats.docs_in  # a spool of an earlier run has no ids
        docs = [Document(t, "", doc_id or f"tokenized document {seen + i + 1:,}")
                for i, (t, doc_id) in enumerate(zip(texts, ids))]
    return compress.check_batch(lengths, [len(t) for t in texts], docs)


def shard_ranges(n: int, cfg: DataConfig) -> list[tuple[int, int]]:
    """The sequences [lo, hi) of each shard of a split of ``n`` sequences."""
    per_shard = max(1, cfg.shard_tokens // cfg.seq_len)
    return [(lo, min(n, lo + per_shard)) for lo in range(0, n, per_shard)]


def frame_rows(bodies: np.ndarray, seq_len: int, frame: int, cls_id: int, sep_id: int,
               dtype: np.dtype) -> np.ndarray:
    """A shard's rows: ``[CLS] body [SEP]`` when the family frames rows, else the bodies."""
    if not frame:
        return bodies
    rows = np.empty((len(bodies), seq_len), dtype=dtype)
    rows[:, 0], rows[:, -1] = cls_id, sep_id
    rows[:, 1:-1] = bodies
    return rows


def pack_shard(build: Path, split: str, k: int, bodies: Any, lo: int, hi: int,
               order: np.ndarray | None, doc_starts: np.ndarray, cfg: DataConfig,
               ids: dict[str, int], dtype: np.dtype, previous: dict | None = None
               ) -> tuple[dict, bool]:
    """Write shard ``k``: sequences [lo, hi) of ``bodies`` (the split's stream as rows:
    sliced, or ``take(rows)``), or with ``order`` sequences order[lo:hi], framed, with the
    offsets of the documents starting in them (``doc_starts``: sorted, covering them). The
    shard's record, and whether ``previous`` (an interrupted run's) was intact and kept."""
    if previous is not None and shard_intact(build, previous):
        return previous, True
    frame = cfg.family.row_frame
    src = np.arange(lo, hi) if order is None else np.asarray(order[lo:hi], dtype=np.int64)
    chunk = bodies[lo:hi] if order is None else bodies.take(src)
    rows = frame_rows(chunk, cfg.seq_len, frame, ids.get(CLS, 0), ids.get(SEP, 0), dtype)
    del chunk  # one shard's buffer at a time
    starts = doc_offsets(doc_starts, src, cfg.row_body, cfg.seq_len, frame // 2)
    return asdict(write_shard(build, split, k, rows, dtype, starts)), False


def pack_record(cfg: DataConfig, split: str, enc: dict, shards: list[dict],
                sources: dict | None = None) -> dict:
    """The manifest's entry for a split packed from its encode entry ``enc``."""
    body = cfg.row_body
    n = enc["tokens"] // body
    return {
        **({"sources": sources} if sources is not None else {}),
        "sequences": n,
        "tokens": n * cfg.seq_len,
        "documents": enc["kept_documents"],
        "document_tokens": int(enc["document_tokens"]),
        "dropped_tail_tokens": int(enc["tokens"] - n * body),
        "order": "sort" if sorts(cfg, split) else "none",
        "shards": shards,
    }


def source_split(cfg: DataConfig, split: str, enc: dict, doc_ends: np.ndarray,
                 n: int) -> dict | None:
    """A mixture's per-source part of a split of ``n`` sequences (None without a mixture):
    documents, tokens and the range of sequences of each source; a source without a training
    sequence is an error (the loader could not sample it)."""
    mix = cfg.mixture
    if mix is None:
        return None
    ranges = source_ranges(doc_ends, enc["source_documents"], cfg.row_body, n)
    out = {}
    for name, r in zip(mix.sources, ranges):
        lo, hi = r["sequences"]
        out[name] = {**r, "tokens": (hi - lo) * cfg.seq_len}
        if split == "train" and hi == lo:
            raise ShoestringError(
                f"{counted(r['documents'], 'training document')} with "
                f"{counted(r['document_tokens'], 'token')} do not fill one sequence of "
                f"{cfg.seq_len}", where=f"data.mixture.sources.{name}",
                fix="add text to this source, or drop it from the mixture")
    if split == "train":
        weights = source_weights(mix, {k: v["tokens"] for k, v in out.items()})
        for name, w in weights.items():
            out[name]["weight"] = w
    return out


def sorts(cfg: DataConfig, split: str) -> bool:
    """Whether ``split``'s sequences go in Cramming's order (``data.order=sort``)."""
    return cfg.order == "sort" and split == "train"

