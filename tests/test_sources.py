from __future__ import annotations

import builtins
import errno
import json
import os
import sys
from pathlib import Path

import pytest

from shoestring.data import readers
from shoestring.data.sources import Document, ReadStats, iter_documents, resolve_sources
from shoestring.errors import ShoestringError


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _read(specs: list[str], **kwargs: object) -> list[Document]:
    return list(iter_documents(specs, **kwargs))  # type: ignore[arg-type]


def _error(specs: list[str], **kwargs: object) -> str:
    with pytest.raises(ShoestringError) as info:
        _read(specs, **kwargs)
    return str(info.value)


# --- formats ---------------------------------------------------------------------------


def test_txt_split_on_none_is_one_document(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("first line\n\nsecond paragraph\n", encoding="utf-8")
    stats = ReadStats()
    docs = _read([str(path)], stats=stats, split_on="none")
    assert docs == [Document("first line\n\nsecond paragraph\n", str(path), str(path))]
    assert (stats.files, stats.documents, stats.skipped) == (1, 1, [])


def test_txt_utf8_bom_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffhéllo".encode())
    assert _read([str(path)])[0].text == "héllo"


def test_jsonl_one_document_per_line_blank_lines_ignored(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "alpha"}\n\n   \n{"text": "beta", "id": 2}\n', encoding="utf-8")
    stats = ReadStats()
    docs = _read([str(path)], stats=stats)
    assert [d.text for d in docs] == ["alpha", "beta"]
    assert [d.doc_id for d in docs] == [f"{path}:1", f"{path}:4"]
    assert all(d.source == str(path) for d in docs)
    assert (stats.files, stats.documents) == (1, 2)


def test_jsonl_custom_text_field(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"body": "one", "text": 5}, {"body": "two"}])
    assert [d.text for d in _read([str(path)], text_field="body")] == ["one", "two"]


