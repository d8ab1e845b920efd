"""Words and n-gram hashes for dedup and decontamination, vectorized with numpy.

One definition of a *word* serves fuzzy dedup, decontamination and their tests: after ASCII
lowercasing, a word is a maximal run of characters that are not ASCII punctuation, symbols,
whitespace or control characters. Every non-ASCII character counts as a word character
(it stays as it is: normalization already applied NFKC). So ``"Hello, World!"`` has the
words ``hello`` and ``world``, and punctuation or spacing edits do not change the words.

Two implementations of that definition exist on purpose:

* ``word_hashes`` works on the UTF-8 bytes with numpy (no Python loop per word): a table
  lookup classifies and lowercases bytes, prefix sums give every word's polynomial hash at
  once, and the MurmurHash3 64-bit finalizer mixes them. This is the fast path; many texts
  go through it together with ``batch_word_hashes``.
* ``word_spans`` is a regular expression over the ``str`` (character offsets), used where a
  span must be cut out of the text and in tests that check both agree word for word.

Hashes are deterministic across processes and machines (no Python ``hash()``, which is
salted per process), so workers and re-runs agree.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import cache

import numpy as np

_U64 = np.uint64

# 0 = separator (ASCII non-alphanumeric, controls); otherwise the byte, ASCII-lowercased.
_SEPARATORS = bytes(b for b in range(128) if not chr(b).isalnum())
_BYTE_CLASS = np.array(
    [0 if b in _SEPARATORS else (b + 32 if 65 <= b <= 90 else b) for b in range(256)],
    dtype=np.uint8,
)
_WORD_RE = re.compile("[^" + re.escape(_SEPARATORS.decode("ascii")) + "]+")
_ASCII_LOWER = str.maketrans({chr(c): chr(c + 32) for c in range(65, 91)})

# Base of the polynomial byte hash (odd, so invertible mod 2**64) and the piece size.
_POLY = 0x9E3779B97F4A7C15  # odd: invertible mod 2**64
_PIECE = 1 << 20
# Multipliers for combining word hashes into an n-gram hash (offset within the n-gram).
_GRAM_MULT = (
    np.random.default_rng(0x6EA7).integers(0, 1 << 63, 64, dtype=np.uint64) << _U64(1)
) | _U64(1)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: a bijection that avalanches every input bit (in place)."""
    h ^= h >> _U64(33)
    h *= _U64(0xFF51AFD7ED558CCD)
    h ^= h >> _U64(33)
    h *= _U64(0xC4CEB9FE1A85EC53)
    h ^= h >> _U64(33)
    return h


def ascii_lower(text: str) -> str:
    """Lowercase A-Z only: keeps the length, so character offsets stay valid."""
    return text.translate(_ASCII_LOWER)


def words(text: str) -> list[str]:
    """The words of ``text`` (see the module docstring), as strings."""
    return _WORD_RE.findall(ascii_lower(text))


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of every word of ``text``."""
    return [m.span() for m in _WORD_RE.finditer(ascii_lower(text))]


def word_hashes(text: str) -> np.ndarray:
    """One uint64 hash per word of ``text``, in order; equal words get equal hashes.

    A polynomial hash over the (classified, lowercased) bytes, computed for all words at
    once: with ``v[j] = byte[j] * P**j`` and its prefix sums ``S``, the word spanning bytes
    ``[s, e)`` hashes to ``(S[e-1] - S[s-1]) * P**-s`` (mod 2**64; ``P`` is odd, so it has an
    inverse). Separator bytes classify as 0 and add nothing. Long texts go in pieces cut at
    separators, so the power tables stay small.
    """
    return _hash_bytes(_utf8(text))[0]


def word_hashes_and_lengths(text: str) -> tuple[np.ndarray, np.ndarray]:
    """``word_hashes`` and each word's length in UTF-8 bytes (int64)."""
    hashes, starts, ends = _hash_bytes(_utf8(text))
    return hashes, ends - starts


def _utf8(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)


