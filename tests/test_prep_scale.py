"""bench/prep_scale.py's corpus builder (planted clusters: counts, Jaccard range, order,
determinism) and the drop list it scores prep's dedup with (``curate.dropped_ids``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import SHARED_DATA, run_cli

from shoestring.data.builtin import iter_pydocs

BENCH = Path(__file__).resolve().parents[1] / "bench"
SHARED = SHARED_DATA / "corpora" / "wiki-books-en.jsonl.zst"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SC = _load("scale_corpus")


@pytest.fixture(scope="module")
def pool():
    records = ({"text": d.text, "source": "pydocs"} for _, d in zip(range(300), iter_pydocs()))
    return SC.load_pool(records)


def _spec(**kw: object):
    return SC.CorpusSpec(**{"size_bytes": 1_000_000, "seed": 3, "near_frac": 0.15,
                            "exact_frac": 0.05, "max_delay": 20, **kw})


def _texts(folder: Path) -> dict[str, tuple[str, str]]:
    """id → (location, text) of every document in the corpus's shards."""
    out = {}
    for shard in sorted((folder / "shards").iterdir()):
        for line, rec in enumerate(SC.read_jsonl(shard), 1):
            out[rec["id"]] = (f"{shard.name}:{line}", rec["text"])
    return out


def _check_clusters(folder: Path, meta: dict, spec) -> list[dict]:
    truth = SC.load_truth(folder)
    docs = _texts(folder)
    kinds = [e["kind"] for e in truth]
    assert kinds.count("near") == meta["planted"]["near"] > 0
    assert kinds.count("exact") == meta["planted"]["exact"] > 0
    assert len(docs) == meta["documents"]
    for e in truth:
        (loc, text), (head_loc, head) = docs[e["id"]], docs[e["copy_of"]]
        assert (loc, head_loc) == (e["loc"], e["copy_of_loc"])
        assert int(e["id"][1:]) > int(e["copy_of"][1:])  # the head comes first: it is kept
        j = SC.jaccard(SC.shingles(head, spec.ngram), SC.shingles(text, spec.ngram))
        if e["kind"] == "exact":
            assert text == head
        else:
            assert text != head and spec.j_lo <= j <= spec.j_hi
            assert abs(j - e["jaccard"]) < 1e-3
    copies = len(truth) / len(docs)
    assert 0.3 * (spec.near_frac + spec.exact_frac) < copies < 2 * (spec.near_frac + spec.exact_frac)
    return truth


def test_planted_clusters_have_the_requested_jaccard_and_counts(pool, tmp_path: Path) -> None:
    spec = _spec()
    folder, meta = SC.cached_corpus(lambda: pool, spec, tmp_path)
    assert meta["text_bytes"] >= spec.size_bytes
    truth = _check_clusters(folder, meta, spec)
    near = sorted(e["jaccard"] for e in truth if e["kind"] == "near")
    assert near[0] < 0.8 and near[-1] > 0.85  # spread over the range, not one value


def test_same_seed_same_bytes_other_seed_other_corpus(pool, tmp_path: Path) -> None:
    a, _ = SC.cached_corpus(lambda: pool, _spec(), tmp_path / "a")
    b, _ = SC.cached_corpus(lambda: pool, _spec(), tmp_path / "b")
    c, _ = SC.cached_corpus(lambda: pool, _spec(seed=4), tmp_path / "c")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert [p.read_bytes() for p in (a / f for f in files)] == \
        [p.read_bytes() for p in (b / f for f in files)]
    assert (a / "truth.jsonl").read_bytes() != (c / "truth.jsonl").read_bytes()


def test_a_slice_of_the_shared_corpus(tmp_path: Path) -> None:
    if not SHARED.is_file():
        pytest.skip(f"shared corpus absent: {SHARED}")
    pool = SC.load_pool(SC.read_jsonl(SHARED), max_bytes=4_000_000)
    spec = _spec(size_bytes=1_500_000)
    folder, meta = SC.cached_corpus(lambda: pool, spec, tmp_path)
    _check_clusters(folder, meta, spec)


