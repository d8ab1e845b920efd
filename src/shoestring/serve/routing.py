"""Which loaded model answers a request: the ``model`` field, resolved per request.

A server is started with one or more models, each a folder path or a repository reference
(``NAME``, ``NAME:VERSION``, ``NAME:TAG``). A request's ``model`` field names one of them
(``NAME`` or ``NAME:SELECTOR``; absent: the first). Repository references are resolved
through the repository on every request, so ``shoestring models tag bert:3 prod`` moves
``bert:prod`` to version 3 on a running server: the first request after it loads version 3
(once; off the event loop) and later ones run on it. Every loaded version has its own
`MicroBatcher` (its own queue and worker thread).

Only names the server was started with can be routed to: a request cannot make the server
load an arbitrary model from the repository.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shoestring.errors import ShoestringError
from shoestring.model_repository import ModelRepository, split_ref
from shoestring.serve.batcher import MicroBatcher
from shoestring.serve.engine import Engine, InputError
from shoestring.serve.metrics import ServeMetrics
from shoestring.serve.settings import ServeSettings

Loader = Callable[[Path], Engine]


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
        raise ShoestringError(
            "no such folder",
            where=arg,
            fix="give a run dir, an export folder, or a repository model NAME",
        )
    repo.resolve(arg)  # fails early, naming what exists
    return Served(name=split_ref(arg)[0], ref=arg)


class ModelRouter:
    """The served models, their loaded versions, and the resolution of a ``model`` field."""

    def __init__(
        self,
        served: list[Served],
        settings: ServeSettings,
        metrics: ServeMetrics,
        loader: Loader,
        repository: ModelRepository | None = None,
    ) -> None:
        if not served:
            raise ValueError("a server needs at least one model")
        self.served = {s.name: s for s in served}
        self.default = served[0]
        self.settings, self.metrics, self.loader = settings, metrics, loader
        self.repository = repository or ModelRepository()
        self.slots: dict[str, Slot] = {}
        self._loading: dict[str, asyncio.Lock] = {}
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
            max_batch_tokens=s.max_batch_tokens,
            max_wait_s=s.max_wait_ms / 1000.0,
            max_queue=s.max_queue,
            pad=engine.pad_batches,
            metrics=self.metrics,
        )
        slot = self.slots[key] = Slot(key, engine, batcher)
        if self.started:
            batcher.start()
        return slot

    def key_of(self, model: str | None) -> tuple[str, Path]:
        """(slot key, folder) that ``model`` names now; InputError naming the field if none."""
        if model is None:
            served, sel = self.default, None
        else:
            name, _, sel = model.partition(":")
            served = self.served.get(name)
            if served is None:
                raise InputError(
                    f"this server serves no model {name!r}; it serves "
                    f"{', '.join(sorted(self.served))}",
                    ("body", "model"),
                )
        if served.ref is None:
            if sel:
                raise InputError(
                    f"{served.name} is served from a folder and has no versions or tags: "
                    f"send model={served.name!r}",
                    ("body", "model"),
                )
            return str(served.path), served.path  # type: ignore[return-value]
        ref = f"{served.name}:{sel}" if sel else served.ref
        try:
            version = self.repository.resolve(ref)
        except ShoestringError as e:
            raise InputError(e.what, ("body", "model")) from None
        return version.ref, version.path

    def load_initial(self) -> None:
        """Load every served model's current version (before the server starts)."""
        for served in self.served.values():
            key, path = self.key_of(None if served is self.default else served.name)
            if key not in self.slots:
                self.add(key, self.loader(path))

    async def slot_for(self, model: str | None) -> Slot:
        """The slot that answers ``model`` now, loading its version on first use."""
        key, path = self.key_of(model)
        slot = self.slots.get(key)
        if slot is not None:
            return slot
        lock = self._loading.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self.slots:
                engine = await asyncio.to_thread(self.loader, path)
                self.add(key, engine)
        return self.slots[key]

    @property
    def default_slot(self) -> Slot:
        return self.slots[self.key_of(None)[0]]

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

    def describe(self) -> list[dict]:
        """Each served model: its current version, every stored version, what is loaded."""
        out = []
        for served in self.served.values():
            entry: dict = {"name": served.name, "default": served is self.default}
            try:
                entry["current"] = self.key_of(served.name)[0]
            except InputError as e:
                entry["current"], entry["error"] = None, e.message
            if served.ref is None:
                entry["source"] = str(served.path)
                entry["versions"] = []
            else:
                entry["ref"] = served.ref
                entry["versions"] = [
                    {
                        "version": v.version,
                        "ref": v.ref,
                        "tags": list(v.tags),
                        "created": v.manifest.get("created"),
                        "sha256": v.manifest.get("sha256"),
                        "metrics": v.manifest.get("metrics", {}),
                        "loaded": v.ref in self.slots,
                    }
                    for v in self.repository.versions(served.name)
                ]
            slot = self.slots.get(entry["current"] or "")
            if slot is not None:
                entry["kind"], entry["tasks"] = slot.engine.kind, sorted(slot.engine.tasks)
            out.append(entry)
        return out
