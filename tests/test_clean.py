from __future__ import annotations

import pytest

from shoestring.prep.clean import clean_text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("\ufb01ne \ufb02ow", "fine flow"),
        ("\uff21\uff22\uff23 \u2460", "ABC 1"),
        ("caf\u0065\u0301", "caf\u00e9"),
    ],
)
def test_nfkc_folds_compatibility_forms(raw: str, expected: str) -> None:
    assert clean_text(raw) == expected


def test_control_characters_removed() -> None:
    assert clean_text("a\x00b\x07c\x1bd\x7fe\x9ff") == "abcdef"


def test_format_characters_removed() -> None:
    assert clean_text("\ufeffzero\u200bwidth soft\u00adhyphen\u2060x") == "zerowidth softhyphenx"


def test_lone_surrogate_removed_so_text_encodes() -> None:
    cleaned = clean_text("ok\ud800ay")
    assert cleaned == "okay"
    cleaned.encode("utf-8")


def test_whitespace_collapses_to_single_spaces() -> None:
    assert clean_text("a\t\tb \u00a0 c\u3000d\u2003e    f") == "a b c d e f"


def test_trailing_spaces_stripped_per_line_leading_single_space_kept() -> None:
    assert clean_text("one   \n  two\t\nthree") == "one\n two\nthree"


def test_paragraph_breaks_kept_but_runs_collapsed() -> None:
    assert clean_text("p1\n\np2\n\n\n\n\np3\n \n \n\np4") == "p1\n\np2\n\np3\n\np4"


def test_single_newlines_kept() -> None:
    assert clean_text("line1\nline2") == "line1\nline2"


def test_line_break_variants_become_newlines() -> None:
    assert clean_text("a\r\nb\rc\u2028d\fe") == "a\nb\nc\nd\ne"
    assert clean_text("a\u2029b") == "a\n\nb"


def test_whole_text_stripped() -> None:
    assert clean_text("  \n\n hello \n\n ") == "hello"


def test_empty_and_invisible_only() -> None:
    assert clean_text("") == ""
    assert clean_text("\u200b\ufeff \t\n") == ""


def test_idempotent() -> None:
    raw = "\ufb01  x\u200b\t\n\n\n\ny \u00a0z  \r\n"
    once = clean_text(raw)
    assert clean_text(once) == once
