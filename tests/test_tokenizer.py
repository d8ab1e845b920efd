from __future__ import annotations

from pathlib import Path

import pytest

from shoestring.data.builtin import iter_pydocs
from shoestring.data.tokenizer import load_tokenizer, special_ids
from shoestring.families.spec import MLM_SPECIAL_TOKENS, NUM_SPECIAL
from shoestring.prep.tokenizer_training import train_wordpiece
from shoestring.errors import ShoestringError


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [d.text for _, d in zip(range(200), iter_pydocs())]


def test_wordpiece_learns_vocab_with_specials_first(texts: list[str]) -> None:
    tok = train_wordpiece(texts, vocab_size=1000)
    assert 500 < tok.get_vocab_size() <= 1000
    assert special_ids(tok) == {t: i for i, t in enumerate(MLM_SPECIAL_TOKENS)}
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
    assert by_id[:NUM_SPECIAL] == list(MLM_SPECIAL_TOKENS)
    assert by_id[NUM_SPECIAL:] == sorted(by_id[NUM_SPECIAL:])


# --- kinds, objectives, loading ----------------------------------------------------------

from shoestring.data.tokenizer import load_for_objective, tokenizer_kind
from shoestring.families.spec import CLM_SPECIAL_TOKENS
from shoestring.families.spec import EOT
from shoestring.families import CLM, MLM, FamilySpec

from shoestring.prep.tokenizer_training import train_tokenizer


@pytest.fixture(scope="module")
def short_texts(texts: list[str]) -> list[str]:
    return [t[:3000] for t in texts[:80]]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
@pytest.mark.parametrize("family", [MLM, CLM], ids=["mlm", "clm"])
def test_every_kind_gets_the_objective_layout(short_texts: list[str], kind: str, family: FamilySpec) -> None:
    tok = train_tokenizer(short_texts, kind, family, vocab_size=600, lowercase=False)
    assert tokenizer_kind(tok) == kind
    ids = special_ids(tok, family)
    if family is MLM:
        assert ids == {t: i for i, t in enumerate(MLM_SPECIAL_TOKENS)}
        assert tok.encode("Return it.").tokens[0] == "[CLS]"
    else:
        assert ids[EOT] == 0 and ids["<|pad|>"] == 1
        assert list(ids)[:2] == list(CLM_SPECIAL_TOKENS)
        assert tok.encode("Return it.").ids == tok.encode("Return it.", add_special_tokens=False).ids
    sample = "Return the number of items in a container."
    enc = tok.encode(sample, add_special_tokens=False)
    assert all(i >= len(ids) for i in enc.ids)
    if kind != "wordpiece":  # byte-level BPE and Unigram (no lowercasing) decode losslessly
        assert tok.decode(enc.ids) == sample


def test_byte_level_bpe_has_no_unknowns(short_texts: list[str]) -> None:
    tok = train_tokenizer(short_texts, "bpe", CLM, vocab_size=600, lowercase=False)
    text = "naïve 日本語 🙂 \x7f"
    enc = tok.encode(text)
    assert tok.decode(enc.ids) == text
    assert tok.get_vocab_size() >= 256 + 2


def test_bpe_vocab_too_small_for_bytes(short_texts: list[str]) -> None:
    with pytest.raises(ShoestringError, match="256"):
        train_tokenizer(short_texts, "bpe", CLM, vocab_size=200, lowercase=False)


def test_bpe_training_is_reproducible(short_texts: list[str]) -> None:
    a = train_tokenizer(short_texts, "bpe", CLM, vocab_size=600, lowercase=False)
    b = train_tokenizer(short_texts, "bpe", CLM, vocab_size=600, lowercase=False)
    assert a.to_str() == b.to_str()


def test_loading_a_foreign_tokenizer_lays_specials_out(short_texts: list[str], tmp_path: Path) -> None:
    """A GPT-2-like tokenizer (end-of-text at the end, no pad) gets the CLM layout."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    foreign = Tokenizer(models.BPE())
    foreign.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    foreign.decoder = decoders.ByteLevel()
    foreign.train_from_iterator(short_texts, trainers.BpeTrainer(
        vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    foreign.add_special_tokens([EOT])
    assert foreign.token_to_id(EOT) == foreign.get_vocab_size() - 1
    path = tmp_path / "foreign.json"
    foreign.save(str(path))

    tok = load_for_objective(path, CLM)
    assert special_ids(tok, CLM) == {EOT: 0, "<|pad|>": 1}
    sample = short_texts[5][:400]
    assert tok.encode(sample).tokens == foreign.encode(sample).tokens  # same segmentation
    assert tok.decode(tok.encode(sample).ids) == sample
    mlm = load_for_objective(path, MLM)
    assert special_ids(mlm) == {t: i for i, t in enumerate(MLM_SPECIAL_TOKENS)}
    assert mlm.encode("hi").tokens[0] == "[CLS]"


def test_loading_an_already_laid_out_tokenizer_keeps_it(short_texts: list[str], tmp_path: Path) -> None:
    tok = train_tokenizer(short_texts, "wordpiece", MLM, vocab_size=600, lowercase=True)
    tok.save(str(tmp_path / "t.json"))
    assert load_for_objective(tmp_path / "t.json", MLM).get_vocab() == tok.get_vocab()
