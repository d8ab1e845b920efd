"""Substring dedup: planted repeats of known lengths are cut (and nothing shorter), the first
copy is kept, kept text is byte-identical, and a brute-force definition agrees on random text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from shoestring.prep.curate.substring import SubstringDedup, cut_text, find_repeats
from shoestring.data.sources import Document


def words(rng: np.random.Generator, n: int) -> list[str]:
    """Distinct random words: a span of them never repeats by chance."""
    return [f"w{x}" for x in rng.integers(0, 10**9, n)]


def brute_force(texts: list[str], min_span: int) -> list[set[int]]:
    """Per document, the word positions covered by a span of ≥ min_span words whose first
    min_span words start somewhere earlier (corpus order, same-document overlap allowed)."""
    docs = [t.split() for t in texts]
    seen: set[tuple[str, ...]] = set()
    covered: list[set[int]] = []
    for w in docs:
        cut: set[int] = set()
        for p in range(len(w) - min_span + 1):
            gram = tuple(w[p : p + min_span])
            if gram in seen:
                cut.update(range(p, p + min_span))
            seen.add(gram)
        covered.append(cut)
    return covered


def test_planted_repeats_of_known_lengths_are_cut_and_shorter_ones_kept() -> None:
    rng = np.random.default_rng(0)
    long60, exact50, short49 = words(rng, 60), words(rng, 50), words(rng, 49)
    a = " ".join(words(rng, 30) + long60 + words(rng, 10) + exact50 + words(rng, 5) + short49)
    b = " ".join(words(rng, 7) + short49 + words(rng, 12) + long60 + words(rng, 3))
    c = "\n".join([" ".join(words(rng, 4)), " ".join(exact50), "tail words here"])
    block = SubstringDedup(min_span=50, keep_examples=5)
    out = list(block.process([Document(t, src, f"d{i}") for i, (t, src) in
                              enumerate([(a, "x"), (b, "y"), (c, "y")])]))
    assert out[0].text == a  # first occurrences are all in the first document: kept whole
    # The 60-word repeat is cut from b with its trailing space; the 49-word one stays.
    assert out[1].text == b.replace(" ".join(long60) + " ", "")
    assert " ".join(short49) in out[1].text
    # Exactly min_span words is enough; the cut piece includes the following newline.
    assert out[2].text == c.replace(" ".join(exact50) + "\n", "")
    report = block.report()
    assert report["spans_removed"] == 2 and report["documents_out"] == 3
    assert report["by_source"] == {"y": {"spans_removed": 2, "bytes_removed":
                                         len(" ".join(long60)) + 1 + len(" ".join(exact50)) + 1}}
    assert report["bytes_removed"] == len(a + b + c) - sum(len(d.text) for d in out)
    details = [e.detail for e in block.examples["repeated_span"]]
    assert details == ["60 words also in d0", "50 words also in d0"]


def test_kept_text_is_the_input_minus_the_cut_bytes() -> None:
    text = "  lead  one two\tthree\n\nfour five  six "
    kept, pieces = cut_text(text, [(1, 3), (4, 5)])  # words 1-2 ("one two") and 4 ("four")
    assert pieces == ["one two\t", "four "]
    assert kept == "  lead  three\n\nfive  six "
    assert cut_text(text, []) == (text, [])


def test_matches_never_cross_documents_and_whitespace_does_not_matter() -> None:
    rng = np.random.default_rng(1)
    w = words(rng, 80)
    # Doc 0 ends with w[:40], doc 1 starts with w[40:]: together they are w, but no single
    # document holds it, so doc 2's copy of w is a first occurrence.
    texts = [" ".join(words(rng, 5) + w[:40]), " ".join(w[40:] + words(rng, 5)), " ".join(w),
             "\n".join(w)]
    found = find_repeats(texts, 50)
    assert found[:3] == [[], [], []]
    assert found[3] == [(0, 80)]  # doc 2's words, separated by newlines instead
    block = SubstringDedup(50, keep_examples=1)
    list(block.process([Document(t, "s", f"d{i}") for i, t in enumerate(texts)]))
    assert block.examples["repeated_span"][0].detail == "80 words also in d2"


def test_a_document_that_is_all_repeat_is_dropped() -> None:
    rng = np.random.default_rng(2)
    text = " ".join(words(rng, 70))
    block = SubstringDedup(min_span=50)
    out = list(block.process([Document(text, "s", "a"), Document(text + "\n", "s", "b")]))
    assert [d.doc_id for d in out] == ["a"]
    assert block.report()["dropped"] == {"all_repeated": 1}


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_agrees_with_a_brute_force_definition_on_repetitive_random_text(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = [f"v{i}" for i in range(6)]  # tiny vocabulary: many repeats, overlaps, periods
    texts = [" ".join(rng.choice(vocab, rng.integers(0, 60))) for _ in range(12)]
    min_span = int(rng.integers(2, 6))
    found = find_repeats(texts, min_span)
    expected = brute_force(texts, min_span)
    for ranges, want in zip(found, expected):
        got = {p for lo, hi in ranges for p in range(lo, hi)}
        assert got == want


def test_prep_dedup_substring_records_spans_and_explains(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    shared = " ".join(words(rng, 60))
    docs = [" ".join(words(rng, 80)) + (f"\n{shared}\n" if i % 3 == 0 else "\n")
            + " ".join(words(rng, 40)) for i in range(30)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    r = run_cli("prep", str(corpus), "-o", str(tmp_path / "data"), "--dedup", "substring",
                "--min-span", "50", "--explain", "2", "--set", "data.vocab_size=300",
                "--set", "data.seq_len=32")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    [block] = [b for b in manifest["blocks"] if b["block"] == "substring_dedup"]
    assert block["spans_removed"] == 9 and block["changed"] == 9  # 10 copies, first kept
    assert block["bytes_removed"] == 9 * (len(shared) + 1)
    assert block["by_source"][str(corpus)]["spans_removed"] == 9
    assert "substring_dedup: repeated_span" in r.stderr and "60 words also in" in r.stderr
    r = run_cli("prep", str(corpus), "-o", str(tmp_path / "bad"), "--dedup", "substring",
                "--min-span", "1")
    assert r.returncode == 2 and "--min-span" in r.stderr and "Traceback" not in r.stderr
    # Over curate.substring_max_mb it refuses (before the suffix array), naming the limit.
    r = run_cli("prep", str(corpus), "-o", str(tmp_path / "big"), "--dedup", "substring",
                "--set", "curate.substring_max_mb=0.01")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "substring_max_mb = 0.01 MB" in r.stderr and "--dedup fuzzy" in r.stderr
    assert not (tmp_path / "big").exists()


def test_substring_dedup_refuses_text_over_its_limit() -> None:
    from shoestring.errors import ShoestringError

    docs = [Document("word " * 300, "t", f"d{i}") for i in range(10)]  # 1,500 chars each
    assert len(list(SubstringDedup(50, max_mb=0.02).process(docs))) == 1  # 15,000: fits
    with pytest.raises(ShoestringError, match="at document 7, d6"):
        list(SubstringDedup(50, max_mb=0.01).process(docs))


def test_a_missing_pydivsufsort_is_refused_before_reading(tmp_path: Path) -> None:
    """Issue 52: without the optional package, --dedup substring failed only after the whole
    read. A real process in which the import fails (``sys.modules[name] = None`` makes
    ``import pydivsufsort`` raise ImportError, as if it were not installed) must refuse at
    once: exit 2, the install hint, and no reading — the input's second line is malformed
    JSON, which a prep that read would report instead."""
    import os
    import subprocess
    import sys

    (tmp_path / "c.jsonl").write_text('{"text": "some text to read first"}\n{not json\n')
    script = tmp_path / "without_pydivsufsort.py"
    script.write_text("import sys\nsys.modules['pydivsufsort'] = None\n"
                      "from shoestring.cli import main\nsys.argv[0] = 'shoestring'\nmain()\n")
    r = subprocess.run([sys.executable, str(script), "prep", "c.jsonl", "-o", "d", "--dedup",
                        "substring"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"}, check=False)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "--dedup substring: substring dedup needs the pydivsufsort package" in r.stderr
    assert "pip install 'shoestring[privacy]'" in r.stderr
    assert "read + clean" not in r.stderr and "malformed JSON" not in r.stderr
    assert not (tmp_path / "d").exists() and not (tmp_path / ".d.partial").exists()
