"""Dedup: word hashing, MinHash estimates vs exact Jaccard, LSH keep-first clusters, exact dedup."""

from __future__ import annotations


import numpy as np
import pytest

from shoestring.prep.curate import text as T
from shoestring.prep.curate.dedup import ExactDedup
from shoestring.prep.curate.minhash import (
    Clusters,
    FuzzyDedup,
    MinHasher,
    band_collisions,
    candidate_probability,
    cluster_histogram,
    component_labels,
    first_in_bucket,
    similar,
    union_pairs,
)
from shoestring.data.sources import Document

RNG_VOCAB = np.random.default_rng(7)
VOCAB = [
    "".join(RNG_VOCAB.choice(list("abcdefghijklmnopqrstuvwxyz"), size=RNG_VOCAB.integers(2, 9)))
    for _ in range(5000)
]


def random_words(rng: np.random.Generator, n: int) -> list[str]:
    return [VOCAB[i] for i in rng.integers(0, len(VOCAB), n)]


def edit(words: list[str], rate: float, rng: np.random.Generator) -> list[str]:
    """Replace a ``rate`` fraction of the words at random positions."""
    out = list(words)
    for i in rng.choice(len(out), int(round(rate * len(out))), replace=False):
        out[i] = VOCAB[rng.integers(0, len(VOCAB))]
    return out


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    w = T.words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


def test_numpy_words_match_the_regex_definition() -> None:
    texts = [
        "",
        "  ,;  ",
        "Hello, World!",
        "don't stop-me now",
        "naïve café — ÉCOLE x2 y_z",
        "tab\tnew\nline",
        "a" * 10,
        "日本語 テキスト",
        "end.",
    ]
    for text in texts:
        words = T.words(text)
        hashes, lengths = T.word_hashes_and_lengths(text)
        assert len(hashes) == len(words), text
        assert lengths.tolist() == [len(w.encode()) for w in words]
        by_word: dict[str, int] = {}
        for w, h in zip(words, hashes.tolist()):
            assert by_word.setdefault(w, h) == h  # equal words, equal hashes
        assert len(set(by_word.values())) == len(by_word)  # distinct words, distinct hashes
    assert T.words("Hello, World!") == ["hello", "world"]
    assert T.word_spans("Hi, you") == [(0, 2), (4, 7)]


def test_batch_word_hashes_equal_one_by_one() -> None:
    texts = ["one two three", "", "!!", "four, five", "x" * 50]
    hashes, counts = T.batch_word_hashes(texts)
    assert counts.tolist() == [3, 0, 0, 2, 1]
    assert np.array_equal(hashes, np.concatenate([T.word_hashes(t) for t in texts]))


def test_long_texts_hash_in_pieces_exactly() -> None:
    text = ("alpha beta gamma " * 150_000) + "x" * 2_500_000 + " omega"  # > 2 pieces, a giant word
    hashes = T.word_hashes(text)
    assert len(hashes) == len(T.words(text)) == 450_002
    assert len(set(hashes[:450_000].tolist())) == 3
    assert hashes[-1] == T.word_hashes("omega")[0]


def test_ngram_hashes_of_all_lengths_agree() -> None:
    wh = T.word_hashes(" ".join(VOCAB[:40]))
    many = T.ngram_hashes_upto(wh, [1, 5, 13])
    for n in (1, 5, 13):
        assert np.array_equal(many[n], T.ngram_hashes(wh, n))
    assert T.ngram_hashes(wh[:3], 5).size == 0


def test_minhash_estimates_match_exact_jaccard() -> None:
    rng = np.random.default_rng(0)
    hasher = MinHasher(num_perm=256, bands=16)
    errors = []
    for rate in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0):
        base = random_words(rng, 400)
        a, b = " ".join(base), " ".join(edit(base, rate, rng))
        sig, _ = hasher.signatures([a, b])
        estimate = float(np.mean(sig[0] == sig[1]))
        exact = jaccard(a, b)
        sd = max(np.sqrt(exact * (1 - exact) / 256), 0.01)
        assert abs(estimate - exact) < 4 * sd, (rate, estimate, exact)
        errors.append(abs(estimate - exact))
    assert np.mean(errors) < 0.03


