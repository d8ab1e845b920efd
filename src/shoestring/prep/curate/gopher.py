"""Gopher's quality and repetition rules (Rae et al. 2021, "Scaling Language Models", App. A).

Defaults are the published thresholds; every one is a ``curate.gopher_*`` / ``curate.rep_*``
field, and ``null`` turns a rule off. A document is dropped by the first rule it fails, and
that rule is the drop reason.

Definitions used here (the paper leaves some open; these are stated so results can be
reproduced):

* *tokens* are the whitespace-separated pieces of the text; *words* are tokens with leading
  and trailing punctuation stripped, ignoring those that are then empty (``—``, ``...``).
  Word counts and the mean word length use words; the alphabetic-word fraction is the
  fraction of tokens that contain a letter.
* *lines* are the non-blank lines; *paragraphs* are the non-blank blocks between blank lines
  (blank lines are not counted as duplicate lines of each other).
* stop words count every occurrence (as datatrove and Dolma do), case-insensitively.
* n-gram rules use the words of ``curate.text`` (lowercased, punctuation split off) so a
  repeated phrase is found whatever its punctuation. Character fractions are over the
  characters of words (spaces and punctuation excluded from both sides of the ratio), and
  characters covered by several repeated n-grams count once. "Duplicated n-grams" count
  every occurrence after the first; the "top n-gram" is the most frequent one, counted
  only if it occurs at least twice.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

import numpy as np

from shoestring.prep.curate.blocks import Block, Drop
from shoestring.prep.curate.text import ngram_hashes_upto, word_hashes_and_lengths
from shoestring.data.sources import Document

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
BULLETS = ("•", "●", "○", "■", "□", "▪", "▫", "◦", "‣", "⁃", "➢", "➤", "✓", "✔")
_PUNCT = string.punctuation + "“”‘’«»…–—·•"
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
# A whitespace token with no letter in it (digits, symbols); linear time, no backtracking blowup.
_LETTERLESS_TOKEN = re.compile(r"(?<!\S)(?:[\d_]|[^\w\s])+(?!\S)")


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.2%}"


class GopherQuality(Block):
    """Word count, mean word length, symbols, bullets and ellipses, letters, stop words."""

    name = "gopher_quality"

    def __init__(
        self,
        min_words: int | None = 50,
        max_words: int | None = 100_000,
        min_mean_word_len: float | None = 3.0,
        max_mean_word_len: float | None = 10.0,
        max_symbol_word_ratio: float | None = 0.1,
        max_bullet_lines: float | None = 0.9,
        max_ellipsis_lines: float | None = 0.3,
        min_alpha_words: float | None = 0.8,
        min_stop_words: int | None = 2,
        stop_words: Sequence[str] = STOP_WORDS,
        keep_examples: int = 0,
    ) -> None:
        super().__init__(keep_examples)
        self.min_words, self.max_words = min_words, max_words
        self.min_mean, self.max_mean = min_mean_word_len, max_mean_word_len
        self.max_symbol_ratio = max_symbol_word_ratio
        self.max_bullet_lines, self.max_ellipsis_lines = max_bullet_lines, max_ellipsis_lines
        self.min_alpha = min_alpha_words
        self.min_stop_words = min_stop_words
        alternatives = "|".join(
            re.escape(w) for w in sorted(set(stop_words), key=len, reverse=True)
        )
        self._stop_re = (
            re.compile(rf"\b(?:{alternatives})\b", re.IGNORECASE) if stop_words else None
        )

    def apply(self, doc: Document) -> Document | Drop:
        drop = self.check(doc.text)
        return doc if drop is None else drop

    def check(self, text: str) -> Drop | None:
        """The first rule ``text`` fails, or None."""
        tokens = text.split()
        words = [w for w in (t.strip(_PUNCT) for t in tokens) if w]
        n = len(words)
        if self.min_words is not None and n < self.min_words:
            return Drop("too_few_words", f"{n} words < gopher_min_words={self.min_words}")
        if self.max_words is not None and n > self.max_words:
            return Drop("too_many_words", f"{n:,} words > gopher_max_words={self.max_words:,}")
        if n == 0:
            return Drop("no_words", "no words at all")
        mean = sum(map(len, words)) / n
        if self.min_mean is not None and mean < self.min_mean:
            return Drop("mean_word_length", f"mean word length {mean:.2f} < {self.min_mean}")
        if self.max_mean is not None and mean > self.max_mean:
            return Drop("mean_word_length", f"mean word length {mean:.2f} > {self.max_mean}")
        if self.max_symbol_ratio is not None:
            hashes = text.count("#") / n
            if hashes > self.max_symbol_ratio:
                return Drop("hash_ratio", f"'#' per word {hashes:.2f} > {self.max_symbol_ratio}")
            ellipses = (text.count("...") + text.count("…")) / n
            if ellipses > self.max_symbol_ratio:
                return Drop(
                    "ellipsis_ratio", f"ellipses per word {ellipses:.2f} > {self.max_symbol_ratio}"
                )
        lines = [line.strip() for line in text.split("\n") if line.strip()]
        if self.max_bullet_lines is not None:
            frac = sum(line.startswith(BULLETS) for line in lines) / len(lines)
            if frac > self.max_bullet_lines:
                return Drop(
                    "bullet_lines",
                    f"{_pct(frac)} of lines start with a bullet > {_pct(self.max_bullet_lines)}",
                )
        if self.max_ellipsis_lines is not None:
            frac = sum(line.endswith(("...", "…")) for line in lines) / len(lines)
            if frac > self.max_ellipsis_lines:
                return Drop(
                    "ellipsis_lines",
                    f"{_pct(frac)} of lines end with an ellipsis > {_pct(self.max_ellipsis_lines)}",
                )
        if self.min_alpha is not None:
            frac = 1.0 - len(_LETTERLESS_TOKEN.findall(text)) / len(tokens)
            if frac < self.min_alpha:
                return Drop(
                    "alpha_words", f"{_pct(frac)} of words have a letter < {_pct(self.min_alpha)}"
                )
        if self.min_stop_words and self._stop_re is not None:
            found = 0
            for _ in self._stop_re.finditer(text):
                found += 1
                if found >= self.min_stop_words:
                    break
            else:
                return Drop(
                    "stop_words",
                    f"{found} stop words (the, be, to, of, ...) < {self.min_stop_words}",
                )
        return None


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(items equal to an earlier item, their characters)."""
    seen: set[str] = set()
    n = chars = 0
    for item in items:
        if item in seen:
            n += 1
            chars += len(item)
        else:
            seen.add(item)
    return n, chars


