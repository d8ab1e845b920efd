"""Fuzzy dedup: shoestring's MinHash LSH vs datasketch, rensa and datatrove, same settings.

Corpus: ``../shared/data/corpora/mixed-en.jsonl`` plus a generated near-duplicate set with
known edits (each of ``--bases`` corpus documents gets one copy with a ``--rates`` fraction of
its words substituted, deleted or inserted). Ground truth: every pair of documents whose
exact Jaccard similarity of word-5-gram sets is at least ``--threshold`` (computed exactly,
with a sparse document × shingle product, over *all* pairs, so real near-duplicates in the
corpus count too).

Every side uses the same shingles (word 5-grams of ``shoestring.prep.curate.text.words``),
112 permutations and 14 bands × 8 rows; shoestring computes its signatures with rensa's
R-MinHash batch API on its own shingle hashes (since this benchmark showed it faster than
the numpy code it had; ``signature_stage`` still times both); datasketch its default
``affine32`` family; rensa its R-MinHash through its
batch API (``RMinHash.digest_matrix_from_token_sets`` on shingle strings, and
``digest_matrix_from_flat_token_hashes`` on our shingle hashes, then
``RMinHashLSH.insert_matrix_and_query_duplicate_flags``, batches of 4,096); datatrove its
``MinhashDedupSignature`` → ``MinhashDedupBuckets`` → ``MinhashDedupCluster`` stages on one
worker with its default hashing (xxhash 64-bit, permutations mod 2**61-1) and
``get_shingles`` overridden to our shingles. Recall for rensa is of its signatures' band
collisions; for datatrove of the pairs its bucket stage wrote. Timed: text → shingles → signature → LSH decision
(for shoestring: its FuzzyDedup block, spill and replay included); corpus loading and the ground truth are not timed.
Predicted pairs are the LSH candidate pairs (documents sharing at least one band).

    python bench/dedup.py                       # everything, 3 runs (seeds) per side
    python bench/dedup.py --limit 2000 --repeats 1

Prints documents/s for each side (best of ``--repeats`` interleaved runs), the ratio, and pair
precision/recall against the truth, averaged over the runs' permutation seeds (1..repeats),
since one seed's recall differs from another's by chance.
The machine may be shared: the ratio is the figure to compare; the load average is printed
(``bench/common.py``'s header) and the tables are recorded (``--record``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from shoestring.prep.curate.minhash import (
    FuzzyDedup,
    MinHasher,
    candidate_probability,
)
from shoestring.data.sources import Document
from shoestring.prep.curate.text import words

from common import SHARED, Bench, add_repeats, load_average, parser
from dedup_rss import band_decision_peak

CORPUS = SHARED / "corpora" / "mixed-en.jsonl"


def load_corpus(path: Path, limit: int | None) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if limit is not None and len(texts) == limit:
                break
    return texts


def near_duplicates(texts: list[str], n_bases: int, rates: list[float], seed: int) -> list[str]:
    """One edited copy of ``n_bases`` documents (≥ 50 words): substitute/delete/insert words."""
    rng = np.random.default_rng(seed)
    eligible = [i for i, t in enumerate(texts) if 50 <= len(t.split()) <= 20_000]
    vocab = sorted({w for i in eligible[:500] for w in texts[i].split()})
    out = []
    for k, i in enumerate(rng.choice(eligible, min(n_bases, len(eligible)), replace=False)):
        tokens = texts[i].split()
        rate = rates[k % len(rates)]
        edited: list[str] = []
        for tok in tokens:
            r = rng.random()
            if r < rate / 3:  # substitute
                edited.append(vocab[rng.integers(len(vocab))])
            elif r < 2 * rate / 3:  # delete
                continue
            elif r < rate:  # insert after
                edited += [tok, vocab[rng.integers(len(vocab))]]
            else:
                edited.append(tok)
        out.append(" ".join(edited))
    return out


def shingle_sets(texts: list[str], n: int = 5) -> list[list[str]]:
    result = []
    for t in texts:
        w = words(t)
        k = min(n, len(w))
        result.append(sorted({" ".join(w[i : i + k]) for i in range(len(w) - k + 1)}) if k else [])
    return result


def truth_pairs(sets: list[list[str]], threshold: float) -> dict[tuple[int, int], float]:
    """All pairs with exact Jaccard >= threshold (→ Jaccard), via a sparse doc × shingle product."""
    from scipy import sparse

    ids: dict[str, int] = {}
    rows, cols = [], []
    for d, s in enumerate(sets):
        for g in s:
            rows.append(d)
            cols.append(ids.setdefault(g, len(ids)))
    x = sparse.csr_matrix(
        (np.ones(len(rows), dtype=np.int32), (rows, cols)), shape=(len(sets), len(ids))
    )
    inter = (x @ x.T).tocoo()
    sizes = np.array([len(s) for s in sets])
    keep = inter.row < inter.col
    r, c, v = inter.row[keep], inter.col[keep], inter.data[keep]
    jac = v / (sizes[r] + sizes[c] - v)
    hit = jac >= threshold
    return {(int(a), int(b)): float(j) for a, b, j in zip(r[hit], c[hit], jac[hit])}


def run_ours(texts: list[str], seed: int = 1, batch: int = 256) -> tuple[float, np.ndarray, int]:
    """Timed: the FuzzyDedup block over the texts (batched signatures and band keys spilled
    per band, the per-band sort, the replay). The keys for the pair score are computed
    again, untimed."""
    block = FuzzyDedup(seed=seed, batch=batch)
    docs = [Document(text, "bench", str(i)) for i, text in enumerate(texts)]
    t = time.perf_counter()
    kept = sum(1 for _ in block.process(docs))
    seconds = time.perf_counter() - t
    hasher = block.hasher
    keys = np.concatenate([hasher.band_keys(hasher.signatures(texts[i : i + batch])[0])
                           for i in range(0, len(texts), batch)])
    return seconds, keys, len(texts) - kept


def index_bytes_per_doc(texts: list[str]) -> float:
    """Peak memory of the dedup decision per document (tracemalloc over ``band_collisions``
    on the corpus's band keys, spilled as FuzzyDedup spills them), not timed."""
    hasher = MinHasher(num_perm=112, ngram=5, bands=14)
    keys = np.concatenate(
        [
            hasher.band_keys(hasher.signatures(texts[i : i + 256])[0])
            for i in range(0, len(texts), 256)
        ]
    )
    return band_decision_peak(keys)


def pairs_from_keys(keys: np.ndarray) -> set[tuple[int, int]]:
    pairs: set[tuple[int, int]] = set()
    for band in range(keys.shape[1]):
        buckets: dict[int, list[int]] = defaultdict(list)
        for doc, key in enumerate(keys[:, band].tolist()):
            buckets[key].append(doc)
        for members in buckets.values():
            for a in range(len(members)):
                for b in range(a + 1, len(members)):
                    pairs.add((members[a], members[b]))
    return pairs


def run_datasketch(
    texts: list[str], hashfunc=None, seed: int = 1
) -> tuple[float, set[tuple[int, int]], int]:
    from datasketch import MinHash, MinHashLSH

    template = MinHash(num_perm=112, seed=seed)
    kwargs = {"permutations": template.permutations, "scheme": "affine32"}
    if hashfunc is not None:
        kwargs["hashfunc"] = hashfunc
    lsh = MinHashLSH(num_perm=112, params=(14, 8))
    pairs: set[tuple[int, int]] = set()
    dropped = 0
    t = time.perf_counter()
    for i, text in enumerate(texts):
        w = words(text)
        k = min(5, len(w))
        if not k:
            continue
        grams = {" ".join(w[j : j + k]).encode() for j in range(len(w) - k + 1)}
        m = MinHash(num_perm=112, **kwargs)
        m.update_batch(grams)
        found = lsh.query(m)
        if found:
            dropped += 1
            pairs.update((j, i) for j in found)
        lsh.insert(i, m, check_duplication=False)
    return time.perf_counter() - t, pairs, dropped


def _shingle_strings(text: str) -> list[str]:
    """Word 5-grams of ``words`` as strings (all the words when fewer): our shingles."""
    w = words(text)
    k = min(5, len(w))
    return sorted({" ".join(w[j : j + k]) for j in range(len(w) - k + 1)}) if k else []


def _pairs_from_digests(rows: np.ndarray, has: np.ndarray) -> set[tuple[int, int]]:
    """LSH candidate pairs (equal band) of any 112-value signatures, 14 bands × 8 rows."""
    keys = MinHasher(num_perm=112, bands=14).band_keys(rows.astype(np.uint32, copy=False))
    keys[~has] = np.arange(int((~has).sum()), dtype=np.uint64)[:, None] + np.uint64(1 << 63)
    return pairs_from_keys(keys)


def run_rensa(texts: list[str], seed: int = 1, prehashed: bool = False,
              batch: int = 4096) -> tuple[float, set[tuple[int, int]], int]:
    """rensa's batch API: a digest matrix per batch, then its LSH's matrix insert + query.

    ``prehashed``: our vectorized shingle hashes go to ``digest_matrix_from_flat_token_hashes``
    (rensa's fastest input); otherwise shingle strings go to ``digest_matrix_from_token_sets``.
    """
    from rensa import RMinHash, RMinHashLSH

    hasher = MinHasher(num_perm=112, ngram=5, bands=14, seed=seed)
    lsh = RMinHashLSH(threshold=0.8, num_perm=112, num_bands=14)
    digests, masks = [], []
    dropped = 0
    t = time.perf_counter()
    for i in range(0, len(texts), batch):
        chunk = texts[i : i + batch]
        if prehashed:
            values, lengths = hasher.batch_shingle_hashes(chunk)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
            matrix = RMinHash.digest_matrix_from_flat_token_hashes(
                values.astype(np.uint64), offsets, 112, seed)
            has = lengths > 0
        else:
            sets = [_shingle_strings(t) for t in chunk]
            matrix = RMinHash.digest_matrix_from_token_sets(sets, 112, seed)
            has = np.array([bool(s) for s in sets])
        flags = lsh.insert_matrix_and_query_duplicate_flags(matrix, i)
        dropped += int(np.count_nonzero(np.asarray(flags) & has))
        digests.append(matrix)
        masks.append(has)
    seconds = time.perf_counter() - t
    rows = np.concatenate([np.asarray(m.to_rows(), dtype=np.uint64) for m in digests])
    return seconds, _pairs_from_digests(rows, np.concatenate(masks)), dropped


def run_datatrove(texts: list[str], seed: int = 1) -> tuple[float, set[tuple[int, int]], int]:
    """datatrove's MinHash stages (signature → buckets → cluster), as its docs chain them,
    on one worker; its own hashing (xxhash64, mod 2**61-1 permutations), our shingles."""
    import struct
    import tempfile

    from datatrove.data import Document
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupSignature,
    )

    from datatrove.utils.word_tokenizers import WordTokenizer

    class OurWords(WordTokenizer):  # datatrove's documented hook for a custom tokenizer
        def word_tokenize(self, text: str) -> list[str]:
            return words(text)

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    class SameShingles(MinhashDedupSignature):
        def get_shingles(self, text: str) -> np.ndarray:
            return np.fromiter((self._hash_func(g.encode()) for g in _shingle_strings(text)),
                               dtype=np.uint64).reshape((-1, 1))

    config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, seed=seed)
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    with tempfile.TemporaryDirectory() as tmp:
        sigs, buckets, clusters = (f"{tmp}/{name}" for name in ("sigs", "buckets", "clusters"))
        t = time.perf_counter()
        for _ in SameShingles(sigs, config=config, language=OurWords()).run(iter(docs)) or ():
            pass
        for b in range(config.num_buckets):
            for _ in MinhashDedupBuckets(sigs, buckets, config=config).run(
                    None, rank=b, world_size=config.num_buckets) or ():
                pass
        for _ in MinhashDedupCluster(buckets, clusters, config=config).run() or ():
            pass
        seconds = time.perf_counter() - t
        removed = Path(clusters, "000000.remove")
        dropped = removed.stat().st_size // 4 if removed.is_file() else 0
        pairs: set[tuple[int, int]] = set()
        for dups in sorted(Path(buckets).glob("*.dups")):
            groups: dict[int, set[int]] = {}  # chains of equal signatures → groups
            data = dups.read_bytes()
            for a_f, a, b_f, b in struct.iter_unpack("<4I", data):
                group = groups.get(a) or {a}
                group.add(b)
                groups[a] = groups[b] = group
            for group in {id(g): g for g in groups.values()}.values():
                members = sorted(group)
                pairs.update((x, y) for k, x in enumerate(members) for y in members[k + 1 :])
    return seconds, pairs, dropped


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer on a uint32 array (returns a new array)."""
    h = h ^ (h >> np.uint32(16))
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def numpy_signatures(values: np.ndarray, lengths: np.ndarray, num_perm: int = 112,
                     seed: int = 1, chunk: int = 4096) -> np.ndarray:
    """The signature code shoestring had before rensa replaced it (kept here to measure
    the choice): datasketch's affine32 permutations in numpy, reduced per document."""
    gen = np.random.RandomState(seed)
    a = (gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1))[:, None]
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)[:, None]
    buf = np.empty((num_perm, chunk), dtype=np.uint32)
    sig = np.full((len(lengths), num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
    has = lengths > 0
    values = fmix32(values)
    docs = np.flatnonzero(has)
    starts = np.cumsum(lengths[has]) - lengths[has]
    for c0 in range(0, len(values), chunk):
        c1 = min(c0 + chunk, len(values))
        block = buf[:, : c1 - c0]
        np.multiply(values[None, c0:c1], a, out=block)
        block += b
        first = np.searchsorted(starts, c0, side="right") - 1
        last = np.searchsorted(starts, c1, side="left")
        bounds = np.maximum(starts[first:last], c0) - c0
        rows = docs[first:last]
        sig[rows] = np.minimum(sig[rows], np.minimum.reduceat(block, bounds, axis=1).T)
    return sig


def signature_stage(texts: list[str], repeats: int) -> list[dict]:
    """The signature step alone on the same shingle hashes: rensa (used) vs the old numpy;
    prints the comparison and returns its rows."""
    hasher = MinHasher(num_perm=112, ngram=5, bands=14)
    values, lengths = hasher.batch_shingle_hashes(texts)
    times: dict[str, list[float]] = {"rensa digest matrix (used)": [], "numpy (before)": []}
    for _ in range(repeats):
        t = time.perf_counter()
        hasher._signatures(values, lengths)
        times["rensa digest matrix (used)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        numpy_signatures(values, lengths)
        times["numpy (before)"].append(time.perf_counter() - t)
    print(f"\nsignature step only, {len(values):,} shingle hashes of {len(texts):,} documents "
          f"(112 permutations), {repeats} interleaved runs:")
    for name, ts in times.items():
        print(f"  {name:28} best {min(ts):.3f} s, median {float(np.median(ts)):.3f} s")
    best = min(times["numpy (before)"]) / min(times["rensa digest matrix (used)"])
    print(f"  rensa is {best:.1f}x faster (best of each)")
    return [{"signatures": name, "best s": min(ts), "median s": float(np.median(ts)),
             "runs s": ts} for name, ts in times.items()]


def score(pred: set[tuple[int, int]], truth: dict[tuple[int, int], float]) -> tuple[float, float]:
    hit = len(pred & truth.keys())
    return (hit / len(pred) if pred else 1.0), (hit / len(truth) if truth else 1.0)


def parse_args() -> argparse.Namespace:
    ap = parser(__doc__)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--limit", type=int, default=None, help="use the first N corpus documents")
    ap.add_argument("--bases", type=int, default=2000, help="documents that get an edited copy")
    ap.add_argument(
        "--rates",
        default="0.01,0.02,0.03,0.05,0.08,0.12,0.2",
        help="word edit rates, cycled over the copies",
    )
    ap.add_argument("--threshold", type=float, default=0.8, help="Jaccard of a true duplicate pair")
    add_repeats(ap, 3, help="runs per side, seeds 1..N: best time kept, precision/recall averaged")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    if not args.corpus.is_file():
        raise SystemExit(f"corpus not found: {args.corpus} (see ../shared/data/README.md)")
    return args


def sides_to_run(texts: list[str]) -> tuple[dict, dict]:
    """Every side: {name: datasketch hash function or None} and the peers' runners."""
    sides: dict = {"shoestring": None, "datasketch": None}
    try:
        import xxhash

        sides["datasketch+xxh32"] = xxhash.xxh32_intdigest
    except ImportError:
        pass
    peers = {"rensa (digest matrix)": lambda s: run_rensa(texts, s),
             "rensa (prehashed)": lambda s: run_rensa(texts, s, prehashed=True),
             "datatrove": lambda s: run_datatrove(texts, s)}
    sides.update(dict.fromkeys(peers))
    return sides, peers


def run_sides(texts: list[str], truth: dict[tuple[int, int], float],
              repeats: int) -> dict[str, list[dict]]:
    """Every side ``repeats`` times with seeds 1..repeats, interleaved, so load changes hit
    all sides alike: one run's seconds, pairs, precision, recall and drops per side."""
    sides, peers = sides_to_run(texts)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for seed in range(1, repeats + 1):
        for name, hashfunc in sides.items():
            if name == "shoestring":  # our shingles → rensa signatures → our LSH index
                seconds, keys, dropped = run_ours(texts, seed)
                pairs = pairs_from_keys(keys)
            elif name in peers:
                seconds, pairs, dropped = peers[name](seed)
            else:
                seconds, pairs, dropped = run_datasketch(texts, hashfunc, seed)
            precision, recall = score(pairs, truth)
            runs[name].append({"seconds": seconds, "pairs": len(pairs), "precision": precision,
                               "recall": recall, "dropped": dropped})
    return runs


def summarize(runs: dict[str, list[dict]], n_docs: int, mb: float) -> dict[str, dict]:
    """Per side: the best time (and its rates), the median time, and the mean of the
    pairs, precision, recall and drops over the seeds."""
    results: dict[str, dict] = {}
    for name, rs in runs.items():
        best = min(r["seconds"] for r in rs)
        results[name] = {"seconds": best, "docs_per_s": n_docs / best, "mb_per_s": mb / best}
        for key in ("pairs", "precision", "recall", "dropped"):
            results[name][key] = float(np.mean([r[key] for r in rs]))
        results[name]["recall_by_seed"] = [round(r["recall"], 4) for r in rs]
        results[name]["median_seconds"] = float(np.median([r["seconds"] for r in rs]))
    return results


def report(results: dict[str, dict], repeats: int) -> list[dict]:
    """Print the sides' table (ratios to ours, best and median) and return its rows."""
    ours = results["shoestring"]
    print(
        f"\n{'':18} {'docs/s':>9} {'MB/s':>6} {'seconds':>8} {'pairs':>7} {'precision':>9} "
        f"{'recall':>7} {'dropped':>8} {'ours ×':>7} {'(median)':>8}"
    )
    rows = []
    for name, r in results.items():
        ratio = r["seconds"] / ours["seconds"]
        median_ratio = r["median_seconds"] / ours["median_seconds"]
        print(
            f"{name:18} {r['docs_per_s']:9,.0f} {r['mb_per_s']:6.2f} {r['seconds']:8.2f} "
            f"{r['pairs']:7,.0f} {r['precision']:9.3f} {r['recall']:7.3f} {r['dropped']:8,.0f} "
            f"{ratio:7.1f} {median_ratio:8.1f}"
        )
        rows.append({"side": name, "docs/s": r["docs_per_s"], "MB/s": r["mb_per_s"],
                     "seconds": r["seconds"], "pairs": r["pairs"], "precision": r["precision"],
                     "recall": r["recall"], "dropped": r["dropped"], "ours ×": ratio,
                     "(median)": median_ratio, "recall by seed": r["recall_by_seed"]})
    print(
        f"\n{os.cpu_count()} CPUs; time: best of {repeats} interleaved runs per side; "
        f"pairs, precision, recall: mean over permutation seeds 1..{repeats}"
    )
    for name, r in results.items():
        print(f"recall by seed, {name}: {r['recall_by_seed']}")
    print("(rensa's 'dropped' counts its duplicate flags, which mark both members of a pair)")
    return rows


FORMATS = {"docs/s": ",.0f", "MB/s": ".2f", "seconds": ".2f", "pairs": ",.0f",
           "precision": ".3f", "recall": ".3f", "dropped": ",.0f", "ours ×": ".1f",
           "(median)": ".1f", "recall by seed": ".4f"}


def main() -> None:
    args = parse_args()
    bench = Bench("dedup", args)
    corpus = load_corpus(args.corpus, args.limit)
    dups = near_duplicates(corpus, args.bases, [float(r) for r in args.rates.split(",")], args.seed)
    texts = corpus + dups
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(
        f"{len(texts):,} documents ({len(corpus):,} corpus + {len(dups):,} edited copies), "
        f"{mb:.1f} MB"
    )
    t = time.perf_counter()
    truth = truth_pairs(shingle_sets(texts), args.threshold)
    print(
        f"ground truth: {len(truth):,} pairs with exact Jaccard >= {args.threshold} "
        f"({time.perf_counter() - t:.1f}s, not timed)"
    )
    expected = float(np.mean([candidate_probability(j, 14, 8) for j in truth.values()]))
    print(
        f"expected recall of 14 × 8 LSH on these pairs (from their exact Jaccard): {expected:.3f}"
    )
    per_doc = index_bytes_per_doc(texts)
    print(
        f"LSH decision memory (tracemalloc peak of band_collisions, {len(texts):,} documents): "
        f"{per_doc:,.0f} bytes/doc"
    )
    results = summarize(run_sides(texts, truth, args.repeats), len(texts), mb)
    load = load_average()
    setting = (f"{len(texts):,} documents, {mb:.1f} MB; {len(truth):,} true pairs (Jaccard >= "
               f"{args.threshold}); expected recall {expected:.3f}; LSH decision memory "
               f"{per_doc:,.0f} bytes/doc")
    bench.table(report(results, args.repeats), formats=FORMATS, notes=[
        setting, f"time: best of {args.repeats} interleaved runs per side; pairs, precision, "
        f"recall: mean over permutation seeds 1..{args.repeats}",
        "rensa's 'dropped' counts its duplicate flags, which mark both members of a pair"])
    bench.table(signature_stage(texts, max(args.repeats, 3)), "signatures",
                formats={"best s": ".3f", "median s": ".3f", "runs s": ".3f"})
    bench.end()
    if args.json:
        results["expected_recall"] = expected  # type: ignore[assignment]
        results["index_bytes_per_doc"] = per_doc  # type: ignore[assignment]
        args.json.write_text(json.dumps({"documents": len(texts), "mb": mb,
                                         "truth_pairs": len(truth), "threshold": args.threshold,
                                         "load": load, "results": results}, indent=2))


if __name__ == "__main__":
    main()