def test_json_extension_is_read_as_json_lines(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.json", [{"text": "x"}, {"text": "y"}])
    assert [d.text for d in _read([str(path)])] == ["x", "y"]


def test_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a\u2028b\rc"}\r\n{"text": "d"}\n', encoding="utf-8")
    assert [d.text for d in _read([str(path)])] == ["a\u2028b\rc", "d"]


def test_jsonl_is_streamed(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "good"}\n{broken\n', encoding="utf-8")
    docs = iter_documents([str(path)])
    assert next(docs).text == "good"
    with pytest.raises(ShoestringError):
        next(docs)


# --- resolving -------------------------------------------------------------------------


def _tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".hidden").mkdir()
    for rel in ["b.txt", "a.jsonl", "sub/c.json", "sub/deeper/a.txt", "z.TXT"]:
        (root / rel).write_text('{"text": "t"}\n', encoding="utf-8")
    for rel in ["notes.md", ".secret.txt", ".hidden/x.txt", "image.png"]:
        (root / rel).write_text("ignored", encoding="utf-8")


def test_folder_expands_recursively_sorted_supported_only(tmp_path: Path) -> None:
    _tree(tmp_path)
    expected = ["a.jsonl", "b.txt", "sub/c.json", "sub/deeper/a.txt", "z.TXT"]
    assert resolve_sources([str(tmp_path)]) == [str(tmp_path / e) for e in expected]


def test_glob_expands_sorted(tmp_path: Path) -> None:
    _tree(tmp_path)
    for name in ["c.txt", "a.txt", "b.txt"]:
        (tmp_path / "sub" / name).write_text("x", encoding="utf-8")
    got = resolve_sources([str(tmp_path / "sub" / "*.txt")])
    assert got == [str(tmp_path / "sub" / n) for n in ["a.txt", "b.txt", "c.txt"]]


def test_recursive_glob_skips_unsupported_matches(tmp_path: Path) -> None:
    _tree(tmp_path)
    got = resolve_sources([str(tmp_path / "**" / "*")])
    assert str(tmp_path / "notes.md") not in got
    assert got == sorted(got)
    assert str(tmp_path / "sub" / "deeper" / "a.txt") in got


def test_specs_keep_order_and_drop_duplicates(tmp_path: Path) -> None:
    b = tmp_path / "b.txt"
    a = tmp_path / "a.txt"
    for p in (a, b):
        p.write_text("x", encoding="utf-8")
    got = resolve_sources([str(b), "builtin:pydocs", str(a), str(b)])
    assert got == [str(b), "builtin:pydocs", str(a)]


def test_documents_follow_spec_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("B", encoding="utf-8")
    (tmp_path / "a.txt").write_text("A", encoding="utf-8")
    specs = [str(tmp_path / "b.txt"), str(tmp_path / "a.txt")]
    assert [d.text for d in _read(specs)] == ["B", "A"]


def test_missing_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(ShoestringError) as info:
        resolve_sources([missing])
    assert info.value.where == missing
    assert "no such file or folder" in str(info.value)
    assert info.value.fix


def test_glob_matching_nothing(tmp_path: Path) -> None:
    pattern = str(tmp_path / "*.jsonl")
    with pytest.raises(ShoestringError, match="matched nothing") as info:
        resolve_sources([pattern])
    assert info.value.where == pattern


def test_glob_matching_only_unsupported_files(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("x", encoding="utf-8")
    with pytest.raises(ShoestringError, match=r"matched 1 path\(s\) but no readable") as info:
        resolve_sources([str(tmp_path / "*.md")])
    assert ".jsonl" in str(info.value)


def test_literal_path_with_glob_characters(tmp_path: Path) -> None:
    path = tmp_path / "data[1].txt"
    path.write_text("x", encoding="utf-8")
    assert resolve_sources([str(path)]) == [str(path)]


def test_folder_without_readable_files(tmp_path: Path) -> None:
    (tmp_path / "readme.md").write_text("x", encoding="utf-8")
    with pytest.raises(ShoestringError, match="no readable files") as info:
        resolve_sources([str(tmp_path)])
    assert info.value.where == str(tmp_path)


def test_unsupported_extension_names_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "data.docx"
    path.write_text("a,b\n", encoding="utf-8")
    with pytest.raises(ShoestringError) as info:
        resolve_sources([str(path)])
    message = str(info.value)
    assert "'.docx'" in message and str(path) in message
    assert all(s in message for s in (".txt", ".jsonl", ".json"))


def test_unknown_builtin_lists_known_ones() -> None:
    with pytest.raises(ShoestringError) as info:
        resolve_sources(["builtin:wiki"])
    assert "wiki" in str(info.value) and "builtin:pydocs" in str(info.value)


def test_no_specs_is_an_error() -> None:
    with pytest.raises(ShoestringError, match="no input"):
        resolve_sources([])


def test_bad_on_error_value(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x", encoding="utf-8")
    assert "on_error" in _error([str(tmp_path / "a.txt")], on_error="ignore")


# --- bad records and files -------------------------------------------------------------


def test_malformed_json_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": "unterminated\n', encoding="utf-8")
    message = _error([str(path)])
    assert f"{path}:3" in message
    assert "malformed JSON" in message and "data.on_error=skip" in message


def test_pretty_printed_json_hints_at_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('[\n  {"text": "a"}\n]\n', encoding="utf-8")
    message = _error([str(path)])
    assert f"{path}:1" in message and "JSON lines" in message


def test_json_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"text": "ok"}, ["a", "list"]])
    message = _error([str(path)])
    assert f"{path}:2" in message and "array" in message and "'text'" in message


def test_missing_text_field_lists_available_fields(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"content": "x", "url": "u"}])
    message = _error([str(path)])
    assert f"{path}:1" in message
    assert "'text'" in message and "'content'" in message and "'url'" in message
    assert "data.text_field=" in message


def test_missing_field_lists_at_most_ten_fields(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{f"f{i:02d}": i for i in range(15)}])
    message = _error([str(path)])
    assert "'f09'" in message and "'f10'" not in message and "5 more" in message


def test_text_field_not_a_string(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"text": "ok"}, {"text": "ok"}, {"text": None}])
    message = _error([str(path)])
    assert f"{path}:3" in message and "null" in message and "not a string" in message


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "blob.txt"
    path.write_bytes(b"abc\x00\x01\x02" * 100)
    message = _error([str(path)])
    assert str(path) in message and "binary" in message


def test_binary_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "blob.jsonl"
    path.write_bytes(b'{"text": "a"}\n\x00\x00\x00\n')
    message = _error([str(path)])
    assert str(path) in message and "binary" in message