def test_signatures_are_rensas_r_minhash_of_the_shingle_hashes() -> None:
    """The signature is rensa's R-MinHash of our shingle hashes (its one-document API
    agrees with the batch one prep uses)."""
    from rensa import RMinHash

    text = "The quick brown fox jumps over the lazy dog, again and again and again."
    hasher = MinHasher(num_perm=112, seed=3)
    values, lengths = hasher.batch_shingle_hashes([text])
    sig, has = hasher.signatures([text])
    peer = RMinHash.digest_matrix_from_token_hash_sets([[int(v) for v in values]], 112, 3)
    assert lengths[0] == len(values) == len(T.words(text)) - 4
    assert has[0] and np.array_equal(sig[0], np.asarray(peer.to_rows()[0], dtype=np.uint32))
    other, _ = MinHasher(num_perm=112, seed=4).signatures([text])
    assert not np.array_equal(sig[0], other[0])  # the seed draws the permutations


def test_signatures_do_not_depend_on_the_batch() -> None:
    rng = np.random.default_rng(1)
    texts = [" ".join(random_words(rng, int(n))) for n in rng.integers(0, 40, 30)] + ["one", ""]
    hasher = MinHasher()
    together, has = hasher.signatures(texts)
    for i, text in enumerate(texts):
        alone, has_alone = hasher.signatures([text])
        assert np.array_equal(alone[0], together[i]) and has_alone[0] == has[i]
    assert not has[-1] and has[-2]  # no words: no signature; one word: one shingle


def test_candidate_probability_s_curve() -> None:
    assert candidate_probability(0.8, 14, 8) == pytest.approx(0.924, abs=0.002)
    assert candidate_probability(0.5, 14, 8) < 0.06


def docs_with_planted_duplicates(
    n_base: int = 40, n_dup: int = 12
) -> tuple[list[Document], set[str]]:
    rng = np.random.default_rng(3)
    bases = [random_words(rng, int(rng.integers(80, 300))) for _ in range(n_base)]
    docs = [Document(" ".join(w), "t", f"base-{i}") for i, w in enumerate(bases)]
    planted = set()
    for k, i in enumerate(rng.choice(n_base, n_dup, replace=False)):
        near = edit(bases[i], 0.02, rng)
        # Punctuation and case edits do not matter to the shingles.
        text = " ".join(near).capitalize().replace(" ", ", ", 3) + "."
        after = [d.doc_id for d in docs].index(f"base-{i}") + 1
        docs.insert(int(rng.integers(after, len(docs) + 1)), Document(text, "t", f"dup-{k}-of-{i}"))
        planted.add(f"dup-{k}-of-{i}")
    return docs, planted


def test_fuzzy_dedup_finds_planted_near_duplicates_and_keeps_distinct_documents() -> None:
    docs, planted = docs_with_planted_duplicates()
    block = FuzzyDedup(batch=7, keep_examples=20)
    kept = [d.doc_id for d in block.process(docs)]
    dropped = {e.doc_id for e in block.examples["near_duplicate"]}
    assert dropped == planted
    assert kept == [d.doc_id for d in docs if d.doc_id not in planted]  # order kept
    report = block.report()
    assert report["clusters"] == len(planted) and report["dropped"] == {
        "near_duplicate": len(planted)
    }
    # The explanation names the kept original (first seen of the cluster).
    for e in block.examples["near_duplicate"]:
        assert e.detail.endswith("base-" + e.doc_id.rsplit("-", 1)[1])


def edited_to(words: list[str], target: float, rng: np.random.Generator) -> list[str]:
    """A copy of ``words`` with single words replaced until its shingle Jaccard with the
    original falls to ``target`` or just below."""
    base, out = " ".join(words), list(words)
    while jaccard(base, " ".join(out)) > target:
        out[int(rng.integers(len(out)))] = VOCAB[int(rng.integers(len(VOCAB)))]
    return out


