"""Packed token shards: flat little-endian token arrays plus offset indexes.

A split (``train/``, ``val/``) is a list of shards. Each shard is two files:

- ``NNNNN.bin``: the tokens of its sequences back to back (uint16 when the vocabulary fits in
  16 bits, else uint32), opened with ``numpy.memmap`` without parsing;
- ``NNNNN.idx``: little-endian uint64 values: the offset of each sequence's start in the
  ``.bin`` plus a final end offset (n + 1 values), so variable-length sequences need no other
  format; then the offset of every document start that falls in the shard (``doc_starts``
  values, counted in the manifest), so document boundaries survive packing.

Files are written to a temporary name and renamed, so a shard is complete or absent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoestring.fsutil import file_sha256
from shoestring.errors import ShoestringError
from shoestring.fsutil import write_bytes_atomic


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


VERIFY_MODES = ("size", "sha256")


@dataclass
class ShardInfo:
    bin: str
    idx: str
    sequences: int
    tokens: int
    doc_starts: int
    sha256_bin: str
    sha256_idx: str


def write_shard(
    root: Path, split: str, index: int, rows: np.ndarray, dtype: np.dtype,
    doc_starts: np.ndarray | None = None,
) -> ShardInfo:
    """Write rows (n, seq_len) as shard ``index`` of ``split``; returns its manifest entry."""
    rows = np.asarray(rows)
    n, seq_len = rows.shape
    starts = np.zeros(0, dtype="<u8") if doc_starts is None else np.asarray(doc_starts, "<u8")
    offsets = np.arange(n + 1, dtype="<u8") * np.uint64(seq_len)
    rel_bin, rel_idx = f"{split}/{index:05d}.bin", f"{split}/{index:05d}.idx"
    (root / split).mkdir(parents=True, exist_ok=True)
    # the array's own bytes, not a copy (tobytes): a shard is written from one buffer
    data = np.ascontiguousarray(rows.astype(dtype, copy=False)).reshape(-1).view(np.uint8)
    index_bytes = offsets.tobytes() + starts.tobytes()
    write_bytes_atomic(root / rel_bin, data)
    write_bytes_atomic(root / rel_idx, index_bytes)
    return ShardInfo(
        bin=rel_bin, idx=rel_idx, sequences=n, tokens=n * seq_len, doc_starts=int(starts.size),
        sha256_bin=hashlib.sha256(data).hexdigest(),
        sha256_idx=hashlib.sha256(index_bytes).hexdigest(),
    )


def read_index(path: str | Path, sequences: int) -> tuple[np.ndarray, np.ndarray]:
    """(sequence offsets (n + 1), document start offsets) of a shard's ``.idx`` file."""
    values = np.fromfile(path, dtype="<u8")
    return values[: sequences + 1], values[sequences + 1 :]


def shard_intact(root: Path, info: dict) -> bool:
    """Both files of a shard exist and match their manifest checksums (used by resume)."""
    for key in ("bin", "idx"):
        path = root / info[key]
        if not path.is_file() or file_sha256(path) != info[f"sha256_{key}"]:
            return False
    return True


class PackedSplit:
    """Read side: all sequences of one split as a (n, seq_len) view over memmapped shards.

    Opening checks every shard against the manifest: ``verify="size"`` (or False) compares
    file sizes (instant; catches truncation), ``verify="sha256"`` (or True) also hashes every
    byte (catches corruption; about 1 s per GB). A bad shard is refused with its file named.
    """

    def __init__(
        self, root: Path, split_info: dict, seq_len: int, dtype: str, verify: bool | str = "size"
    ) -> None:
        mode = _verify_mode(verify)
        self.seq_len = seq_len
        self.ordered = split_info.get("order", "none") != "none"
        self.sources: dict | None = split_info.get("sources")  # a data mixture's parts
        self._parts: list[np.ndarray] = []
        itemsize = np.dtype(dtype).itemsize
        for shard in split_info["shards"]:
            bin_path, idx_path = root / shard["bin"], root / shard["idx"]
            idx_values = shard["sequences"] + 1 + shard.get("doc_starts", 0)
            for path, expected in ((bin_path, shard["tokens"] * itemsize),
                                   (idx_path, idx_values * 8)):
                if not path.is_file():
                    raise ShoestringError(
                        "shard file is missing", where=str(path), fix="re-run shoestring prep"
                    )
                if path.stat().st_size != expected:
                    raise ShoestringError(
                        f"shard has {path.stat().st_size} bytes, the manifest says {expected}: "
                        "it is truncated or corrupted",
                        where=str(path),
                        fix="re-run shoestring prep to rebuild the data dir",
                    )
            if mode == "sha256":
                for path, key in ((bin_path, "sha256_bin"), (idx_path, "sha256_idx")):
                    if file_sha256(path) != shard[key]:
                        raise ShoestringError(
                            "shard checksum does not match the manifest: the file is corrupted",
                            where=str(path),
                            fix="re-run shoestring prep to rebuild the data dir",
                        )
            if shard["tokens"] != shard["sequences"] * seq_len:
                raise ShoestringError(
                    "shard does not hold fixed-length sequences", where=str(bin_path)
                )
            if shard["sequences"] == 0:
                continue
            tokens = np.memmap(bin_path, dtype=dtype, mode="r")
            # A plain ndarray view of the map (the view keeps the map alive): indexing a
            # np.memmap goes through its subclass hooks, about 3 µs a row; a view, under 1.
            self._parts.append(tokens.reshape(shard["sequences"], seq_len).view(np.ndarray))
        self.dtype = np.dtype(dtype)
        self._starts = np.cumsum([0] + [len(p) for p in self._parts])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def take(self, indices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``indices`` as an int64 (len(indices), seq_len) array (written into ``out``
        when given: the loader passes the numpy view of a pinned tensor, so no second copy).

        Random access across many shards hits a different shard almost every row, so the
        gather is one row copy per index from the shard's map into a buffer of the stored
        dtype (under a microsecond each), then one widening copy of the whole batch; grouping
        rows by shard (np.unique and a mask per shard) cost more than the copies themselves
        (bench/loader.py).
        """
        idx = np.asarray(indices, dtype=np.int64)
        if out is None:
            out = np.empty((len(idx), self.seq_len), dtype=np.int64)
        elif out.shape != (len(idx), self.seq_len) or out.dtype != np.int64:
            raise ValueError(f"out must be int64 of shape {(len(idx), self.seq_len)}, "
                             f"not {out.dtype} {out.shape}")
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"row indices must lie in [0, {len(self)})")
        shard_of = np.searchsorted(self._starts, idx, side="right") - 1
        local = idx - self._starts[shard_of]
        buf = np.empty((len(idx), self.seq_len), dtype=self.dtype)
        parts = self._parts
        for i, (s, j) in enumerate(zip(shard_of.tolist(), local.tolist())):
            buf[i] = parts[s][j]
        np.copyto(out, buf)
        return out

    def token_counts(self, vocab_size: int) -> np.ndarray:
        counts = np.zeros(vocab_size, dtype=np.int64)
        for part in self._parts:
            counts += np.bincount(np.asarray(part).ravel(), minlength=vocab_size)[:vocab_size]
        return counts


def _verify_mode(verify: bool | str) -> str:
    if verify is True:
        return "sha256"
    if verify is False:
        return "size"
    if verify not in VERIFY_MODES:
        raise ShoestringError(f"unknown shard verification {verify!r}",
                              fix=f"use one of: {', '.join(VERIFY_MODES)}")
    return str(verify)