def test_utf16_file_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "u16.txt"
    path.write_bytes("hello".encode("utf-16"))
    message = _error([str(path)])
    assert str(path) in message and "UTF-16" in message


def test_non_utf8_txt_names_offset_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes(b"line one\nline two\ncaf\xe9\n")
    message = _error([str(path)])
    assert f"{path}:3" in message
    assert "byte offset 21" in message and "0xe9" in message
    assert "UTF-8" in message and "iconv" in message


def test_non_utf8_jsonl_names_offset_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    first = b'{"text": "ok"}\n'
    path.write_bytes(first + b'{"text": "caf\xe9"}\n')
    message = _error([str(path)])
    assert f"{path}:2" in message
    assert f"byte offset {len(first) + 13}" in message and "iconv" in message


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked.txt"
    path.write_text("x", encoding="utf-8")

    def deny(file: object, *args: object, **kwargs: object) -> object:
        if str(file) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return builtins.open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(readers, "open", deny, raising=False)
    message = _error([str(path)])
    assert str(path) in message and "permission denied" in message


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads all")
def test_permission_denied_for_real(tmp_path: Path) -> None:
    path = tmp_path / "locked.jsonl"
    path.write_text('{"text": "x"}\n', encoding="utf-8")
    path.chmod(0)
    try:
        assert "permission denied" in _error([str(path)])
    finally:
        path.chmod(0o644)


def test_skip_mode_counts_bad_records_and_keeps_good_ones(tmp_path: Path) -> None:
    good = tmp_path / "a_good.txt"
    good.write_text("fine text", encoding="utf-8")
    mixed = tmp_path / "b_mixed.jsonl"
    mixed.write_bytes(
        b'{"text": "one"}\n'
        b"{oops\n"
        b'{"body": "no text"}\n'
        b'{"text": "caf\xe9"}\n'
        b'"a string"\n'
        b'{"text": 3}\n'
        b'{"text": "two"}\n'
    )
    binary = tmp_path / "c_binary.txt"
    binary.write_bytes(b"\x00" * 64)
    latin = tmp_path / "d_latin.txt"
    latin.write_bytes(b"caf\xe9")

    stats = ReadStats()
    docs = _read([str(tmp_path)], on_error="skip", stats=stats)

    assert [d.text for d in docs] == ["fine text", "one", "two"]
    assert [d.doc_id for d in docs] == [f"{good}:1", f"{mixed}:1", f"{mixed}:7"]
    assert stats.documents == 3
    assert stats.files == 4
    assert len(stats.skipped) == 7
    for lineno in (2, 3, 4, 5, 6):
        assert any(s.startswith(f"{mixed}:{lineno}: ") for s in stats.skipped)
    assert any(s.startswith(f"{binary}: ") and "binary" in s for s in stats.skipped)
    assert any(s.startswith(f"{latin}:1: ") and "UTF-8" in s for s in stats.skipped)


def test_skip_mode_counts_records_files_and_bytes(tmp_path: Path) -> None:
    mixed = tmp_path / "a.jsonl"
    bad_lines = [b"{oops\n", b'{"text": "caf\xe9"}\n']
    mixed.write_bytes(b'{"text": "one"}\n' + b"".join(bad_lines) + b'\n{"text": "two"}\n')
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\x00" * 64)
    stats = ReadStats()
    assert [d.text for d in _read([str(tmp_path)], on_error="skip", stats=stats)] == ["one", "two"]
    assert (stats.skipped_records, stats.skipped_files) == (2, 1)
    assert stats.skipped_bytes == sum(map(len, bad_lines)) + 64


