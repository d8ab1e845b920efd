"""Which loaded model answers a request: the ``model`` field, resolved per request.

A server is started with one or more models, each a folder path or a repository reference
(``NAME``, ``NAME:VERSION``, ``NAME:TAG``). A request's ``model`` field names one of them
(``NAME`` or ``NAME:SELECTOR``; absent: the first). Repository references are resolved
through the repository on every request, so ``shoestring models tag bert:3 prod`` moves
``bert:prod`` to version 3 on a running server: the first request after it loads version 3
(once; off the event loop) and later ones run on it. Every loaded version has its own
`MicroBatcher` (its own queue and worker thread).

Only names the server was started with can be routed to: a request cannot make the server
load an arbitrary model from the repository. A repository version's files are checked against
the sha256 recorded at push before it is loaded; a version that cannot be served (its tag
points nowhere, its files changed) is answered 503 naming it, and `/readyz` turns 503 while a
served model's current version is such a one.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shoestring.errors import ShoestringError
from shoestring.model_repository import ModelRepository, ModelVersion, split_ref
from shoestring.serve.batcher import GROUP_OVERHEAD_TOKENS, MicroBatcher
from shoestring.inference.engine import Engine, InputError
from shoestring.serve.prometheus import ServeMetrics
from shoestring.serve.settings import ServeSettings

Loader = Callable[[Path], Engine]


class ModelUnavailable(Exception):
    """A served model whose current version cannot be served now (HTTP 503)."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(message)
        self.model, self.message = model, message


class UnknownModel(InputError):
    """A ``model`` field naming no model this server serves: a 422 on the server's own routes;
    the OpenAI and rerank routes answer it 404, as those protocols do."""


@dataclass
class Served:
    """One model the server was started with."""

    name: str  # what a request's ``model`` field names
    ref: str | None  # repository reference (None: a folder path, fixed)
    path: Path | None = None  # the folder, for a path


@dataclass
class Slot:
    """One loaded model version with its batcher."""

    key: str  # "NAME:VERSION" for a repository version, else the folder path
    engine: Engine
    batcher: MicroBatcher


def served_from_arg(arg: str, repo: ModelRepository) -> Served:
    """A CLI argument: an existing folder is a path; anything else a repository reference."""
    path = Path(arg)
    if path.is_dir():
        return Served(name=path.resolve().name, ref=None, path=path)
    if "/" in arg or arg.startswith("."):
        raise ShoestringError("no such folder", where=arg,
                              fix="give a run dir, an export folder, or a repository model NAME")
    repo.resolve(arg)  # fails early, naming what exists
    return Served(name=split_ref(arg)[0], ref=arg)


