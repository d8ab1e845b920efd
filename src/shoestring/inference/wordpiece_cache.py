"""A BERT WordPiece tokenizer's common case, encoded word by word from a cache, bit-exact.

The Rust ``tokenizers`` library spends most of a short text's time outside the vocabulary:
its normalizer and pre-tokenizer keep an alignment entry per character (for offsets nobody
here reads), and WordPiece rebuilds each word's pieces every time it meets the word. For a
served encoder that was 37 µs of CPU per 110-character sentence (bench/tokenize_cache.py),
a large share of the server's whole CPU per request (bench/serve_cpu.py). For printable ASCII text, what the BERT
normalizer and pre-tokenizer do reduces to lower-casing and splitting into runs of letters
and digits and single punctuation characters; each word's pieces are then a pure function
of the word, so they are computed once by the library's own WordPiece model and kept.
Natural text repeats its words (Zipf), so nearly every word is a dictionary lookup:
bench/tokenize_cache.py measured 3.8-5.1x less CPU per text than the library's batch call.

`WordPieceCache.for_tokenizer` returns one only for the layout whose behaviour this
reproduces exactly (a WordPiece model; the BERT normalizer or none; the BERT pre-tokenizer;
special tokens around the text by a template; no truncation or padding in the tokenizer);
anything else keeps the library. A text outside the common case (a character outside
printable ASCII, a control character, an added token other than the verbatim special
tokens such as ``[MASK]``, which are split out first as the library does) is encoded by the library, in one batch call with the other such texts. The test suite checks
equality with the library on real corpora and on generated edge cases.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

# The words of a lower-cased printable-ASCII text as the BERT pre-tokenizer splits them:
# runs of letters and digits, and every ASCII punctuation character on its own (Rust's
# ``is_ascii_punctuation``: the 32 characters in these four ranges); whitespace separates.
_WORDS = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
# Characters the BERT normalizer removes (control characters other than tab, LF and CR) and
# which this path therefore leaves to the library.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Distinct words kept; the cache is emptied when it reaches this: a bounded memory, about
# 21 MB per served model at the bound (bench/tokenize_cache.py).
MAX_WORDS = 65_536


Encoder = Callable[[list[Any]], list[list[int]]]


def encoder_for(tokenizer: Tokenizer) -> Encoder:
    """``texts -> ids per text`` for ``tokenizer``: the word cache where its layout is one
    this reproduces exactly, else the library's batch call (`library_encoder`)."""
    cached = WordPieceCache.for_tokenizer(tokenizer)
    return cached.encode if cached is not None else library_encoder(tokenizer)


def library_encoder(tokenizer: Tokenizer, fast: bool | None = None) -> Encoder:
    """The library's batch call, ids only. ``encode_batch_fast`` (tokenizers >= 0.20) skips
    the character offsets nobody here reads; older releases have only ``encode_batch``, which
    gives the same ids. ``fast``: None takes the fast call where the library has it; False
    forces the full one (the tests compare the two)."""
    if fast is None:
        fast = hasattr(tokenizer, "encode_batch_fast")
    batch = tokenizer.encode_batch_fast if fast else tokenizer.encode_batch
    return lambda texts: [e.ids for e in batch(texts)]