@pytest.mark.parametrize("split_on", ["blank", "lines"])
def test_txt_bad_byte_skips_only_its_record(tmp_path: Path, split_on: str) -> None:
    """Issue 37: one bad byte used to drop everything after it in the file."""
    paragraphs = [f"paragraph {i} line one\nparagraph {i} line two\n" for i in range(50)]
    raw = "\n".join(paragraphs).encode()
    bad_at = raw.index(b"paragraph 20 line two")
    raw = raw[:bad_at] + b"\xff" + raw[bad_at:]
    path = tmp_path / "a.txt"
    path.write_bytes(raw)
    stats = ReadStats()
    docs = _read([str(path)], on_error="skip", stats=stats, split_on=split_on)
    texts = [d.text for d in docs]
    if split_on == "blank":
        assert texts == [p.rstrip("\n") for i, p in enumerate(paragraphs) if i != 20]
        dropped = len(paragraphs[20]) + 1  # with the bad byte
    else:
        lines = [line for p in paragraphs for line in p.splitlines()]
        assert texts == [line for line in lines if line != "paragraph 20 line two"]
        dropped = len("paragraph 20 line two\n") + 1
    assert (len(stats.skipped), stats.skipped_records, stats.skipped_files) == (1, 1, 0)
    assert stats.skipped_bytes == dropped
    bad_line = raw[:bad_at].count(b"\n") + 1
    assert stats.skipped[0].startswith(f"{path}:{bad_line}: ")


def test_long_documents_are_cut_at_breaks_and_nothing_is_lost(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(30000)]
    lines = [" ".join(words[i:i + 20]) for i in range(0, len(words), 20)]
    text = "\n".join(lines)
    txt = tmp_path / "a.txt"
    txt.write_text(text + "\n", encoding="utf-8")  # one paragraph, no blank line
    _jsonl(tmp_path / "b.jsonl", [{"text": text}, {"text": "short"}])
    stats = ReadStats()
    docs = _read([str(txt), str(tmp_path / "b.jsonl")], stats=stats, max_chars=5000)
    by_source: dict[str, list[Document]] = {}
    for d in docs:
        by_source.setdefault(d.source, []).append(d)
    for source, pieces in by_source.items():
        whole = [p for p in pieces if p.text != "short"]
        assert all(len(p.text) <= 5000 for p in whole)
        assert "".join(p.text for p in whole).rstrip("\n") == text
        assert all(p.text.endswith("\n") for p in whole[:-1])  # cut at line breaks
        first = whole[0].doc_id
        assert [p.doc_id for p in whole[1:3]] == [f"{first}#2", f"{first}#3"]
    assert stats.split_documents == 2
    assert stats.split_pieces == len(docs) - 1
    one_line = tmp_path / "c.txt"  # no line breaks at all: cut at spaces
    one_line.write_text(" ".join(words), encoding="utf-8")
    pieces = [d.text for d in _read([str(one_line)], max_chars=5000)]
    assert "".join(pieces) == " ".join(words) and all(p.endswith(" ") for p in pieces[:-1])
    assert all(len(p) <= 5000 for p in pieces)


