"""Atomic writes: a file or folder is complete or absent, never half-written.

Write to a temporary sibling, flush it to disk, then rename over the target (rename is atomic
on POSIX filesystems); folders are built beside their target and swapped in. Outputs are only
ever replaced when they are shoestring's own. And the readers beside them: YAML, whose errors
name the file (and the line of a syntax error), and a JSON object where damaged means absent.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from shoestring.errors import ShoestringError


# What a filesystem answers when it cannot take a write: full, over quota, too big a file,
# read-only, or not permitted. These are the user's disk, not a bug: `output_error` turns them
# into a ShoestringError (exit 2, no traceback) wherever they surface.
_FS_REFUSALS = {
    errno.ENOSPC: "free space on that filesystem, or write the output elsewhere",
    errno.EDQUOT: "free space within your quota, or write the output elsewhere",
    errno.EFBIG: "write the output to a filesystem that takes larger files",
    errno.EROFS: "the filesystem is read-only: write the output elsewhere",
    errno.EACCES: "check the permissions of that path, or use another one",
    errno.EPERM: "check the permissions of that path, or use another one",
}


def shoestring_home() -> Path:
    """``$SHOESTRING_HOME`` (``~/.shoestring`` when unset): the measured peaks, compile costs,
    model repository and ONNX caches of this machine, kept across runs."""
    return Path(os.environ.get("SHOESTRING_HOME") or "~/.shoestring").expanduser()


def output_error(exc: BaseException, where: str | Path | None = None) -> ShoestringError | None:
    """The ShoestringError for a filesystem that refused a write (full, read-only, not
    permitted), when ``exc`` is one or wraps one (its cause or context, or a failure of
    torch.distributed.checkpoint's ``CheckpointException``); None for anything else.

    Each command removes its own temporary files on the way out (`building_dir`,
    `write_bytes_atomic`, prep's build folder, checkpoint build folders); this only says why.
    ``where``: the output to name when the error carries no file name (a failed ``write``).
    """
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FS_REFUSALS:
            return ShoestringError(
                f"the filesystem refused: {e.strerror or os.strerror(e.errno)}",
                where=str(e.filename if e.filename is not None else where)
                if e.filename is not None or where is not None else None,
                fix=_FS_REFUSALS[e.errno] + "; nothing half-written was kept",
            )
        if isinstance(e, shutil.Error):  # copytree: [(src, dst, "[Errno 28] ..."), ...]
            todo += [_errno_of(entry) for entry in (e.args[0] if e.args else [])]
        failures = getattr(e, "failures", None)  # DCP: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]  # Ray: .cause
    return None


def _errno_of(entry: object) -> OSError | None:
    """The OSError one of `shutil.copytree`'s error entries (src, dst, message) describes."""
    import re

    if not isinstance(entry, tuple) or len(entry) != 3:
        return None
    m = re.match(r"\[Errno (\d+)\]", str(entry[2]))
    return OSError(int(m.group(1)), os.strerror(int(m.group(1))), str(entry[1])) if m else None


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Any]:
    """A binary file to write ``path``'s new content into: a temporary sibling, synced and
    renamed over ``path`` when the block ends; on any failure (a full disk) it is removed
    and ``path`` keeps its previous content."""
    path = Path(path)
    # A name of its own per writer: two processes writing one file at once (the caches under
    # $SHOESTRING_HOME) must not write into, or rename, each other's temporary file.
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _default_mode())  # mkstemp's is 0600
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _default_mode() -> int:
    """The mode a file created with open() gets here (0o666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def json_cache(path: str | Path) -> Iterator[dict[str, Any]]:
    """A JSON object cache file (under $SHOESTRING_HOME) to read and update in place: the
    block gets its data ({} when absent or damaged) and may change it; the new content is
    written atomically when the block ends. Concurrent updaters take turns on an exclusive
    lock (``path.lock``), so none of their records is lost. Unwritable: nothing is written
    and nothing is raised (a cache is not worth failing a run for)."""
    import fcntl

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "a")
    except OSError:
        yield json_object_or_none(path) or {}
        return
    with lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        data = json_object_or_none(path) or {}
        before = json.dumps(data, sort_keys=True)
        yield data
        if json.dumps(data, sort_keys=True) != before:
            try:
                write_json_atomic(path, data)
            except (OSError, ValueError):
                pass


def unique_paths(paths: list[Any]) -> list[Any]:
    """``paths`` with later mentions of a folder already listed dropped (the same folder by
    another spelling too: ``d`` and ``./d/``), in their first order: a data dir given twice to
    dedup against, or a run given twice to a report, counts once."""
    seen: set[str] = set()
    out = []
    for p in paths:
        key = os.path.realpath(os.path.expanduser(str(p)))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing (`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)


def json_object_or_none(path: str | Path) -> dict[str, Any] | None:
    """A JSON object file's data; None when it is absent, unreadable, not JSON or not an
    object (for callers to whom a damaged file is as good as none)."""
    try:  # NaN and Infinity are not JSON: read as null, so writing the data back never fails
        value = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=lambda c: None)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_yaml(path: str | Path, what: str, fix: str = "check the path") -> Any:
    """The data of a YAML file; a missing, unreadable or invalid one is a ShoestringError
    naming ``what`` it is meant to be, the file, and the line of a syntax error."""
    p = Path(path)
    if not p.is_file():
        raise ShoestringError(f"{what} not found", where=str(p), fix=fix)
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ShoestringError(f"cannot read the {what} ({e})", where=str(p)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise ShoestringError(f"not valid YAML ({e})", where=where) from None


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def save_safetensors(tensors: dict, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file``, then the mode any other file gets (it writes 0600); an
    I/O failure is an OSError with its errno, like any other write's."""
    import re

    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except Exception as e:  # its Rust I/O errors are not OSErrors: make them one (a full disk)
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        Path(path).unlink(missing_ok=True)
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from e
    os.chmod(path, _default_mode())


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


