"""The bodies of `shoestring models push|list|tag|rm|verify`: one call to the model repository
each, and what it prints (any repository file a read skipped something of, on stderr)."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from shoestring.consoles import err, out
from shoestring.errors import ShoestringError
from shoestring.model_repository import ModelRepository


def push(source: Path, name: str) -> None:
    """Store ``source`` as the next version of ``name``, or say it is stored already."""
    version, new = ModelRepository().push(source, name)
    if new:
        out.print(f"stored {version.ref} (sha256 {version.manifest['sha256'][:12]}) in {version.path.parent}",
                  soft_wrap=True, highlight=False)
    else:
        out.print(f"{source} is already stored as {version.ref}: nothing to do", highlight=False)


def list_versions(name: str | None) -> None:
    """A table of the stored versions (of ``name``, or all)."""
    repo = ModelRepository()
    versions = repo.versions(name)
    if not versions:
        out.print(f"no models in {repo.root}; store one with: shoestring models push RUN --name NAME",
                  highlight=False)
    else:
        t = Table(box=None, pad_edge=False, header_style="bold")
        for col in ("model", "version", "tags", "created", "kind", "metrics"):
            t.add_column(col)
        for v in versions:
            metrics = " ".join(f"{k}={x:.4g}" for k, x in v.manifest["metrics"].items())
            t.add_row(*(Text(str(c)) for c in (v.name, v.version, ",".join(v.tags),
                                              v.manifest.get("created", ""),
                                              v.manifest.get("kind", ""), metrics)))
        out.print(t)
    _problems(repo)


def _problems(repo: ModelRepository) -> None:
    """Each repository file a read skipped something of, on stderr (one line each)."""
    for path, problem in sorted(repo.problems.items()):
        err.print(f"[yellow]warning:[/] {escape(path)}: {escape(problem)}", soft_wrap=True,
                  highlight=False)


def tag(ref: str, name: str) -> None:
    """Point tag ``name`` at version ``ref``."""
    v = ModelRepository().tag(ref, name)
    out.print(f"{v.name}:{name} → {v.ref}", highlight=False)


def remove(ref: str, force: bool) -> None:
    """Remove a model or one version of it."""
    removed = ModelRepository().remove(ref, force=force)
    out.print(f"removed {', '.join(removed)}", highlight=False)


def verify(ref: str | None) -> None:
    """Check the stored versions (``ref``'s, or all) against their sha256; a ShoestringError
    names those that fail, after every version's line is printed."""
    repo = ModelRepository()
    versions = repo.versions(ref) if ref is None or ":" not in ref else [repo.resolve(ref)]
    if ref and not versions and not repo.unusable:
        repo.resolve(ref)  # raises: no such model
    bad = []
    for v in versions:
        try:
            repo.verify(v)
        except ShoestringError as e:
            bad.append(v.ref)
            out.print(f"{v.ref}  MISMATCH  {e.where}: {e.what}", highlight=False, soft_wrap=True,
                      markup=False)
        else:
            out.print(f"{v.ref}  ok  sha256 {v.manifest['sha256']}", highlight=False, markup=False)
    _problems(repo)
    bad += sorted(repo.unusable)  # versions no manifest (or a link) let us check
    if bad:
        raise ShoestringError(
            f"{len(bad)} stored version(s) failed the check: {', '.join(bad)}",
            where=str(repo.root),
            fix="push each again from its source (shoestring models push SOURCE --name NAME) "
            "and remove the bad version (shoestring models rm NAME:VERSION --force)")
    out.print(f"{len(versions)} version(s) match their recorded sha256", highlight=False)
