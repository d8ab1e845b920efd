"""A local model repository: named models, numbered versions, movable tags (BentoML's idea).

Layout, all under one folder (``$SHOESTRING_HOME/models``, default ``~/.shoestring/models``)::

    NAME/1/manifest.json      content hash, created time, source, kind, eval metrics
    NAME/1/model/             a servable folder: a run dir's final/ or an export/classifier
    NAME/tags.json            {"prod": 1, ...}

Every write is atomic: a version is built in a hidden sibling and renamed into place (a
reader sees it complete or not at all; a concurrent push that loses the race for a number
takes the next one, and one of identical content gets the stored version), ``tags.json`` is
replaced whole, and removal renames before deleting. Versions are immutable; a tag is the one
movable pointer, which is what lets a running server follow ``NAME:prod`` to a new version
without a restart (`resolve` is re-read per request, cheaply: ``tags.json`` is cached by its
modification time).

What is read is not trusted blindly (docs/security.md): every model name, tag and selector
passes `check_name` before it touches the filesystem (no ``..``, ``/`` or absolute paths),
symbolic links in place of a model's or a version's folder are refused, a ``tags.json`` or
``manifest.json`` that does not parse or holds a bad entry is reported by name
(`ModelRepository.problems`) and that entry skipped while the rest keeps working, and a
version's files are checked against the sha256 recorded at push (`ModelRepository.verify`)
before a server loads them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
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

from shoestring.artifacts import Kind, identify
from shoestring.errors import ShoestringError
from shoestring.fsutil import json_object_or_none, shoestring_home, write_json_atomic
from shoestring.rundir import RunDir

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
LATEST = "latest"  # an implicit tag: the highest version


def default_root() -> Path:
    """``$SHOESTRING_HOME/models`` (``~/.shoestring/models`` when the variable is unset)."""
    return shoestring_home() / "models"


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

    @property
    def content_dir(self) -> Path:
        """The folder whose files the manifest's sha256 covers (what push hashed)."""
        return self.path / "final" if self.manifest.get("kind") == "run" else self.path


def check_name(value: str, what: str) -> str:
    """``value`` if it is a valid model name or tag, else a ShoestringError saying what is
    allowed. The one gate every name and tag passes before it becomes part of a path: the
    pattern has no ``/``, cannot start with ``.``, so ``..`` and absolute paths are refused."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ShoestringError(f"{what} {value!r} is not allowed", fix="use lower-case letters, "
                              "digits, '.', '_' and '-' (starting with a letter or digit, at most "
                              "64 characters)")
    return value


def split_ref(ref: str) -> tuple[str, str]:
    """``NAME[:VERSION|:TAG]`` → (name, selector), both checked; the selector defaults to
    ``latest``."""
    name, _, sel = ref.partition(":")
    check_name(name, "model name")
    sel = sel or LATEST
    if not sel.isdigit():
        check_name(sel, "tag")
    return name, sel


def _servable(source: Path) -> tuple[str, Path]:
    """(kind, folder to copy) for a run dir or an export/classifier folder; else an error."""
    artifact = identify(source, want=(Kind.RUN, Kind.EXPORT, Kind.CLASSIFIER),
                        command="shoestring models push", trained=True)
    return ("run", artifact.model_dir) if artifact.kind is Kind.RUN else ("folder", artifact.path)


def content_hash(folder: Path) -> str:
    """sha256 over the folder's relative file names and bytes, in sorted order."""
    h = hashlib.sha256()
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(folder)).encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# decoder_eval.json nests its numbers: (section, key) → the metric's name in the manifest.
_DECODER_METRICS = {
    ("perplexity", "loss"): "loss",
    ("perplexity", "perplexity"): "perplexity",
    ("perplexity", "bits_per_byte"): "bits_per_byte",
    ("multiple_choice", "accuracy"): "mc_accuracy",
    ("multiple_choice", "accuracy_norm"): "mc_accuracy_norm",
}


def _eval_metrics(source: Path, kind: str) -> dict[str, float]:
    """The finite numbers of a run's eval results: eval.json's top level (MLM) and
    decoder_eval.json's perplexity and multiple-choice sections (decoder)."""
    if kind != "run":
        return {}
    run = RunDir(source)
    metrics: dict[str, float] = {}
    for path in (run.eval_path, run.decoder_eval_path):
        data = json_object_or_none(path)
        if data is None:
            continue
        metrics.update({k: v for k, v in data.items() if _finite(v)})
        for (section, key), name in _DECODER_METRICS.items():
            value = data.get(section, {}).get(key) if isinstance(data.get(section), dict) else None
            if _finite(value):
                metrics[name] = value
    return metrics