def _most_frequent(grams: np.ndarray, lengths: np.ndarray, n: int) -> tuple[int, int] | None:
    """(value, count) of the most frequent n-gram hash if it occurs twice or more.

    Ties go to the n-gram with the most characters, then to the earliest, so the choice
    does not depend on hash values.
    """
    if len(grams) < 2:
        return None
    ordered = np.sort(grams)
    run_starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    counts = np.diff(np.append(run_starts, len(ordered)))
    best = int(counts.max())
    if best < 2:
        return None
    tied = ordered[run_starts[counts == best]]
    if len(tied) == 1:
        return tied[0], best
    at = np.minimum(np.searchsorted(tied, grams), len(tied) - 1)
    pos = np.flatnonzero(tied[at] == grams)
    ends = np.concatenate(([0], np.cumsum(lengths)))
    chars = ends[pos + n] - ends[pos]
    return grams[pos[int(np.argmax(chars))]], best


def _repeat_positions(grams: np.ndarray) -> np.ndarray:
    """Positions of n-grams equal to an earlier one (sorted), by sorting, not hashing sets."""
    if len(grams) < 2:
        return np.empty(0, dtype=np.int64)
    ordered = np.sort(grams)
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return np.empty(0, dtype=np.int64)
    repeated = np.unique(ordered[1:][same])
    at = np.minimum(np.searchsorted(repeated, grams), len(repeated) - 1)
    pos = np.flatnonzero(repeated[at] == grams)
    first = np.unique(grams[pos], return_index=True)[1]
    keep = np.ones(len(pos), dtype=bool)
    keep[first] = False
    return pos[keep]


def _covered_chars(positions: np.ndarray, n: int, lengths: np.ndarray) -> int:
    """Characters of the words covered by n-grams starting at ``positions`` (each word once)."""
    delta = np.zeros(len(lengths) + 1, dtype=np.int32)
    delta[positions] += 1
    delta[positions + n] -= 1
    return int(lengths[np.cumsum(delta[:-1]) > 0].sum())


