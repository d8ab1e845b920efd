"""Open a possibly compressed file as a stream of decompressed bytes.

Compression is decided by the file's first bytes (its magic number), not only its name: a
``.jsonl`` that is really gzip is read correctly, a ``.gz`` that is not gzip is an error that
says so, and formats we cannot read (xz, zip, lz4, 7z) are named instead of being parsed as
garbage. Supported: gzip (``.gz``), Zstandard (``.zst``), bzip2 (``.bz2``).
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
from typing import BinaryIO

from shoestring.errors import ShoestringError

#: extension → compression name, for the ones we read
COMPRESSED_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".bz2": "bzip2"}
#: extensions of compressions we recognise but do not read
UNSUPPORTED_SUFFIXES = {
    ".xz": "xz", ".lzma": "xz", ".zip": "zip", ".lz4": "lz4", ".7z": "7z", ".br": "brotli",
    ".zstd": "zstd",
}

_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"PK\x03\x04", "zip"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"7z\xbc\xaf\x27\x1c", "7z"),
)
_READABLE = frozenset(COMPRESSED_SUFFIXES.values())
_FIX = "decompress it first, or recompress it as .gz, .zst or .bz2"


def sniff(head: bytes) -> str | None:
    """The compression named by the magic number at the start of ``head``, or None."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


def split_suffix(name: str) -> tuple[str, str | None]:
    """``data.jsonl.gz`` → (``.jsonl``, ``gzip``); ``data.txt`` → (``.txt``, None).

    Raises for a compression suffix we recognise but cannot read (``.xz``, ``.zip``...).
    """
    lower = os.path.basename(name).lower()
    dot = lower.rfind(".")
    outer = lower[dot:] if dot > 0 else ""
    if outer in UNSUPPORTED_SUFFIXES:
        raise ShoestringError(
            f"unsupported compression ({UNSUPPORTED_SUFFIXES[outer]})", where=name, fix=_FIX
        )
    if outer in COMPRESSED_SUFFIXES:
        inner = lower[:dot]
        idot = inner.rfind(".")
        return (inner[idot:] if idot > 0 else ""), COMPRESSED_SUFFIXES[outer]
    return outer, None


def open_decompressed(path: str, raw: BinaryIO) -> BinaryIO:
    """Wrap the open binary file ``raw`` so reads return decompressed bytes.

    ``raw`` must be at its start; the choice is made from its first bytes and checked against
    the file name's compression suffix.
    """
    head = raw.read(8)
    raw.seek(0)
    found = sniff(head)
    _, named = split_suffix(path)
    if found is not None and found not in _READABLE:
        raise ShoestringError(f"unsupported compression ({found}, by its first bytes)",
                              where=path, fix=_FIX)
    if named is not None and found != named:
        what = f"{found} data" if found else f"not {named} data (it starts with {head[:4].hex(' ')})"
        if found is None:
            raise ShoestringError(
                f"the name says {named}, but the file is {what}",
                where=path,
                fix="rename the file to match its contents, or re-download it (it may be truncated "
                "or not compressed at all)",
            )
    if found == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if found == "bzip2":
        return bz2.BZ2File(raw, mode="rb")  # type: ignore[return-value]
    if found == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader, buffer_size=1 << 16)  # type: ignore[arg-type]
    return raw


#: errors the decompressors raise on damaged data (zstd raises its own ZstdError)
def decompression_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [EOFError, gzip.BadGzipFile, OSError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstandard is a dependency
        pass
    return tuple(errors)
