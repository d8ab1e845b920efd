"""Incremental dedup: prep keeps a dedup index in the data dir, and ``--dedup-against OLD``
drops new documents that (near-)duplicate OLD's without reading OLD's text."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from shoestring.prep.curate.dedup import ExactDedup
from shoestring.prep.curate.dedup_index import DedupIndex, finish
from shoestring.prep.curate.minhash import FuzzyDedup
from shoestring.data.sources import Document
from shoestring.errors import ShoestringError

SMALL = ("--set", "data.vocab_size=300", "--set", "data.seq_len=32")
VOCAB = np.array([f"w{i}" for i in range(20000)])


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    w = text.split()
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


def random_texts(rng: np.random.Generator, n: int, words: int = 150) -> list[str]:
    return [" ".join(VOCAB[rng.integers(0, len(VOCAB), words)]) for _ in range(n)]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """OLD prepped with --dedup fuzzy (its source then deleted); NEW = 20 fresh documents,
    an exact copy of an OLD document (line 21) and a near-copy with word edits (line 22)."""
    tmp = tmp_path_factory.mktemp("against")
    rng = np.random.default_rng(0)
    old = random_texts(rng, 30)
    near = old[7].split()
    for k in rng.choice(len(near), 4, replace=False):
        near[k] = VOCAB[rng.integers(0, len(VOCAB))]
    new = random_texts(rng, 20) + [old[3], " ".join(near)]
    src = write_jsonl(tmp / "old.jsonl", old)
    r = run_cli("prep", str(src), "-o", str(tmp / "OLD"), "--dedup", "fuzzy", *SMALL)
    assert r.returncode == 0, r.stderr
    src.unlink()  # --dedup-against must not need OLD's text
    return {"tmp": tmp, "old": old, "new": write_jsonl(tmp / "new.jsonl", new),
            "near_jaccard": jaccard(old[7], new[-1])}


def test_prep_keeps_a_dedup_index_recorded_in_the_manifest(corpora: dict) -> None:
    data = corpora["tmp"] / "OLD"
    entry = json.loads((data / "manifest.json").read_text())["dedup_index"]
    assert entry["format"] == 2 and entry["exact"]["documents"] == 30
    assert {k: entry["minhash"][k] for k in ("ngram", "bands", "rows", "seed", "threshold",
                                             "documents")} == \
        {"ngram": 5, "bands": 28, "rows": 4, "seed": 1, "threshold": 0.65, "documents": 30}
    assert set(entry["files"]) == {"dedup/index.json", "dedup/exact.npy", "dedup/minhash.npy",
                                   "dedup/minhash_ids.npy", "dedup/signatures.npy"}
    for name, info in entry["files"].items():
        assert hashlib.sha256((data / name).read_bytes()).hexdigest() == info["sha256"]
    assert np.load(data / "dedup" / "minhash.npy").shape == (28, 30)
    ids = np.load(data / "dedup" / "minhash_ids.npy")
    assert ids.shape == (28, 30) and all(sorted(r) == list(range(30)) for r in ids.tolist())
    sig = np.load(data / "dedup" / "signatures.npy")
    assert sig.shape == (30, 112)
    # Each band: the keys of the signatures, sorted, with their documents beside them.
    keys = FuzzyDedup().hasher.band_keys(sig).T
    for b in range(28):
        order = np.argsort(keys[b], kind="stable")
        assert (np.load(data / "dedup" / "minhash.npy")[b] == keys[b][order]).all()
        assert (ids[b] == order).all()
    keys = np.load(data / "dedup" / "exact.npy")
    assert keys.shape == (30, 2) and (np.diff(keys[:, 0].astype(np.float64)) >= 0).all()


def test_dedup_against_drops_the_planted_copies_and_nothing_else(corpora: dict) -> None:
    assert 0.7 <= corpora["near_jaccard"] <= 0.9  # a near-copy, not an exact one
    out = corpora["tmp"] / "NEW"
    old = corpora["tmp"] / "OLD"
    r = run_cli("prep", str(corpora["new"]), "-o", str(out), "--dedup", "fuzzy",
                "--dedup-against", str(old), "--explain", "5", *SMALL)
    assert r.returncode == 0, r.stderr
    new = str(corpora["new"])
    assert f"-- {new}:21 " in r.stderr.split("duplicate_in_earlier_data ==")[1]
    assert f"-- {new}:22 " in r.stderr.split("near_duplicate_in_earlier_data ==")[1]
    manifest = json.loads((out / "manifest.json").read_text())
    blocks = {b["block"]: b for b in manifest["blocks"]}
    assert blocks["exact_dedup"]["dropped"] == {"duplicate_in_earlier_data": 1}
    assert blocks["fuzzy_dedup"]["dropped"] == {"near_duplicate_in_earlier_data": 1}
    assert blocks["fuzzy_dedup"]["documents_out"] == 20  # every fresh document kept
    [against] = manifest["dedup_against"]
    assert against["path"] == str(old.resolve())
    assert against["dropped"] == {"exact_dedup": 1, "fuzzy_dedup": 1}
    assert against["indexed"] == {"exact": 30, "minhash": 30}
    assert against["fingerprint"] == json.loads((old / "manifest.json").read_text())["fingerprint"]
    assert "deduped against" in r.stdout + r.stderr
    # Exact dedup alone against the same index drops the exact copy only.
    r = run_cli("prep", str(corpora["new"]), "-o", str(corpora["tmp"] / "NEW-exact"),
                "--dedup", "exact", "--dedup-against", str(old), *SMALL)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((corpora["tmp"] / "NEW-exact" / "manifest.json").read_text())
    assert manifest["dedup_against"][0]["dropped"] == {"exact_dedup": 1}
    assert manifest["dedup_index"]["minhash"] is None


def test_dedup_against_errors(corpora: dict) -> None:
    tmp, new = corpora["tmp"], str(corpora["new"])
    unindexed = tmp / "OLD-unindexed"  # what a data dir from before the index looks like
    shutil.copytree(tmp / "OLD", unindexed)
    manifest = json.loads((unindexed / "manifest.json").read_text())
    del manifest["dedup_index"]
    (unindexed / "manifest.json").write_text(json.dumps(manifest))
    format1 = tmp / "OLD-format1"  # an index of band keys only, from before verification
    shutil.copytree(tmp / "OLD", format1)
    manifest = json.loads((format1 / "manifest.json").read_text())
    manifest["dedup_index"]["format"] = 1
    (format1 / "manifest.json").write_text(json.dumps(manifest))
    cases = [
        (["--dedup", "fuzzy", "--dedup-against", str(unindexed)], "has no dedup index"),
        (["--dedup", "fuzzy", "--dedup-against", str(format1)], "has format 1; this "
         "shoestring reads format 2"),
        (["--dedup", "fuzzy", "--dedup-against", str(tmp / "OLD"), "--set",
          "curate.minhash_bands=16"], "minhash_bands 28 there, 16 here"),
        (["--dedup", "none", "--dedup-against", str(tmp / "OLD")], "needs dedup on"),
        (["--dedup", "exact", "--dedup-against", str(tmp)], "not a shoestring data dir"),
    ]
    for flags, message in cases:
        out = tmp / "bad"
        r = run_cli("prep", new, "-o", str(out), *flags, *SMALL)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert "re-prep" in r.stderr or "--dedup" in r.stderr
        assert not out.exists()
    # -o the folder it is deduplicated against, or inside it, or holding it: refused before
    # anything is written, the earlier data dir intact (issue 52: 2,900 documents became 96)
    outer = tmp / "OUTER"  # a data dir that holds the one it is deduplicated against
    shutil.copytree(tmp / "OLD", outer)
    shutil.copytree(tmp / "OLD", outer / "inner")
    for target, against in ((tmp / "OLD", tmp / "OLD"), (tmp / "OLD" / "sub", tmp / "OLD"),
                            (outer, outer / "inner")):
        before = {p: p.read_bytes() for p in against.rglob("*") if p.is_file()}
        r = run_cli("prep", new, "-o", str(target), "--overwrite", "--dedup", "exact",
                    "--dedup-against", str(against), *SMALL)
        assert r.returncode == 2 and "--dedup-against" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "replace what it is deduplicated" in r.stderr
        assert {p: p.read_bytes() for p in against.rglob("*") if p.is_file()} == before
    assert not (tmp / "OLD" / "sub").exists()


def index_of(tmp: Path, docs: list[Document], fuzzy: bool) -> DedupIndex:
    """Dedup ``docs`` with index writing on, and open the index as --dedup-against does."""
    folder = tmp / "dedup"
    exact = ExactDedup(index_dir=folder)
    blocks: list = [exact] + ([FuzzyDedup(index_dir=folder)] if fuzzy else [])
    stream = docs
    for b in blocks:
        stream = b.process(stream)
    list(stream)
    minhash = {**blocks[1].settings(), "documents": blocks[1].indexed} if fuzzy else None
    entry = finish(folder, exact.report()["distinct"], minhash)
    (tmp / "manifest.json").write_text(json.dumps({"dedup_index": entry, "fingerprint": "x"}))
    settings = {"ngram": 5, "bands": 28, "rows": 4, "seed": 1}
    return DedupIndex.open(tmp, settings if fuzzy else None)


def test_dedup_against_drops_what_one_combined_run_would(tmp_path: Path) -> None:
    """Deduping NEW against OLD's index keeps exactly the NEW documents that one run over
    OLD then NEW keeps (planted near-duplicates across and within the halves)."""
    rng = np.random.default_rng(4)
    base = random_texts(rng, 60, 120)
    docs = [Document(t, "t", f"d{i}") for i, t in enumerate(base)]
    for k, i in enumerate(rng.choice(60, 30, replace=False)):  # near-copies, anywhere later
        w = base[i].split()
        w[int(rng.integers(len(w)))] = "edited"
        at = int(rng.integers(i + 1, len(docs) + 1))
        docs.insert(at, Document(" ".join(w), "t", f"near{k}-of-{i}"))
    docs.insert(70, Document(docs[3].text, "t", "copy-of-3"))  # and an exact copy
    old, new = docs[:45], docs[45:]
    index = index_of(tmp_path, old, fuzzy=True)
    combined = [d.doc_id for d in FuzzyDedup().process(ExactDedup().process(docs))]
    exact, fuzzy = ExactDedup(against=[index]), FuzzyDedup(against=[index])
    alone = [d.doc_id for d in fuzzy.process(exact.process(new))]
    assert alone == [d for d in combined if d in {x.doc_id for x in new}]
    assert exact.against_dropped == [1] and fuzzy.against_dropped[0] >= 5


def test_an_exact_only_index_cannot_serve_fuzzy_dedup(tmp_path: Path) -> None:
    docs = [Document(t, "t", str(i)) for i, t in
            enumerate(random_texts(np.random.default_rng(2), 5))]
    index_of(tmp_path, docs, fuzzy=False)
    with pytest.raises(ShoestringError, match="without --dedup fuzzy"):
        DedupIndex.open(tmp_path, {"ngram": 5, "bands": 28, "rows": 4, "seed": 1})


def test_index_arrays_are_written_as_numpy_writes_them(tmp_path: Path) -> None:
    """The dedup index's arrays are written with plain writes (a writable map's dirty pages
    counted in prep's RSS): the bytes of ``np.save``, rows given one by one or in blocks,
    and zeros for rows not given."""
    import io

    from shoestring.prep.curate.dedup_index import save_array_atomic

    a = np.random.default_rng(0).integers(0, 2**63, size=(100, 3), dtype=np.uint64)
    buf = io.BytesIO()
    np.save(buf, a)
    for rows in (list(a), [a[:40], a[40:]]):
        save_array_atomic(tmp_path / "a.npy", a.shape, rows)
        assert (tmp_path / "a.npy").read_bytes() == buf.getvalue()
    save_array_atomic(tmp_path / "b.npy", (4, 100), [a[:, 0], a[:, 1]], np.uint32)
    b = np.load(tmp_path / "b.npy")
    assert b.dtype == np.uint32 and np.array_equal(b[:2], a[:, :2].T.astype(np.uint32))
    assert not b[2:].any()