class GopherRepetition(Block):
    """Duplicate lines and paragraphs, the top n-gram, and all duplicated n-grams."""

    name = "gopher_repetition"

    def __init__(
        self,
        max_dup_line_frac: float | None = 0.30,
        max_dup_para_frac: float | None = 0.30,
        max_dup_line_char_frac: float | None = 0.20,
        max_dup_para_char_frac: float | None = 0.20,
        max_top_ngram_frac: dict[int, float] | None = None,
        max_dup_ngram_frac: dict[int, float] | None = None,
        keep_examples: int = 0,
    ) -> None:
        super().__init__(keep_examples)
        self.line_frac, self.para_frac = max_dup_line_frac, max_dup_para_frac
        self.line_chars, self.para_chars = max_dup_line_char_frac, max_dup_para_char_frac
        self.top = dict(
            sorted((max_top_ngram_frac if max_top_ngram_frac is not None else TOP_NGRAM).items())
        )
        self.dup = dict(
            sorted((max_dup_ngram_frac if max_dup_ngram_frac is not None else DUP_NGRAM).items())
        )

    def apply(self, doc: Document) -> Document | Drop:
        drop = self.check(doc.text)
        return doc if drop is None else drop

    def check(self, text: str) -> Drop | None:
        """The first rule ``text`` fails, or None."""
        total = max(len(text), 1)
        paragraphs = [p.strip() for p in _PARAGRAPH_BREAK.split(text) if p.strip()]
        drop = self._check_units(paragraphs, total, "para", self.para_frac, self.para_chars)
        if drop is not None:
            return drop
        lines = [line.strip() for line in text.split("\n") if line.strip()]
        drop = self._check_units(lines, total, "line", self.line_frac, self.line_chars)
        if drop is not None:
            return drop
        if not self.top and not self.dup:
            return None
        wh, lengths = word_hashes_and_lengths(text)
        word_chars = int(lengths.sum())
        grams = ngram_hashes_upto(wh, [*self.top, *self.dup], mix=False)
        for n, limit in self.top.items():
            found = _most_frequent(grams[n], lengths, n)
            if found is None:
                continue
            value, count = found
            frac = _covered_chars(np.flatnonzero(grams[n] == value), n, lengths) / word_chars
            if frac > limit:
                return Drop(
                    f"top_{n}gram",
                    f"the most frequent {n}-gram ({count}×) covers {_pct(frac)} of characters"
                    f" > {_pct(limit)}",
                )
        dup = list(self.dup.items())
        for i, (n, limit) in enumerate(dup):
            repeats = _repeat_positions(grams[n])
            frac = _covered_chars(repeats, n, lengths) / word_chars if len(repeats) else 0.0
            if frac > limit:
                return Drop(
                    f"dup_{n}gram",
                    f"repeated {n}-grams cover {_pct(frac)} of characters > {_pct(limit)}",
                )
            # Repeated longer n-grams cover a subset of what repeated n-grams cover, so
            # once the fraction is below every remaining limit, no longer n can fail.
            if all(frac <= rest for m, rest in dup[i + 1 :] if m > n):
                break
        return None

    @staticmethod
    def _check_units(
        units: list[str], total: int, kind: str, max_frac: float | None, max_chars: float | None
    ) -> Drop | None:
        if not units:
            return None
        n_dup, chars = _duplicates(units)
        label = "paragraphs" if kind == "para" else "lines"
        if max_frac is not None and n_dup / len(units) > max_frac:
            return Drop(
                f"dup_{kind}_frac",
                f"{n_dup}/{len(units)} {label} repeat an earlier one "
                f"({_pct(n_dup / len(units))} > {_pct(max_frac)})",
            )
        if max_chars is not None and chars / total > max_chars:
            return Drop(
                f"dup_{kind}_chars",
                f"repeated {label} hold {_pct(chars / total)} of characters > {_pct(max_chars)}",
            )
        return None


TOP_NGRAM: dict[int, float] = {2: 0.20, 3: 0.18, 4: 0.16}
DUP_NGRAM: dict[int, float] = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
