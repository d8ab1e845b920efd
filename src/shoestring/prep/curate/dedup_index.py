"""The dedup index a data dir keeps, so a later prep can dedup against it (``--dedup-against``).

``prep`` with dedup on writes, in the data dir's ``dedup/`` folder, what its dedup blocks
kept — never their text:

- ``exact.npy``: the 128-bit exact-dedup key (``dedup.text_key``) of every kept distinct
  text, as ``(n, 2)`` uint64 rows (high, low), sorted: 16 bytes per document;
- ``minhash.npy`` (``--dedup fuzzy`` only): the LSH band keys of every document fuzzy dedup
  saw, ``(bands, n)`` uint64 with each band's row sorted (equal keys in input order): 8
  bytes per band per document (224 bytes with 28 bands);
- ``minhash_ids.npy``: beside each sorted key, the document it belongs to (its position in
  input order), ``(bands, n)`` uint32: 4 bytes per band per document (112 with 28 bands);
- ``signatures.npy``: every such document's MinHash signature, ``(n, num_perm)`` uint32
  in input order, to verify a candidate pair: 448 bytes per document with 112 values;
- ``index.json``: the format version, the counts and the MinHash settings the keys depend
  on (shingle n-gram, bands, rows, seed), and the verification threshold used (for the
  record: a later run may verify at another).

The manifest records the folder (``dedup_index``: the files with their sha256). A later
``prep NEW --dedup-against OLD`` opens the arrays memory-mapped and looks every new key up
with a binary search (the first of equal keys names OLD's first document of that bucket,
whose signature row is then read to verify the pair), so it reads neither OLD's text nor
its index into memory.

The keys are computed where the dedup blocks run: after cleaning and the quality filters,
before decontamination; a document decontamination later removed is still in the index.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from shoestring.fsutil import atomic_file, file_sha256, write_json_atomic
from shoestring.errors import ShoestringError

FORMAT = 2  # 2: band keys with their documents, and signatures (verification)
DIR = "dedup"
EXACT_FILE = "exact.npy"
MINHASH_FILE = "minhash.npy"
IDS_FILE = "minhash_ids.npy"
SIGNATURES_FILE = "signatures.npy"
INDEX_FILE = "index.json"
MINHASH_SETTINGS = ("ngram", "bands", "rows", "seed")
_LOW = (1 << 64) - 1


def save_array_atomic(path: Path, shape: tuple[int, ...], rows: Iterable[np.ndarray],
                      dtype: type = np.uint64) -> None:
    """Write a ``.npy`` of ``shape`` from its rows in order — one row, or a block of rows
    when an item has as many dimensions as ``shape`` (memory: one item; rows not given are
    zeros) — through a temporary sibling, so ``path`` is never half-written.

    Written with plain writes, not through a writable map: the map's dirty pages counted in
    prep's resident memory, as much as the whole file (~670 bytes a document for fuzzy
    dedup's index)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dt = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False,
              "shape": tuple(shape)}
    with atomic_file(path) as f:
        np.lib.format.write_array_header_1_0(f, header)
        data_start = f.tell()
        for row in rows:
            f.write(np.ascontiguousarray(np.asarray(row).astype(dt, copy=False)).tobytes())
        f.truncate(data_start + int(np.prod(shape, dtype=np.int64)) * dt.itemsize)


def save_exact(folder: Path, keys: Iterable[int], n: int) -> None:
    """``exact.npy`` from the ``n`` kept 128-bit keys."""
    table = np.empty((n, 2), dtype=np.uint64)
    for i, key in enumerate(keys):
        table[i, 0], table[i, 1] = key >> 64, key & _LOW
    order = np.lexsort((table[:, 1], table[:, 0]))
    save_array_atomic(folder / EXACT_FILE, (n, 2), (table[i] for i in order))


