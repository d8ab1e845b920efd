"""Training a tokenizer for prep: the sample it trains on and the trainers of each kind.

The trained tokenizer gets the layout of ``shoestring.data.tokenizer`` (specials first, the
rest in a canonical order: `finish`), which is also what loads it back.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable, Iterable, Iterator

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from shoestring.config import TOKENIZER_KINDS
from shoestring.data.tokenizer import finish
from shoestring.errors import ShoestringError
from shoestring.families import MLM, FamilySpec

_BYTE_ALPHABET = 256

Texts = Iterable[str] | Callable[[], Iterable[str]]


def tokenizer_sample(texts: Iterable[str], max_chars: int, total_chars: int) -> Iterator[str]:
    """The texts a tokenizer trains on: all of them when ``total_chars`` fit ``max_chars``;
    otherwise those whose content hash falls in the first ``max_chars / total_chars`` of the
    range — a uniform sample that depends on neither the order nor how the texts are split
    into parts (local and Ray prep draw the same one) — never more than ``max_chars`` in all
    (a drawn text that would pass the cap is left out)."""
    if total_chars <= max_chars:
        yield from texts
        return
    fraction, taken = max_chars / total_chars, 0
    for text in texts:
        h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                            person=b"tok-sample")
        if int.from_bytes(h.digest(), "little") / 2**64 < fraction and taken + len(text) <= max_chars:
            taken += len(text)
            yield text


def train_tokenizer(
    texts: Texts,
    kind: str,
    family: FamilySpec,
    vocab_size: int,
    lowercase: bool,
    length: int | None = None,
) -> Tokenizer:
    """Train a ``kind`` tokenizer on ``texts`` with the special tokens of ``family``.

    ``texts``: a collection, or a function that returns a fresh iterator over them —
    WordPiece reads them twice (see `_pinned_continuations`); a one-shot iterator is kept
    in memory for that.
    """
    if kind not in TOKENIZER_KINDS:
        raise ShoestringError(f"unknown tokenizer kind {kind!r}", where="data.tokenizer",
                              fix=f"use one of: auto, {', '.join(TOKENIZER_KINDS)}, or a "
                              "tokenizer.json path")
    specials = family.special_tokens(kind)
    unk = family.unk_token
    if kind == "bpe" and vocab_size < _BYTE_ALPHABET + len(specials) + 1:
        raise ShoestringError(
            f"byte-level BPE needs a vocabulary above {_BYTE_ALPHABET + len(specials)} "
            f"(256 bytes + specials), got {vocab_size}",
            where="data.vocab_size", fix="raise data.vocab_size",
        )
    read = _rereadable(texts)
    tok, _ = _build(kind, specials, unk, vocab_size, lowercase)
    pinned = _pinned_continuations(tok, read()) if kind == "wordpiece" else []
    tok, trainer = _build(kind, specials + pinned, unk, vocab_size, lowercase)
    tok.train_from_iterator(_nonempty(read()), trainer=trainer, length=length)
    if pinned:
        tok = _unpin(tok, set(pinned))
    if tok.get_vocab_size() <= len(specials) + (_BYTE_ALPHABET if kind == "bpe" else 0):
        raise ShoestringError(
            "the tokenizer learned no vocabulary: the training text is empty",
            fix="give prep a corpus with some text in it",
        )
    return finish(tok, family, kind, order="canonical")


def _rereadable(texts: Texts) -> Callable[[], Iterable[str]]:
    if callable(texts):
        return texts
    if iter(texts) is texts:  # a one-shot iterator
        texts = list(texts)
    return lambda: texts


def _pinned_continuations(tok: Tokenizer, texts: Iterable[str]) -> list[str]:
    """``##c`` for every character ``c`` that can continue a word, in code point order.

    Why: the WordPiece trainer (BPE with a ``##`` prefix) numbers the ``##c`` symbols in
    the order it walks its word-count hash map, which is seeded at random per process, and
    breaks ties between equally frequent merges by those numbers — so the same text gave
    different vocabularies run to run (huggingface/tokenizers#1794). Handing them to the
    trainer up front as special tokens fixes their numbers (sorted), so every tie is broken
    the same way; `_unpin` then makes them ordinary vocabulary again. Characters the
    pre-tokenizer always isolates (whitespace, punctuation, CJK ideographs) never continue a
    word and are left out, so they cost no vocabulary.
    """
    normalizer = tok.normalizer
    chars: set[str] = set()
    for text in texts:
        chars.update(normalizer.normalize_str(text) if normalizer is not None else text)
    return [f"##{c}" for c in sorted(chars) if _continues_word(c)]


def _continues_word(c: str) -> bool:
    """Whether BERT's pre-tokenizer can leave ``c`` inside a word (not at its start only)."""
    if c.isspace() or unicodedata.category(c).startswith(("P", "C", "Z")):
        return False
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return False  # ASCII punctuation and symbols: BERT splits them off
    return not any(lo <= cp <= hi for lo, hi in _CJK)


# The ideograph blocks BertNormalizer(handle_chinese_chars) surrounds with spaces.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _unpin(tok: Tokenizer, pinned: set[str]) -> Tokenizer:
    """The trained tokenizer with the pinned ``##c`` symbols as plain vocabulary (they stay
    in the model's vocabulary, as the trainer would have put them; they are no longer added
    tokens, which would match ``##c`` in raw text)."""
    data = json.loads(tok.to_str())
    data["added_tokens"] = [a for a in data.get("added_tokens") or []
                            if a["content"] not in pinned]
    return Tokenizer.from_str(json.dumps(data))


def _build(kind: str, specials: list[str], unk: str, vocab_size: int, lowercase: bool):
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk, max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=lowercase,
            lowercase=lowercase,
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
            continuing_subword_prefix="##", show_progress=False,
        )
    elif kind == "bpe":
        tok = Tokenizer(models.BPE())
        if lowercase:
            tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
    else:
        tok = Tokenizer(models.Unigram())
        if lowercase:
            tok.normalizer = normalizers.Lowercase()
        # Line breaks become their own pieces (SentencePiece would fold them into spaces, and
        # pieces spanning paragraphs slow training 5x); "never" prepends no space, so decoding
        # gives back the exact text.
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\s*\n\s*"), behavior="isolated"),
            pre_tokenizers.Metaspace(prepend_scheme="never"),
        ])
        tok.decoder = decoders.Metaspace(prepend_scheme="never")
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token=unk, show_progress=False,
        )
    return tok, trainer


def train_wordpiece(
    texts: Texts, vocab_size: int, lowercase: bool = True, length: int | None = None
) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer on ``texts`` (the MLM layout)."""
    return train_tokenizer(texts, "wordpiece", MLM, vocab_size, lowercase, length)


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    return (t for t in texts if t)