def test_verification_drops_a_pair_at_jaccard_072_and_keeps_one_at_05() -> None:
    """The defaults (28 bands × 4 rows, threshold 0.65): a near copy at J ≈ 0.72 — a pair
    14 × 8 without verification found only 65% of the time — is dropped; a copy at
    J ≈ 0.5, which 28 × 4 makes a candidate 84% of the time, is kept because its
    signature agrees with the original's on well under 0.65 of the values."""
    rng = np.random.default_rng(21)
    a, b = random_words(rng, 400), random_words(rng, 400)
    near, far = edited_to(a, 0.72, rng), edited_to(b, 0.5, rng)
    texts = [" ".join(w) for w in (a, b, near, far)]
    assert 0.70 <= jaccard(texts[0], texts[2]) <= 0.72
    assert 0.48 <= jaccard(texts[1], texts[3]) <= 0.5
    docs = [Document(t, "t", name) for t, name in zip(texts, ["a", "b", "near-a", "far-b"])]
    block = FuzzyDedup(keep_examples=5)
    assert [d.doc_id for d in block.process(docs)] == ["a", "b", "far-b"]
    assert [e.doc_id for e in block.examples["near_duplicate"]] == ["near-a"]
    # Both pairs are LSH candidates: verification is what keeps far-b.
    hasher = block.hasher
    sig, _ = hasher.signatures(texts)
    keys = hasher.band_keys(sig)
    assert (keys[0] == keys[2]).any() and (keys[1] == keys[3]).any()
    assert similar(sig[[0]], sig[[2]], 0.65)[0] and not similar(sig[[1]], sig[[3]], 0.65)[0]
    # Without verification (threshold 0) the J = 0.5 copy would be dropped too.
    assert [d.doc_id for d in FuzzyDedup(threshold=0.0).process(docs)] == ["a", "b"]


def test_fuzzy_dedup_results_do_not_depend_on_the_batch_size() -> None:
    docs, _ = docs_with_planted_duplicates()
    runs = [[d.doc_id for d in FuzzyDedup(batch=b).process(docs)] for b in (1, 5, 256)]
    assert runs[0] == runs[1] == runs[2]


def write_bands(folder, keys: list[list[int]]) -> list:
    """One raw uint64 file per band, a key per document (FuzzyDedup's spill format)."""
    table = np.array(keys, dtype=np.uint64)
    paths = []
    for b in range(table.shape[1]):
        paths.append(folder / f"band-{b}.u64")
        np.ascontiguousarray(table[:, b]).tofile(paths[-1])
    return paths


def test_band_collisions_keep_the_first_and_merge_clusters(tmp_path) -> None:
    keys = [[1, 2], [3, 4], [1, 9], [5, 4], [7, 8], [1, 4], [6, 8]]
    earliest, labels = band_collisions(write_bands(tmp_path, keys), len(keys))
    # doc 2 joins doc 0, doc 3 joins doc 1, doc 5 bridges both (the earliest is named),
    # doc 6 joins doc 4.
    assert earliest.tolist() == [0, 1, 0, 1, 4, 0, 4]
    assert labels.tolist() == [0, 0, 0, 0, 4, 0, 4]
    assert cluster_histogram(labels) == {2: 1, 5: 1}


def test_first_in_bucket_keeps_the_earliest_row_of_each_key() -> None:
    """The keep rule both executors run: one key with positions (local, per band), two keys
    with rows' input ids in any row order (ray, per shuffle partition) — against a dict."""
    rng = np.random.default_rng(11)
    k0, k1 = rng.integers(0, 4, 400).astype(np.uint64), rng.integers(0, 30, 400).astype(np.uint64)
    order = rng.permutation(10_000)[:400].astype(np.int64)
    want: dict[tuple[int, int], int] = {}
    for a, b, o in zip(k0.tolist(), k1.tolist(), order.tolist()):
        want[a, b] = min(want.get((a, b), o), o)
    got = first_in_bucket(k0, k1, order=order)
    assert got.tolist() == [want[a, b] for a, b in zip(k0.tolist(), k1.tolist())]
    seen: dict[int, int] = {}
    firsts = [seen.setdefault(k, i) for i, k in enumerate(k1.tolist())]
    assert first_in_bucket(k1).tolist() == firsts
    assert first_in_bucket(k1, order=np.arange(400)).tolist() == firsts


