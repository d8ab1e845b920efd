"""The work of each Ray task of ``prep --executor ray``: plain functions over files.

Every function here runs the same code the local executor runs — the reader `Read`,
the blocks' own ``process`` (clean, filters, decontamination), `text_key`, `MinHasher`,
and the stages' work of ``prep/stages.py`` (`encode`, `pack_shard`) — on one *part* of
the corpus (or one shard), and writes its output next to the build folder atomically,
finishing with a small JSON *sidecar* that says what it wrote. A task that finds its sidecar returns it without
working again: that is how a killed prep resumes task by task, and why a retried task
(Ray re-runs a task whose worker died) leaves the same bytes.

Rows are identified by a 64-bit *rid*: source index (23 bits) · document index in the
source (33 bits) · piece (8 bits, for decontamination's cut pieces). Sorting by rid is
input order, so the first document of a duplicate bucket is the one the local executor
keeps, and part files named by source and chunk list the corpus in order.

Nothing here imports Ray except ``resolve`` (broadcast objects) and the fault hook.
"""

from __future__ import annotations

import copy
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shoestring.config import DataConfig
from shoestring.data.shards import shard_intact
from shoestring.data.sources import Document, Read
from shoestring.errors import ShoestringError
from shoestring.fsutil import write_bytes_atomic, write_text_atomic
from shoestring.prep.curate.blocks import Block, BlockStats
from shoestring.prep.stages import NO_COUNTS, encode, pack_shard
from shoestring.prep.workers import WorkerPool, init_worker

PIECE_BITS = 8
DOC_BITS = 33
MAX_SOURCES = 1 << (64 - 1 - DOC_BITS - PIECE_BITS)
_CACHE: dict[str, Any] = {}


def user_errors(fn: Any) -> Any:
    """Run a stage function so a bad-input error reaches the driver whole (what, where,
    fix) as its summary: Ray Data re-wraps a raised exception and loses its fields, and
    a bad input is not a task failure to retry."""
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ShoestringError as e:
            return {"summary": json.dumps({"user_error": [e.what, e.where, e.fix]})}
    wrapped.__name__ = fn.__name__
    wrapped.__qualname__ = fn.__qualname__
    return wrapped


def raise_user_error(summary: dict) -> None:
    """On the driver: raise the bad-input error a stage function returned, if any."""
    if "user_error" in summary:
        what, where, fix = summary["user_error"]
        raise ShoestringError(what, where=where, fix=fix)


def maybe_fail(fault: str | None, stage: str) -> None:
    """Test hook: ``fault`` = ``"STAGE,STAGE@FOLDER"``: the first task of each stage named
    kills its worker process (Ray then retries the task), leaving ``FOLDER/fault-STAGE``."""
    if not fault:
        return
    names, _, folder = fault.partition("@")
    if stage not in names.split(","):
        return
    marker = Path(folder) / f"fault-{stage}"
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("fired\n")
        os._exit(1)


def resolve(value: Any) -> Any:
    """An ObjectRef's value, fetched once per worker process (broadcast objects)."""
    try:
        import ray
    except ImportError:  # plain values when called without Ray (unit use)
        return value
    if not isinstance(value, ray.ObjectRef):
        return value
    key = value.hex()
    if key not in _CACHE:
        _CACHE[key] = ray.get(value)
    return _CACHE[key]


def make_rid(source: int, doc: int, piece: int = 0) -> int:
    return (source << (DOC_BITS + PIECE_BITS)) | (doc << PIECE_BITS) | piece


def without(rids: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """Mask of ``rids`` not in the sorted array ``dropped``."""
    if not len(dropped):
        return np.ones(len(rids), dtype=bool)
    at = np.minimum(np.searchsorted(dropped, rids), len(dropped) - 1)
    return dropped[at] != rids


# --- part files ------------------------------------------------------------------------


def write_part(path: Path, rids: list[int] | np.ndarray, texts: list[str],
               val: np.ndarray | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {"rid": pa.array(np.asarray(rids, dtype=np.int64)), "text": pa.array(texts, pa.string())}
    if val is not None:
        cols["val"] = pa.array(np.asarray(val, dtype=bool))
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, buf.getvalue())


def read_part(path: Path, columns: list[str] | None = None) -> dict[str, Any]:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=columns)
    return {name: (table[name].to_pylist() if name == "text" else table[name].to_numpy())
            for name in table.column_names}


def _done(sidecar: Path) -> dict | None:
    return json.loads(sidecar.read_text(encoding="utf-8")) if sidecar.is_file() else None


