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
* invalid UTF-8 in a ``.txt`` file: the record that holds it (the paragraph, the line, or
  with ``split_on="none"`` the rest of the file), nothing after it;
* a binary file, an unreadable file, damaged compressed data, a missing column: the (rest of
  the) file.

``ReadStats`` counts what was skipped: records (with their bytes) and whole files.

Long documents: ``max_chars`` (``data.max_document_chars``) cuts a document longer than that
into pieces (`Splitter`: at a paragraph break, else a line break, else a space, in the last
half of the window). ``.txt`` files are read in bounded chunks, so no reader holds more than
about ``max_chars`` of one paragraph or line however long it is; a record of the other
formats (a JSON line, a CSV record, a Parquet cell) is parsed whole, then cut.
"""

from __future__ import annotations

import csv
import errno
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from shoestring.data.compressed import decompression_errors, open_decompressed, split_suffix
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
    label: str = ""  # JSON lines: the value of ReadOptions.label_field (a mixture's source)


@dataclass
class ReadStats:
    """Counts for the manifest, so a run says what it read and what it dropped.

    ``skipped`` holds one ``where: why`` line per bad input; ``skipped_records`` and
    ``skipped_bytes`` count the records (lines, paragraphs, rows) skipped and their bytes,
    ``skipped_files`` the files skipped whole (their bytes: the size on disk, when known).
    ``split_documents`` counts documents over ``max_chars``, cut into ``split_pieces``.
    """

    files: int = 0
    documents: int = 0
    skipped: list[str] = field(default_factory=list)
    skipped_records: int = 0
    skipped_files: int = 0
    skipped_bytes: int = 0
    split_documents: int = 0
    split_pieces: int = 0

    def skip_record(self, nbytes: int) -> None:
        self.skipped_records += 1
        self.skipped_bytes += nbytes

    def skip_file(self, path: str) -> None:
        self.skipped_files += 1
        try:
            self.skipped_bytes += os.path.getsize(path)
        except OSError:
            pass

    def skipped_summary(self) -> dict[str, int]:
        """For the manifest: what ``on_error=skip`` dropped."""
        return {"inputs": len(self.skipped), "records": self.skipped_records,
                "files": self.skipped_files, "bytes": self.skipped_bytes}

    def record(self, max_chars: int) -> dict:
        """The reader's record in the manifest's ``blocks`` (``max_chars``: what
        ``data.max_document_chars`` was)."""
        return {"block": "read", "documents_out": self.documents,
                "dropped": {"bad_input": len(self.skipped)}, "skipped": self.skipped_summary(),
                "long_documents": {"max_chars": max_chars, "cut": self.split_documents,
                                   "pieces": self.split_pieces}}

    def counts(self) -> dict[str, int]:
        """The counters other than ``files`` and ``documents`` (to add up across tasks)."""
        return {name: getattr(self, name) for name in _COUNTERS}

    def add(self, counts: dict[str, int]) -> None:
        for name in _COUNTERS:
            setattr(self, name, getattr(self, name) + counts.get(name, 0))


_COUNTERS = ("skipped_records", "skipped_files", "skipped_bytes", "split_documents",
             "split_pieces")


Report = Callable[[ShoestringError], None]


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    split_on: str = "blank"
    max_chars: int | None = None  # data.max_document_chars: longer documents are cut
    label_field: str | None = None  # JSON lines: this field's value becomes Document.label


class Splitter:
    """Text in fragments, out in pieces of at most ``max_chars`` characters (None: one piece).

    A piece ends at the last paragraph break in the second half of its window, else the
    last line break, else the last space, else exactly at ``max_chars``; what is buffered
    never exceeds ``max_chars`` plus one fragment, so memory does not depend on the length
    of the document.
    """

    def __init__(self, max_chars: int | None) -> None:
        self.max_chars = max_chars
        self._parts: list[str] = []
        self._chars = 0

    def add(self, fragment: str) -> Iterator[str]:
        """Take ``fragment``; yield the pieces that are complete."""
        self._parts.append(fragment)
        self._chars += len(fragment)
        if self.max_chars is None or self._chars <= self.max_chars:
            return
        buf = "".join(self._parts)
        while len(buf) > self.max_chars:
            cut = cut_point(buf, self.max_chars)
            yield buf[:cut]
            buf = buf[cut:]
        self._parts, self._chars = [buf], len(buf)

    def finish(self) -> str:
        """The rest (the last piece), and start afresh."""
        rest = "".join(self._parts)
        self._parts, self._chars = [], 0
        return rest


def cut_point(text: str, limit: int) -> int:
    """Where to end a piece of at most ``limit`` characters of ``text`` (see `Splitter`)."""
    for sep in ("\n\n", "\n", " "):
        at = text.rfind(sep, limit // 2, limit)
        if at > 0:
            return at + len(sep)
    return limit


def split_long(docs: Iterator[Document], max_chars: int | None,
               stats: ReadStats) -> Iterator[Document]:
    """Each document, or its pieces when it is longer than ``max_chars`` (see `piece_id`)."""
    for doc in docs:
        if max_chars is None or len(doc.text) <= max_chars:
            yield doc
            continue
        splitter = Splitter(max_chars)
        pieces = [p for p in (*splitter.add(doc.text), splitter.finish()) if p]
        stats.split_documents += 1
        stats.split_pieces += len(pieces)
        for k, text in enumerate(pieces, 1):
            yield replace(doc, text=text, doc_id=piece_id(doc.doc_id, k))


def piece_id(doc_id: str, k: int) -> str:
    """The id of piece ``k`` (1-based) of a cut document: the first keeps the document's."""
    return doc_id if k == 1 else f"{doc_id}#{k}"


