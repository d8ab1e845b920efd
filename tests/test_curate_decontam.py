"""Decontamination: planted 13-gram overlaps are dropped or cut out; clean text is untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shoestring.config import CurateConfig
from shoestring.prep.curate import Curator
from shoestring.prep.curate.decontam import Decontaminate, EvalNgrams
from shoestring.data.sources import Document
from shoestring.errors import ShoestringError

SHARED_GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"

EVAL_SENTENCE = (
    "the committee approved the new budget after a long debate that lasted "
    "well into the night on thursday"
)  # 18 words
SHORT_EVAL = "a charming and often affecting journey through memory"  # 8 words


def filler(seed: int, n_words: int) -> str:
    rng = np.random.default_rng(seed)
    vocab = [
        "river",
        "stone",
        "market",
        "lantern",
        "harbor",
        "meadow",
        "copper",
        "window",
        "orchard",
        "signal",
        "garden",
        "engine",
        "valley",
        "letter",
        "candle",
        "bridge",
    ]
    return " ".join(
        vocab[i] + str(j)
        for i, j in zip(rng.integers(0, 16, n_words), rng.integers(0, 99, n_words))
    )


@pytest.fixture
def eval_dir(tmp_path: Path) -> Path:
    d = tmp_path / "glue"
    d.mkdir()
    (d / "dev.tsv").write_text(
        f"sentence\tlabel\n{EVAL_SENTENCE}\t1\n{SHORT_EVAL}\t0\ntoo short here\t1\n"
    )
    return d


def doc(text: str, doc_id: str = "d") -> Document:
    return Document(text, "t", doc_id)


def index_for(eval_dir: Path) -> EvalNgrams:
    return EvalNgrams.from_paths([str(eval_dir)])


def test_index_reads_fields_and_counts_ngrams(eval_dir: Path) -> None:
    index = index_for(eval_dir)
    assert index.files == [str(eval_dir / "dev.tsv")]
    assert set(index.tables) == {13, 8}  # 18-word sentence → 6 13-grams; 8-word one whole
    assert index.size == 6 + 1 and index.segments == 2


def test_drop_mode_drops_planted_overlap_and_keeps_clean_text(eval_dir: Path) -> None:
    block = Decontaminate(index_for(eval_dir), mode="drop", keep_examples=3)
    planted = (
        filler(1, 150)
        + " The Committee approved the new budget, after a long debate"
        + " that lasted well into the night. "
        + filler(2, 150)
    )
    clean = filler(3, 300)
    near_miss = (
        filler(4, 100)
        + " the committee approved the new budget after a long debate that lasted "
        + filler(5, 100)
    )  # 12 words
    kept = [
        d.doc_id
        for d in block.process(
            [doc(planted, "planted"), doc(clean, "clean"), doc(near_miss, "near")]
        )
    ]
    assert kept == ["clean", "near"]
    assert block.stats.dropped == {"contaminated": 1}
    (example,) = block.examples["contaminated"]
    assert example.doc_id == "planted" and "dev.tsv" in example.detail
    assert "Committee approved the new budget" in example.detail


def test_short_eval_segment_matches_only_whole(eval_dir: Path) -> None:
    block = Decontaminate(index_for(eval_dir), mode="drop")
    whole = (
        filler(6, 80) + " A charming and often affecting journey through memory. " + filler(7, 80)
    )
    partial = filler(8, 80) + " a charming and often affecting journey " + filler(9, 80)
    kept = [d.doc_id for d in block.process([doc(whole, "whole"), doc(partial, "partial")])]
    assert kept == ["partial"]


def test_cut_mode_removes_the_span_with_margins_and_splits(eval_dir: Path) -> None:
    block = Decontaminate(index_for(eval_dir), mode="cut", margin_chars=50, min_piece_chars=100)
    left, right = filler(10, 120), filler(11, 120)
    text = f"{left} {EVAL_SENTENCE} {right}"
    pieces = list(block.process([doc(text, "src")]))
    assert [p.doc_id for p in pieces] == ["src#1", "src#2"]
    start = text.index(EVAL_SENTENCE)
    end = start + len(EVAL_SENTENCE)
    assert pieces[0].text == text[: start - 50].strip()
    assert pieces[1].text == text[end + 50 :].strip()
    assert "committee" not in pieces[0].text + pieces[1].text
    report = block.report()
    assert report["documents_in"] == 1 and report["documents_out"] == 2
    assert report["docs_cut"] == 1 and report["spans_removed"] == 1 and report["changed"] == 1


def test_cut_mode_drops_tiny_pieces_and_fragmented_documents(eval_dir: Path) -> None:
    index = index_for(eval_dir)
    block = Decontaminate(index, mode="cut", margin_chars=10, min_piece_chars=100)
    only = list(
        block.process([doc(filler(12, 5) + " " + EVAL_SENTENCE + " " + filler(13, 60), "one")])
    )
    assert len(only) == 1 and only[0].doc_id == "one"  # the short left piece is gone
    assert list(block.process([doc(EVAL_SENTENCE, "all")])) == []
    assert block.stats.dropped == {"nothing_left": 1}
    many = (
        " ".join(filler(20 + i, 40) + " " + EVAL_SENTENCE for i in range(4)) + " " + filler(30, 40)
    )
    strict = Decontaminate(index, mode="cut", margin_chars=0, max_pieces=3, min_piece_chars=10)
    assert list(strict.process([doc(many, "many")])) == []
    assert strict.stats.dropped == {"too_many_pieces": 1}


def test_eval_sources_jsonl_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "eval.jsonl"
    good.write_text(json.dumps({"q": EVAL_SENTENCE, "answers": ["x", SHORT_EVAL]}) + "\n\n")
    assert EvalNgrams.from_paths([str(good)]).size == 7
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"q": EVAL_SENTENCE}) + "\n{oops\n")
    with pytest.raises(ShoestringError) as e:
        EvalNgrams.from_paths([str(bad)])
    assert e.value.where == f"curate.decontam: {bad}:2" and "malformed JSON" in e.value.what
    with pytest.raises(ShoestringError) as e:
        EvalNgrams.from_paths([str(tmp_path / "missing.tsv")])
    assert "missing.tsv" in e.value.where and "no such file" in e.value.what
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\0\1\2" * 10)
    with pytest.raises(ShoestringError, match="binary"):
        EvalNgrams.from_paths([str(binary)])
    empty = tmp_path / "short.txt"
    empty.write_text("tiny line\nanother\n")
    with pytest.raises(ShoestringError, match="no text segment of 8 or more words"):
        EvalNgrams.from_paths([str(empty)])


def test_curator_builds_decontam_from_config(eval_dir: Path) -> None:
    cfg = CurateConfig(decontam=[str(eval_dir)], decontam_mode="drop", dedup="none")
    curator = Curator.from_config(cfg)
    docs = [doc(filler(40, 50) + " " + EVAL_SENTENCE, "bad"), doc(filler(41, 50), "ok")]
    assert [d.doc_id for d in curator.run(docs)] == ["ok"]
    (entry,) = curator.stats()["blocks"]
    assert entry["block"] == "decontam" and entry["dropped"] == {"contaminated": 1}
    assert entry["eval_ngrams"] == 7 and entry["mode"] == "drop"


def test_glue_dev_files_as_they_are() -> None:
    if not (SHARED_GLUE / "SST-2" / "dev.tsv").is_file():
        pytest.skip(f"shared GLUE data not found at {SHARED_GLUE}")
    dev = SHARED_GLUE / "SST-2" / "dev.tsv"
    index = EvalNgrams.from_paths([str(dev), str(SHARED_GLUE / "MRPC" / "dev.tsv")])
    assert index.size > 5000
    sentence = dev.read_text(encoding="utf-8").split("\n")[1].split("\t")[0]
    block = Decontaminate(index, mode="drop")
    kept = list(block.process([doc(filler(50, 100) + " " + sentence + " " + filler(51, 100))]))
    assert kept == [] and block.stats.dropped == {"contaminated": 1}


def test_curator_reports_each_dropped_document_once_with_its_block(eval_dir: Path) -> None:
    """``Curator.run(on_drop=...)`` (curate.dropped_ids): every dropped input by id and
    block, none of the kept ones — also when decontamination cuts a document into pieces
    (``ID#k``) and when the reader's pieces of a long document (``ID``, ``ID#2``) lose the
    first one."""
    from shoestring.prep.curate import Curator
    from shoestring.prep.curate.dedup import ExactDedup

    block = Decontaminate(index_for(eval_dir), mode="cut", margin_chars=50, min_piece_chars=100)
    a, b = filler(40, 120), filler(41, 120)
    docs = [doc(a, "f:1"), doc(a, "f:2"),                           # exact copy: f:2
            doc(f"{a[:300]} {EVAL_SENTENCE} {b}", "f:3"),          # cut into f:3#1, f:3#2
            doc(EVAL_SENTENCE, "f:4"),                              # nothing left
            doc(a, "f:5"), doc(b, "f:5#2"),                         # reader pieces: first a copy
            doc(filler(42, 80), "f:6")]
    drops: list[tuple[str, str, str]] = []
    kept = list(Curator([ExactDedup(), block]).run(
        docs, lambda i, name, of: drops.append((i, name, of))))
    assert [d.doc_id for d in kept] == ["f:1", "f:3#1", "f:3#2", "f:5#2", "f:6"]
    # without examples kept, exact dedup does not hold the first ids, so it names none
    assert sorted(drops) == [("f:2", "exact_dedup", ""), ("f:4", "decontam", ""),
                             ("f:5", "exact_dedup", "")]