def _finish(sidecar: Path, summary: dict) -> dict:
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(sidecar, json.dumps(summary))
    return {"summary": json.dumps(summary)}


# --- blocks in tasks ---------------------------------------------------------------------


def fresh(block: Block) -> Block:
    """A copy of a broadcast block with counters of its own; shares its read-only indexes.

    The broadcast block never processes a document, so its counters (``BlockStats`` and
    plain ints such as decontam's ``cut_docs``) are zero; only the mutable ones need new
    objects."""
    twin = copy.copy(block)
    twin.stats = BlockStats(block.name)
    twin.examples = {}
    return twin


def apply_blocks(blocks: list[Block], doc: Document) -> list[Document]:
    """What ``blocks`` keep of one document (several pieces when a block cuts it)."""
    out = [doc]
    for block in blocks:
        out = list(block.process(out))
        if not out:
            break
    return out


def merge_reports(pristine: list[dict], parts: list[list[dict]]) -> list[dict]:
    """One report per block from the reports of each task's copy of the blocks.

    Counts add up; a figure that the untouched block already reports (a setting such as
    decontam's ``eval_ngrams``) is kept as it is.
    """
    merged = []
    for k, base in enumerate(pristine):
        out = dict(base)
        out["dropped"] = dict(base["dropped"])
        for reports in parts:
            rep = reports[k]
            for key, value in rep.items():
                if key == "dropped":
                    for reason, n in value.items():
                        out["dropped"][reason] = out["dropped"].get(reason, 0) + n
                elif isinstance(value, int) and not isinstance(value, bool) and not base.get(key):
                    out[key] = out.get(key, 0) + value
        out["dropped"] = dict(sorted(out["dropped"].items(), key=lambda kv: (-kv[1], kv[0])))
        merged.append(out)
    return merged


# --- stage: read + clean + the first stateless blocks ----------------------------------


@user_errors
def read_source(item: dict, *, cfg: DataConfig, blocks: Any, work: str, part_docs: int,
                part_chars: int, fault: str | None = None) -> dict:
    """Read one source, run ``blocks`` (clean first); write parts ``parts0/SSSSSSS-CCCCC``."""
    index, source = int(item["index"]), item["source"]
    root = Path(work)
    sidecar = root / "read" / f"{index:07d}.json"
    if (found := _done(sidecar)) is not None:
        return {"summary": json.dumps(found)}
    maybe_fail(fault, "read")
    init_worker()
    mine = [fresh(b) for b in resolve(blocks)]
    read = Read([source], cfg)
    parts: list[dict] = []
    rids: list[int] = []
    texts: list[str] = []
    chars = 0

    def flush() -> None:
        nonlocal rids, texts, chars
        if not texts and parts:
            return
        name = f"{index:07d}-{len(parts):05d}"
        write_part(root / "parts0" / f"{name}.parquet", rids, texts)
        parts.append({"name": name, "rows": len(texts)})
        rids, texts, chars = [], [], 0

    for i, doc in enumerate(read):
        for piece, kept in enumerate(apply_blocks(mine, doc)):
            rids.append(make_rid(index, i, piece))
            texts.append(kept.text)
            chars += len(kept.text)
        if len(texts) >= part_docs or chars >= part_chars:
            flush()
    if texts or not parts:
        flush()
    stats = read.stats
    summary = {"index": index, "parts": parts, "read": stats.documents, "files": stats.files,
               "skipped": stats.skipped, "counts": stats.counts(),
               "reports": [b.report() for b in mine]}
    return _finish(sidecar, summary)


# --- stages between and after the stateful blocks -------------------------------------