def test_skip_mode_without_stats_object_still_yields(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\nnot json\n{"text": "b"}\n', encoding="utf-8")
    assert [d.text for d in _read([str(path)], on_error="skip")] == ["a", "b"]


# --- builtin:pydocs --------------------------------------------------------------------


@pytest.fixture(scope="module")
def pydocs() -> tuple[list[Document], ReadStats, set[str]]:
    before = set(sys.modules)
    stats = ReadStats()
    docs = list(iter_documents(["builtin:pydocs"], stats=stats))
    return docs, stats, before


def test_pydocs_is_a_sizeable_corpus(pydocs: tuple[list[Document], ReadStats, set[str]]) -> None:
    docs, stats, _ = pydocs
    assert len(docs) > 300
    assert sum(len(d.text) for d in docs) > 500_000
    assert stats.documents == len(docs)
    assert all(d.source == "builtin:pydocs" and d.text for d in docs)
    assert len({d.doc_id for d in docs}) == len(docs)


def test_pydocs_has_topics_and_module_docstrings(
    pydocs: tuple[list[Document], ReadStats, set[str]],
) -> None:
    docs, _, _ = pydocs
    by_id = {d.doc_id: d for d in docs}
    assert any(i.startswith("topics/") for i in by_id)
    decoder = by_id["json.decoder"].text
    assert decoder.startswith("Implementation of JSONDecoder")
    assert "json.decoder.JSONDecoder.decode\nReturn the Python representation of ``s``" in decoder
    assert "json" in by_id and "os.path" not in by_id
    assert not any(i.startswith(("test.", "idlelib", "lib2to3", "ensurepip")) for i in by_id)


def test_pydocs_imports_no_stdlib_modules(
    pydocs: tuple[list[Document], ReadStats, set[str]],
) -> None:
    _, _, before = pydocs
    for name in ("antigravity", "this", "tkinter", "turtle"):
        assert name in before or name not in sys.modules


def test_pydocs_order_is_deterministic(
    pydocs: tuple[list[Document], ReadStats, set[str]],
) -> None:
    docs, _, _ = pydocs
    again = [d.doc_id for d in iter_documents(["builtin:pydocs"])]
    assert again == [d.doc_id for d in docs]


# --- more formats: .txt blocks, Parquet, CSV/TSV, compression, hf: ----------------------


def test_txt_is_split_on_blank_lines_by_default(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("first doc\nstill first\n\n\n  \nsecond doc\n\nthird\n", encoding="utf-8")
    docs = _read([str(path)])
    assert [d.text for d in docs] == ["first doc\nstill first", "second doc", "third"]
    assert [d.doc_id for d in docs] == [f"{path}:1", f"{path}:6", f"{path}:8"]


def test_txt_split_on_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text(" = Title = \n \n first paragraph \nsecond\n\nthird", encoding="utf-8")
    docs = _read([str(path)], split_on="lines")
    assert [d.text for d in docs] == [" = Title = ", " first paragraph ", "second", "third"]
    assert [d.doc_id for d in docs] == [f"{path}:1", f"{path}:3", f"{path}:4", f"{path}:6"]


def test_bad_split_on_value(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x", encoding="utf-8")
    assert "split_on" in _error([str(tmp_path / "a.txt")], split_on="paragraphs")


def _parquet(path: Path, columns: dict[str, list[object]], row_group_size: int = 2) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def test_parquet_column_streamed_by_row_group(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", {"body": ["a", "b", "c", "d", "e"], "n": [1, 2, 3, 4, 5]})
    docs = _read([str(path)], text_field="body")
    assert [d.text for d in docs] == ["a", "b", "c", "d", "e"]
    assert docs[4].doc_id == f"{path}:row 5"


def test_parquet_missing_column_lists_columns(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", {"content": ["a"], "url": ["u"]})
    message = _error([str(path)])
    assert str(path) in message and "'text'" in message and "'content'" in message
    assert "data.text_field" in message


def test_parquet_non_string_column_and_null_rows(tmp_path: Path) -> None:
    numbers = _parquet(tmp_path / "n.parquet", {"text": [1, 2]})
    assert "not strings" in _error([str(numbers)])
    nulls = _parquet(tmp_path / "z.parquet", {"text": ["a", None, "c"]})
    assert f"{nulls}:row 2" in _error([str(nulls)])
    stats = ReadStats()
    assert [d.text for d in _read([str(nulls)], on_error="skip", stats=stats)] == ["a", "c"]
    assert len(stats.skipped) == 1


def test_not_a_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_text("hello", encoding="utf-8")
    message = _error([str(path)])
    assert str(path) in message and "Parquet" in message


def test_csv_column_with_quoted_multiline_field(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('id,text\n1,"hello, world"\n2,"two\nlines ""quoted"""\n3,plain\n',
                    encoding="utf-8")
    docs = _read([str(path)])
    assert [d.text for d in docs] == ["hello, world", 'two\nlines "quoted"', "plain"]
    assert [d.doc_id for d in docs] == [f"{path}:2", f"{path}:3", f"{path}:5"]


def test_tsv_is_unquoted_and_names_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.tsv"
    path.write_text('sentence\tlabel\nit\'s "great"\t1\nbad line without tab\nok\t0\n',
                    encoding="utf-8")
    message = _error([str(path)], text_field="sentence")
    assert f"{path}:3" in message and "1 fields" in message
    docs = _read([str(path)], text_field="sentence", on_error="skip")
    assert [d.text for d in docs] == ['it\'s "great"', "ok"]


def test_csv_missing_column_names_header(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("sentence,label\nx,1\n", encoding="utf-8")
    message = _error([str(path)])
    assert f"{path}:1" in message and "'sentence'" in message and "header" in message


def test_csv_non_utf8_line(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(b"text\nfine\ncaf\xe9\n")
    assert f"{path}:3" in _error([str(path)])


def _compress(data: bytes, kind: str) -> bytes:
    import bz2
    import gzip

    import zstandard

    return {"gz": gzip.compress, "bz2": bz2.compress,
            "zst": zstandard.ZstdCompressor().compress}[kind](data)


@pytest.mark.parametrize("kind", ["gz", "zst", "bz2"])
def test_compressed_jsonl_txt_csv(tmp_path: Path, kind: str) -> None:
    lines = b'{"text": "one"}\n{"text": "two"}\n'
    (tmp_path / f"a.jsonl.{kind}").write_bytes(_compress(lines, kind))
    (tmp_path / f"b.txt.{kind}").write_bytes(_compress(b"whole file\n\nstill", kind))
    (tmp_path / f"c.csv.{kind}").write_bytes(_compress(b"text\nthree\n", kind))
    docs = _read([str(tmp_path)])
    assert [d.text for d in docs] == ["one", "two", "whole file", "still", "three"]
    assert docs[1].doc_id == f"{tmp_path / f'a.jsonl.{kind}'}:2"


def test_compression_is_detected_by_magic_bytes(tmp_path: Path) -> None:
    path = tmp_path / "really_gzip.jsonl"
    path.write_bytes(_compress(b'{"text": "hidden"}\n', "gz"))
    assert [d.text for d in _read([str(path)])] == ["hidden"]


def test_name_says_gzip_but_data_is_not(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(b'{"text": "plain"}\n')
    message = _error([str(path)])
    assert str(path) in message and "gzip" in message


def test_unknown_compression_by_name_and_by_magic(tmp_path: Path) -> None:
    named = tmp_path / "d.jsonl.xz"
    named.write_bytes(b"\xfd7zXZ\x00\x00rest")
    with pytest.raises(ShoestringError, match=r"unsupported compression \(xz\)") as info:
        resolve_sources([str(named)])
    assert info.value.where == str(named)
    hidden = tmp_path / "d.jsonl"
    hidden.write_bytes(b"\xfd7zXZ\x00\x00rest")
    message = _error([str(hidden)])
    assert str(hidden) in message and "unsupported compression (xz" in message


def test_truncated_gzip_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    data = _compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(2000)), "gz")
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShoestringError) as info:
        _read([str(path)])
    assert info.value.where == str(path) and "damaged or truncated" in info.value.what
    stats = ReadStats()
    docs = _read([str(path)], on_error="skip", stats=stats)
    assert len(docs) > 10 and len(stats.skipped) == 1


def test_binary_inside_compressed_file(tmp_path: Path) -> None:
    path = tmp_path / "d.txt.zst"
    path.write_bytes(_compress(b"\x00\x01\x02" * 50, "zst"))
    assert "binary" in _error([str(path)])


def test_hf_spec_parsing() -> None:
    from shoestring.data.readers import parse_hf_spec

    assert parse_hf_spec("hf:wikitext:wikitext-103-raw-v1") == ("wikitext", "wikitext-103-raw-v1", "train")
    assert parse_hf_spec("hf:user/ds::validation") == ("user/ds", None, "validation")
    assert parse_hf_spec("hf:ds") == ("ds", None, "train")
    with pytest.raises(ShoestringError, match="hf:NAME"):
        resolve_sources(["hf:"])


def test_hf_local_dataset_through_datasets_streaming(tmp_path: Path) -> None:
    """The hub is unreachable here: a local folder goes through the same load_dataset path."""
    folder = tmp_path / "ds"
    (folder / "data").mkdir(parents=True)
    _parquet(folder / "data" / "train-00000-of-00001.parquet",
             {"content": ["alpha", "beta", "gamma"]}, row_group_size=2)
    _parquet(folder / "data" / "validation-00000-of-00001.parquet", {"content": ["delta"]})
    stats = ReadStats()
    docs = _read([f"hf:{folder}"], text_field="content", stats=stats)
    assert [d.text for d in docs] == ["alpha", "beta", "gamma"]
    assert docs[2].doc_id == f"hf:{folder}:row 3" and stats.files == 1
    val = _read([f"hf:{folder}::validation"], text_field="content")
    assert [d.text for d in val] == ["delta"]
    message = _error([f"hf:{folder}"])
    assert f"hf:{folder}:row 1" in message and "'content'" in message


def test_hf_missing_dataset_is_a_clear_error(tmp_path: Path) -> None:
    message = _error([f"hf:{tmp_path / 'nothing-here'}"])
    assert "cannot open the dataset" in message and "hf:" in message
