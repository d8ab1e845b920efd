"""MinHash signatures, LSH banding and candidate verification for fuzzy dedup.

Shingles are word n-grams (word 5-grams by default; words as in ``curate.text``), hashed
without a Python loop per shingle: all shingles of a batch of documents at once, as one flat
array of 32-bit hashes plus a count per document.

The signatures are rensa's R-MinHash (``RMinHash.digest_matrix_from_flat_token_hashes``, its
batch API on pre-hashed tokens, Rust): bench/dedup.py measured it 2.0x faster than the
numpy permutation code this module had (5.2 M shingles: 0.16 s against 0.32 s, including
the copy of its rows into numpy), with the same recall, so the peer replaced it; the
shingle hashing stays ours, because rensa's string path (``digest_matrix_from_token_sets``)
measured 9x slower end to end.
Each value is the minimum of an affine permutation of the shingle hashes, so the fraction
of equal values estimates the Jaccard similarity of the shingle sets (a test checks it).

LSH, then verification (as datatrove, NeMo Curator and text-dedup do it): the signature is
cut into ``bands`` bands of ``rows`` values; each band is hashed to one 64-bit key. Two
documents are *candidates* when any band key is equal, which happens with probability
``1 - (1 - J**rows)**bands`` for Jaccard similarity ``J``; a candidate pair counts only when
its whole signatures agree on at least ``threshold`` of their values (``similar``: the
estimated Jaccard, from all ``num_perm`` values).

Why 28 bands × 4 rows and threshold 0.65 (the defaults, ``config.CurateConfig``): the
planted near copies that bench/prep_scale.py scores reach down to J = 0.7, and 14 × 8 (the
earlier default, no verification) made such a pair a candidate only 57% of the time. With
the same 112 values cut into 28 × 4 a pair is a candidate with probability 0.9995 at
J = 0.7 (0.98 at 0.6, 0.84 at 0.5, 0.52 at 0.4): LSH alone would now drop far too much,
and verification is what decides. The estimate from 112 values has a standard deviation
of sqrt(J(1-J)/112) (0.043 at J = 0.7), so the chance that a pair passes ``>= 0.65`` (73
of 112 values) is 0.887 at J = 0.7, 0.954 at 0.72, 0.992 at 0.75, 1.000 at 0.8, and 0.53
at 0.65, 0.15 at 0.6, 0.018 at 0.55, 0.001 at 0.5: 0.977 on average over J uniform in
0.7–0.8, 0.991 over 0.7–0.95. A lower threshold catches more of the pairs just above 0.7
but also more of the pairs at 0.55–0.65 that real text holds: at 0.6 (0.998 over 0.7–0.8)
bench/prep_scale.py's 1.4 GB corpus lost precision to 0.988, most of it documents that
share most of their paragraphs with another without being planted copies (docs/data.md).
Same signature cost as before (112 values); more, cheaper band sorts (28 instead of 14).

Keep rule (both executors): in every band, each document is compared with the *first*
document of its bucket (the earliest in input order, ``first_in_bucket``); a document is
dropped exactly when, in some band, that first document is not itself and the pair
verifies (``verify_pairs``). So the earliest document of every cluster (a connected
component of the verified pairs) is kept, and the outcome depends only on input order,
never on batch sizes or partitions.

Deciding (``FuzzyDedup``): band keys spill to one file per band and signatures to one
memory-mapped file of uint32 rows; each band is sorted once (``first_in_bucket``) and only
its candidate pairs' signature rows are read back, a chunk at a time, so memory holds
arrays of a few bytes per document instead of dict tables (docs/data.md, "Bounded
memory"). The ray executor runs the same code on its shuffled buckets:
``MinHasher.text_signatures``/``band_keys`` in its map tasks, `first_in_bucket` and
`verify_pairs` in its reduce tasks (``distributed.shuffle.bucket_firsts``).
"""

from __future__ import annotations

import itertools
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from shoestring.prep.curate.blocks import Block, Drop
from shoestring.prep.curate.dedup_index import DedupIndex, save_minhash_index
from shoestring.prep.curate.text import batch_word_hashes, fmix64, ngram_hashes
from shoestring.data.sources import Document

