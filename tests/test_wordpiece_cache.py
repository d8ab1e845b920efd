"""The cached WordPiece path gives exactly the library's ids, on real text and on edge cases."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer

from shoestring.inference import wordpiece_cache
from shoestring.data.builtin import iter_pydocs
from shoestring.inference.wordpiece_cache import WordPieceCache, encoder_for, library_encoder
from shoestring.families import CLM
from shoestring.prep.tokenizer_training import train_tokenizer, train_wordpiece

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpora" / "mixed-en.jsonl"


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return [d.text for _, d in zip(range(300), iter_pydocs())]


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def tok(request: pytest.FixtureRequest, docs: list[str]) -> Tokenizer:
    return train_wordpiece(docs, vocab_size=1500, lowercase=request.param)


def library(tok: Tokenizer, texts: list) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts)]


def sentences(docs: list[str]) -> list[str]:
    return [s for d in docs for s in d.split(". ") if s]


def test_real_text_gives_the_librarys_ids(tok: Tokenizer, docs: list[str]) -> None:
    cache = WordPieceCache.for_tokenizer(tok)
    assert cache is not None
    texts = sentences(docs) + docs
    assert cache.encode(texts) == library(tok, texts)
    # The path is taken (most of this corpus is printable ASCII), not left to the library.
    assert sum(map(cache.common, texts)) > 0.8 * len(texts)
    again = cache.encode(texts)  # now from the cache
    assert again == library(tok, texts)


def _edge_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pieces = (list("abcXYZ019") + list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
              + [" ", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "\x00", "\x1f", "\x7f"]
              + ["é", "ß", "中", "\u00a0", "\u2019", "😀", "\ufffd"]
              + ["[MASK]", "[mask]", "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MA", "SK]", "##"]
              + ["the", "return", "function", "Python", "a" * 100, "b" * 101, "ab" * 60])
    return [" ".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(n)]


def test_edge_cases_give_the_librarys_ids(tok: Tokenizer) -> None:
    texts = ["", " ", "\t\n", "[MASK]", "[MASK][MASK]", "a[MASK]b", "x" * 100, "x" * 101,
             "Don't stop-me now!!", "e.g. 3.14 + x_1", "naïve café", "tab\tsep\rline\nend",
             "ctrl\x01char", "[mask] lower", "[[MASK]]", "A" * 250]
    texts += _edge_texts(3000)
    cache = WordPieceCache.for_tokenizer(tok)
    assert cache is not None
    got = cache.encode(texts)
    want = library(tok, texts)
    bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, bad[:3]
    assert 0.2 * len(texts) < sum(map(cache.common, texts)) < len(texts)


def test_a_full_cache_starts_again(tok: Tokenizer, docs: list[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wordpiece_cache, "MAX_WORDS", 50)
    cache = WordPieceCache.for_tokenizer(tok)
    texts = sentences(docs)[:400]
    assert cache.encode(texts) == library(tok, texts)
    assert len(cache._pieces) <= 50


def test_an_added_normalized_token_sends_its_texts_to_the_library(tok: Tokenizer) -> None:
    tok = Tokenizer.from_str(tok.to_str())
    tok.add_tokens([AddedToken("zorblat", normalized=True), AddedToken("qq", single_word=True)])
    cache = WordPieceCache.for_tokenizer(tok)
    texts = ["a zorblat b", "ZORBLAT here", "qq x", "xqqx", "plain words only"]
    assert cache.encode(texts) == library(tok, texts)
    assert [cache.common(t) for t in texts] == [False, False, False, False, True]


def test_other_layouts_keep_the_library(docs: list[str]) -> None:
    short = [d[:2000] for d in docs[:100]]
    assert WordPieceCache.for_tokenizer(train_tokenizer(short, "bpe", CLM, 600, False)) is None
    wp = train_wordpiece(short, vocab_size=800)
    truncating = Tokenizer.from_str(wp.to_str())
    truncating.enable_truncation(16)
    assert WordPieceCache.for_tokenizer(truncating) is None
    spec = json.loads(wp.to_str())
    spec["normalizer"] = {"type": "Lowercase"}
    assert WordPieceCache.for_tokenizer(Tokenizer.from_str(json.dumps(spec))) is None
    spec = json.loads(wp.to_str())
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    assert WordPieceCache.for_tokenizer(Tokenizer.from_str(json.dumps(spec))) is None
    assert WordPieceCache.for_tokenizer(wp) is not None


@pytest.mark.skipif(not SHARED.is_file(), reason=f"shared corpus not found at {SHARED}")
def test_the_shared_english_corpus_gives_the_librarys_ids(tok: Tokenizer) -> None:
    with SHARED.open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(3000), f)]
    texts += [s for t in texts[:500] for s in t.split("\n") if s]
    cache = WordPieceCache.for_tokenizer(tok)
    got, want = cache.encode(texts), library(tok, texts)
    bad = [t[:80] for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, bad[:3]


class _OldLibrary:
    """A tokenizer as tokenizers < 0.20 has it: ``encode_batch`` only, no ``encode_batch_fast``
    (the real tokenizer's calls behind it)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.encode_batch = tok.encode_batch


def test_the_full_batch_call_gives_the_fast_calls_ids(tok: Tokenizer, docs: list[str]) -> None:
    texts = sentences(docs)[:200] + ["Ünïcode café", "tab\tand\x07bell", ""]
    fast, full = library_encoder(tok, fast=True), library_encoder(tok, fast=False)
    assert fast(texts) == full(texts) == library(tok, texts)
    old = library_encoder(_OldLibrary(tok))  # type: ignore[arg-type]
    assert old(texts) == library(tok, texts)
    with pytest.raises(AttributeError):  # the fallback really is the only call it has
        library_encoder(_OldLibrary(tok), fast=True)  # type: ignore[arg-type]


def test_encoder_for_takes_the_cache_only_where_it_applies(tok: Tokenizer,
                                                          docs: list[str]) -> None:
    texts = sentences(docs)[:100] + ["naïve façade"]
    assert encoder_for(tok).__self__.__class__ is WordPieceCache  # type: ignore[attr-defined]
    assert encoder_for(tok)(texts) == library(tok, texts)
    bpe = train_tokenizer([d[:2000] for d in docs[:100]], "bpe", CLM, 600, False)
    assert not hasattr(encoder_for(bpe), "__self__")  # the library's call
    assert encoder_for(bpe)(texts) == library(bpe, texts)