@user_errors
def apply_part(item: dict, *, blocks: Any, dropped: Any, work: str, src: str, dst: str,
               val_fraction: float | None, fault: str | None = None,
               stage: str = "final") -> dict:
    """Drop the rows of ``dropped``, run ``blocks``; with ``val_fraction``, mark the
    validation rows (by content hash, as the local executor does)."""
    from shoestring.prep.driver import is_validation

    root = Path(work)
    name = item["name"]
    sidecar = root / dst / f"{name}.json"
    if (found := _done(sidecar)) is not None:
        return {"summary": json.dumps(found)}
    maybe_fail(fault, stage)
    mine = [fresh(b) for b in resolve(blocks)]
    part = read_part(root / src / f"{name}.parquet")
    keep = without(part["rid"], resolve(dropped))
    rids: list[int] = []
    texts: list[str] = []
    for rid, text in zip(part["rid"][keep].tolist(), (t for t, k in zip(part["text"], keep) if k)):
        pieces = apply_blocks(mine, Document(text, "", str(rid)))
        if len(pieces) > 1 and (rid & ((1 << PIECE_BITS) - 1)) + len(pieces) > 1 << PIECE_BITS:
            raise ShoestringError(f"a document was cut into {len(pieces)} pieces, more than "
                                  f"the ray executor numbers ({1 << PIECE_BITS})",
                                  where="curate.decontam_max_pieces", fix="lower it")
        for k, doc in enumerate(pieces):
            rids.append(rid + k)
            texts.append(doc.text)
    val = None
    if val_fraction is not None:
        val = np.array([is_validation(t, val_fraction) for t in texts], dtype=bool)
    write_part(root / dst / f"{name}.parquet", rids, texts, val)
    summary = {"name": name, "rows_in": int(keep.sum()), "rows": len(texts),
               "val": int(val.sum()) if val is not None else 0,
               "chars": sum(len(t) for t in texts),
               "val_chars": sum(len(t) for t, v in zip(texts, val) if v) if val is not None else 0,
               "reports": [b.report() for b in mine]}
    return _finish(sidecar, summary)


# --- shuffle inputs (map side of the dedup shuffles) -----------------------------------


def exact_rows(arg: tuple) -> dict[str, np.ndarray]:
    """(k0, k1) = the 128-bit text key of exact dedup, per row not yet dropped."""
    from shoestring.prep.curate.dedup import text_key

    path, dropped, work, fault = arg
    maybe_fail(fault, "exact")
    part = read_part(Path(path))
    keep = without(part["rid"], resolve(dropped))
    keys = [text_key(t) for t, k in zip(part["text"], keep) if k]
    mask = (1 << 64) - 1
    return {"k0": np.array([k & mask for k in keys], dtype=np.uint64),
            "k1": np.array([k >> 64 for k in keys], dtype=np.uint64),
            "order": part["rid"][keep].astype(np.int64)}


def band_rows(arg: tuple) -> dict[str, np.ndarray]:
    """(k0, k1) = (band, LSH band key) of every band of every row with a word; ``hasher``:
    the fuzzy dedup block's `MinHasher` arguments (num_perm, ngram, seed, bands). Writes
    the part's signatures for the reduce tasks' verification (`PartSignatures`)."""
    from shoestring.prep.curate.minhash import BATCH, MinHasher

    path, dropped, work, fault, hasher = arg
    maybe_fail(fault, "fuzzy")
    part = read_part(Path(path))
    keep = without(part["rid"], resolve(dropped))
    texts = [t for t, k in zip(part["text"], keep) if k]
    rids = part["rid"][keep].astype(np.int64)
    hasher = MinHasher(*hasher)  # its own scratch buffer (a broadcast one is read-only)
    bands = hasher.bands
    out_k0, out_k1, out_rid, sigs = [], [], [], []
    for i in range(0, len(texts), BATCH):  # FuzzyDedup's own batches of its own keys
        sig, has = hasher.text_signatures(texts[i : i + BATCH])
        keys = hasher.band_keys(sig)
        sigs.append(sig)
        out_k0.append(np.tile(np.arange(bands, dtype=np.uint64), len(keys)))
        out_k1.append(keys.reshape(-1))
        out_rid.append(np.repeat(rids[i : i + BATCH][has], bands))
    sig_rids = (np.concatenate(out_rid)[::bands] if out_rid else np.zeros(0, np.int64))
    PartSignatures.write(Path(work), Path(path).stem, sig_rids,
                         np.concatenate(sigs) if sigs else np.zeros((0, hasher.num_perm),
                                                                    np.uint32))
    if not out_rid:
        z = np.zeros(0, np.uint64)
        return {"k0": z, "k1": z, "order": np.zeros(0, np.int64)}
    return {"k0": np.concatenate(out_k0), "k1": np.concatenate(out_k1),
            "order": np.concatenate(out_rid)}


