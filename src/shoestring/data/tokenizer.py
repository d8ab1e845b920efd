"""Tokenizers, trained or loaded, stored as standard Hugging Face `tokenizer.json` files.

Three kinds are trained with the `tokenizers` library: WordPiece (BERT-style encoders),
byte-level BPE (GPT-style decoders: every byte is representable, so there is no unknown
token) and Unigram (SentencePiece-style). An existing `tokenizer.json` can be loaded instead.

Whatever the kind, the special tokens of the objective take the first ids, in a fixed order,
so the rest of shoestring can rely on them:

* MLM: ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4`` (``id < NUM_SPECIAL`` means "special");
* CLM: ``<|endoftext|>=0 <|pad|>=1``, plus ``<|unk|>=2`` for the kinds that need an unknown
  token (WordPiece, Unigram).

The rest of the vocabulary follows in a canonical order (see `_relayout`).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from shoestring import families
from shoestring.errors import ShoestringError
from shoestring.families.spec import (  # noqa: F401  (the token names, re-exported here)
    CLM_PAD,
    CLM_UNK,
    CLS,
    EOT,
    MASK,
    NEEDS_UNK,
    NUM_SPECIAL,
    PAD,
    SEP,
    UNK,
)
from shoestring.families.spec import CLM_SPECIAL_TOKENS as _CLM
from shoestring.families.spec import MLM_SPECIAL_TOKENS as _MLM

SPECIAL_TOKENS, CLM_SPECIAL_TOKENS = list(_MLM), list(_CLM)  # id order of each layout

KINDS = ("wordpiece", "bpe", "unigram")
_BYTE_ALPHABET = 256


def default_kind(objective: str) -> str:
    """WordPiece for encoders (as BERT), byte-level BPE for decoders (as GPT-2)."""
    return families.get(objective).tokenizer_kind


def special_tokens(objective: str, kind: str) -> list[str]:
    """The special tokens, in id order, of a tokenizer of ``kind`` for ``objective``."""
    return families.get(objective).special_tokens(kind)


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
    objective: str,
    vocab_size: int,
    lowercase: bool,
    length: int | None = None,
) -> Tokenizer:
    """Train a ``kind`` tokenizer on ``texts`` with the special tokens of ``objective``.

    ``texts``: a collection, or a function that returns a fresh iterator over them —
    WordPiece reads them twice (see `_pinned_continuations`); a one-shot iterator is kept
    in memory for that.
    """
    if kind not in KINDS:
        raise ShoestringError(f"unknown tokenizer kind {kind!r}", where="data.tokenizer",
                              fix=f"use one of: auto, {', '.join(KINDS)}, or a tokenizer.json path")
    specials = special_tokens(objective, kind)
    unk = families.get(objective).unk_token
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
    return finish(tok, objective, kind, order="canonical")


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
    return train_tokenizer(texts, "wordpiece", "mlm", vocab_size, lowercase, length)


def load_for_objective(path: str | Path, objective: str) -> Tokenizer:
    """Load an existing ``tokenizer.json`` and give it the special-token layout of ``objective``.

    Missing special tokens are added; tokens are renumbered (specials first, then the rest in
    their original id order) only when the layout differs. A model trained on it learns its
    own embeddings, so renumbering loses nothing.
    """
    tok = load_tokenizer(path)
    kind = tokenizer_kind(tok)
    if kind not in KINDS:
        raise ShoestringError(
            f"unsupported tokenizer model {kind!r}", where=str(path),
            fix="use a WordPiece, BPE or Unigram tokenizer.json, or let prep train one",
        )
    specials = special_tokens(objective, kind)
    if _ids_of(tok, specials) == list(range(len(specials))):
        return finish(tok, objective, kind, order=None)
    return finish(tok, objective, kind, order="keep")


def finish(tok: Tokenizer, objective: str, kind: str, order: str | None) -> Tokenizer:
    """Lay the specials out first (``order``: canonical, keep, or None = leave ids) and set the
    post-processor of the objective."""
    specials = special_tokens(objective, kind)
    if order is not None:
        tok = _relayout(tok, specials, order)
    if families.get(objective).row_frame:
        cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, cls_id), (SEP, sep_id)],
        )
    elif isinstance(tok.post_processor, processors.TemplateProcessing):
        tok.post_processor = None  # its ids may be stale; CLM adds no specials per sequence
    special_ids(tok, objective)
    return tok


def _relayout(tok: Tokenizer, specials: list[str], order: str) -> Tokenizer:
    """The same tokenizer with ids: specials, then the rest in a fixed order.

    ``canonical`` (after training): the `tokenizers` trainers number tokens in hash-map order,
    so the same text gives different ids on every run (huggingface/tokenizers#1794). WordPiece
    segments by greedy longest match against the vocabulary *set*, BPE by its merge list (of
    strings) and Unigram by piece scores, so renumbering changes no segmentation and makes
    prep reproducible. Canonical is: WordPiece and Unigram sorted; BPE the alphabet sorted,
    then each merge's product in merge order (so a prefix of the vocabulary is meaningful).
    ``keep``: the rest in the existing id order (for loaded tokenizers).
    """
    data = json.loads(tok.to_str())
    model = data["model"]
    unigram = model["type"] == "Unigram"
    if unigram:
        scores = {piece: score for piece, score in model["vocab"]}
        old = [piece for piece, _ in model["vocab"]]
    else:
        old = sorted(model["vocab"], key=model["vocab"].get)
    added = [a["content"] for a in sorted(data.get("added_tokens") or [], key=lambda a: a["id"])]
    rest = [t for t in dict.fromkeys([*old, *added]) if t not in specials]
    if order == "canonical":
        rest = _bpe_order(model, rest) if model["type"] == "BPE" else sorted(rest)
    new = [*specials, *rest]
    ids = {t: i for i, t in enumerate(new)}
    if unigram:
        model["vocab"] = [[t, scores.get(t, 0.0)] for t in new]
        unk = old[model["unk_id"]] if model.get("unk_id") is not None else None
        model["unk_id"] = ids[unk] if unk is not None else None
    else:
        model["vocab"] = ids
    entries = {a["content"]: a for a in data.get("added_tokens") or []}
    for token in specials:
        entries.setdefault(token, {"content": token, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
        entries[token]["special"] = True
    for token, entry in entries.items():
        entry["id"] = ids[token]
    data["added_tokens"] = sorted(entries.values(), key=lambda a: a["id"])
    data["post_processor"] = None
    return Tokenizer.from_str(json.dumps(data))


def _bpe_order(model: dict[str, Any], tokens: list[str]) -> list[str]:
    prefix = model.get("continuing_subword_prefix") or ""
    products: list[str] = []
    for merge in model.get("merges") or []:
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        products.append(a + (b[len(prefix):] if prefix and b.startswith(prefix) else b))
    present = set(tokens)
    produced = [t for t in dict.fromkeys(products) if t in present]
    produced_set = set(produced)
    return sorted(t for t in tokens if t not in produced_set) + produced


def _ids_of(tok: Tokenizer, tokens: list[str]) -> list[int | None]:
    return [tok.token_to_id(t) for t in tokens]


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    return (t for t in texts if t)


def tokenizer_kind(tok: Tokenizer) -> str:
    """``wordpiece``, ``bpe``, ``unigram`` (or another model type, lowercased)."""
    return json.loads(tok.to_str())["model"]["type"].lower()


def special_ids(tok: Tokenizer, objective: str = "mlm") -> dict[str, int]:
    """Special token → id, checked to be the fixed layout of ``objective``."""
    names = special_tokens(objective, tokenizer_kind(tok))
    ids = {name: tok.token_to_id(name) for name in names}
    if list(ids.values()) != list(range(len(names))):
        raise ShoestringError(
            f"tokenizer special tokens are not the first ids in order {names}: {ids}",
            fix="train the tokenizer with shoestring prep (or pass it as data.tokenizer=PATH, "
            "which lays the specials out)",
        )
    return ids


def load_tokenizer(path: str | Path) -> Tokenizer:
    p = Path(path)
    if not p.is_file():
        raise ShoestringError("tokenizer.json not found", where=str(p),
                              fix="run shoestring prep, or check data.tokenizer")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises plain Exception on bad JSON
        raise ShoestringError(f"cannot load tokenizer ({e})", where=str(p)) from None
