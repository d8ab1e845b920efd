"""Curation blocks: each Gopher rule on crafted documents, the pipeline's counts, --explain,
and config validation (see tests/test_curate_dedup.py and test_curate_decontam.py too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoestring.config import CurateConfig, DataConfig, load_config
from shoestring.prep.curate import Curator, Drop
from shoestring.prep.curate.compress import Compressibility
from shoestring.prep.curate.gopher import GopherQuality, GopherRepetition
from shoestring.prep.curate.normalize import Clean, Length
from shoestring.prep.ray.remote import merge_reports
from shoestring.prep.prep import prep
from shoestring.data.sources import Document
from shoestring.errors import ShoestringError

# Ordinary prose: passes every Gopher rule (checked below), ~150 words on 8 lines.
GOOD = """The river that runs through the old town has shaped its streets for centuries.
Merchants built their warehouses along the banks, and barges carried grain to the coast.
In the spring the water rises quickly, so the houses near it stand on stone foundations.
Children learn to swim in the shallow bend below the mill, where the current is gentle.
Visitors often ask why the bridge has seven arches; the answer lies in a medieval dispute
between two guilds that each wanted to pay for its own part of the crossing.
Today the quarrel is remembered with a festival, music, boats decorated with lanterns,
and a long dinner that begins at sunset and ends when the last candle burns out."""


def doc(text: str, doc_id: str = "d") -> Document:
    return Document(text=text, source="test", doc_id=doc_id)


def reason(block: GopherQuality | GopherRepetition, text: str) -> str | None:
    drop = block.check(text)
    return None if drop is None else drop.reason


def test_good_text_passes_every_rule() -> None:
    assert GopherQuality().check(GOOD) is None
    assert GopherRepetition().check(GOOD) is None


@pytest.mark.parametrize(
    ("text", "kwargs", "expected"),
    [
        (" ".join(GOOD.split()[:30]), {}, "too_few_words"),
        (GOOD, {"max_words": 60}, "too_many_words"),
        (
            "to be or an it is of as at by on we so do go up no me my " * 5 + "the and",
            {},
            "mean_word_length",
        ),
        ("incomprehensibilities extraordinarily " * 30 + "the and", {}, "mean_word_length"),
        (GOOD + " #" * 20, {}, "hash_ratio"),
        (GOOD + " ..." * 20, {}, "ellipsis_ratio"),
        (
            "\n".join(f"• item {i} of the list and another word here" for i in range(12)),
            {},
            "bullet_lines",
        ),
        (
            "\n".join(line + ("…" if i % 2 else "") for i, line in enumerate(GOOD.split("\n"))),
            {},
            "ellipsis_lines",
        ),
        (GOOD + " " + " ".join(str(1900 + i) for i in range(45)), {}, "alpha_words"),
        (
            "cats dogs horses rabbits chase quickly across green fields under bright skies " * 6,
            {},
            "stop_words",
        ),
    ],
    ids=[
        "few-words",
        "many-words",
        "short-words",
        "long-words",
        "hashes",
        "ellipses",
        "bullets",
        "ellipsis-lines",
        "numbers",
        "no-stop-words",
    ],
)
def test_each_quality_rule(text: str, kwargs: dict, expected: str) -> None:
    assert reason(GopherQuality(**kwargs), text) == expected


def test_a_rule_set_to_none_is_off() -> None:
    text = " ".join(GOOD.split()[:30])
    assert reason(GopherQuality(min_words=None), text) is None


def test_quality_boundaries_are_the_published_ones() -> None:
    # 50 words exactly passes, 49 fails (Gopher: "fewer than 50 ... words").
    words = GOOD.split()
    assert reason(GopherQuality(), " ".join(words[:50])) is None
    assert reason(GopherQuality(), " ".join(words[:49])) == "too_few_words"


LINES = [line for line in GOOD.split("\n")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\n".join(LINES[:6] + [LINES[0]] * 4), "dup_line_frac"),
        ("\n\n".join(LINES[:5] + [LINES[1]] * 3), "dup_para_frac"),
        (
            "\n".join(
                [
                    "short one",
                    "short two",
                    "short three",
                    "short four",
                    "short five",
                    "short six",
                    "short seven",
                    GOOD.replace("\n", " "),
                ]
                * 1
                + [GOOD.replace("\n", " ")]
            ),
            "dup_line_chars",
        ),
        (GOOD.replace("\n", " ") + " " + "peace and quiet " * 40, "top_2gram"),
        (" ".join([GOOD.replace("\n", " ")] * 2), "dup_5gram"),
    ],
    ids=["dup-lines", "dup-paragraphs", "dup-line-chars", "top-2gram", "dup-5gram"],
)
def test_each_repetition_rule(text: str, expected: str) -> None:
    assert reason(GopherRepetition(), text) == expected


def test_repeated_sentence_inside_one_line_is_a_duplicated_ngram() -> None:
    sentence = "a quiet garden behind the library grows tomatoes beans and sunflowers every summer"
    text = " ".join(LINES[:3]) + " " + sentence + " and then, once more: " + sentence + "."
    drop = GopherRepetition().check(text)
    assert drop is not None and drop.reason.startswith("dup_") and drop.reason.endswith("gram")
    # Off when every n-gram rule is off.
    assert GopherRepetition(max_top_ngram_frac={}, max_dup_ngram_frac={}).check(text) is None


def test_blank_lines_are_not_duplicate_lines() -> None:
    text = "\n\n".join(LINES)  # 8 paragraphs of one line, 7 blank lines between them
    assert GopherRepetition().check(text) is None


def test_clean_and_length_blocks_count() -> None:
    docs = [doc("a\u200bb  c\r\nd", "x"), doc("tiny", "y"), doc("long enough text here", "z")]
    clean = Clean(min_chars=5)
    length = Length(max_chars=15, keep_examples=5)
    out = list(length.process(clean.process(docs)))
    assert [d.text for d in out] == ["ab c\nd"]
    assert clean.stats.dropped == {"too_short": 1} and clean.stats.docs_out == 2
    assert length.stats.dropped == {"too_long": 1}
    assert [e.doc_id for e in length.examples["too_long"]] == ["z"]


def test_compressibility_check_counts_and_explains() -> None:
    check = Compressibility(0.3, keep_examples=1)
    keep = check.check_batch([25, 40, 50], [100, 100, 100],
                             [doc("a", "ok"), doc("x" * 100, "dense"), doc("b", "denser")])
    assert keep.tolist() == [True, False, False]
    report = check.report()
    assert report["documents_in"] == 3 and report["documents_out"] == 1
    assert report["dropped"] == {"ratio_too_high": 2}
    assert [e.doc_id for e in check.examples["ratio_too_high"]] == ["dense"]


def test_compressibility_batch_check_and_config() -> None:
    assert Compressibility.from_config(CurateConfig()) is None  # filters=none: off
    assert (
        Compressibility.from_config(CurateConfig(filters="gopher", compress_max_ratio=None)) is None
    )
    check = Compressibility.from_config(CurateConfig(filters="gopher", explain=5))
    assert check is not None and check.max_ratio == 0.3
    keep = check.check_batch(
        [10, 31, 30], [100, 100, 100], [doc("a", "x"), doc("b", "y"), doc("c", "z")]
    )
    assert keep.tolist() == [True, False, True]
    assert check.report()["dropped"] == {"ratio_too_high": 1}
    assert [e.doc_id for e in check.examples["ratio_too_high"]] == ["y"]


def _corpus() -> list[Document]:
    """The documents as curation sees them: through prep's clean block (``min_chars=16``)."""
    docs = [doc(GOOD, "good-1"), doc(GOOD.replace("river", "canal"), "good-2")]
    docs += [doc(" ".join(GOOD.split()[:20]), f"short-{i}") for i in range(3)]
    docs += [doc(GOOD, "copy-of-good-1"), doc("  " + GOOD.replace(" ", "  "), "spaced-copy")]
    docs += [doc("x", "tiny")]
    return list(Clean(min_chars=16).process(docs))


