"""Normalize raw text before tokenizing, so the vocabulary is not spent on look-alikes.

Web and document dumps carry many encodings of "the same" text: ligatures and full-width
forms (NFKC folds them), invisible characters (zero-width spaces, BOMs, soft hyphens,
stray control bytes), exotic spaces, and ragged whitespace. Left in, each variant becomes
its own tokens and wastes model capacity. Paragraph breaks are kept because they are real
structure; everything else about whitespace is not.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from functools import cache

_LINE_BREAKS = str.maketrans(
    {
        "\r": "\n",
        "\v": "\n",
        "\f": "\n",
        "\x85": "\n",
        "\u2028": "\n",
        "\u2029": "\n\n",
    }
)
# Runs of whitespace other than newlines become one space. A lone " " already is one, so the
# pattern skips it (every space of the text would otherwise be a substitution: 1.5x slower).
_SPACES = re.compile(r"[^\S\n]{2,}|[^\S \n]")
# The invisible characters an ASCII text can hold (the full class is slow to scan).
_ASCII_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_TRAILING_SPACES = re.compile(r" +\n")
_BLANK_LINES = re.compile(r"\n{3,}")
_KEPT_CONTROLS = frozenset("\n\t")
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})


def clean_text(text: str) -> str:
    """NFKC, drop invisible characters, collapse whitespace, keep paragraph breaks.

    Lone surrogates (category Cs, e.g. from a ``"\\ud800"`` escape in JSON) are dropped
    too: they cannot be encoded as UTF-8, so they would break every later stage.
    """
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    text = text.replace("\r\n", "\n").translate(_LINE_BREAKS)
    text = (_ASCII_INVISIBLE if text.isascii() else _invisible()).sub("", text)
    text = _SPACES.sub(" ", text)
    text = _TRAILING_SPACES.sub("\n", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


@cache
def _invisible() -> re.Pattern[str]:
    """Built on first use from this Python's Unicode tables (a 0.1 s scan, not at import)."""
    points = [
        cp
        for cp in range(sys.maxunicode + 1)
        if unicodedata.category(chr(cp)) in _INVISIBLE_CATEGORIES
        and chr(cp) not in _KEPT_CONTROLS
    ]
    return re.compile("[" + "".join(_class_ranges(points)) + "]")


def _class_ranges(points: list[int]) -> list[str]:
    ranges: list[str] = []
    start = prev = points[0]
    for cp in points[1:] + [-1]:
        if cp == prev + 1:
            prev = cp
            continue
        ranges.append(_escape(start) if start == prev else f"{_escape(start)}-{_escape(prev)}")
        start = prev = cp
    return ranges


def _escape(cp: int) -> str:
    return f"\\U{cp:08x}"