class PartSignatures:
    """The signatures ``band_rows`` wrote, one pair of files per part
    (``fuzzy-sig/NAME.rid.npy``: the part's row ids, sorted; ``NAME.sig.npy``: their
    ``(rows, num_perm)`` uint32 signatures), looked up by row id in a reduce task:
    ``signatures(rids)`` for ``verify_pairs``.

    Parts hold disjoint ranges of row ids (a source's documents, cut in order), so a row id
    finds its part by the parts' first ids and its row by a binary search in that part's
    memory-mapped ids: memory per task is a few numbers per part, not per document."""

    DIR = "fuzzy-sig"

    def __init__(self, work: str, names: list[str]) -> None:
        self.work, self.names = work, list(names)
        self._open: tuple[np.ndarray, list[np.ndarray], list[np.ndarray]] | None = None

    @classmethod
    def write(cls, work: Path, name: str, rids: np.ndarray, sig: np.ndarray) -> None:
        folder = work / cls.DIR
        folder.mkdir(parents=True, exist_ok=True)
        order = np.argsort(rids, kind="stable")
        for suffix, array in (("rid", rids[order].astype(np.int64)),
                              ("sig", sig[order].astype(np.uint32))):
            buf = io.BytesIO()
            np.save(buf, array)
            write_bytes_atomic(folder / f"{name}.{suffix}.npy", buf.getvalue())

    def __getstate__(self) -> dict:
        return {"work": self.work, "names": self.names, "_open": None}

    def _tables(self) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        if self._open is None:
            folder = Path(self.work) / self.DIR
            rids, sigs = [], []
            for n in self.names:
                r = np.load(folder / f"{n}.rid.npy", mmap_mode="r")
                if len(r):
                    rids.append(r)
                    sigs.append(np.load(folder / f"{n}.sig.npy", mmap_mode="r"))
            order = np.argsort([int(r[0]) for r in rids]).tolist()
            rids, sigs = [rids[k] for k in order], [sigs[k] for k in order]
            self._open = (np.array([int(r[0]) for r in rids], dtype=np.int64), rids, sigs)
        return self._open

    def __call__(self, rids: np.ndarray) -> np.ndarray:
        starts, part_rids, sigs = self._tables()
        part = np.searchsorted(starts, rids, side="right") - 1
        out = np.empty((len(rids), sigs[0].shape[1] if sigs else 0), dtype=np.uint32)
        for k in np.unique(part).tolist():
            sel = np.flatnonzero(part == k)
            row = np.minimum(np.searchsorted(part_rids[k], rids[sel]), len(part_rids[k]) - 1)
            if k < 0 or not np.array_equal(part_rids[k][row], rids[sel]):
                raise ValueError(f"row ids without a signature in {self.work}/{self.DIR}")
            out[sel] = sigs[k][row]
        return out


# --- tokenizer --------------------------------------------------------------------------


def train_texts(paths: list[Path]) -> Iterator[str]:
    """The training documents of the kept parts ``paths``, in order (`stages.train_on_sample`'s
    ``texts``, in one task)."""
    for path in paths:
        part = read_part(path, ["text", "val"])
        yield from (t for t, val in zip(part["text"], part["val"].tolist()) if not val)


# --- stage: tokenize --------------------------------------------------------------------


@user_errors
def encode_part(item: dict, *, work: str, tokenizer: str, sep_id: int, dtype: str,
                compress: Any = None, fault: str | None = None) -> dict:
    """`stages.encode` over one part's documents of one split, inline, filtered by the
    driver's ``compress`` (a copy per task); write ``encode-SPLIT/NAME.bin`` (tokens, each
    document followed by ``sep_id``) and ``.ends`` (document ends)."""
    root = Path(work)
    name, split = item["name"], item["split"]
    out = root / f"encode-{split}"
    sidecar = out / f"{name}.json"
    if (found := _done(sidecar)) is not None:
        return {"summary": json.dumps(found)}
    maybe_fail(fault, "encode")
    init_worker()
    part = read_part(root / "kept" / f"{name}.parquet", ["text", "val"])
    want = split == "val"
    records = ((t, None) for t, v in zip(part["text"], part["val"].tolist()) if v == want)
    streams: list[np.ndarray] = [np.zeros(0, dtype)]
    ends: list[np.ndarray] = [np.zeros(0, np.int64)]
    counts = dict(NO_COUNTS)
    for tokens, batch_ends, counts, _ in encode(records, WorkerPool(1).map, tokenizer, sep_id,
                                                np.dtype(dtype), counts, compress):
        streams.append(tokens)
        ends.append(batch_ends)
    out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out / f"{name}.bin", np.concatenate(streams).tobytes())
    write_bytes_atomic(out / f"{name}.ends", np.concatenate(ends).astype("<u8").tobytes())
    return _finish(sidecar, {"name": name, **counts})


# --- stage: pack ------------------------------------------------------------------------


