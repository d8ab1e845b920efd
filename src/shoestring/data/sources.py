"""Turn what the user points at (files, folders, globs, ``builtin:`` corpora) into documents.

Two formats, chosen by extension:

* ``.txt``: the whole file is one document.
* ``.jsonl`` / ``.json``: JSON lines, one object per line, text in ``obj[text_field]``.
  ``.json`` is read as JSON lines too, because that is what most corpus dumps named
  ``.json`` are; a pretty-printed JSON array fails on its first line with a hint saying so.

Everything is UTF-8, decoded strictly: silently replacing bad bytes would train the model
on mojibake, so a bad file is an error that names the byte offset and line.

Bad input is a ``ShoestringError`` (``on_error="raise"``) or a ``"where: why"`` line in
``ReadStats.skipped`` (``on_error="skip"``). What is skipped:

* a malformed or unusable JSON line: that line only;
* invalid UTF-8 in a ``.jsonl``/``.json`` file: that line only (JSON lines are read
  streaming, so earlier lines may already have been used; lines are independent anyway);
* invalid UTF-8 in a ``.txt`` file, a binary file, an unreadable file: the whole file.
"""

from __future__ import annotations

import errno
import glob
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoestring.errors import ShoestringError

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".json")
BUILTINS = {"pydocs": "Python's help topics and standard-library docstrings (offline)"}

_BUILTIN_PREFIX = "builtin:"
_GLOB_CHARS = frozenset("*?[")
_SNIFF_BYTES = 8192
_MAX_FIELDS_SHOWN = 10
_SKIP_HINT = "--set data.on_error=skip"
_UTF8_FIX = (
    f"convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8) or skip bad files with {_SKIP_HINT}"
)


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


_Report = Callable[[ShoestringError], None]


def resolve_sources(specs: list[str]) -> list[str]:
    """Expand specs into an ordered list of files and ``builtin:`` names.

    Folders are walked recursively for supported files (hidden entries skipped) and globs
    keep only supported files; both are sorted so a run is reproducible. Every problem is
    found here, before any reading, so a typo in the fifth path fails in a second, not after
    an hour of tokenizing the first four. Duplicates are dropped, first occurrence wins.
    """
    if not specs:
        raise ShoestringError(
            "no input given",
            fix="pass one or more files, folders or globs (.txt, .jsonl, .json), "
            "or builtin:pydocs for the embedded corpus",
        )
    resolved: list[str] = []
    seen: set[str] = set()
    for spec in specs:
        for item in _resolve_one(spec):
            if item not in seen:
                seen.add(item)
                resolved.append(item)
    return resolved


def iter_documents(
    specs: list[str],
    text_field: str = "text",
    on_error: str = "raise",
    stats: ReadStats | None = None,
) -> Iterator[Document]:
    """Yield every document of every source, in order; see the module docstring for errors."""
    if on_error not in ("raise", "skip"):
        raise ShoestringError(
            f"on_error must be 'raise' or 'skip', got {on_error!r}", where="data.on_error"
        )
    stats = stats if stats is not None else ReadStats()
    report = _reporter(on_error, stats)
    for source in resolve_sources(specs):
        for doc in _read_source(source, text_field, report, stats):
            stats.documents += 1
            yield doc


def _reporter(on_error: str, stats: ReadStats) -> _Report:
    def report(err: ShoestringError) -> None:
        if on_error == "raise":
            raise err
        stats.skipped.append(f"{err.where}: {err.what}" if err.where else err.what)

    return report


def _read_source(
    source: str, text_field: str, report: _Report, stats: ReadStats
) -> Iterator[Document]:
    if source.startswith(_BUILTIN_PREFIX):
        stats.files += 1
        return _read_builtin(source[len(_BUILTIN_PREFIX) :])
    if Path(source).suffix.lower() == ".txt":
        return _read_txt(source, report, stats)
    return _read_jsonl(source, text_field, report, stats)


def _read_builtin(name: str) -> Iterator[Document]:
    from shoestring.data.builtin import iter_pydocs

    readers = {"pydocs": iter_pydocs}
    return readers[name]()