# --- opening ---------------------------------------------------------------------------


def _open_stream(path: str, report: Report, stats: ReadStats) -> BinaryIO | None:
    """The file's decompressed bytes, checked for binary content; None (reported) if unusable."""
    try:
        raw = open(path, "rb")
    except OSError as e:
        return _skip_file(path, unreadable(path, e), report, stats)
    try:
        stream = open_decompressed(path, raw)
        head = stream.peek(_SNIFF_BYTES)[:_SNIFF_BYTES]  # type: ignore[attr-defined]
    except (ShoestringError, *decompression_errors()) as e:
        raw.close()
        err = e if isinstance(e, ShoestringError) else _damaged(path, e, 0)
        return _skip_file(path, err, report, stats)
    stats.files += 1
    problem = binary_problem(head, path)
    if problem is not None:
        stream.close()
        return _skip_file(path, problem, report, stats)
    return stream


def _skip_file(path: str, err: ShoestringError, report: Report, stats: ReadStats) -> None:
    """Report ``err`` and count the (rest of the) file as skipped; returns None, the
    readers' "nothing to read"."""
    report(err)
    stats.skip_file(path)


def _lines(path: str, stream: BinaryIO, report: Report,
           stats: ReadStats) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, raw line) of a stream; damaged compressed data is reported
    (and the rest of the file counted as skipped)."""
    offset, lineno = 0, 0
    try:
        for lineno, raw in enumerate(stream, 1):
            yield lineno, offset, raw
            offset += len(raw)
    except decompression_errors() as e:
        report(_damaged(path, e, lineno))
        stats.skipped_files += 1


# --- .txt ------------------------------------------------------------------------------


_TXT_CHUNK = 1 << 20  # bytes of a line read at a time (less when max_chars is smaller)


def read_txt(path: str, opts: ReadOptions, report: Report, stats: ReadStats) -> Iterator[Document]:
    stream = _open_stream(path, report, stats)
    if stream is None:
        return
    with stream:
        yield from _TxtRecords(path, opts, report, stats).read(stream)


class _TxtRecords:
    """The records of a .txt stream — paragraphs (``blank``), lines (``lines``) or the whole
    file (``none``) — read in chunks of a line, each record cut by a `Splitter`.

    A chunk with invalid UTF-8 is reported; skipped, it drops its record from there: the
    pieces of that record not yet yielded, and the rest of it (nothing after it).
    """

    def __init__(self, path: str, opts: ReadOptions, report: Report, stats: ReadStats) -> None:
        self.path, self.report, self.stats = path, report, stats
        self.mode = opts.split_on
        self.splitter = Splitter(opts.max_chars)
        self.chunk = _TXT_CHUNK if opts.max_chars is None else max(
            4096, min(_TXT_CHUNK, opts.max_chars))
        self.start = 0  # first line of the open record; 0: none is open
        self.pieces = 0  # pieces of the open record already yielded
        self.bad = False  # the open record holds invalid UTF-8: it is dropped
        self.unyielded = 0  # bytes of the open record not in a yielded piece

    def read(self, stream: BinaryIO) -> Iterator[Document]:
        line_text = False  # the current line has non-space text
        spaces: list[tuple[str, int]] = []  # its leading whitespace-only chunks
        for lineno, offset, raw, ends in _chunks(self.path, stream, self.report, self.stats,
                                                 self.chunk):
            try:
                text: str | None = raw.decode("utf-8")
                if offset == 0:
                    text = text.removeprefix("\ufeff")
            except UnicodeDecodeError as e:
                self.report(not_utf8(self.path, lineno, offset + e.start, raw[e.start]))
                text = None
            if text is not None and not line_text and self.mode != "none" and not text.strip():
                spaces.append((text, len(raw)))
            else:
                line_text = True
                for held, size in spaces:
                    yield from self._add(lineno, held, size)
                spaces = []
                yield from self._add(lineno, text, len(raw))
            if ends:
                if self.mode == "lines" or (self.mode == "blank" and not line_text):
                    yield from self._close()
                line_text, spaces = False, []
        yield from self._close()

    def _add(self, lineno: int, text: str | None, size: int) -> Iterator[Document]:
        """Add one chunk (None: invalid UTF-8) to the open record (opening one)."""
        if not self.start:
            self.start = lineno
        self.unyielded += size
        if text is None and not self.bad:
            self.bad = True
            self.splitter.finish()
        if self.bad:
            return
        for piece in self.splitter.add(text):
            self.pieces += 1
            self.unyielded -= len(piece.encode("utf-8", "surrogatepass"))
            yield Document(piece, self.path, piece_id(self._id(), self.pieces))

    def _close(self) -> Iterator[Document]:
        if not self.start:
            return
        rest = self.splitter.finish()
        if self.bad:
            self.stats.skip_record(max(self.unyielded, 0))
        else:
            if self.mode != "none":
                rest = rest.rstrip("\r\n")
            if rest or not self.pieces:
                self.pieces += 1
                yield Document(rest, self.path, piece_id(self._id(), self.pieces))
            if self.pieces > 1:
                self.stats.split_documents += 1
                self.stats.split_pieces += self.pieces
        self.start, self.pieces, self.bad, self.unyielded = 0, 0, False, 0

    def _id(self) -> str:
        return self.path if self.mode == "none" else f"{self.path}:{self.start}"


def _chunks(path: str, stream: BinaryIO, report: Report, stats: ReadStats,
            size: int) -> Iterator[tuple[int, int, bytes, bool]]:
    """(line number, byte offset, bytes, whether they end the line): each line in chunks of
    at most about ``size`` bytes, never cutting a UTF-8 character; damaged compressed data
    is reported."""
    offset, lineno, carry = 0, 1, b""
    try:
        while True:
            data = stream.readline(size)
            if not data:
                if carry:
                    yield lineno, offset, carry, True
                return
            raw, carry = carry + data, b""
            ends = raw.endswith(b"\n")
            if not ends:
                whole = _utf8_whole(raw)
                raw, carry = raw[:whole], raw[whole:]
            if raw:
                yield lineno, offset, raw, ends
            offset += len(raw)
            lineno += ends
    except decompression_errors() as e:
        report(_damaged(path, e, lineno))
        stats.skipped_files += 1


def _utf8_whole(raw: bytes) -> int:
    """The length of ``raw`` without a UTF-8 character cut off at its end."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte < 0x80:
            return len(raw)
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(raw) - back if need > back else len(raw)
    return len(raw)


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
        for lineno, offset, raw in _lines(path, stream, report, stats):
            doc = _parse_line(raw, path, lineno, offset, opts.text_field, report,
                              opts.label_field)
            if doc is None:
                if raw.strip():  # a blank line is no record
                    stats.skip_record(len(raw))
            else:
                yield doc