class ModelRepository:
    """The models under ``root``; every method validates names and says what to do.

    ``problems`` maps a repository file to what is wrong with it, for every bad file or entry
    the last reads skipped (`models list` and `models verify` show them; a server lists them
    under ``/v1/models``); ``unusable`` holds those that made a whole version unusable.
    """

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self._tags_cache: dict[str, tuple[tuple[int, int], dict[str, int]]] = {}
        self.problems: dict[str, str] = {}
        self.unusable: dict[str, str] = {}  # the problems that made a version unusable

    # --- paths: every one goes through here ----------------------------------------------------

    def _model_dir(self, name: str) -> Path:
        """``root/NAME`` for a checked name; a symbolic link there is refused (it could point
        anywhere, and rm would delete what it points to)."""
        folder = self.root / check_name(name, "model name")
        _no_link(folder, f"model {name!r}")
        return folder

    def _version_dir(self, name: str, version: int) -> Path:
        folder = self._model_dir(name) / str(int(version))
        _no_link(folder, f"{name}:{version}")
        return folder

    def _note(self, path: Path, problem: str | None, unusable: bool = False) -> None:
        """Record (or clear, with None) what is wrong with a repository file; ``unusable``:
        a whole version was skipped for it."""
        self.problems.pop(str(path), None)
        self.unusable.pop(str(path), None)
        if problem is not None:
            self.problems[str(path)] = problem
            if unusable:
                self.unusable[str(path)] = problem

    # --- reading -------------------------------------------------------------------------------

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            if not (NAME_RE.match(p.name) and p.is_dir()):
                continue
            if p.is_symlink():
                self._note(p, f"skipped: a symbolic link (to {os.readlink(p)}), not a model folder")
                continue
            out.append(p.name)
        return sorted(out)

    def _versions(self, name: str) -> list[int]:
        folder = self._model_dir(name)
        if not folder.is_dir():
            return []
        out = []
        for p in folder.iterdir():
            if not p.name.isdigit():
                continue
            if p.is_symlink():
                self._note(p, f"skipped: a symbolic link (to {os.readlink(p)}), not a version",
                           unusable=True)
            elif (p / "manifest.json").is_file():
                out.append(int(p.name))
        return sorted(out)

    def tags(self, name: str) -> dict[str, int]:
        """``tags.json`` of ``name``: tag → version. A file that does not parse, or an entry
        that is not ``"tag": number``, is recorded in `problems` and skipped."""
        path = self._model_dir(name) / "tags.json"
        try:
            st = path.stat()
        except FileNotFoundError:
            self._note(path, None)
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._tags_cache.get(name)
        if cached and cached[0] == stamp:
            return dict(cached[1])
        tags: dict[str, int] = {}
        bad: list[str] = []
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            why = f"cannot be read ({type(e).__name__}: {e}); every tag of {name} skipped"
            data, bad = {}, [why]
        if not isinstance(data, dict):
            data, bad = {}, [f"is not a JSON object; every tag of {name} skipped"]
        for tag, version in data.items():
            if not NAME_RE.match(tag) or tag.isdigit() or tag == LATEST:
                bad.append(f"tag {tag!r} skipped (not an allowed tag name)")
            elif not isinstance(version, int) or isinstance(version, bool) or version < 1:
                bad.append(f"tag {tag!r} skipped (points at {version!r}, not a version number)")
            else:
                tags[tag] = version
        self._note(path, "; ".join(bad) or None)
        self._tags_cache[name] = (stamp, tags)
        return dict(tags)

    def _manifest(self, name: str, version: int) -> tuple[dict[str, Any] | None, str | None]:
        """(manifest, None), or (None, what is wrong with it); bad metric entries are dropped
        (and recorded in `problems`)."""
        path = self._version_dir(name, version) / "manifest.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            problem = f"cannot be read ({type(e).__name__}: {e})"
        else:
            problem = _manifest_problem(data)
        if problem is not None:
            self._note(path, f"{name}:{version} skipped: manifest.json {problem}", unusable=True)
            return None, problem
        metrics = data.get("metrics") if isinstance(data.get("metrics"), dict) else {}
        kept = {k: v for k, v in metrics.items() if isinstance(k, str) and _finite(v)}
        dropped = sorted(str(k) for k in metrics if k not in kept)
        self._note(path, f"metrics {', '.join(map(repr, dropped))} skipped (not finite numbers)"
                   if dropped else None)
        return {**data, "metrics": kept}, None

    def get(self, name: str, version: int) -> ModelVersion:
        """One version; a ShoestringError naming its manifest when that cannot be used."""
        manifest, problem = self._manifest(name, version)
        folder = self._version_dir(name, version)
        if manifest is None:
            raise ShoestringError(
                f"{name}:{version} cannot be used: its manifest.json {problem}",
                where=str(folder / "manifest.json"),
                fix=f"push the model again (shoestring models push SOURCE --name {name}) or "
                f"remove this version (shoestring models rm {name}:{version} --force)")
        tags = tuple(sorted(t for t, v in self.tags(name).items() if v == version))
        return ModelVersion(name, version, folder / "model", manifest, tags)

    def versions(self, name: str | None = None) -> list[ModelVersion]:
        """Every usable version (of one model, or of all), oldest first; unusable ones are
        skipped and recorded in `problems`."""
        out = []
        for n in [name] if name else self.names():
            for v in self._versions(n):
                try:
                    out.append(self.get(n, v))
                except ShoestringError:
                    continue
        return out

    def resolve(self, ref: str) -> ModelVersion:
        """``NAME``, ``NAME:VERSION`` or ``NAME:TAG`` → that version (errors say what exists)."""
        name, sel = split_ref(ref)
        versions = self._versions(name)
        if not versions:
            known = ", ".join(self.names()) or "none yet"
            raise ShoestringError(
                f"no model named {name!r} in the repository {self.root} (models: {known})",
                fix=f"store one with: shoestring models push RUN_DIR --name {name}")
        if sel == LATEST:  # the newest usable version (a bad one is skipped and recorded)
            for v in reversed(versions[1:]):
                try:
                    return self.get(name, v)
                except ShoestringError:
                    continue
            return self.get(name, versions[0])  # raises, saying why, if it is bad too
        if sel.isdigit():
            if int(sel) not in versions:
                raise ShoestringError(f"{name} has no version {sel} (versions: "
                                      f"{', '.join(map(str, versions))})")
            return self.get(name, int(sel))
        tags = self.tags(name)
        if sel not in tags:
            raise ShoestringError(
                f"{name} has no tag {sel!r} (tags: {', '.join(sorted(tags)) or 'none'})",
                fix=f"tag a version: shoestring models tag {name}:VERSION {sel}")
        if tags[sel] not in versions:
            raise ShoestringError(
                f"{name}:{sel} points at version {tags[sel]}, which is not in the repository "
                f"(versions: {', '.join(map(str, versions))})",
                fix=f"point it at a stored version: shoestring models tag {name}:VERSION {sel}")
        return self.get(name, tags[sel])

    def verify(self, version: ModelVersion) -> None:
        """Check ``version``'s files against the sha256 recorded at push; a ShoestringError
        with the folder and both hashes if they differ (a changed or corrupted file)."""
        recorded = version.manifest["sha256"]
        actual = content_hash(version.content_dir)
        if actual != recorded:
            raise ShoestringError(
                f"{version.ref}'s files do not match the sha256 recorded when it was pushed "
                f"(recorded {recorded}, now {actual}): a file was changed or corrupted",
                where=str(version.content_dir),
                fix=f"push the model again (shoestring models push SOURCE --name {version.name}) "
                f"and remove this version (shoestring models rm {version.ref} --force)")

    # --- writing -------------------------------------------------------------------------------

    @contextmanager
    def _locked(self, name: str) -> Iterator[Path]:
        """An exclusive lock on one model's folder (tags.json read-modify-write, numbering)."""
        folder = self._model_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        try:  # O_NOFOLLOW: a planted link cannot make the lock create a file elsewhere
            fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise ShoestringError(
                f"cannot lock model {name!r} ({e.strerror})", where=str(folder / ".lock"),
                fix="it must be a plain file the repository can write (remove a link there)",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield folder
        finally:
            os.close(fd)  # releases the lock

    def _same_content(self, name: str, digest: str) -> ModelVersion | None:
        return next((v for v in self.versions(name) if v.manifest["sha256"] == digest), None)

    def push(self, source: str | Path, name: str) -> tuple[ModelVersion, bool]:
        """Store ``source`` as the next version of ``name``; (version, whether it is new).

        Identical content already stored under ``name`` is not stored twice: its version is
        returned with ``False`` (checked again under the lock, so two concurrent pushes of the
        same content make one version).
        """
        check_name(name, "model name")
        source = Path(source)
        kind, folder = _servable(source)
        digest = content_hash(folder)
        existing = self._same_content(name, digest)
        if existing is not None:
            return existing, False
        self._model_dir(name).mkdir(parents=True, exist_ok=True)
        build = self._model_dir(name) / f".push-{uuid.uuid4().hex}"
        try:
            # A run is stored as a run dir (final/ inside), the shape load_engine expects.
            shutil.copytree(folder, build / "model" / "final" if kind == "run" else build / "model")
            manifest = {"name": name, "sha256": digest,
                        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "source": str(source.resolve()), "kind": kind,
                        "metrics": _eval_metrics(source, kind)}
            with self._locked(name) as folder_:
                existing = self._same_content(name, digest)
                if existing is None:
                    version = (self._versions(name) or [0])[-1] + 1
                    manifest["version"] = version
                    write_json_atomic(build / "manifest.json", manifest)
                    os.rename(build, folder_ / str(version))  # atomic: complete or absent
        finally:
            shutil.rmtree(build, ignore_errors=True)  # gone already unless it lost or failed
        return (existing, False) if existing is not None else (self.get(name, version), True)

    def tag(self, ref: str, tag: str) -> ModelVersion:
        """Point ``tag`` at the version ``ref`` names (moving it if it pointed elsewhere)."""
        check_name(tag, "tag")
        if tag.isdigit() or tag == LATEST:
            raise ShoestringError(
                f"tag {tag!r} is reserved (numbers are versions; {LATEST!r} is always the newest)",
                fix="pick another tag")
        target = self.resolve(ref)
        with self._locked(target.name) as folder:
            tags = self.tags(target.name)
            tags[tag] = target.version
            write_json_atomic(folder / "tags.json", tags)
        return self.get(target.name, target.version)

    def remove(self, ref: str, force: bool = False) -> list[str]:
        """Remove ``NAME`` (every version) or ``NAME:VERSION|TAG`` (one); the refs removed.

        A version a tag points at may be what a server serves (``serve NAME:TAG``): it is only
        removed with ``force`` (its tags go with it)."""
        name, _ = split_ref(ref)
        whole = ":" not in ref
        folder = self._model_dir(name)
        if whole:
            numbers = self._versions(name)
            if not numbers and not folder.is_dir():
                self.resolve(name)  # raises: no such model
        else:
            numbers = [self.resolve(ref).version]
        tags = self.tags(name)
        held = sorted(f"{name}:{t} → {name}:{v}" for t, v in tags.items() if v in numbers)
        if held and not force:
            what = name if whole else f"{name}:{numbers[0]}"
            raise ShoestringError(
                f"{what} is tagged ({', '.join(held)}): a server started with a tag serves "
                "it, and would have nothing to serve",
                fix="move the tag first (shoestring models tag NAME:VERSION TAG), or pass "
                "--force to remove it with its tags")
        removed = []
        with self._locked(name):
            if not whole:
                write_json_atomic(folder / "tags.json",
                                  {t: v for t, v in tags.items() if v not in numbers})
            for v in numbers:
                trash = folder / f".rm-{uuid.uuid4().hex}"
                os.rename(self._version_dir(name, v), trash)
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(f"{name}:{v}")
        if whole:
            trash = self.root / f".rm-{uuid.uuid4().hex}"
            os.rename(folder, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return removed


def _no_link(path: Path, what: str) -> None:
    if path.is_symlink():
        raise ShoestringError(
            f"{what} is a symbolic link (to {os.readlink(path)}); the repository only uses "
            "its own folders",
            where=str(path),
            fix="remove the link by hand; store models with shoestring models push")


def _manifest_problem(data: Any) -> str | None:
    """What makes a parsed manifest unusable, or None."""
    if not isinstance(data, dict):
        return "is not a JSON object"
    sha = data.get("sha256")
    if not isinstance(sha, str) or not SHA256_RE.match(sha):
        return f"has no valid sha256 (found {sha!r}), so its files cannot be checked"
    if data.get("kind") not in ("run", "folder"):
        return f"has kind {data.get('kind')!r}, not 'run' or 'folder'"
    return None