BATCH = 256  # texts hashed at once: the batch does not change a key, it bounds memory
BANDS, ROWS, THRESHOLD = 28, 4, 0.65  # the defaults; why: the module docstring
VERIFY_CHUNK = 1 << 12  # candidate pairs verified at once: bounds the signature rows read
_BAND_MULT = (
    np.random.default_rng(0xBA4D).integers(0, 1 << 63, 64, dtype=np.uint64) << np.uint64(1)
) | np.uint64(1)


class MinHasher:
    """Turns texts into MinHash signatures (uint32, ``num_perm`` per text) and LSH band keys."""

    def __init__(self, num_perm: int = BANDS * ROWS, ngram: int = 5, seed: int = 1,
                 bands: int = BANDS) -> None:
        if num_perm % bands:
            raise ValueError(f"bands ({bands}) must divide num_perm ({num_perm})")
        self.num_perm = num_perm
        self.ngram = ngram
        self.seed = seed
        self.bands = bands
        self.rows = num_perm // bands

    def signatures(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(signatures ``(len(texts), num_perm)`` uint32, mask of texts that have a word).

        A text without words has no shingles; its row is all ``0xFFFFFFFF`` and its mask
        entry False (such texts are left to exact dedup).
        """
        values, lengths = self.batch_shingle_hashes(texts)
        return self._signatures(values, lengths)

    def batch_shingle_hashes(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' shingle hashes concatenated, and how many belong to each text."""
        wh, counts = batch_word_hashes(texts)
        n = self.ngram
        starts = np.cumsum(counts) - counts
        full = np.maximum(counts - n + 1, 0)  # shingles of texts with at least n words
        grams = ngram_hashes(wh, n)
        take = np.arange(int(full.sum()), dtype=np.int64)
        take += np.repeat(starts - (np.cumsum(full) - full), full)
        lengths = full.copy()
        values = grams[take]
        short = np.flatnonzero((counts > 0) & (counts < n))
        if len(short):  # fewer words than n: one shingle of all the words
            extra = np.array(
                [
                    ngram_hashes(wh[starts[i] : starts[i] + counts[i]], int(counts[i]))[0]
                    for i in short
                ],
                dtype=np.uint64,
            )
            lengths[short] = 1
            # Insert each text's single shingle at its place in the concatenation.
            at = (np.cumsum(full) - full)[short]
            values = np.insert(values, at, extra)
        return (values >> np.uint64(32)).astype(np.uint32), lengths

    def _signatures(self, values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from rensa import RMinHash

        sig = np.full((len(lengths), self.num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
        has = lengths > 0
        if not has.any():
            return sig, has
        offsets = np.concatenate([[0], np.cumsum(lengths[has])]).astype(np.uint64)
        matrix = RMinHash.digest_matrix_from_flat_token_hashes(
            values.astype(np.uint64), offsets, self.num_perm, self.seed)
        sig[has] = np.asarray(matrix.to_rows(), dtype=np.uint32)
        return sig, has

    def text_signatures(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(``(k, num_perm)`` signatures of the ``k`` texts that have a word, that mask):
        what both executors index (``band_keys``) and verify with, ``BATCH`` texts at a
        time."""
        sig, has = self.signatures(texts)
        return sig[has], has

    def band_keys(self, sig: np.ndarray) -> np.ndarray:
        """``(n, bands)`` uint64 keys: each band's ``rows`` values hashed together."""
        bands = sig.reshape(len(sig), self.bands, self.rows).astype(np.uint64)
        acc = bands[:, :, 0] * _BAND_MULT[0]
        for r in range(1, self.rows):
            acc += bands[:, :, r] * _BAND_MULT[r]
        acc += np.arange(self.bands, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        return fmix64(acc)


def candidate_probability(jaccard: float, bands: int, rows: int) -> float:
    """Chance that two documents with this Jaccard similarity share at least one band."""
    return 1.0 - (1.0 - jaccard**rows) ** bands


def similar(sig_a: np.ndarray, sig_b: np.ndarray, threshold: float) -> np.ndarray:
    """Per row pair of two ``(k, num_perm)`` signature arrays: whether the fraction of equal
    values (the estimated Jaccard) is at least ``threshold``."""
    agree = np.count_nonzero(sig_a == sig_b, axis=1)
    return agree >= threshold * sig_a.shape[1] - 1e-9


def verify_pairs(later: np.ndarray, owners: np.ndarray,
                 signatures: Callable[[np.ndarray], np.ndarray], threshold: float) -> np.ndarray:
    """Mask of the candidate pairs ``(later[i], owners[i])`` that verify (``similar``).

    ``signatures(ids)``: the ``(len(ids), num_perm)`` signature rows of those documents —
    a memory map indexed by position locally, rows looked up by input id on Ray. Pairs are
    read ``VERIFY_CHUNK`` at a time, so memory does not grow with the candidates."""
    ok = np.zeros(len(later), dtype=bool)
    for at in range(0, len(later), VERIFY_CHUNK):
        end = at + VERIFY_CHUNK
        ok[at:end] = similar(signatures(later[at:end]), signatures(owners[at:end]), threshold)
    return ok


def first_in_bucket(*keys: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """For every row, the ``order`` of the first row with the same key(s) — itself when it
    is first; ``order`` defaults to the row's position, i.e. input order.

    The keep rule of both executors' dedup: a row is a duplicate (exact dedup) or a
    candidate to verify against that first row (fuzzy dedup, `verify_pairs`) exactly when
    its answer is not its own ``order``. The local run asks per LSH band with positions
    (``band_collisions``); the ray executor per shuffle partition with rows' input ids and
    (band, band key) or the 128-bit text key as the key (``distributed.shuffle``).

    One stable sort: equal keys end up adjacent, in ``order``, so the first of each run is
    the earliest row of that bucket. Memory (one key, no ``order``): about 33 bytes per key
    besides ``keys`` (the sort, a run flag and the answer)."""
    n = len(keys[0])
    if order is None and len(keys) == 1:
        perm = np.argsort(keys[0], kind="stable")
    else:  # np.lexsort: the last key sorts first; it is stable, so ties keep row order
        perm = np.lexsort(((order,) if order is not None else ()) + keys[::-1])
    start = np.empty(n, dtype=bool)
    start[:1] = True
    for i, key in enumerate(keys):  # a run starts where any key changes
        sorted_key = key[perm]
        if i == 0:
            np.not_equal(sorted_key[1:], sorted_key[:-1], out=start[1:])
        else:
            start[1:] |= sorted_key[1:] != sorted_key[:-1]
        del sorted_key
    run = np.arange(n, dtype=np.int64)
    run[~start] = 0
    np.maximum.accumulate(run, out=run)  # each sorted position → where its run starts
    first = np.empty(n, dtype=np.int64)
    first[perm] = perm[run] if order is None else order[perm[run]]
    return first


def _roots(parent: np.ndarray, x: np.ndarray) -> np.ndarray:
    r = parent[x]
    while True:
        up = parent[r]
        if np.array_equal(up, r):
            return r
        r = up


def union_pairs(parent: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Union-find over a numpy parent array: merge the components of every pair (a[i], b[i]).

    Vectorized: each round finds the pairs' roots and hooks the larger root under the
    smallest one it meets (``np.minimum.at``), so every root is the smallest document of
    its tree and a round merges at least one pair; rounds repeat until no pair spans two
    components."""
    while len(a):
        ra, rb = _roots(parent, a), _roots(parent, b)
        apart = ra != rb
        a, b, ra, rb = a[apart], b[apart], ra[apart], rb[apart]
        np.minimum.at(parent, np.maximum(ra, rb), np.minimum(ra, rb))


def component_labels(parent: np.ndarray) -> np.ndarray:
    """Every document's root (the smallest document of its component), by pointer jumping."""
    while True:
        up = parent[parent]
        if np.array_equal(up, parent):
            return parent
        parent = up


class Clusters:
    """Connected components of documents linked pair by pair: how both executors count
    fuzzy dedup's clusters (union-find over a numpy parent array, ``union_pairs``).

    ``ids``: a count ``n`` (the documents are positions 0..n-1: the local run), or the
    sorted ids that links may name (the ray executor's driver: the row ids of the dropped
    documents and of the first documents they were verified against), mapped to positions
    by binary search. Memory: 8 bytes per id (and 8 more per id with ``ids``); links are
    merged a batch at a time, never all held."""

    def __init__(self, ids: int | np.ndarray) -> None:
        self.ids = None if isinstance(ids, (int, np.integer)) else np.asarray(ids, np.int64)
        self.parent = np.arange(int(ids) if self.ids is None else len(self.ids), dtype=np.int64)

    def link(self, a: np.ndarray, b: np.ndarray) -> None:
        """Merge the components of every pair ``(a[i], b[i])``."""
        if self.ids is not None:
            a, b = np.searchsorted(self.ids, a), np.searchsorted(self.ids, b)
        union_pairs(self.parent, a, b)

    def labels(self) -> np.ndarray:
        """Per position, its component's smallest position."""
        return component_labels(self.parent)

    def sizes(self) -> dict[int, int]:
        """Size histogram of the components of two or more (size → count)."""
        return cluster_histogram(self.labels())


def band_collisions(band_files: Sequence[Path], n: int,
                    signatures: Callable[[np.ndarray], np.ndarray] | None = None,
                    threshold: float = THRESHOLD,
                    claimed_files: Sequence[Path] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(earliest, labels) for ``n`` documents whose band keys are in ``band_files`` (one
    raw uint64 file per band, a key per document in input order).

    In each band, every document is paired with the first document of its bucket
    (`first_in_bucket`); with ``signatures`` (see `verify_pairs`) a pair counts only when
    it verifies at ``threshold``, without them every candidate counts (plain LSH).
    ``claimed_files`` (``--dedup-against``, one raw bool file per band): rows whose bucket
    an earlier corpus already holds; they were compared with that corpus's first document
    instead, so they take no part in this band here.

    ``earliest[i]``: the earliest document with a counted pair with document ``i`` (``i``
    when none came before it) — so ``i`` is dropped exactly when ``earliest[i] < i``.
    ``labels``: the connected components of the counted pairs (union-find).
    Memory: 16 bytes per document held (the two answers), plus about 41 per document for
    one band at a time (its keys and ``first_in_bucket``) and one chunk of signature rows;
    nothing per text byte.
    """
    earliest = np.arange(n, dtype=np.int64)
    clusters = Clusters(n)
    for b, path in enumerate(band_files):
        keys = np.fromfile(path, dtype=np.uint64, count=n)
        if claimed_files is None:
            rows, first = None, first_in_bucket(keys)
        else:
            rows = np.flatnonzero(~np.fromfile(claimed_files[b], dtype=bool, count=n))
            first = first_in_bucket(keys[rows], order=rows)
        del keys
        own = np.arange(n, dtype=np.int64) if rows is None else rows
        dup = first != own
        later, owners = own[dup], first[dup]
        del first, own, dup
        if signatures is not None:
            ok = verify_pairs(later, owners, signatures, threshold)
            later, owners = later[ok], owners[ok]
        earliest[later] = np.minimum(earliest[later], owners)
        clusters.link(later, owners)
    return earliest, clusters.labels()


def cluster_histogram(labels: np.ndarray) -> dict[int, int]:
    """Size histogram of the components with two or more documents (size → count)."""
    sizes = np.bincount(labels)
    sizes = sizes[sizes >= 2]
    values, counts = np.unique(sizes, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts)}


class FuzzyDedup(Block):
    """Near-duplicate removal with MinHash LSH and verification; keeps the first document
    seen of a cluster.

    Keep rule (deterministic, the module docstring): a document is dropped when, in some
    band, the first document of its bucket is an earlier one whose signature agrees with
    its own on at least ``threshold`` of the values. The earliest document of a cluster
    (connected component of the verified pairs, union-find) is therefore always kept. A
    rare late document that bridges two clusters whose first documents do not verify with
    each other is dropped, and both first documents stay. Documents without any word are
    passed through (exact dedup handles empty-ish texts).

    Bounded memory, in three steps (docs/data.md): (1) documents are hashed in batches of
    ``batch`` and spooled, with their band keys written to one file per band and their
    signatures to one file of uint32 rows, in a temporary folder under ``work_dir``;
    (2) each band's keys are sorted to pair every document with the first of its bucket,
    and those candidate pairs' signature rows are read back (memory-mapped) to verify them
    (``band_collisions``); (3) the spool is replayed in order, keeping or dropping each
    document. Peak memory holds one batch of documents and about 60 bytes per document
    (never the text), so it does not grow with the text's size; the temporary disk is the
    kept text plus 8 bytes per band and 4 per signature value per document (672 bytes with
    28 × 4). Results do not depend on the batch size.

    ``against``: earlier data dirs' indexes (``--dedup-against``): in each band, a document
    whose bucket an index holds is compared with that index's first document of the bucket
    (and with no document of this corpus), exactly as one run over the earlier corpus and
    then this one would; a pair that verifies drops it (``near_duplicate_in_earlier_data``).
    ``index_dir``: where to write this corpus's band keys and signatures for later runs.
    """

    name = "fuzzy_dedup"
    stateful = True

    def __init__(
        self,
        ngram: int = 5,
        bands: int = BANDS,
        rows: int = ROWS,
        seed: int = 1,
        batch: int = BATCH,
        keep_examples: int = 0,
        work_dir: Path | None = None,
        against: Sequence[DedupIndex] = (),
        index_dir: Path | None = None,
        threshold: float = THRESHOLD,
        name_partners: bool = False,
    ) -> None:
        super().__init__(keep_examples)
        # name the earlier document of every drop (Drop.of: curate.dropped_ids), at the
        # cost of one id per drop held until the replay ends
        self.name_partners = name_partners
        self.hasher = MinHasher(num_perm=bands * rows, ngram=ngram, seed=seed, bands=bands)
        self.threshold = threshold
        self.batch = batch
        self.work_dir = work_dir
        self.against = list(against)
        self.against_dropped = [0] * len(self.against)
        self.index_dir = index_dir
        self.indexed = 0
        self.clusters = 0
        self.cluster_sizes: dict[int, int] = {}

    def settings(self) -> dict[str, Any]:
        """What the index depends on (recorded in it; ``threshold`` only for the record)."""
        h = self.hasher
        return {"ngram": h.ngram, "bands": h.bands, "rows": h.rows, "seed": h.seed,
                "threshold": self.threshold}

    def process(self, docs: Iterable[Document]) -> Iterator[Document]:
        if self.work_dir is not None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="fuzzy-dedup-", dir=self.work_dir) as tmp:
            folder = Path(tmp)
            n = self._spill(docs, folder)
            bands = [folder / f"band-{b:03d}.u64" for b in range(self.hasher.bands)]
            claimed = ([folder / f"claimed-{b:03d}.u8" for b in range(self.hasher.bands)]
                       if self.against else None)
            sig = self._signatures(folder, n)
            earliest, labels = band_collisions(bands, n, sig.__getitem__, self.threshold,
                                               claimed)
            self.indexed = n
            self.cluster_sizes = cluster_histogram(labels)
            self.clusters = sum(self.cluster_sizes.values())
            del labels
            if self.index_dir is not None:
                save_minhash_index(self.index_dir, bands, sig, n)
            del sig
            old = np.fromfile(folder / "old.i8", dtype=np.int8)
            yield from self._replay(folder / "docs.pkl", earliest, old)

    def _signatures(self, folder: Path, n: int) -> np.ndarray:
        """The spilled ``(n, num_perm)`` signatures, memory-mapped (read only)."""
        if not n:
            return np.zeros((0, self.hasher.num_perm), dtype=np.uint32)
        return np.memmap(folder / "sig.u32", dtype=np.uint32, mode="r",
                         shape=(n, self.hasher.num_perm))

    def _spill(self, docs: Iterable[Document], folder: Path) -> int:
        """Step 1: hash batches, append band keys per band and signatures, spool the
        documents; with ``against``, decide each row against the earlier indexes."""
        it = iter(docs)
        n = 0
        nb = self.hasher.bands
        with ExitStack() as files:
            bands = [files.enter_context(open(folder / f"band-{b:03d}.u64", "wb"))
                     for b in range(nb)]
            claimed = [files.enter_context(open(folder / f"claimed-{b:03d}.u8", "wb"))
                       for b in range(nb)] if self.against else []
            sigs = files.enter_context(open(folder / "sig.u32", "wb"))
            old = files.enter_context(open(folder / "old.i8", "wb"))
            spool = files.enter_context(open(folder / "docs.pkl", "wb"))
            while batch := list(itertools.islice(it, self.batch)):
                sig, has = self.hasher.text_signatures([d.text for d in batch])
                keys = self.hasher.band_keys(sig)
                for b, f in enumerate(bands):
                    np.ascontiguousarray(keys[:, b]).tofile(f)
                sig.tofile(sigs)
                which, taken = self._old_hits(keys, sig)
                which.tofile(old)
                for b, f in enumerate(claimed):
                    np.ascontiguousarray(taken[:, b]).tofile(f)
                pickle.dump((batch, has), spool, protocol=pickle.HIGHEST_PROTOCOL)
                n += len(keys)
        return n

    def _old_hits(self, keys: np.ndarray, sig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the first ``against`` index holding a document it verifies with in a
        shared bucket (else -1); and per row and band, whether an index holds its bucket
        (the first such index answers for that band)."""
        which = np.full(len(keys), -1, dtype=np.int8)
        taken = np.zeros(keys.shape, dtype=bool)
        for i, idx in enumerate(self.against):
            owner = idx.band_owners(keys)  # (rows, bands): the index's first document, or -1
            owner[taken] = -1  # an earlier index already holds that bucket
            taken |= owner >= 0
            row, band = np.nonzero(owner >= 0)
            ok = similar(sig[row], idx.signature_rows(owner[row, band]), self.threshold)
            hit = np.zeros(len(keys), dtype=bool)
            hit[row[ok]] = True
            which[hit & (which < 0)] = i
        return which, taken

    def _replay(self, spool: Path, earliest: np.ndarray, old: np.ndarray) -> Iterator[Document]:
        """Step 3: the spooled documents again, in order, each kept or dropped."""
        stats = self.stats
        ids: dict[int, str] = {}
        need: set[int] = set()
        if self.keep_examples or self.name_partners:  # the originals the drops name
            pos = np.arange(len(earliest))
            dropped = np.flatnonzero((earliest < pos) & (old < 0))
            if not self.name_partners:  # only the first examples' (ids kept: a few)
                dropped = dropped[: self.keep_examples]
            need = set(earliest[dropped].tolist())
        i = 0
        how = f"shares a MinHash LSH band and >= {self.threshold:g} of its signature with"
        with open(spool, "rb") as f:
            while True:
                try:
                    batch, has = pickle.load(f)
                except EOFError:
                    break
                for doc, ok in zip(batch, has.tolist()):
                    stats.docs_in += 1
                    if not ok:
                        stats.docs_out += 1
                        yield doc
                        continue
                    pos, i = i, i + 1
                    if pos in need:
                        ids[pos] = doc.doc_id
                    first, by = int(earliest[pos]), int(old[pos])
                    if by >= 0:
                        self.against_dropped[by] += 1
                        self.record_drop(doc, Drop(
                            "near_duplicate_in_earlier_data",
                            f"{how} a document of {self.against[by].path}"))
                    elif first < pos:
                        name = ids.get(first, "an earlier document")
                        self.record_drop(doc, Drop("near_duplicate", f"{how} {name}",
                                                   of=ids.get(first, "")))
                    else:
                        stats.docs_out += 1
                        yield doc

    def report(self) -> dict:
        extra: dict[str, Any] = {"against": self.against_dropped} if self.against else {}
        return self.stats.to_dict() | {
            "clusters": self.clusters,
            "cluster_sizes": {str(k): v for k, v in self.cluster_sizes.items()},
            "indexed": self.indexed,
            "bands": self.hasher.bands,
            "rows": self.hasher.rows,
            "ngram": self.hasher.ngram,
            "threshold": self.threshold,
        } | extra
