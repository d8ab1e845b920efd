"""Turn what the user points at (files, folders, globs, ``builtin:``, ``hf:``) into documents.

Resolving (this module) finds every problem with the *specs* before any reading, so a typo in
the fifth path fails in a second, not after an hour of tokenizing the first four. Reading is
one function per format in `shoestring.data.readers` (see its docstring for the formats and
what ``on_error="skip"`` skips); compressed files (``.gz``, ``.zst``, ``.bz2``, detected by
magic bytes) are read through `shoestring.data.compressed`.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoestring.data.compressed import COMPRESSED_SUFFIXES, split_suffix
from shoestring.data.readers import (
    HF_PREFIX,
    SUPPORTED_SUFFIXES,
    Document,
    ReadOptions,
    ReadStats,
    Report,
    parse_hf_spec,
    read_hf,
    reader_for,
    split_long,
)
from shoestring.errors import ShoestringError

if TYPE_CHECKING:
    from shoestring.config import DataConfig

__all__ = [
    "BUILTINS", "SUPPORTED_SUFFIXES", "Document", "Read", "ReadStats", "iter_documents",
    "resolve_sources",
]

BUILTINS = {"pydocs": "Python's help topics and standard-library docstrings (offline)"}
SPLIT_ON = ("blank", "lines", "none")

_BUILTIN_PREFIX = "builtin:"
_GLOB_CHARS = frozenset("*?[")
_SUPPORTED_TEXT = f"{', '.join(SUPPORTED_SUFFIXES)} (optionally {', '.join(COMPRESSED_SUFFIXES)})"


def resolve_sources(specs: list[str]) -> list[str]:
    """Expand specs into an ordered list of files, ``builtin:`` and ``hf:`` names.

    Folders are walked recursively for supported files (hidden entries skipped) and globs
    keep only supported files; both are sorted so a run is reproducible. Duplicates are
    dropped, first occurrence wins.
    """
    if not specs:
        raise ShoestringError(
            "no input given",
            fix=f"pass one or more files, folders or globs ({_SUPPORTED_TEXT}), "
            "hf:NAME[:CONFIG][:SPLIT], or builtin:pydocs for the embedded corpus",
        )
    return list(dict.fromkeys(item for spec in specs for item in _resolve_one(spec)))


def iter_documents(
    specs: list[str],
    text_field: str = "text",
    on_error: str = "raise",
    stats: ReadStats | None = None,
    split_on: str = "blank",
    max_chars: int | None = None,
    label_field: str | None = None,
) -> Iterator[Document]:
    """Yield every document of every source, in order; see `readers` for formats and errors.

    ``max_chars`` (``data.max_document_chars``): a longer document comes as several pieces
    of at most that many characters, so memory downstream does not depend on its length.
    ``label_field``: JSON lines carry that field's value as ``Document.label`` (a mixture).
    """
    if on_error not in ("raise", "skip"):
        raise ShoestringError(
            f"on_error must be 'raise' or 'skip', got {on_error!r}", where="data.on_error"
        )
    if split_on not in SPLIT_ON:
        raise ShoestringError(
            f"split_on must be one of {', '.join(SPLIT_ON)}, got {split_on!r}",
            where="data.split_on",
        )
    stats = stats if stats is not None else ReadStats()
    report = _reporter(on_error, stats)
    opts = ReadOptions(text_field=text_field, split_on=split_on, max_chars=max_chars,
                       label_field=label_field)
    for source in resolve_sources(specs):
        for doc in split_long(_read_source(source, opts, report, stats), max_chars, stats):
            stats.documents += 1
            yield doc


class Read:
    """Prep's reader: the documents of ``specs`` in order, read with ``cfg``'s settings;
    ``stats`` count what it read and skipped, and `report` is its record in the manifest."""

    name = "read"

    def __init__(self, specs: list[str], cfg: DataConfig, label_field: str | None = None) -> None:
        self.specs, self.cfg, self.label_field = specs, cfg, label_field
        self.stats = ReadStats()

    def __iter__(self) -> Iterator[Document]:
        cfg = self.cfg
        return iter_documents(self.specs, text_field=cfg.text_field, on_error=cfg.on_error,
                              stats=self.stats, split_on=cfg.split_on,
                              max_chars=cfg.max_document_chars, label_field=self.label_field)

    def report(self) -> dict[str, Any]:
        return self.stats.record(self.cfg.max_document_chars)


def _reporter(on_error: str, stats: ReadStats) -> Report:
    def report(err: ShoestringError) -> None:
        if on_error == "raise":
            raise err
        stats.skipped.append(f"{err.where}: {err.what}" if err.where else err.what)

    return report


def _read_source(
    source: str, opts: ReadOptions, report: Report, stats: ReadStats
) -> Iterator[Document]:
    if source.startswith(_BUILTIN_PREFIX):
        stats.files += 1
        return _read_builtin(source[len(_BUILTIN_PREFIX) :])
    if source.startswith(HF_PREFIX):
        return read_hf(source, opts, report, stats)
    return reader_for(source)(source, opts, report, stats)


def _read_builtin(name: str) -> Iterator[Document]:
    from shoestring.data.builtin import iter_pydocs

    readers = {"pydocs": iter_pydocs}
    return readers[name]()


# --- resolving -------------------------------------------------------------------------


def _resolve_one(spec: str) -> list[str]:
    if spec.startswith(_BUILTIN_PREFIX):
        _check_builtin(spec)
        return [spec]
    if spec.startswith(HF_PREFIX):
        parse_hf_spec(spec)  # syntax only: opening it may need the network
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
        fix="check the path (it is relative to the current folder); "
        "hf:NAME for a Hugging Face dataset, builtin:pydocs for the embedded corpus",
    )


def _check_builtin(spec: str) -> None:
    name = spec[len(_BUILTIN_PREFIX) :]
    if name not in BUILTINS:
        known = ", ".join(f"{_BUILTIN_PREFIX}{n} ({d})" for n, d in BUILTINS.items())
        raise ShoestringError(f"unknown builtin corpus '{name}'", where=spec, fix=f"known: {known}")


def _supported(path: Path) -> bool:
    try:
        inner, compression = split_suffix(path.name)
    except ShoestringError:
        return False
    return inner in SUPPORTED_SUFFIXES and not (compression and inner == ".parquet")


def _check_suffix(path: Path, spec: str) -> None:
    inner, compression = split_suffix(str(path))  # raises for .xz, .zip, ...
    if inner == ".parquet" and compression:
        raise ShoestringError(
            "compressed Parquet is not read (Parquet compresses internally)",
            where=spec, fix="decompress the file to plain .parquet",
        )
    if inner not in SUPPORTED_SUFFIXES:
        shown = f"'{inner}'" if inner else "no extension"
        raise ShoestringError(
            f"unsupported file type ({shown})",
            where=spec,
            fix=f"supported: {_SUPPORTED_TEXT}; rename or convert the file",
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
            fix=f"supported file types: {_SUPPORTED_TEXT}",
        )
    return sorted(files)


def _expand_folder(path: Path, spec: str) -> list[str]:
    files = _walk_folder(path)
    if not files:
        raise ShoestringError(
            "the folder has no readable files",
            where=spec,
            fix=f"put {_SUPPORTED_TEXT} files in it (subfolders are searched; "
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
