"""Packed token shards: flat little-endian token arrays plus offset indexes.

A split (``train/``, ``val/``) is a list of shards. Each shard is two files:

- ``NNNNN.bin``: the tokens of its sequences back to back (uint16 when the vocabulary fits in
  16 bits, else uint32), opened with ``numpy.memmap`` without parsing;
- ``NNNNN.idx``: little-endian uint64 offsets of each sequence's start in the ``.bin`` plus a
  final end offset (n + 1 values), so variable-length sequences need no other format.

Files are written to a temporary name and renamed, so a shard is complete or absent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from shoestring.data.tokenizer import file_sha256
from shoestring.errors import ShoestringError
from shoestring.fsutil import write_bytes_atomic


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass
class ShardInfo:
    bin: str
    idx: str
    sequences: int
    tokens: int
    sha256_bin: str
    sha256_idx: str


class ShardWriter:
    """Accumulates fixed- or variable-length sequences and writes bounded-size shards."""

    def __init__(self, root: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.root = root
        self.split = split
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        (root / split).mkdir(parents=True, exist_ok=True)
        self.shards: list[ShardInfo] = []
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0

    def add(self, sequences: np.ndarray) -> None:
        """Add a (n, seq_len) block of sequences."""
        for row in sequences:
            if self._pending_tokens + len(row) > self.shard_tokens and self._pending:
                self._flush()
            self._pending.append(row)
            self._pending_tokens += len(row)

    def _flush(self) -> None:
        if not self._pending:
            return
        n = len(self.shards)
        lengths = np.fromiter((len(r) for r in self._pending), dtype=np.uint64)
        offsets = np.zeros(len(lengths) + 1, dtype="<u8")
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.concatenate(self._pending).astype(self.dtype, copy=False)
        rel_bin, rel_idx = f"{self.split}/{n:05d}.bin", f"{self.split}/{n:05d}.idx"
        write_bytes_atomic(self.root / rel_bin, tokens.tobytes())
        write_bytes_atomic(self.root / rel_idx, offsets.tobytes())
        self.shards.append(
            ShardInfo(
                bin=rel_bin,
                idx=rel_idx,
                sequences=len(self._pending),
                tokens=int(tokens.size),
                sha256_bin=file_sha256(self.root / rel_bin),
                sha256_idx=file_sha256(self.root / rel_idx),
            )
        )
        self._pending, self._pending_tokens = [], 0

    def close(self) -> dict:
        self._flush()
        return {
            "sequences": sum(s.sequences for s in self.shards),
            "tokens": sum(s.tokens for s in self.shards),
            "shards": [asdict(s) for s in self.shards],
        }


class PackedSplit:
    """Read side: all sequences of one split as a (n, seq_len) view over memmapped shards."""

    def __init__(self, root: Path, split_info: dict, seq_len: int, dtype: str, verify: bool) -> None:
        self.seq_len = seq_len
        self._parts: list[np.ndarray] = []
        for shard in split_info["shards"]:
            bin_path, idx_path = root / shard["bin"], root / shard["idx"]
            itemsize = np.dtype(dtype).itemsize
            for path, expected in ((bin_path, shard["tokens"] * itemsize),
                                   (idx_path, (shard["sequences"] + 1) * 8)):
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
            if verify:
                for path, key in ((bin_path, "sha256_bin"), (idx_path, "sha256_idx")):
                    if file_sha256(path) != shard[key]:
                        raise ShoestringError(
                            "shard checksum does not match the manifest: the file is corrupted",
                            where=str(path),
                            fix="re-run shoestring prep to rebuild the data dir",
                        )
            tokens = np.memmap(bin_path, dtype=dtype, mode="r")
            if shard["tokens"] != shard["sequences"] * seq_len:
                raise ShoestringError(
                    "shard does not hold fixed-length sequences", where=str(bin_path)
                )
            self._parts.append(tokens.reshape(shard["sequences"], seq_len))
        self._starts = np.cumsum([0] + [len(p) for p in self._parts])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def take(self, indices: np.ndarray) -> np.ndarray:
        """Rows ``indices`` as an int64 (len(indices), seq_len) array."""
        out = np.empty((len(indices), self.seq_len), dtype=np.int64)
        shard_of = np.searchsorted(self._starts, indices, side="right") - 1
        for s in np.unique(shard_of):
            sel = shard_of == s
            out[sel] = self._parts[s][indices[sel] - self._starts[s]]
        return out

    def token_counts(self, vocab_size: int) -> np.ndarray:
        counts = np.zeros(vocab_size, dtype=np.int64)
        for part in self._parts:
            counts += np.bincount(np.asarray(part).ravel(), minlength=vocab_size)[:vocab_size]
        return counts