# --- resolving -------------------------------------------------------------------------


def _resolve_one(spec: str) -> list[str]:
    if spec.startswith(_BUILTIN_PREFIX):
        _check_builtin(spec)
        return [spec]
    path = Path(os.path.expanduser(spec))
    if not path.exists() and _GLOB_CHARS.intersection(spec):
        return _expand_glob(spec)
    if path.is_dir():
        return _expand_folder(path, spec)
    if path.is_file():
        _check_suffix(path, spec)
        return [str(path)]
    if path.exists():
        raise ShoestringError(
            "not a regular file or folder", where=spec, fix="point at a file or a folder"
        )
    raise ShoestringError(
        "no such file or folder",
        where=spec,
        fix="check the path (it is relative to the current folder), "
        "or use builtin:pydocs for the embedded corpus",
    )


def _check_builtin(spec: str) -> None:
    name = spec[len(_BUILTIN_PREFIX) :]
    if name not in BUILTINS:
        known = ", ".join(f"{_BUILTIN_PREFIX}{n} ({d})" for n, d in BUILTINS.items())
        raise ShoestringError(f"unknown builtin corpus '{name}'", where=spec, fix=f"known: {known}")


def _supported(path: Path) -> bool:
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def _check_suffix(path: Path, spec: str) -> None:
    if not _supported(path):
        shown = f"'{path.suffix}'" if path.suffix else "no extension"
        raise ShoestringError(
            f"unsupported file type ({shown})",
            where=spec,
            fix=f"supported: {', '.join(SUPPORTED_SUFFIXES)} (UTF-8 text, or JSON lines); "
            "rename or convert the file",
        )


def _expand_glob(spec: str) -> list[str]:
    matches = sorted(glob.glob(os.path.expanduser(spec), recursive=True))
    if not matches:
        raise ShoestringError(
            "the pattern matched nothing",
            where=spec,
            fix="check the pattern; quote it so the shell does not expand it first, "
            "and use ** for subfolders",
        )
    files: set[str] = set()
    for match in matches:
        path = Path(match)
        if path.is_dir():
            files.update(_walk_folder(path))
        elif path.is_file() and _supported(path):
            files.add(str(path))
    if not files:
        raise ShoestringError(
            f"the pattern matched {len(matches)} path(s) but no readable files",
            where=spec,
            fix=f"supported file types: {', '.join(SUPPORTED_SUFFIXES)}",
        )
    return sorted(files)


def _expand_folder(path: Path, spec: str) -> list[str]:
    files = _walk_folder(path)
    if not files:
        raise ShoestringError(
            "the folder has no readable files",
            where=spec,
            fix=f"put {', '.join(SUPPORTED_SUFFIXES)} files in it (subfolders are searched; "
            "hidden files are not)",
        )
    return files


def _walk_folder(root: Path) -> list[str]:
    def fail(err: OSError) -> None:
        raise ShoestringError(
            f"cannot list folder ({err.strerror or err})",
            where=str(err.filename or root),
            fix="check the folder's permissions (ls -ld)",
        )

    found: list[str] = []
    for folder, dirs, names in os.walk(root, onerror=fail):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            path = Path(folder, name)
            if not name.startswith(".") and _supported(path) and path.is_file():
                found.append(str(path))
    return sorted(found)


# --- reading ---------------------------------------------------------------------------


def _read_txt(path: str, report: _Report, stats: ReadStats) -> Iterator[Document]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        report(_unreadable(path, e))
        return
    stats.files += 1
    problem = _binary_problem(data[:_SNIFF_BYTES], path)
    if problem is not None:
        report(problem)
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = data.count(b"\n", 0, e.start) + 1
        report(_not_utf8(path, lineno, e.start, data[e.start]))
        return
    yield Document(text=text.removeprefix("\ufeff"), source=path, doc_id=path)