def test_ray_reduce_drops_what_the_local_run_drops(tmp_path) -> None:
    """Fuzzy dedup's decision on the same band keys and signatures: the local run's
    ``band_collisions`` and the ray executor's reduce (``bucket_firsts``) over rows shuffled
    into partitions drop the same documents (both are `first_in_bucket`, then
    `verify_pairs`), with verification and without."""
    from shoestring.prep.ray.shuffle import bucket_firsts, split_columns

    rng = np.random.default_rng(2)
    n, bands, perm = 600, 5, 40
    keys = rng.integers(0, 900, size=(n, bands)).astype(np.uint64)  # plenty of collisions
    # Signatures: 12 families; a document agrees with its family's on ~85% of the values,
    # with another family's on ~0%, so only some candidate pairs verify.
    family = rng.integers(0, 12, n)
    base = rng.integers(0, 1 << 32, size=(12, perm), dtype=np.uint64).astype(np.uint32)
    sig = base[family].copy()
    noise = rng.random((n, perm)) < 0.15
    sig[noise] = rng.integers(0, 1 << 32, int(noise.sum()), dtype=np.uint64).astype(np.uint32)
    rows = {"k0": np.tile(np.arange(bands, dtype=np.uint64), n), "k1": keys.reshape(-1),
            "order": np.repeat(np.arange(n, dtype=np.int64), bands)}
    shuffled = rng.permutation(n * bands)
    rows = {k: v[shuffled] for k, v in rows.items()}
    parts = split_columns(rows, "k1", 3)
    dropped = {}
    for verify in (None, lambda ids: sig[ids]):
        earliest, labels = band_collisions(write_bands(tmp_path, keys.tolist()), n, verify, 0.6)
        local = np.flatnonzero(earliest < np.arange(n))
        out = [bucket_firsts(p, verify, 0.6) for p in parts]
        ray = np.unique(np.concatenate([o[0]["dropped"] for o in out]))
        assert ray.tolist() == local.tolist()
        edges = np.concatenate([o[1] for o in out])
        parent = np.arange(n, dtype=np.int64)
        union_pairs(parent, edges[:, 0], edges[:, 1])
        assert component_labels(parent).tolist() == labels.tolist()
        dropped[verify is None] = local
    assert len(dropped[True]) > 100 and 30 < len(dropped[False]) < len(dropped[True]) - 50
    assert (family[dropped[False]] == family[earliest[dropped[False]]]).all()


def test_union_pairs_matches_a_plain_union_find() -> None:
    rng = np.random.default_rng(5)
    n = 500
    a, b = rng.integers(0, n, 300), rng.integers(0, n, 300)
    parent = np.arange(n, dtype=np.int64)
    union_pairs(parent, a, b)
    labels = component_labels(parent)
    ref = list(range(n))

    def find(x: int) -> int:
        while ref[x] != x:
            x = ref[x]
        return x

    for x, y in zip(a.tolist(), b.tolist()):
        rx, ry = find(x), find(y)
        ref[max(rx, ry)] = min(rx, ry)
    assert labels.tolist() == [find(x) for x in range(n)]  # roots: smallest of the component


def fuzzy_peak_bytes(n: int, folder) -> int:
    """Peak traced memory of fuzzy dedup over ``n`` distinct 60-word documents."""
    import tracemalloc

    vocab = np.array([f"w{i}" for i in range(5000)])
    rows = np.random.default_rng(n).integers(0, len(vocab), (n, 60))
    docs = (Document(" ".join(vocab[r]), "t", str(i)) for i, r in enumerate(rows))
    block = FuzzyDedup(work_dir=folder)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = sum(1 for _ in block.process(docs))
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert kept == n
    return peak


