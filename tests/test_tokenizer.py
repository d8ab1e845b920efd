from __future__ import annotations

from pathlib import Path

import pytest

from shoestring.data.builtin import iter_pydocs
from shoestring.data.tokenizer import (
    NUM_SPECIAL,
    SPECIAL_TOKENS,
    load_tokenizer,
    special_ids,
    train_wordpiece,
)
from shoestring.errors import ShoestringError


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [d.text for _, d in zip(range(200), iter_pydocs())]


def test_wordpiece_learns_vocab_with_specials_first(texts: list[str]) -> None:
    tok = train_wordpiece(texts, vocab_size=1000)
    assert 500 < tok.get_vocab_size() <= 1000
    assert special_ids(tok) == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    enc = tok.encode("Return the number of items in a container.")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    assert "[UNK]" not in enc.tokens
    assert all(i >= NUM_SPECIAL for i in enc.ids[1:-1])
    assert tok.decode(enc.ids) == "return the number of items in a container."


def test_uncased_vs_cased(texts: list[str]) -> None:
    uncased = train_wordpiece(texts, vocab_size=800, lowercase=True)
    cased = train_wordpiece(texts, vocab_size=800, lowercase=False)
    assert uncased.encode("Hello").ids == uncased.encode("hello").ids
    assert cased.encode("Hello").ids != cased.encode("hello").ids


def test_subwords_cover_unseen_words(texts: list[str]) -> None:
    tok = train_wordpiece(texts, vocab_size=1000)
    tokens = tok.encode("unfathomablezzyx", add_special_tokens=False).tokens
    assert len(tokens) > 1 and all(t.startswith("##") for t in tokens[1:])


def test_save_load_round_trip(texts: list[str], tmp_path: Path) -> None:
    tok = train_wordpiece(texts, vocab_size=600)
    tok.save(str(tmp_path / "tokenizer.json"))
    again = load_tokenizer(tmp_path / "tokenizer.json")
    sample = texts[3][:500]
    assert again.encode(sample).ids == tok.encode(sample).ids


def test_empty_training_text_is_a_clear_error() -> None:
    with pytest.raises(ShoestringError, match="empty"):
        train_wordpiece(["", ""], vocab_size=500)


def test_bad_tokenizer_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ShoestringError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path / "tokenizer.json")


def test_ids_are_in_canonical_order(texts: list[str]) -> None:
    """The trainer numbers tokens in hash-map order; we renumber: specials, then sorted."""
    vocab = train_wordpiece(texts, vocab_size=800).get_vocab()
    by_id = sorted(vocab, key=vocab.get)
    assert by_id[:NUM_SPECIAL] == SPECIAL_TOKENS
    assert by_id[NUM_SPECIAL:] == sorted(by_id[NUM_SPECIAL:])