def _read_jsonl(
    path: str, text_field: str, report: _Report, stats: ReadStats
) -> Iterator[Document]:
    """Streams line by line in binary, so only ``\\n`` ends a line (not U+2028 or ``\\r``).

    Raw control characters inside JSON strings (a literal tab or CR, common in scraped
    dumps) are accepted rather than rejected; cleaning removes or normalizes them later.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        report(_unreadable(path, e))
        return
    stats.files += 1
    with f:
        problem = _binary_problem(f.read(_SNIFF_BYTES), path)
        if problem is not None:
            report(problem)
            return
        f.seek(0)
        offset = 0
        for lineno, raw in enumerate(f, 1):
            doc = _parse_line(raw, path, lineno, offset, text_field, report)
            offset += len(raw)
            if doc is not None:
                yield doc


def _parse_line(
    raw: bytes, path: str, lineno: int, offset: int, text_field: str, report: _Report
) -> Document | None:
    where = f"{path}:{lineno}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        report(_not_utf8(path, lineno, offset + e.start, raw[e.start]))
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
                problem,
                where=where,
                fix="name the field that holds the text with --set data.text_field=NAME, "
                f"or skip such records with {_SKIP_HINT}",
            )
        )
        return None
    return Document(text=obj[text_field], source=path, doc_id=where)


def _field_problem(obj: Any, text_field: str) -> str | None:
    if not isinstance(obj, dict):
        return f"expected a JSON object with a '{text_field}' field, got a JSON {_kind(obj)}"
    if text_field not in obj:
        return f"no '{text_field}' field; {_describe_fields(obj)}"
    if not isinstance(obj[text_field], str):
        return f"field '{text_field}' is a JSON {_kind(obj[text_field])}, not a string"
    return None


def _describe_fields(obj: dict[str, Any]) -> str:
    if not obj:
        return "the object is empty"
    names = list(obj)
    shown = ", ".join(f"'{n}'" for n in names[:_MAX_FIELDS_SHOWN])
    more = len(names) - _MAX_FIELDS_SHOWN
    return f"the object has {shown}" + (f" and {more} more" if more > 0 else "")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string"}.get(type(value), type(value).__name__)


# --- error messages --------------------------------------------------------------------


def _malformed(path: str, where: str, err: ValueError) -> ShoestringError:
    detail = f"{err.msg}, column {err.colno}" if isinstance(err, json.JSONDecodeError) else err
    fix = f"fix that line, or skip bad lines with {_SKIP_HINT}"
    if Path(path).suffix.lower() == ".json":
        fix += "; note that .json files are read as JSON lines (one object per line)"
    return ShoestringError(f"malformed JSON ({detail})", where=where, fix=fix)


def _binary_problem(head: bytes, path: str) -> ShoestringError | None:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return ShoestringError(
            "looks like UTF-16 text; shoestring reads UTF-8 only",
            where=path,
            fix=f"convert it (iconv -f utf-16 -t utf-8) or skip bad files with {_SKIP_HINT}",
        )
    nul = head.find(b"\0")
    if nul < 0:
        return None
    return ShoestringError(
        f"looks like a binary file, not text (NUL byte at byte offset {nul})",
        where=path,
        fix=f"pass UTF-8 text files ({', '.join(SUPPORTED_SUFFIXES)}), "
        f"or skip bad files with {_SKIP_HINT}",
    )


def _not_utf8(path: str, lineno: int, offset: int, byte: int) -> ShoestringError:
    return ShoestringError(
        f"not valid UTF-8: byte 0x{byte:02x} at byte offset {offset} (line {lineno}); "
        "shoestring reads UTF-8 only",
        where=f"{path}:{lineno}",
        fix=_UTF8_FIX,
    )


def _unreadable(path: str, err: OSError) -> ShoestringError:
    if err.errno in (errno.EACCES, errno.EPERM):
        what = "cannot read file (permission denied)"
    else:
        what = f"cannot read file ({err.strerror or err})"
    return ShoestringError(
        what, where=path, fix=f"check the file's permissions (ls -l), or skip it with {_SKIP_HINT}"
    )