def _hash_bytes(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(word hashes, byte offset of each word's start, and just past its end) of UTF-8 bytes."""
    cls = _BYTE_CLASS[raw]
    if len(raw) <= _PIECE:
        return _hash_piece(cls, 0)
    parts = []
    start = 0
    while start < len(raw):
        stop = min(start + _PIECE, len(raw))
        if stop < len(raw):
            seps = np.flatnonzero(cls[start:stop] == 0)
            if len(seps) and seps[-1] > 0:
                stop = start + int(seps[-1])
            else:  # one word longer than a piece: hash it whole, byte for byte
                after = np.flatnonzero(cls[stop:] == 0)
                stop = stop + int(after[0]) if len(after) else len(raw)
                parts.append(_hash_long_word(cls[start:stop], start))
                start = stop
                continue
        parts.append(_hash_piece(cls[start:stop], start))
        start = stop
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


def batch_word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``word_hashes`` of many texts in one vectorized pass: (all hashes, words per text).

    The texts are joined with a separator byte, hashed together, and the word counts say
    which hashes belong to which text; the per-call numpy overhead is paid once per batch.
    """
    if not texts:
        return np.empty(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    joined = b"\n".join(encoded)
    # Byte offset just past each text's end; a word never spans the joining "\n".
    ends = np.cumsum([len(e) + 1 for e in encoded], dtype=np.int64) - 1
    hashes, _, word_ends = _hash_bytes(np.frombuffer(joined, dtype=np.uint8))
    counts = np.diff(np.searchsorted(word_ends, ends, side="right"), prepend=0)
    return hashes, counts


def _hash_long_word(cls: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    first = int(np.argmax(cls != 0))  # a piece may start with separators
    digest = hashlib.blake2b(cls[first:].tobytes(), digest_size=8).digest()
    h = fmix64(np.array([int.from_bytes(digest, "little")], dtype=np.uint64))
    return (
        h,
        np.array([offset + first], dtype=np.int64),
        np.array([offset + len(cls)], dtype=np.int64),
    )


def _hash_piece(cls: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(cls)
    is_word = cls != 0
    if n == 0 or not is_word.any():
        return (
            np.empty(0, dtype=np.uint64),
            np.empty(0, dtype=np.int64),
            np.empty(0, dtype=np.int64),
        )
    edges = np.flatnonzero(is_word[1:] != is_word[:-1]) + 1
    if is_word[0]:
        edges = np.concatenate(([0], edges))
    if is_word[-1]:
        edges = np.concatenate((edges, [n]))
    starts, ends = edges[0::2], edges[1::2]
    pow_, inv = _powers()
    prefix = np.cumsum(cls * pow_[:n])
    before = prefix[starts - 1]
    if starts[0] == 0:
        before[0] = 0
    h = (prefix[ends - 1] - before) * inv[starts]
    h += (ends - starts).astype(np.uint64) * _U64(0x9E3779B97F4A7C15)
    return fmix64(h), starts + offset, ends + offset


@cache
def _powers() -> tuple[np.ndarray, np.ndarray]:
    """``P**j`` and ``P**-j`` mod 2**64 for ``j < _PIECE`` (16 MiB, built on first use)."""
    pow_ = np.full(_PIECE, _POLY, dtype=np.uint64)
    inv = np.full(_PIECE, pow(_POLY, -1, 1 << 64), dtype=np.uint64)
    pow_[0] = inv[0] = 1
    return np.cumprod(pow_), np.cumprod(inv)


def ngram_hashes(wh: np.ndarray, n: int) -> np.ndarray:
    """uint64 hash of every run of ``n`` consecutive word hashes (``len(wh) - n + 1`` of them).

    Order matters (``a b`` and ``b a`` differ): each position in the n-gram has its own odd
    multiplier before the sum, then the finalizer mixes. Fewer than ``n`` words: empty.
    """
    return ngram_hashes_upto(wh, [n])[n]


def ngram_hashes_upto(
    wh: np.ndarray, lengths: Sequence[int], mix: bool = True
) -> dict[int, np.ndarray]:
    """``{n: ngram_hashes(wh, n)}`` for several ``n`` at once, in ``max(lengths)`` passes.

    The pre-mix sums are prefix-shaped (an (n+1)-gram's sum is its n-gram's sum plus one
    term), so every length reuses the shorter one's work. With ``mix=False`` the final
    finalizer is skipped: it is a bijection, so equality tests (lookups, counting repeats)
    give the same answers on the unmixed values, at less cost.
    """
    wanted = set(lengths)
    out: dict[int, np.ndarray] = {}
    top = max(wanted, default=0)
    if top > len(_GRAM_MULT):
        raise ValueError(f"n-grams longer than {len(_GRAM_MULT)} words are not supported")
    if top == 0 or len(wh) == 0:
        return {n: np.empty(0, dtype=np.uint64) for n in wanted}
    acc = wh * _GRAM_MULT[0]
    for n in range(1, top + 1):
        count = len(wh) - n + 1
        if count <= 0:
            out.update({m: np.empty(0, dtype=np.uint64) for m in wanted if m >= n})
            break
        if n > 1:
            acc = acc[:count]
            acc += wh[n - 1 : n - 1 + count] * _GRAM_MULT[n - 1]
        if n in wanted:
            out[n] = fmix64(acc + _U64(n)) if mix else acc + _U64(n)
    return out

