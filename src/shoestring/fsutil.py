"""Atomic file writes: a file is complete or absent, never half-written.

Write to a temporary sibling, flush it to disk, then rename over the target (rename is atomic
on POSIX filesystems).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def recover_interrupted_swap(out: str | Path) -> None:
    """A process killed between the two renames of `swap_in_dir` leaves the previous folder
    in ``.NAME.old``: put it back (or drop it, when the new folder did land)."""
    out = Path(out)
    old = out.parent / f".{out.name}.old"
    if old.is_dir() and not out.exists():
        old.rename(out)
    elif old.is_dir():
        shutil.rmtree(old)


def swap_in_dir(build: str | Path, out: str | Path) -> None:
    """Replace folder ``out`` with the finished folder ``build``.

    The previous ``out`` survives (as ``.NAME.old``) until the new one is in place, and is
    put back if the final rename fails.
    """
    build, out = Path(build), Path(out)
    recover_interrupted_swap(out)
    old = out.parent / f".{out.name}.old"
    if out.exists():
        out.rename(old)
    try:
        build.rename(out)
    except BaseException:
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