def save_minhash_index(folder: Path, band_files: list[Path], sig: np.ndarray, n: int) -> None:
    """``minhash.npy``, ``minhash_ids.npy`` and ``signatures.npy`` of the ``n`` documents
    whose band keys are in ``band_files`` (a raw uint64 file per band, input order) and
    whose signatures are ``sig`` (memory: one band's keys and sort order at a time)."""
    if n >= 1 << 32:
        raise ShoestringError(f"{n:,} documents: the dedup index numbers them with 32 bits",
                              where="--dedup fuzzy", fix="prep the corpus in parts")

    raw = folder / (IDS_FILE + ".raw")  # each band's sort order, while its keys are written
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with open(raw, "wb") as ids:
            def sorted_keys(path: Path) -> np.ndarray:
                keys = np.fromfile(path, dtype=np.uint64, count=n)
                order = np.argsort(keys, kind="stable")  # equal keys stay in input order
                order.astype(np.uint32).tofile(ids)
                return keys[order]

            save_array_atomic(folder / MINHASH_FILE, (len(band_files), n),
                              (sorted_keys(p) for p in band_files))
        save_array_atomic(folder / IDS_FILE, (len(band_files), n),
                          (np.fromfile(raw, dtype=np.uint32, count=n, offset=4 * n * b)
                           for b in range(len(band_files))), np.uint32)
    finally:
        raw.unlink(missing_ok=True)
    step = 1 << 16
    save_array_atomic(folder / SIGNATURES_FILE, (n, sig.shape[1]),
                      (_rows(sig, at, at + step) for at in range(0, n, step)), np.uint32)