def _parse_line(
    raw: bytes, path: str, lineno: int, offset: int, text_field: str, report: Report,
    label_field: str | None = None,
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
    label = obj.get(label_field) if label_field else None
    return Document(text=obj[text_field], source=path, doc_id=where,
                    label="" if label is None else str(label))


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

    def __init__(self, path: str, stream: BinaryIO, report: Report, stats: ReadStats) -> None:
        self.path, self.stream, self.report, self.stats = path, stream, report, stats
        self.lineno = 0
        self.offset = 0  # the byte offset after the last line handed out

    def __iter__(self) -> Iterator[str]:
        for lineno, offset, raw in _lines(self.path, self.stream, self.report, self.stats):
            self.lineno, self.offset = lineno, offset + len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                self.report(not_utf8(self.path, lineno, offset + e.start, raw[e.start]))
                self.stats.skip_record(len(raw))
                continue
            yield line.removeprefix("\ufeff") if lineno == 1 else line


def read_csv(path: str, opts: ReadOptions, report: Report, stats: ReadStats) -> Iterator[Document]:
    stream = _open_stream(path, report, stats)
    if stream is None:
        return
    tsv = split_suffix(path)[0] == ".tsv"
    csv.field_size_limit(2**31 - 1)  # documents are long; the default limit is 128 KiB
    with stream:
        feed = _LineFeed(path, stream, report, stats)
        if tsv:
            reader = csv.reader(feed, delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            reader = csv.reader(feed, strict=True)
        try:
            header = next(reader, None)
        except csv.Error as e:
            _skip_file(path, ShoestringError(f"malformed header ({e})", where=f"{path}:1"),
                       report, stats)
            return
        if header is None:
            return
        if opts.text_field not in header:
            shown = _describe_fields(header, "the header has")
            _skip_file(path, ShoestringError(
                f"no '{opts.text_field}' column; {shown}", where=f"{path}:1",
                fix=f"{_FIELD_FIX} (CSV/TSV files need a header row)",
            ), report, stats)
            return
        column = header.index(opts.text_field)
        while True:
            start, start_offset = feed.lineno + 1, feed.offset
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                report(ShoestringError(f"malformed {'TSV' if tsv else 'CSV'} record ({e})",
                                       where=f"{path}:{start}", fix=f"fix it, or {SKIP_HINT}"))
                stats.skip_record(feed.offset - start_offset)
                continue
            if not record:
                continue
            if len(record) != len(header):
                report(ShoestringError(
                    f"the record has {len(record)} fields, the header has {len(header)}",
                    where=f"{path}:{start}",
                    fix=f"fix that line (a stray delimiter or quote?), or {SKIP_HINT}",
                ))
                stats.skip_record(feed.offset - start_offset)
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
    except (OSError, pa.ArrowException) as e:
        if isinstance(e, (PermissionError, FileNotFoundError)):
            err = unreadable(path, e)
        else:
            err = ShoestringError(f"not a readable Parquet file ({e})", where=path,
                                  fix=f"check the file, or skip it with {SKIP_HINT}")
        _skip_file(path, err, report, stats)
        return
    stats.files += 1
    schema = pf.schema_arrow
    kind = schema.field(opts.text_field).type if opts.text_field in schema.names else None
    if kind is None or not _is_text_type(kind):
        what = (f"no '{opts.text_field}' column; {_describe_fields(schema.names, 'the file has')}"
                if kind is None else f"column '{opts.text_field}' holds {kind}, not strings")
        _skip_file(path, ShoestringError(what, where=path, fix=_FIELD_FIX), report, stats)
        return
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=1024, columns=[opts.text_field]):
            for value in batch.column(0).to_pylist():
                row += 1
                if value is None:
                    report(ShoestringError(f"column '{opts.text_field}' is null",
                                           where=f"{path}:row {row}", fix=f"{SKIP_HINT}"))
                    stats.skip_record(0)
                    continue
                yield Document(value, path, f"{path}:row {row}")
    except (OSError, pa.ArrowException) as e:
        report(ShoestringError(f"damaged Parquet data after row {row} ({e})", where=path))
        stats.skipped_files += 1


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
        stats.skipped_files += 1
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
        stats.skipped_files += 1
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
                stats.skip_record(0)
                continue
            yield Document(value, spec, where)
    except ShoestringError:
        raise
    except Exception as e:  # network drops, damaged files inside the dataset
        report(ShoestringError(f"reading the dataset failed after row {row} "
                               f"({type(e).__name__}: {e})", where=spec))
        stats.skipped_files += 1


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
