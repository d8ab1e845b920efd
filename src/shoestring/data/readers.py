"""One reader per source format; each yields `Document`s and reports bad input with its place.

Formats (chosen by extension; compression by magic bytes, see `compression`):

* ``.txt``: ``split_on="blank"`` (the default): each block of non-blank lines (a paragraph)
  is one document, its id ``path:LINE`` of its first line; ``"lines"``: each non-blank line
  (WikiText, line-per-document dumps); ``"none"``: the whole file.
* ``.jsonl`` / ``.json``: JSON lines, one object per line, text in ``obj[text_field]``.
  ``.json`` is read as JSON lines too, because that is what most corpus dumps named ``.json``
  are; a pretty-printed JSON array fails on its first line with a hint saying so.
* ``.parquet``: the ``text_field`` column, streamed record batch by record batch (pyarrow);
  rows are named ``path:row N`` (1-based).
* ``.csv`` / ``.tsv``: a header row, then records; text in the ``text_field`` column. CSV is
  RFC 4180 (quoted fields may span lines); TSV is unquoted (tabs and newlines cannot occur
  in a field; quote characters are text), as GLUE and most TSV dumps are written.
* ``hf:NAME[:CONFIG][:SPLIT]``: a Hugging Face dataset through ``datasets`` streaming (NAME
  may be a hub id or a local folder of data files); rows are named ``hf:…:row N``.

Everything is UTF-8, decoded strictly: silently replacing bad bytes would train the model
on mojibake, so a bad file is an error that names the byte offset and line.

Bad input is a ``ShoestringError`` (``on_error="raise"``) or a ``"where: why"`` line in
``ReadStats.skipped`` (``on_error="skip"``). What is skipped:

* a malformed or unusable record (JSON line, CSV/TSV record, Parquet or hf row): that record;
* invalid UTF-8 in a line-based file: that line only (records are read streaming, so earlier
  ones may already have been used; they are independent anyway);
* invalid UTF-8 in a ``.txt`` file, a binary file, an unreadable file, damaged compressed
  data, a missing column: the (rest of the) file.
"""

from __future__ import annotations

import csv
import errno
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from shoestring.data.compression import decompression_errors, open_decompressed, split_suffix
from shoestring.errors import ShoestringError

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet", ".csv", ".tsv")
SKIP_HINT = "--on-error skip (or --set data.on_error=skip)"
_SNIFF_BYTES = 8192
_MAX_FIELDS_SHOWN = 10
_UTF8_FIX = f"convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8) or skip bad files with {SKIP_HINT}"
_FIELD_FIX = "name the field/column that holds the text with --set data.text_field=NAME"


@dataclass(frozen=True)
class Document:
    """One unit of training text, with where it came from (for the manifest and errors)."""

    text: str
    source: str
    doc_id: str


@dataclass
class ReadStats:
    """Counts for the manifest, so a run says what it read and what it dropped."""

    files: int = 0
    documents: int = 0
    skipped: list[str] = field(default_factory=list)


Report = Callable[[ShoestringError], None]


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    split_on: str = "blank"


# --- opening ---------------------------------------------------------------------------


def _open_stream(path: str, report: Report, stats: ReadStats) -> BinaryIO | None:
    """The file's decompressed bytes, checked for binary content; None (reported) if unusable."""
    try:
        raw = open(path, "rb")
    except OSError as e:
        report(unreadable(path, e))
        return None
    try:
        stream = open_decompressed(path, raw)
        head = stream.peek(_SNIFF_BYTES)[:_SNIFF_BYTES]  # type: ignore[attr-defined]
    except ShoestringError as e:
        raw.close()
        report(e)
        return None
    except decompression_errors() as e:
        raw.close()
        report(_damaged(path, e, 0))
        return None
    stats.files += 1
    problem = binary_problem(head, path)
    if problem is not None:
        stream.close()
        report(problem)
        return None
    return stream


