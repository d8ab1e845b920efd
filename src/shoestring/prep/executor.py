"""What `prep` hands an executor, and how executors are found.

`prep` (``prep/prep.py``) checks the settings, resolves the sources, opens the build folder's
`Journal` and hands an `Executor` a `PrepPlan`; the executor runs the stages and returns the
manifest. ``prep`` names no executor: it looks the ``--executor`` name up in a registry that
each executor's package fills when imported (`register`). The local executor
(``prep/local.py``) registers here; the Ray one (``prep/ray/``) when
``shoestring.prep.ray`` is imported, which `get_executor` does by name the first time
``ray`` is asked for.

A new executor is a module of its own implementing `Executor` (usually by running
``driver.Driver`` with its own stages, see ``prep/driver.py``) plus one `register` call.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Protocol

from rich.console import Console

from shoestring.config import CurateConfig, DataConfig
from shoestring.errors import ShoestringError
from shoestring.fsutil import write_json_atomic

JOURNAL = "journal.json"
WORK_DIR = "work"  # executors' intermediate files other than the spools and streams
STAGES = ("read", "tokenizer", "encode.train", "pack.train", "encode.val", "pack.val")
_FAULT_ENV = "SHOESTRING_PREP_FAULT"  # tests: "STAGE:N" hard-exits after N steps of STAGE


@dataclass(frozen=True)
class PrepPlan:
    """One prep's inputs, settled before any stage runs: what every executor's stages read."""

    specs: list[str]  # the source specs as given (the manifest's ``sources``)
    files: list[str]  # what they resolved to
    build: Path  # the build folder (swapped in as the data dir when complete)
    cfg: DataConfig
    curate: CurateConfig | None
    console: Console


class Executor(Protocol):
    """Runs a `PrepPlan` into its build folder and returns the manifest."""

    name: str  # the --executor name

    def check(self, cfg: DataConfig, curate: CurateConfig | None) -> None:
        """Refuse (``ShoestringError``) settings this executor cannot run, before any
        reading or writing."""

    def session(self) -> ContextManager[Any]:
        """What must be up for the whole prep (a cluster connection), entered before the
        build folder is touched."""

    def run(self, plan: PrepPlan, journal: Journal) -> dict:
        """Build the data dir's files in ``plan.build``; the manifest (also written there)."""

    def build_fingerprint(self, data: str) -> str:
        """The journal's fingerprint from the data's; apart if the build holds files of its own."""


_REGISTRY: dict[str, Callable[[Any], Executor]] = {}
# Executors whose package registers them on import, found by name the first time one is asked
# for (like an entry point): a Python caller's ``prep(..., executor="ray")`` works without an
# import of its own, and nothing here imports them (prep knows no executor).
_PACKAGES = {"local": "shoestring.prep.local", "ray": "shoestring.prep.ray"}


def register(name: str, factory: Callable[[Any], Executor]) -> None:
    """Make ``--executor NAME`` build its executor with ``factory(options)``."""
    _REGISTRY[name] = factory


def get_executor(name: str, options: Any = None) -> Executor:
    """The registered executor ``name`` (its package imported first if it is a known one),
    built with ``options``."""
    if name not in _REGISTRY and name in _PACKAGES:
        importlib.import_module(_PACKAGES[name])
    if name not in _REGISTRY:
        raise ShoestringError(f"unknown executor {name!r}", where="--executor",
                              fix=f"use {' or '.join(sorted({*_REGISTRY, *_PACKAGES}))}")
    return _REGISTRY[name](options)


# --- the journal -----------------------------------------------------------------------


class Journal:
    """Finished stages of one build folder, keyed by the inputs' fingerprint."""

    def __init__(self, build: Path, fingerprint: str) -> None:
        self.path = build / JOURNAL
        self.fingerprint = fingerprint
        self.stages: dict[str, Any] = {}
        self.resumed: list[str] = []

    @classmethod
    def open(cls, build: Path, fingerprint: str) -> Journal:
        """Resume the build folder when its journal matches; otherwise start it afresh."""
        journal = cls(build, fingerprint)
        try:
            data = json.loads(journal.path.read_text(encoding="utf-8"))
            if data.get("fingerprint") == fingerprint:
                journal.stages = dict(data["stages"])
                journal.resumed = list(journal.stages)
                return journal
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if build.is_dir() and any(build.iterdir()) and not journal.path.is_file():
            raise ShoestringError(
                "folder exists and is not an interrupted shoestring prep", where=str(build),
                fix="move it away: prep builds its data dir there")
        if build.exists():
            shutil.rmtree(build)
        build.mkdir(parents=True)
        journal._save()
        return journal

    def get(self, stage: str) -> Any:
        return self.stages.get(stage)

    def put(self, stage: str, value: Any) -> None:
        self.stages[stage] = value
        self._save()

    def restart(self, stage: str) -> None:
        """Forget ``stage`` and every later one (their inputs are about to change)."""
        for name in STAGES[STAGES.index(stage) :]:
            self.stages.pop(name, None)
        self._save()

    def _save(self) -> None:
        write_json_atomic(self.path, {"fingerprint": self.fingerprint, "stages": self.stages})


def fault_point(stage: str, count: int) -> None:
    """Test hook: die like a killed process (no cleanup) after ``count`` steps of ``stage``;
    with ``STAGE:N:wait``, wait there (for a signal) instead."""
    spec = os.environ.get(_FAULT_ENV)
    if spec == f"{stage}:{count}:wait":
        time.sleep(3600)
    if spec and spec == f"{stage}:{count}":
        os._exit(137)


def no_session() -> ContextManager[None]:
    """`Executor.session` for an executor that needs nothing up."""
    return contextlib.nullcontext()