def test_curator_counts_chain_and_manifest_shape() -> None:
    cfg = CurateConfig(filters="gopher", dedup="fuzzy", explain=2)
    curator = Curator.from_config(cfg)
    kept = list(curator.run(_corpus()))
    assert [d.doc_id for d in kept] == ["good-1"]  # good-2 is a near-duplicate of good-1
    stats = curator.stats()
    blocks = [b for b in stats["blocks"] if b["block"] != "compressibility"]
    assert [b["block"] for b in blocks] == [
        "gopher_quality",
        "gopher_repetition",
        "exact_dedup",
        "fuzzy_dedup",
    ]
    for before, after in zip(blocks, blocks[1:]):
        assert before["documents_out"] == after["documents_in"]
    assert stats["documents_in"] == 7 and stats["documents_out"] == 1  # "tiny" did not pass clean
    by_name = {b["block"]: b for b in blocks}
    assert by_name["gopher_quality"]["dropped"] == {"too_few_words": 3}
    assert by_name["exact_dedup"]["dropped"] == {"duplicate": 2}  # the spaced copy normalizes equal
    assert by_name["fuzzy_dedup"]["dropped"] == {"near_duplicate": 1}
    assert by_name["fuzzy_dedup"]["clusters"] == 1


def test_explain_shows_up_to_n_examples_per_reason() -> None:
    curator = Curator.from_config(CurateConfig(filters="gopher", dedup="exact", explain=2))
    list(curator.run(_corpus()))
    text = curator.explain()
    assert "== gopher_quality: too_few_words ==" in text
    assert "-- short-0" in text and "-- short-1" in text and "short-2" not in text  # N = 2
    assert "20 words < gopher_min_words=50" in text
    assert "== exact_dedup: duplicate ==" in text and "same text as good-1" in text
    one = curator.explain(1)
    assert "-- short-0" in one and "-- short-1" not in one
    quiet = Curator.from_config(CurateConfig(filters="gopher"))
    list(quiet.run(_corpus()))
    assert quiet.explain() == "no dropped documents to explain"  # explain=0 keeps nothing