class SplitStream:
    """The split's token stream (its parts back to back) as rows of ``body`` tokens, read
    as `packing.StreamRows` reads one file: ``[lo:hi]`` and ``take(rows)``."""

    def __init__(self, parts: list[dict], root: Path, split: str, dtype: str,
                 body: int) -> None:
        self.parts = [p for p in parts if p["tokens"]]
        self.starts = np.array([p["offset"] for p in self.parts], dtype=np.int64)
        self.streams = [np.memmap(root / f"encode-{split}" / f"{p['name']}.bin", dtype=dtype,
                                  mode="r") for p in self.parts]
        self.root, self.split, self.dtype, self.body = root, split, dtype, body

    def __getitem__(self, key: slice) -> np.ndarray:
        return self._tokens(key.start * self.body, key.stop * self.body).reshape(-1, self.body)

    def take(self, rows: np.ndarray) -> np.ndarray:
        if not len(rows):
            return np.zeros((0, self.body), self.dtype)
        return np.stack([self[r : r + 1][0] for r in np.asarray(rows).tolist()])

    def _tokens(self, t0: int, t1: int) -> np.ndarray:
        k = int(np.searchsorted(self.starts, t0, side="right")) - 1
        out = [np.zeros(0, self.dtype)]
        while t0 < t1:
            lo = int(self.starts[k])
            take = self.streams[k][t0 - lo : min(t1 - lo, len(self.streams[k]))]
            out.append(np.asarray(take))
            t0 += len(take)
            k += 1
        return out[-1] if len(out) == 2 else np.concatenate(out)

    def doc_starts(self, t0: int = 0, t1: int | None = None) -> np.ndarray:
        """Stream offsets of the split's document starts in [t0, t1) (default: all of them;
        8 bytes a document), read only from the parts that overlap the range."""
        starts = []
        for p in self.parts:
            lo, hi = p["offset"], p["offset"] + p["tokens"]
            if hi <= t0 or (t1 is not None and lo >= t1):
                continue
            ends = np.fromfile(self.root / f"encode-{self.split}" / f"{p['name']}.ends",
                               dtype="<u8").astype(np.int64)
            found = lo + np.concatenate([[0], ends[:-1]])
            starts.append(found if t1 is None else found[(found >= t0) & (found < t1)])
        return np.concatenate(starts) if starts else np.zeros(0, np.int64)


@user_errors
def unigram_part(item: dict, *, work: str, parts: list[dict], split: str, dtype: str,
                 body: int, vocab: int, logp: Any = None, fault: str | None = None) -> dict:
    """Sequences [lo, hi): their token counts (``logp`` None) or their unigram scores, saved
    as ``sort/{counts,scores}-K.npy`` (the local ``unigram_sort_order``, cut into ranges)."""
    from shoestring.prep.packing import unigram_counts, unigram_scores

    root = Path(work)
    k, lo, hi = int(item["index"]), int(item["lo"]), int(item["hi"])
    what = "counts" if logp is None else "scores"
    path = root / "sort" / f"{what}-{k:05d}.npy"
    if not path.is_file():
        bodies = SplitStream(parts, root, split, dtype, body)[lo:hi]
        value = (unigram_counts(bodies, vocab) if logp is None
                 else unigram_scores(bodies, resolve(logp)))
        buf = io.BytesIO()
        np.save(buf, value)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, buf.getvalue())
    return {"summary": json.dumps({"index": k, "path": str(path)})}


@user_errors
def pack_part(item: dict, *, work: str, build: str, parts: list[dict], split: str,
              cfg: DataConfig, ids: dict[str, int], dtype: str, order: str | None = None,
              fault: str | None = None) -> dict:
    """`stages.pack_shard` for shard ``item['index']`` (sequences [lo, hi), or with
    ``order`` — the path of the sorted sequence order — sequences order[lo:hi])."""
    root, out = Path(work), Path(build)
    k, lo, hi = int(item["index"]), int(item["lo"]), int(item["hi"])
    sidecar = root / f"pack-{split}" / f"{k:05d}.json"
    found = _done(sidecar)
    if found is not None and shard_intact(out, found):
        return {"summary": json.dumps({**found, "kept": True})}
    maybe_fail(fault, "pack")
    body = cfg.row_body
    stream = SplitStream(parts, root, split, dtype, body)
    if order is None:
        sequences, starts = None, stream.doc_starts(lo * body, hi * body)
    else:  # sorted: this shard's sequences are order[lo:hi], from anywhere in the stream
        sequences, starts = np.load(order, mmap_mode="r"), stream.doc_starts()
    info, _ = pack_shard(out, split, k, stream, lo, hi, sequences, starts, cfg, ids,
                         np.dtype(dtype))
    _finish(sidecar, info)
    return {"summary": json.dumps({**info, "kept": False})}