class ModelRouter:
    """The served models, their loaded versions, and the resolution of a ``model`` field."""

    def __init__(self, served: list[Served], settings: ServeSettings, metrics: ServeMetrics,
                 loader: Loader, repository: ModelRepository | None = None) -> None:
        if not served:
            raise ValueError("a server needs at least one model")
        self.served = {s.name: s for s in served}
        self.default = served[0]
        self.settings, self.metrics, self.loader = settings, metrics, loader
        self.repository = repository or ModelRepository()
        self.slots: dict[str, Slot] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self.failed: dict[str, str] = {}  # slot key → why it could not be loaded
        self.started = False

    @classmethod
    def single(cls, engine: Engine, settings: ServeSettings, metrics: ServeMetrics) -> ModelRouter:
        """A router around one already loaded engine (a folder path)."""
        served = Served(name=Path(engine.source).resolve().name, ref=None, path=Path(engine.source))
        router = cls([served], settings, metrics, loader=lambda p: engine)
        router.add(str(served.path), engine)
        return router

    def add(self, key: str, engine: Engine) -> Slot:
        s = self.settings
        batcher = MicroBatcher(
            engine.run,
            # Unset: the token budget decides (an input is at least one token).
            max_batch_size=s.max_batch_size or s.max_batch_tokens,
            max_batch_tokens=s.max_batch_tokens, max_wait_s=s.max_wait_ms / 1000.0,
            max_queue=s.max_queue, pad=engine.pad_batches, metrics=self.metrics,
            tokenize=engine.tokenize, group_overhead_tokens=engine.call_overhead_tokens
            or GROUP_OVERHEAD_TOKENS)
        engine.stages = self.metrics.stages
        slot = self.slots[key] = Slot(key, engine, batcher)
        if self.started:
            batcher.start()
        return slot

    def target(self, model: str | None) -> tuple[str, Path, ModelVersion | None]:
        """(slot key, folder, repository version or None) that ``model`` names now.

        InputError (422) naming the field for a model or selector the request got wrong;
        `ModelUnavailable` (503) when the served reference itself resolves to nothing."""
        if model is None:
            served, sel = self.default, None
        else:
            name, _, sel = model.partition(":")
            served = self.served.get(name)
            if served is None:
                raise UnknownModel(f"this server serves no model {name!r}; it serves "
                                   f"{', '.join(sorted(self.served))}", ("body", "model"))
        if served.ref is None:
            if sel:
                raise InputError(f"{served.name} is served from a folder and has no versions or "
                                 f"tags: send model={served.name!r}", ("body", "model"))
            return str(served.path), served.path, None  # type: ignore[return-value]
        ref = f"{served.name}:{sel}" if sel else served.ref
        try:
            version = self.repository.resolve(ref)
        except ShoestringError as e:
            if sel:
                raise InputError(e.what, ("body", "model")) from None
            raise ModelUnavailable(ref, f"{ref} cannot be served now: {e.what}") from None
        return version.ref, version.path, version

    def _load(self, path: Path, version: ModelVersion | None) -> Engine:
        """The engine for one version, its files checked against the pushed sha256 first."""
        if version is not None:
            self.repository.verify(version)
        return self.loader(path)

    def _current(self, served: Served) -> tuple[str, Path, ModelVersion | None]:
        return self.target(None if served is self.default else served.name)

    def load_initial(self) -> None:
        """Load every served model's current version (before the server starts)."""
        for served in self.served.values():
            key, path, version = self._current(served)
            if key not in self.slots:
                self.add(key, self._load(path, version))

    def loaded(self, model: str | None) -> Slot | None:
        """The slot that answers ``model`` now if it is loaded (nothing to await), else None."""
        return self.slots.get(self.target(model)[0])

    async def slot_for(self, model: str | None) -> Slot:
        """The slot that answers ``model`` now, loading its version on first use (a version
        that failed to load is answered 503 from then on, without trying again)."""
        key, path, version = self.target(model)
        slot = self.slots.get(key)
        if slot is not None:
            return slot
        lock = self._loading.setdefault(key, asyncio.Lock())
        async with lock:
            if key in self.failed:
                raise ModelUnavailable(key, self.failed[key])
            if key not in self.slots:
                try:
                    engine = await asyncio.to_thread(self._load, path, version)
                except Exception as e:  # noqa: BLE001 - any load failure: 503 naming it
                    why = e.message if isinstance(e, ShoestringError) else f"{type(e).__name__}: {e}"
                    self.failed[key] = f"{key} cannot be served: {why}"
                    raise ModelUnavailable(key, self.failed[key]) from None
                self.add(key, engine)
        return self.slots[key]

    def unservable(self) -> list[str]:
        """Why each served model's current version cannot be served now (empty: all can)."""
        out = []
        for served in self.served.values():
            try:
                key = self._current(served)[0]
            except (ModelUnavailable, InputError) as e:
                out.append(e.message)
                continue
            if key in self.failed:
                out.append(self.failed[key])
        return out

    def current_slots(self) -> list[Slot]:
        """Each served model's current version, loaded (after `load_initial`), default first."""
        return [self.slots[self._current(served)[0]] for served in self.served.values()]

    @property
    def default_slot(self) -> Slot:
        return self.slots[self.target(None)[0]]

    def start(self) -> None:
        self.started = True
        for slot in self.slots.values():
            slot.batcher.start()

    def close(self, drain: bool, timeout: float | None) -> None:
        for slot in list(self.slots.values()):
            slot.batcher.close(drain, timeout)

    # --- totals for gauges and health --------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return sum(s.batcher.queue_depth for s in self.slots.values())

    @property
    def in_flight(self) -> int:
        return sum(s.batcher.in_flight for s in self.slots.values())

    @property
    def accepting(self) -> bool:
        return all(s.batcher.accepting for s in self.slots.values())

    def able(self, can: Callable[[Engine], bool]) -> list[str]:
        """The served models whose current version is loaded and ``can`` do something."""
        out = []
        for name in self.served:
            try:
                slot = self.loaded(name)
            except (InputError, ModelUnavailable):
                continue
            if slot is not None and can(slot.engine):
                out.append(name)
        return out

    def model_objects(self) -> list[dict]:
        """Each served model as OpenAI's model object (what ``client.models.list()`` reads):
        ``created`` is when its folder last changed."""
        out = []
        for served in self.served.values():
            folder = served.path or self.repository.root / served.name
            try:
                created = int(folder.stat().st_mtime)
            except OSError:
                created = 0
            out.append({"id": served.name, "object": "model", "created": created,
                        "owned_by": "shoestring"})
        return out

    def describe(self) -> list[dict]:
        """Each served model: its current version, every stored version, what is loaded."""
        out = []
        for served in self.served.values():
            entry: dict = {"name": served.name, "default": served is self.default}
            try:
                entry["current"] = self.target(served.name)[0]
            except (InputError, ModelUnavailable) as e:
                entry["current"], entry["error"] = None, e.message
            if served.ref is None:
                entry["source"] = str(served.path)
                entry["versions"] = []
            else:
                entry["ref"] = served.ref
                try:
                    stored = self.repository.versions(served.name)
                except ShoestringError as e:
                    stored, entry["error"] = [], e.message
                entry["versions"] = [
                    {"version": v.version, "ref": v.ref, "tags": list(v.tags),
                     "created": v.manifest.get("created"), "sha256": v.manifest.get("sha256"),
                     "metrics": v.manifest.get("metrics", {}), "loaded": v.ref in self.slots}
                    for v in stored]
                folder = str(self.repository.root / served.name)
                entry["problems"] = {path: problem for path, problem
                                     in sorted(self.repository.problems.items())
                                     if path.startswith(folder + os.sep)}
            if entry["current"] in self.failed:
                entry["error"] = self.failed[entry["current"]]
            slot = self.slots.get(entry["current"] or "")
            if slot is not None:
                entry["kind"], entry["tasks"] = slot.engine.kind, sorted(slot.engine.tasks)
            out.append(entry)
        return out