def test_prep_lists_the_documents_dedup_dropped(pool, tmp_path: Path) -> None:
    """``curate.dropped_ids`` lists every document a block dropped, by id and block; on the
    planted corpus, fuzzy dedup drops the planted copies (exact copies all of them)."""
    bench = _load("prep_scale")
    folder, _ = SC.cached_corpus(lambda: pool, _spec(), tmp_path)
    out = tmp_path / "data"
    proc = run_cli("prep", str(folder / "shards"), "-o", str(out), "--filters", "gopher",
                   "--dedup", "fuzzy", "--set", "curate.dropped_ids=true",
                   "--set", "data.vocab_size=300", "--set", "data.seq_len=64")
    assert proc.returncode == 0, proc.stderr
    dropped, partners = bench.read_dropped(out / "dropped.tsv")
    manifest = json.loads((out / "manifest.json").read_text())
    per_block = {b["block"]: sum(b["dropped"].values()) for b in manifest["blocks"]
                 if b["block"] in ("gopher_quality", "gopher_repetition", "exact_dedup",
                                   "fuzzy_dedup")}
    assert {b: list(dropped.values()).count(b) for b in per_block} == per_block
    assert per_block["exact_dedup"] > 0 and per_block["fuzzy_dedup"] > 0
    truth = SC.load_truth(folder)
    scores = bench.score(truth, dropped)
    assert scores["recall_exact"] == 1.0 and scores["precision"] == 1.0
    assert scores["recall_near"] > 0.5
    # every fuzzy drop names the earlier document it matched; a planted near copy, its head
    fuzzy = [d for d, b in dropped.items() if b == "fuzzy_dedup"]
    assert set(partners) == set(fuzzy)

    def order(loc: str) -> tuple[str, int]:
        name, line = loc.rsplit(":", 1)
        return name, int(line)

    assert all(order(partners[d]) < order(d) for d in fuzzy)
    head_of = {e["loc"]: e["copy_of_loc"] for e in truth if e["kind"] == "near"}
    named = [partners[d] == head_of[d] for d in fuzzy if d in head_of]
    assert named and sum(named) >= 0.9 * len(named)
    # nothing dropped outside the planted clusters here, so nothing to explain
    extra = bench.unplanted(folder, truth, dropped, partners, 0.65)
    assert extra["unplanted_drops"] == 0 and extra["unplanted_real"] == 0


def test_dedup_scores_count_any_one_survivor_per_cluster() -> None:
    """datatrove keeps its union-find root, not the first document: dropping the head and
    keeping a copy is as right as the reverse; dropping a whole cluster is one wrong drop."""
    bench = _load("prep_scale")
    truth = [{"loc": "c1", "copy_of_loc": "h", "kind": "exact", "jaccard": 1.0},
             {"loc": "c2", "copy_of_loc": "h", "kind": "near", "jaccard": 0.8},
             {"loc": "d1", "copy_of_loc": "g", "kind": "near", "jaccard": 0.75}]
    s = bench.score(truth, {"h": "fuzzy_dedup", "c2": "fuzzy_dedup", "d1": "fuzzy_dedup"})
    assert (s["precision"], s["recall"], s["recall_exact"], s["recall_near"]) == (1.0, 1.0, 1.0, 1.0)
    s = bench.score(truth, {"h": "fuzzy_dedup", "c1": "exact_dedup", "c2": "fuzzy_dedup",
                            "x": "fuzzy_dedup"})
    # 4 drops: 2 right in h's cluster, 1 too many there (all gone), x is no copy; d1 missed
    assert (s["precision"], s["recall"], s["recall_near"]) == (0.5, round(2 / 3, 4), 0.5)
    s = bench.score(truth, {"h": "gopher_quality"})  # c1 and c2 remain a cluster of two
    assert s["recall"] == 0.0 and s["precision"] is None and s["recall_by_jaccard"]["0.7-0.8"] == 0.0


def test_unplanted_drops_are_measured_against_their_partner(pool, tmp_path: Path) -> None:
    """A drop outside every planted cluster gets the true Jaccard with the document it was
    matched to: here a planted near pair passed as if nobody had planted it."""
    bench = _load("prep_scale")
    folder, _ = SC.cached_corpus(lambda: pool, _spec(), tmp_path)
    near = next(e for e in SC.load_truth(folder) if e["kind"] == "near")
    dropped = {near["loc"]: "fuzzy_dedup", "x.jsonl.zst:1": "gopher_quality"}
    partners = {near["loc"]: near["copy_of_loc"]}
    got = bench.unplanted(folder, [], dropped, partners, near["jaccard"] - 0.01)
    assert got["unplanted_drops"] == 1 and got["unplanted_with_partner"] == 1
    assert got["unplanted_real"] == 1
    assert got["unplanted_jaccard"][0.5] == pytest.approx(near["jaccard"], abs=1e-4)
    assert bench.unplanted(folder, [], dropped, partners, near["jaccard"] + 0.01)[
        "unplanted_real"] == 0