@contextmanager
def building_dir(out: str | Path) -> Iterator[Path]:
    """Build a folder beside ``out`` and swap it in only if the block finishes.

    Yields the empty build folder (``.NAME.partial``); on success it replaces ``out`` via
    `swap_in_dir`, on any failure it is removed and ``out`` is left as it was.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    build = out.parent / f".{out.name}.partial"
    if build.exists():
        shutil.rmtree(build)
    build.mkdir()
    try:
        yield build
        swap_in_dir(build, out)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise


WRITE_PROBE = ".write-probe-"
WRITER_LOCK = ".shoestring.lock"  # `writer_lock`'s file; like a probe, it does not make a folder used


@contextmanager
def writer_lock(folder: str | Path, what: str, enabled: bool = True) -> Iterator[None]:
    """Hold an exclusive OS lock on ``folder`` (``flock`` on its ``.shoestring.lock``) while
    the block runs, so that two processes never write one output at once (their checkpoints
    and metrics would interleave).

    The kernel drops the lock when its process exits, however it exits, so the lock of a
    killed process is simply taken over; the file itself stays (removing it would let a third
    process lock a new file while a second still holds the old one). A second writer gets a
    ShoestringError naming the holder's pid. ``enabled=False`` (the other ranks of a job,
    whose rank 0 holds it) does nothing; a filesystem without locks is written unlocked.
    """
    if not enabled:
        yield
        return
    import fcntl

    folder = Path(folder)
    f = open(folder / WRITER_LOCK, "a+", encoding="utf-8")  # noqa: SIM115 - held for the block
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise ShoestringError(
                f"another process (pid {holder}) is writing this {what}",
                where=str(folder),
                fix="wait for it to finish (or stop it) before writing here; two writers would "
                "interleave checkpoints and metrics",
            ) from None
        except OSError:  # no locks on this filesystem (some network mounts): go on unlocked
            yield
            return
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield
    finally:
        f.close()  # closing the file releases the lock


def check_writable_dir(out: str | Path, kind: str, fix: str) -> None:
    """Create ``out`` and prove a file can be written in it. Every rank of a job probes at
    once before any process group exists, so the probe is named per process and
    `check_output_dir` ignores probes: another rank's must not make the folder look used."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f"{WRITE_PROBE}{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ShoestringError(f"cannot write the {kind} ({e.strerror or e})", where=str(out),
                              fix=fix) from None


def check_output_dir(out: str | Path, kind: str, owned: bool, overwrite: bool) -> None:
    """Refuse to write into a non-empty folder unless it is one of ours (``owned``, e.g. it
    carries our marker) and replacing it was asked for (``overwrite``)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ShoestringError("output path exists and is not a folder", where=str(out))
    if not out.is_dir() or not any(not p.name.startswith(WRITE_PROBE) and p.name != WRITER_LOCK
                                   for p in out.iterdir()):
        return
    if not owned:
        raise ShoestringError(
            f"output folder exists, is not empty and is not a shoestring {kind}",
            where=str(out),
            fix="choose another -o; shoestring only replaces folders it wrote itself",
        )
    if not overwrite:
        raise ShoestringError(
            f"{kind} already exists",
            where=str(out),
            fix="choose another -o, or pass --overwrite to replace it",
        )


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file's bytes, read ``chunk`` bytes at a time (shards and weights
    can be larger than memory): what manifests record and checks compare against."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