def _rows(array: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``array[lo:hi]`` as an array in memory; from a ``np.memmap``, read from its file
    rather than through the map, whose touched pages would stay in the resident set."""
    if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) \
            and array.filename is not None and array.ndim == 2:  # a whole file's map
        hi = min(hi, len(array))
        row = array.shape[1]
        return np.fromfile(array.filename, dtype=array.dtype, count=max(0, hi - lo) * row,
                           offset=array.offset + lo * row * array.itemsize).reshape(-1, row)
    return np.asarray(array[lo:hi])


def finish(folder: Path, exact_docs: int, minhash: dict[str, int] | None) -> dict[str, Any]:
    """Write ``index.json`` beside the arrays the blocks wrote; return the manifest entry.

    ``minhash``: the fuzzy block's settings and kept-document count (None without fuzzy)."""
    index = {"format": FORMAT, "exact": {"file": EXACT_FILE, "documents": exact_docs},
             "minhash": None if minhash is None else {
                 "file": MINHASH_FILE, "ids": IDS_FILE, "signatures": SIGNATURES_FILE,
                 **minhash}}
    write_json_atomic(folder / INDEX_FILE, index)
    names = [INDEX_FILE, EXACT_FILE] + (
        [MINHASH_FILE, IDS_FILE, SIGNATURES_FILE] if minhash is not None else [])
    return {**index, "dir": DIR,
            "files": {f"{DIR}/{n}": {"bytes": (folder / n).stat().st_size,
                                     "sha256": file_sha256(folder / n)} for n in names}}


class DedupIndex:
    """An earlier data dir's dedup index, memory-mapped, for ``--dedup-against``."""

    def __init__(self, path: Path, fingerprint: str, index: dict[str, Any],
                 exact: np.ndarray,
                 minhash: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        self.path, self.fingerprint, self.index = path, fingerprint, index
        self._hi = exact[:, 0]
        self._lo = exact[:, 1]
        # (bands, n) sorted keys, their documents, (n, num_perm) signatures; memory-mapped
        self.minhash, self.minhash_ids, self.signatures = minhash or (None, None, None)

    @classmethod
    def open(cls, path: str | Path, minhash: dict[str, int] | None) -> DedupIndex:
        """Open ``path``'s index; ``minhash``: the settings fuzzy dedup will use (None: exact
        dedup only). Raises a ``ShoestringError`` naming what is missing or different."""
        where = f"--dedup-against {path}"
        root = Path(path)
        manifest_path = root / "manifest.json"
        if not manifest_path.is_file():
            raise ShoestringError(f"{root} is not a shoestring data dir (no manifest.json)",
                                  where=where, fix="name a folder written by shoestring prep")
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        entry = manifest.get("dedup_index")
        if entry is None:
            raise ShoestringError(
                f"{root} has no dedup index: it was prepped with --dedup none, with the ray "
                "executor, or by a shoestring older than the index", where=where,
                fix=f"re-prep {root} with --dedup exact or fuzzy (--executor local), then "
                "dedup against it")
        if entry.get("format") != FORMAT:
            raise ShoestringError(
                f"{root}'s dedup index has format {entry.get('format')}; this shoestring reads "
                f"format {FORMAT}", where=where, fix=f"re-prep {root} with this shoestring")
        folder = root / entry.get("dir", DIR)
        for name in entry["files"]:
            if not (root / name).is_file():
                raise ShoestringError(f"{root / name} is missing", where=where,
                                      fix=f"re-prep {root}")
        exact = np.load(folder / EXACT_FILE, mmap_mode="r")
        bands = None
        if minhash is not None:
            bands = cls._open_minhash(root, folder, entry, minhash, where)
        return cls(root, manifest.get("fingerprint", ""), entry, exact, bands)

    @staticmethod
    def _open_minhash(root: Path, folder: Path, entry: dict[str, Any], want: dict[str, int],
                      where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        have = entry.get("minhash")
        if have is None:
            raise ShoestringError(
                f"{root} was prepped without --dedup fuzzy, so its index has no MinHash keys",
                where=where, fix=f"re-prep {root} with --dedup fuzzy, or dedup the new corpus "
                "with --dedup exact")
        differ = [k for k in MINHASH_SETTINGS if have[k] != want[k]]
        if differ:
            shown = ", ".join(f"minhash_{k} {have[k]} there, {want[k]} here" for k in differ)
            raise ShoestringError(
                f"{root}'s MinHash settings differ from this run's: {shown}", where=where,
                fix="use the same settings (--set " + " --set ".join(
                    f"curate.minhash_{k}={have[k]}" for k in differ) + f"), or re-prep {root}")
        return tuple(np.load(folder / name, mmap_mode="r")  # type: ignore[return-value]
                     for name in (MINHASH_FILE, IDS_FILE, SIGNATURES_FILE))

    def __len__(self) -> int:
        return len(self._hi)

    def has_exact(self, key: int) -> bool:
        """Whether ``key`` (a 128-bit ``text_key``) is one of the indexed texts."""
        hi, lo = np.uint64(key >> 64), np.uint64(key & _LOW)
        a = int(np.searchsorted(self._hi, hi, "left"))
        b = int(np.searchsorted(self._hi, hi, "right"))
        return bool(a < b and (self._lo[a:b] == lo).any())

    def band_owners(self, keys: np.ndarray) -> np.ndarray:
        """Per row of ``keys`` (``(n, bands)`` band keys) and band: the first indexed
        document (input order) of that bucket, or -1 where none is indexed."""
        owner = np.full(keys.shape, -1, dtype=np.int64)
        if self.minhash is None or not self.minhash.shape[1]:
            return owner
        last = self.minhash.shape[1] - 1
        for b in range(keys.shape[1]):
            row = self.minhash[b]
            at = np.minimum(np.searchsorted(row, keys[:, b]), last)  # first of equal keys
            hit = row[at] == keys[:, b]
            owner[hit, b] = self.minhash_ids[b][at[hit]]
        return owner

    def signature_rows(self, ids: np.ndarray) -> np.ndarray:
        """The signatures of indexed documents ``ids`` (read from the memory map)."""
        assert self.signatures is not None
        return np.asarray(self.signatures[np.asarray(ids, dtype=np.int64)])


def against_summary(blocks: list[dict[str, Any]], against: list[DedupIndex]) -> list[dict]:
    """The manifest's ``dedup_against``: per earlier data dir, what it holds and what it
    dropped (from the dedup blocks' ``against`` counts)."""
    out = []
    for i, idx in enumerate(against):
        dropped = {b["block"]: b.get("against", [0] * len(against))[i] for b in blocks
                   if b["block"] in ("exact_dedup", "fuzzy_dedup")}
        out.append({"path": str(idx.path.resolve()), "fingerprint": idx.fingerprint,
                    "indexed": {"exact": len(idx),
                                "minhash": 0 if idx.minhash is None else idx.minhash.shape[1]},
                    "dropped": dropped})
    return out
