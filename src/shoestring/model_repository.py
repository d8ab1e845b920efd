"""A local model repository: named models, numbered versions, movable tags (BentoML's idea).

Layout, all under one folder (``$SHOESTRING_HOME/models``, default ``~/.shoestring/models``)::

    NAME/1/manifest.json      content hash, created time, source, kind, eval metrics
    NAME/1/model/             a servable folder: a run dir's final/ or an export/classifier
    NAME/tags.json            {"prod": 1, ...}

Every write is atomic: a version is built in a hidden sibling and renamed into place (a
reader sees it complete or not at all; a concurrent push that loses the race for a number
takes the next one), ``tags.json`` is replaced whole, and removal renames before deleting.
Versions are immutable; a tag is the one movable pointer, which is what lets a running
server follow ``NAME:prod`` to a new version without a restart (`resolve` is re-read per
request, cheaply: ``tags.json`` is cached by its modification time).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoestring.errors import ShoestringError
from shoestring.fsutil import write_json_atomic
from shoestring.rundir import RunDir

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
LATEST = "latest"  # an implicit tag: the highest version


def default_root() -> Path:
    """``$SHOESTRING_HOME/models`` (``~/.shoestring/models`` when the variable is unset)."""
    home = os.environ.get("SHOESTRING_HOME") or "~/.shoestring"
    return Path(home).expanduser() / "models"


@dataclass(frozen=True)
class ModelVersion:
    """One stored version: where its servable folder is and what its manifest says."""

    name: str
    version: int
    path: Path  # the servable folder (``model/``)
    manifest: dict[str, Any] = field(hash=False, compare=False)
    tags: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


def split_ref(ref: str) -> tuple[str, str]:
    """``NAME[:VERSION|:TAG]`` → (name, selector); the selector defaults to ``latest``."""
    name, _, sel = ref.partition(":")
    return name, sel or LATEST


def _check_name(value: str, what: str) -> None:
    if not NAME_RE.match(value):
        raise ShoestringError(
            f"{what} {value!r} is not allowed",
            fix="use lower-case letters, digits, '.', '_' and '-' (starting with a letter or "
            "digit, at most 64 characters)",
        )


def _servable(source: Path) -> tuple[str, Path]:
    """(kind, folder to copy) for a run dir or an export/classifier folder; else an error."""
    if not source.is_dir():
        raise ShoestringError(
            "no such folder",
            where=str(source),
            fix="give a run dir (shoestring train -o) or an export folder",
        )
    run = RunDir(source)
    if (run.final_dir / "config.json").is_file():
        return "run", run.final_dir
    if (source / "config.json").is_file() and (source / "tokenizer.json").is_file():
        return "folder", source
    raise ShoestringError(
        "not a model folder (no final/config.json, or config.json + tokenizer.json)",
        where=str(source),
        fix="give a run dir (shoestring train -o), an export (shoestring export -o) or a "
        "classifier folder (shoestring eval)",
    )


def _content_hash(folder: Path) -> str:
    """sha256 over the folder's relative file names and bytes, in sorted order."""
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(folder)).encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def _eval_metrics(source: Path, kind: str) -> dict[str, float]:
    """The numbers of a run's eval results (eval.json, decoder_eval.json), if it has any."""
    if kind != "run":
        return {}
    run = RunDir(source)
    metrics: dict[str, float] = {}
    for path in (run.eval_path, run.decoder_eval_path):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            metrics.update(
                {
                    k: v
                    for k, v in data.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
            )
    return metrics


class ModelRepository:
    """The models under ``root``; every method validates names and says what to do."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self._tags_cache: dict[str, tuple[int, dict[str, int]]] = {}

    # --- reading ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME_RE.match(p.name))

    def _versions(self, name: str) -> list[int]:
        folder = self.root / name
        if not folder.is_dir():
            return []
        return sorted(
            int(p.name)
            for p in folder.iterdir()
            if p.name.isdigit() and (p / "manifest.json").is_file()
        )

    def tags(self, name: str) -> dict[str, int]:
        path = self.root / name / "tags.json"
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        cached = self._tags_cache.get(name)
        if cached and cached[0] == mtime:
            return dict(cached[1])
        data = json.loads(path.read_text(encoding="utf-8"))
        self._tags_cache[name] = (mtime, data)
        return dict(data)

    def get(self, name: str, version: int) -> ModelVersion:
        folder = self.root / name / str(version)
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        tags = tuple(sorted(t for t, v in self.tags(name).items() if v == version))
        return ModelVersion(name, version, folder / "model", manifest, tags)

    def versions(self, name: str | None = None) -> list[ModelVersion]:
        """Every version (of one model, or of all), oldest first."""
        return [
            self.get(n, v) for n in ([name] if name else self.names()) for v in self._versions(n)
        ]

    def resolve(self, ref: str) -> ModelVersion:
        """``NAME``, ``NAME:VERSION`` or ``NAME:TAG`` → that version (errors say what exists)."""
        name, sel = split_ref(ref)
        _check_name(name, "model name")
        versions = self._versions(name)
        if not versions:
            known = ", ".join(self.names()) or "none yet"
            raise ShoestringError(
                f"no model named {name!r} in the repository {self.root} (models: {known})",
                fix=f"store one with: shoestring models push RUN_DIR --name {name}",
            )
        if sel == LATEST:
            return self.get(name, versions[-1])
        if sel.isdigit():
            if int(sel) not in versions:
                raise ShoestringError(
                    f"{name} has no version {sel} (versions: {', '.join(map(str, versions))})"
                )
            return self.get(name, int(sel))
        tags = self.tags(name)
        if sel not in tags:
            raise ShoestringError(
                f"{name} has no tag {sel!r} (tags: {', '.join(sorted(tags)) or 'none'})",
                fix=f"tag a version: shoestring models tag {name}:VERSION {sel}",
            )
        return self.get(name, tags[sel])

    # --- writing ---------------------------------------------------------------------------

    @contextmanager
    def _locked(self, name: str) -> Iterator[Path]:
        """An exclusive lock on one model's folder (tags.json read-modify-write, numbering)."""
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield folder
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def push(self, source: str | Path, name: str) -> tuple[ModelVersion, bool]:
        """Store ``source`` as the next version of ``name``; (version, whether it is new).

        Identical content already stored under ``name`` is not stored twice: its version is
        returned with ``False``.
        """
        _check_name(name, "model name")
        source = Path(source)
        kind, folder = _servable(source)
        digest = _content_hash(folder)
        for v in self.versions(name):
            if v.manifest.get("sha256") == digest:
                return v, False
        (self.root / name).mkdir(parents=True, exist_ok=True)
        build = self.root / name / f".push-{uuid.uuid4().hex}"
        try:
            # A run is stored as a run dir (final/ inside), the shape load_engine expects.
            shutil.copytree(folder, build / "model" / "final" if kind == "run" else build / "model")
            manifest = {
                "name": name,
                "sha256": digest,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "source": str(source.resolve()),
                "kind": kind,
                "metrics": _eval_metrics(source, kind),
            }
            with self._locked(name) as folder_:
                version = (self._versions(name) or [0])[-1] + 1
                manifest["version"] = version
                write_json_atomic(build / "manifest.json", manifest)
                os.rename(build, folder_ / str(version))  # atomic: complete or absent
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
        return self.get(name, version), True

    def tag(self, ref: str, tag: str) -> ModelVersion:
        """Point ``tag`` at the version ``ref`` names (moving it if it pointed elsewhere)."""
        _check_name(tag, "tag")
        if tag.isdigit() or tag == LATEST:
            raise ShoestringError(
                f"tag {tag!r} is reserved (numbers are versions; {LATEST!r} is always the newest)",
                fix="pick another tag",
            )
        target = self.resolve(ref)
        with self._locked(target.name) as folder:
            tags = self.tags(target.name)
            tags[tag] = target.version
            write_json_atomic(folder / "tags.json", tags)
        return self.get(target.name, target.version)

    def remove(self, ref: str) -> list[str]:
        """Remove ``NAME`` (every version) or ``NAME:VERSION|TAG`` (one); the refs removed."""
        name = split_ref(ref)[0]
        whole = ":" not in ref
        targets = self.versions(name) if whole else [self.resolve(ref)]
        if not targets:
            self.resolve(name)  # raises: no such model
        removed = []
        with self._locked(name) as folder:
            if not whole:
                tags = {t: v for t, v in self.tags(name).items() if v != targets[0].version}
                write_json_atomic(folder / "tags.json", tags)
            for v in targets:
                trash = folder / f".rm-{uuid.uuid4().hex}"
                os.rename(folder / str(v.version), trash)
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(v.ref)
        if whole:
            trash = self.root / f".rm-{uuid.uuid4().hex}"
            os.rename(self.root / name, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return removed