def test_fuzzy_dedup_memory_grows_by_its_arrays_only(tmp_path) -> None:
    """Documents are spooled, not held: from 1,500 to 6,000 documents (each ~400 bytes of
    text) the peak grows by less than 100 bytes per document (the band arrays; the old
    in-memory LSH tables took 559 bytes per document), and the spill folder is removed."""
    fuzzy_peak_bytes(300, tmp_path)  # imports and first-call caches are not counted
    small, large = fuzzy_peak_bytes(1500, tmp_path), fuzzy_peak_bytes(6000, tmp_path)
    assert large - small < 4500 * 100, (small, large)
    assert not any(tmp_path.iterdir())


def test_exact_dedup_keeps_the_first_copy() -> None:
    block = ExactDedup(keep_examples=5)
    docs = [Document(t, "t", str(i)) for i, t in enumerate(["a b", "c", "a b", "a  b", "c"])]
    assert [d.doc_id for d in block.process(docs)] == ["0", "1", "3"]
    assert [e.detail for e in block.examples["duplicate"]] == ["same text as 0", "same text as 1"]
    assert block.report()["distinct"] == 3


def test_ray_map_and_reduce_tasks_drop_what_fuzzy_dedup_drops(tmp_path) -> None:
    """The ray executor's fuzzy-dedup task functions, called without Ray on two part files:
    ``band_rows`` (signatures written per part), the shuffle's split, ``bucket_firsts``
    verifying with `PartSignatures` — the same drops and clusters as `FuzzyDedup`."""
    from shoestring.prep.ray.shuffle import bucket_firsts, concat_columns, split_columns
    from shoestring.prep.ray.remote import PartSignatures, band_rows, make_rid, write_part

    docs, planted = docs_with_planted_duplicates()
    rng = np.random.default_rng(8)
    for i in rng.choice(len(docs), 6, replace=False).tolist():  # J ≈ 0.5: candidates, kept
        docs.append(Document(" ".join(edited_to(docs[i].text.split(), 0.5, rng)), "t", f"far{i}"))
    block = FuzzyDedup(keep_examples=100)
    kept = {d.doc_id for d in block.process(docs)}
    rids = [make_rid(0, i) for i in range(len(docs))]
    names = ["0000000-00000", "0000000-00001"]
    half = len(docs) // 2
    for name, lo, hi in ((names[0], 0, half), (names[1], half, len(docs))):
        write_part(tmp_path / "parts" / f"{name}.parquet", rids[lo:hi], [d.text for d in docs[lo:hi]])
    h = block.hasher
    mapped = [band_rows((str(tmp_path / "parts" / f"{n}.parquet"), np.zeros(0, np.int64),
                         str(tmp_path), None, (h.num_perm, h.ngram, h.seed, h.bands)))
              for n in names]
    signatures = PartSignatures(str(tmp_path), names)
    out = [bucket_firsts(p, signatures, block.threshold)
           for p in split_columns(concat_columns(mapped), "k1", 3)]
    dropped = np.unique(np.concatenate([o[0]["dropped"] for o in out]))
    assert [docs[rids.index(r)].doc_id for r in dropped.tolist()] == \
        [d.doc_id for d in docs if d.doc_id not in kept]
    assert planted <= {d.doc_id for d in docs} - kept and len(kept) == len(docs) - len(planted)
    # The clusters: the driver's count over the reduce tasks' edges (sparse row ids) is the
    # local run's, by the same `Clusters`.
    nodes = np.unique(np.concatenate([np.concatenate([o[0]["dropped"], o[0]["owners"]])
                                      for o in out]))
    clusters = Clusters(nodes)
    for o in out:
        clusters.link(o[1][:, 0], o[1][:, 1])
    assert clusters.sizes() == block.cluster_sizes == {2: len(planted)}