def _lines(path: str, stream: BinaryIO, report: Report) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, raw line) of a stream; damaged compressed data is reported."""
    offset, lineno = 0, 0
    try:
        for lineno, raw in enumerate(stream, 1):
            yield lineno, offset, raw
            offset += len(raw)
    except decompression_errors() as e:
        report(_damaged(path, e, lineno))


# --- .txt ------------------------------------------------------------------------------


def read_txt(path: str, opts: ReadOptions, report: Report, stats: ReadStats) -> Iterator[Document]:
    stream = _open_stream(path, report, stats)
    if stream is None:
        return
    with stream:
        if opts.split_on != "none":
            yield from _txt_blocks(path, stream, report, per_line=opts.split_on == "lines")
            return
        try:
            data = stream.read()
        except decompression_errors() as e:
            report(_damaged(path, e, 0))
            return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = data.count(b"\n", 0, e.start) + 1
        report(not_utf8(path, lineno, e.start, data[e.start]))
        return
    yield Document(text=text.removeprefix("\ufeff"), source=path, doc_id=path)


def _txt_blocks(
    path: str, stream: BinaryIO, report: Report, per_line: bool = False
) -> Iterator[Document]:
    """Blocks of non-blank lines (each line alone with ``per_line``); a bad line makes the
    file unusable (like a whole .txt)."""
    block: list[str] = []
    start = 0
    for lineno, offset, raw in _lines(path, stream, report):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            report(not_utf8(path, lineno, offset + e.start, raw[e.start]))
            return
        if lineno == 1:
            line = line.removeprefix("\ufeff")
        if line.strip():
            if not block:
                start = lineno
            block.append(line)
            if not per_line:
                continue
        if block:
            yield Document("".join(block).rstrip("\r\n"), path, f"{path}:{start}")
            block = []
    if block:
        yield Document("".join(block).rstrip("\r\n"), path, f"{path}:{start}")


# --- JSON lines ------------------------------------------------------------------------


def read_jsonl(path: str, opts: ReadOptions, report: Report, stats: ReadStats) -> Iterator[Document]:
    """Streams line by line in binary, so only ``\\n`` ends a line (not U+2028 or ``\\r``).

    Raw control characters inside JSON strings (a literal tab or CR, common in scraped
    dumps) are accepted rather than rejected; cleaning removes or normalizes them later.
    """
    stream = _open_stream(path, report, stats)
    if stream is None:
        return
    with stream:
        for lineno, offset, raw in _lines(path, stream, report):
            doc = _parse_line(raw, path, lineno, offset, opts.text_field, report)
            if doc is not None:
                yield doc


def _parse_line(
    raw: bytes, path: str, lineno: int, offset: int, text_field: str, report: Report
) -> Document | None:
    where = f"{path}:{lineno}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        report(not_utf8(path, lineno, offset + e.start, raw[e.start]))
        return None
    if lineno == 1:
        line = line.removeprefix("\ufeff")
    if not line.strip():
        return None
    try:
        obj = json.loads(line, strict=False)
    except ValueError as e:
        report(_malformed(path, where, e))
        return None
    problem = _field_problem(obj, text_field)
    if problem is not None:
        report(
            ShoestringError(
                problem, where=where, fix=f"{_FIELD_FIX}, or skip such records with {SKIP_HINT}"
            )
        )
        return None
    return Document(text=obj[text_field], source=path, doc_id=where)


def _field_problem(obj: Any, text_field: str) -> str | None:
    if not isinstance(obj, dict):
        return f"expected a JSON object with a '{text_field}' field, got a JSON {_kind(obj)}"
    if text_field not in obj:
        return f"no '{text_field}' field; {_describe_fields(list(obj), 'the object has')}"
    if not isinstance(obj[text_field], str):
        return f"field '{text_field}' is a JSON {_kind(obj[text_field])}, not a string"
    return None


def _describe_fields(names: list[str], lead: str) -> str:
    if not names:
        return "the object is empty"
    shown = ", ".join(f"'{n}'" for n in names[:_MAX_FIELDS_SHOWN])
    more = len(names) - _MAX_FIELDS_SHOWN
    return f"{lead} {shown}" + (f" and {more} more" if more > 0 else "")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string"}.get(type(value), type(value).__name__)


# --- CSV / TSV -------------------------------------------------------------------------


class _LineFeed:
    """Decoded lines for `csv.reader`, remembering the number of the last line handed out."""

    def __init__(self, path: str, stream: BinaryIO, report: Report) -> None:
        self.path, self.stream, self.report = path, stream, report
        self.lineno = 0

    def __iter__(self) -> Iterator[str]:
        for lineno, offset, raw in _lines(self.path, self.stream, self.report):
            self.lineno = lineno
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                self.report(not_utf8(self.path, lineno, offset + e.start, raw[e.start]))
                continue
            yield line.removeprefix("\ufeff") if lineno == 1 else line


def read_csv(path: str, opts: ReadOptions, report: Report, stats: ReadStats) -> Iterator[Document]:
    stream = _open_stream(path, report, stats)
    if stream is None:
        return
    tsv = split_suffix(path)[0] == ".tsv"
    csv.field_size_limit(2**31 - 1)  # documents are long; the default limit is 128 KiB
    with stream:
        feed = _LineFeed(path, stream, report)
        if tsv:
            reader = csv.reader(feed, delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            reader = csv.reader(feed, strict=True)
        try:
            header = next(reader, None)
        except csv.Error as e:
            report(ShoestringError(f"malformed header ({e})", where=f"{path}:1"))
            return
        if header is None:
            return
        if opts.text_field not in header:
            shown = _describe_fields(header, "the header has")
            report(ShoestringError(
                f"no '{opts.text_field}' column; {shown}", where=f"{path}:1",
                fix=f"{_FIELD_FIX} (CSV/TSV files need a header row)",
            ))
            return
        column = header.index(opts.text_field)
        while True:
            start = feed.lineno + 1
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                report(ShoestringError(f"malformed {'TSV' if tsv else 'CSV'} record ({e})",
                                       where=f"{path}:{start}", fix=f"fix it, or {SKIP_HINT}"))
                continue
            if not record:
                continue
            if len(record) != len(header):
                report(ShoestringError(
                    f"the record has {len(record)} fields, the header has {len(header)}",
                    where=f"{path}:{start}",
                    fix=f"fix that line (a stray delimiter or quote?), or {SKIP_HINT}",
                ))
                continue
            yield Document(record[column], path, f"{path}:{start}")


# --- Parquet ---------------------------------------------------------------------------


def read_parquet(
    path: str, opts: ReadOptions, report: Report, stats: ReadStats
) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except OSError as e:
        if isinstance(e, (PermissionError, FileNotFoundError)):
            report(unreadable(path, e))
        else:
            report(ShoestringError(f"not a readable Parquet file ({e})", where=path,
                                   fix=f"check the file, or skip it with {SKIP_HINT}"))
        return
    except pa.ArrowException as e:
        report(ShoestringError(f"not a readable Parquet file ({e})", where=path,
                               fix=f"check the file, or skip it with {SKIP_HINT}"))
        return
    stats.files += 1
    schema = pf.schema_arrow
    if opts.text_field not in schema.names:
        report(ShoestringError(
            f"no '{opts.text_field}' column; {_describe_fields(schema.names, 'the file has')}",
            where=path, fix=_FIELD_FIX,
        ))
        return
    kind = schema.field(opts.text_field).type
    if not _is_text_type(kind):
        report(ShoestringError(f"column '{opts.text_field}' holds {kind}, not strings",
                               where=path, fix=_FIELD_FIX))
        return
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=1024, columns=[opts.text_field]):
            for value in batch.column(0).to_pylist():
                row += 1
                if value is None:
                    report(ShoestringError(f"column '{opts.text_field}' is null",
                                           where=f"{path}:row {row}", fix=f"{SKIP_HINT}"))
                    continue
                yield Document(value, path, f"{path}:row {row}")
    except (OSError, pa.ArrowException) as e:
        report(ShoestringError(f"damaged Parquet data after row {row} ({e})", where=path))


def _is_text_type(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    checks = [pa.types.is_string, pa.types.is_large_string]
    if hasattr(pa.types, "is_string_view"):
        checks.append(pa.types.is_string_view)
    return any(check(kind) for check in checks)


# --- Hugging Face datasets -------------------------------------------------------------

HF_PREFIX = "hf:"


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """``hf:NAME[:CONFIG][:SPLIT]`` → (name, config or None, split, default ``train``)."""
    parts = spec[len(HF_PREFIX):].split(":")
    if not parts[0] or len(parts) > 3:
        raise ShoestringError(
            "a Hugging Face source looks like hf:NAME[:CONFIG][:SPLIT]",
            where=spec,
            fix="e.g. hf:wikitext:wikitext-103-raw-v1:train, or hf:/path/to/local/dataset",
        )
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else "train"
    return name, config, split


def read_hf(spec: str, opts: ReadOptions, report: Report, stats: ReadStats) -> Iterator[Document]:
    """Streams rows (``streaming=True``), so nothing is downloaded or cached up front."""
    name, config, split = parse_hf_spec(spec)
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency
        report(ShoestringError("the `datasets` library is not installed", where=spec,
                               fix="pip install datasets"))
        return
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as e:  # datasets raises many unrelated types for "cannot open"
        report(ShoestringError(
            f"cannot open the dataset ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
            where=spec,
            fix="check NAME, CONFIG and SPLIT; hub datasets need network access "
            "(or a local cache with HF_HUB_OFFLINE=1); a local folder of .parquet/.jsonl/.csv "
            "files works offline",
        ))
        return
    stats.files += 1
    row = 0
    try:
        for record in ds:
            row += 1
            where = f"{spec}:row {row}"
            value = record.get(opts.text_field) if isinstance(record, dict) else None
            if not isinstance(value, str):
                what = (f"no '{opts.text_field}' column; "
                        f"{_describe_fields(list(record), 'the dataset has')}"
                        if opts.text_field not in record
                        else f"column '{opts.text_field}' is a {_kind(value)}, not a string")
                report(ShoestringError(what, where=where, fix=f"{_FIELD_FIX}, or {SKIP_HINT}"))
                continue
            yield Document(value, spec, where)
    except ShoestringError:
        raise
    except Exception as e:  # network drops, damaged files inside the dataset
        report(ShoestringError(f"reading the dataset failed after row {row} "
                               f"({type(e).__name__}: {e})", where=spec))


# --- error messages --------------------------------------------------------------------


def _malformed(path: str, where: str, err: ValueError) -> ShoestringError:
    detail = f"{err.msg}, column {err.colno}" if isinstance(err, json.JSONDecodeError) else err
    fix = f"fix that line, or skip bad lines with {SKIP_HINT}"
    if split_suffix(path)[0] == ".json":
        fix += "; note that .json files are read as JSON lines (one object per line)"
    return ShoestringError(f"malformed JSON ({detail})", where=where, fix=fix)


def _damaged(path: str, err: BaseException, lineno: int) -> ShoestringError:
    at = f" after line {lineno}" if lineno else ""
    return ShoestringError(
        f"damaged or truncated compressed data{at} ({err})",
        where=path,
        fix=f"re-download or re-compress the file, or skip it with {SKIP_HINT}",
    )


def binary_problem(head: bytes, path: str) -> ShoestringError | None:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return ShoestringError(
            "looks like UTF-16 text; shoestring reads UTF-8 only",
            where=path,
            fix=f"convert it (iconv -f utf-16 -t utf-8) or skip bad files with {SKIP_HINT}",
        )
    nul = head.find(b"\0")
    if nul < 0:
        return None
    return ShoestringError(
        f"looks like a binary file, not text (NUL byte at byte offset {nul})",
        where=path,
        fix=f"pass UTF-8 text files ({', '.join(SUPPORTED_SUFFIXES)}), "
        f"or skip bad files with {SKIP_HINT}",
    )


def not_utf8(path: str, lineno: int, offset: int, byte: int) -> ShoestringError:
    return ShoestringError(
        f"not valid UTF-8: byte 0x{byte:02x} at byte offset {offset} (line {lineno}); "
        "shoestring reads UTF-8 only",
        where=f"{path}:{lineno}",
        fix=_UTF8_FIX,
    )


def unreadable(path: str, err: OSError) -> ShoestringError:
    if err.errno in (errno.EACCES, errno.EPERM):
        what = "cannot read file (permission denied)"
    else:
        what = f"cannot read file ({err.strerror or err})"
    return ShoestringError(
        what, where=path, fix=f"check the file's permissions (ls -l), or skip it with {SKIP_HINT}"
    )


READERS: dict[str, Callable[[str, ReadOptions, Report, ReadStats], Iterator[Document]]] = {
    ".txt": read_txt,
    ".jsonl": read_jsonl,
    ".json": read_jsonl,
    ".csv": read_csv,
    ".tsv": read_csv,
    ".parquet": read_parquet,
}


def reader_for(path: str) -> Callable[[str, ReadOptions, Report, ReadStats], Iterator[Document]]:
    return READERS[split_suffix(Path(path).name)[0]]