def test_a_corpus_filtered_to_nothing_says_which_block_removed_what(tmp_path: Path) -> None:
    """Prep's error names each block's drops (the clean block's and curation's alike)."""
    texts = [" ".join(GOOD.split()[:20]) for _ in range(4)] + ["x"]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    with pytest.raises(ShoestringError) as err:
        prep([str(tmp_path / "c.jsonl")], tmp_path / "out", DataConfig(),
             curate=CurateConfig(filters="gopher", dedup="none"))
    assert "empty after cleaning: 5 documents read" in err.value.what
    assert "clean dropped 1 too_short" in err.value.what
    assert "gopher_quality dropped 4 too_few_words" in err.value.what


def test_workers_split_and_merge_give_the_same_counts() -> None:
    """The stateless blocks on two halves (two Ray tasks), their reports merged: the counts
    of one run over the whole."""
    cfg = CurateConfig(filters="gopher", dedup="exact")
    whole = Curator.from_config(cfg)
    expected = [d.doc_id for d in whole.run(_corpus())]
    corpus = _corpus()
    stateless = lambda: [b for b in Curator.from_config(cfg).blocks  # noqa: E731
                         if not b.stateful]
    workers = [Curator(stateless()) for _ in range(2)]
    halves = [list(w.run(part)) for w, part in zip(workers, (corpus[:4], corpus[4:]))]
    dedup = Curator([b for b in Curator.from_config(cfg).blocks if b.stateful])
    assert [d.doc_id for d in dedup.run(halves[0] + halves[1])] == expected
    merged = merge_reports([b.report() for b in stateless()],
                           [w.stats()["blocks"] for w in workers])
    whole_blocks = {b["block"]: b for b in whole.stats()["blocks"]}
    for entry in merged:
        assert entry == whole_blocks[entry["block"]]


def test_drop_is_a_plain_value() -> None:
    assert Drop("x", "why") == Drop("x", "why")


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("curate.dedup=fuzz", "curate.dedup"),
        ("curate.filters=c4", "curate.filters"),
        ("curate.gopher_min_words=200000", "curate.gopher_max_words"),
        ("curate.gopher_max_bullet_lines=1.5", "curate.gopher_max_bullet_lines"),
        ("curate.minhash_bands=0", "curate.minhash_bands"),
        ("curate.decontam_min_words=20", "curate.decontam_min_words"),
        ("curate.rep_max_dup_ngram_frac={5: 1.5}", "curate.rep_max_dup_ngram_frac"),
        ("curate.decontam_mode=erase", "curate.decontam_mode"),
        ("curate.bogus=1", "curate.bogus"),
    ],
)
def test_config_errors_name_the_field(override: str, field: str) -> None:
    with pytest.raises(ShoestringError) as e:
        load_config(None, [override])
    assert field in e.value.what


def test_config_defaults_are_the_published_thresholds() -> None:
    c = CurateConfig()
    assert (c.gopher_min_words, c.gopher_max_words) == (50, 100_000)
    assert (c.gopher_min_mean_word_len, c.gopher_max_mean_word_len) == (3.0, 10.0)
    assert c.gopher_max_symbol_word_ratio == 0.1 and c.gopher_min_alpha_words == 0.8
    assert (c.gopher_max_bullet_lines, c.gopher_max_ellipsis_lines) == (0.9, 0.3)
    assert c.rep_max_top_ngram_frac == {2: 0.20, 3: 0.18, 4: 0.16}
    assert c.rep_max_dup_ngram_frac[5] == 0.15 and c.rep_max_dup_ngram_frac[10] == 0.10
    assert c.compress_max_ratio == 0.3
    assert (c.minhash_ngram, c.minhash_bands, c.minhash_rows, c.minhash_threshold) == \
        (5, 28, 4, 0.65)
    assert (c.decontam_ngram, c.decontam_margin_chars, c.decontam_max_pieces) == (13, 200, 10)


def test_reference_sample_is_the_smallest_hashes_whatever_the_order() -> None:
    """The compressibility threshold's sample must be the same documents for the local and
    the Ray executor (which see them in other orders), and bounded in size."""
    import random

    from shoestring.prep.curate.compress import reference_sample

    texts = [f"document {i} " * (1 + i % 7) for i in range(3000)]
    shuffled = texts[:]
    random.Random(1).shuffle(shuffled)
    a, b = reference_sample(texts, 5000), reference_sample(shuffled, 5000)
    assert a == b
    assert 5000 <= sum(map(len, a)) < 5000 + max(map(len, texts))
    assert len(a) < len(texts) / 10