class WordPieceCache:
    """``encode(texts) -> ids per text``, equal to ``tokenizer.encode_batch(texts)``'s ids."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool, prefix: list[int],
                 suffix: list[int], added: list[dict]) -> None:
        self._library = library_encoder(tokenizer)
        self._model = tokenizer.model
        self._lowercase = lowercase
        self._prefix, self._suffix = prefix, suffix
        # Added tokens matched on the raw text (``normalized: false``, no stripping or
        # whole-word rule: the special tokens) are split out here as the library does before
        # normalizing, longest first where two start at one place; a text holding any other
        # added token goes to the library (case-insensitively, to be safe either way).
        exact = sorted((t for t in added if _verbatim(t)), key=lambda t: -len(t["content"]))
        other = [t["content"] for t in added if not _verbatim(t)]
        self._ids = {t["content"]: t["id"] for t in exact}
        self._exact = re.compile("|".join(re.escape(t["content"]) for t in exact)) if exact else None
        self._other = (re.compile("|".join(map(re.escape, other)), re.IGNORECASE)
                       if other else None)
        self._pieces: dict[str, list[int]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> WordPieceCache | None:
        """The cached encoder for ``tokenizer``, or None where its layout is not the one
        this reproduces exactly."""
        if not isinstance(tokenizer, Tokenizer):
            return None
        spec = json.loads(tokenizer.to_str())
        model, norm, pre = spec.get("model") or {}, spec.get("normalizer"), spec.get("pre_tokenizer")
        if model.get("type") != "WordPiece" or (pre or {}).get("type") != "BertPreTokenizer":
            return None
        if spec.get("truncation") is not None or spec.get("padding") is not None:
            return None
        if norm is not None and norm.get("type") != "BertNormalizer":
            return None
        specials = _template(spec.get("post_processor"))
        if specials is None:
            return None
        lowercase = bool(norm and norm.get("lowercase", True))
        added = [t for t in spec.get("added_tokens") or [] if t.get("content")]
        return cls(tokenizer, lowercase, *specials, added)

    def common(self, text: Any) -> bool:
        """Whether this path encodes ``text`` (else the library does)."""
        return (isinstance(text, str) and text.isascii() and _CONTROL.search(text) is None
                and (self._other is None or self._other.search(text) is None))

    def encode(self, texts: list[Any]) -> list[list[int]]:
        """Token ids of each text, the template's special tokens around it."""
        out: list[list[int] | None] = []
        rest: list[int] = []
        for i, text in enumerate(texts):
            if not self.common(text):
                rest.append(i)
                out.append(None)
                continue
            ids = list(self._prefix)
            if self._exact is None:
                self._words(text, ids)
            else:
                start = 0
                for match in self._exact.finditer(text):
                    self._words(text[start:match.start()], ids)
                    ids.append(self._ids[match.group()])
                    start = match.end()
                self._words(text[start:], ids)
            ids += self._suffix
            out.append(ids)
        if rest:
            for i, ids in zip(rest, self._library([texts[i] for i in rest])):
                out[i] = ids
        return out  # type: ignore[return-value]

    def _words(self, text: str, ids: list[int]) -> None:
        """Append the pieces of each word of ``text`` (no added token in it) to ``ids``."""
        pieces = self._pieces
        for word in _WORDS.findall(text.lower() if self._lowercase else text):
            known = pieces.get(word)
            if known is None:
                if len(pieces) >= MAX_WORDS:
                    pieces.clear()
                known = pieces[word] = [t.id for t in self._model.tokenize(word)]
            ids += known


def _verbatim(token: dict) -> bool:
    """An added token the library matches on the raw text, as written, anywhere."""
    return not (token.get("normalized", True) or token.get("single_word")
                or token.get("lstrip") or token.get("rstrip"))


def _template(post: dict | None) -> tuple[list[int], list[int]] | None:
    """(ids before, ids after) a single text under ``post`` (the tokenizer's post-processor),
    or None for a post-processor this does not reproduce."""
    if post is None:
        return [], []
    if post.get("type") == "BertProcessing":
        return [post["cls"][1]], [post["sep"][1]]
    if post.get("type") != "TemplateProcessing":
        return None
    ids = {name: tok["ids"] for name, tok in (post.get("special_tokens") or {}).items()}
    before: list[int] = []
    after: list[int] = []
    seen = False
    for piece in post.get("single") or []:
        if "Sequence" in piece:
            if seen or piece["Sequence"].get("id") != "A":
                return None
            seen = True
        elif "SpecialToken" in piece:
            token = ids.get(piece["SpecialToken"].get("id"))
            if token is None:
                return None
            (after if seen else before).extend(token)
        else:
            return None
    return (before, after) if seen else None
