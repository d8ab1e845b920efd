"""`shoestring prep`: sources → clean → curate → split → tokenizer → encode → pack → shards.

The data dir is built in ``.DATA.partial`` beside ``DATA`` and swapped in only when complete,
so an existing data dir is never left half-written. Each stage leaves its output in the build
folder and records it in ``journal.json`` there:

=========  ===========================================================  =====================
stage      output                                                       resumes
=========  ===========================================================  =====================
read       ``spool-{train,val}.jsonl``: cleaned, kept documents         from the start
tokenizer  ``tokenizer.json``                                           kept when finished
encode     ``stream-{split}.bin`` (token ids; each document followed    from the last batch
           by [SEP] / <|endoftext|>), ``docs-{split}.bin`` (its ends)   written
pack       ``{split}/NNNNN.bin`` + ``.idx`` shards                      shard by shard; kept
                                                                        shards re-verified
                                                                        by sha256
=========  ===========================================================  =====================

A re-run with the same inputs and settings (the journal's fingerprint) after an interruption
(Ctrl-C, a crash, a kill) continues from there and produces the same bytes as an
uninterrupted run. A run with other inputs, or a bad-input error, discards the build folder.

Streaming: memory holds a bounded number of document batches, never the corpus (the sort
order holds one float per sequence), and no document longer than ``data.max_document_chars``
(longer ones are cut while they are read, see `readers.Splitter`). ``data.workers`` > 1 spreads cleaning and tokenizing
over processes; results are consumed in order, so the output is identical to 1 worker.

This module checks, resolves, journals and swaps in; the stages run in an executor
(``prep/executor.py``): the table above is the local one's (``prep/local.py``), over the
stage order both share (``prep/driver.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from shoestring.artifacts import Kind, identify
from shoestring.config import CurateConfig, DataConfig
from shoestring.prep.executor import JOURNAL, WORK_DIR, Executor, Journal, PrepPlan, get_executor
from shoestring.data.datadir import data_fingerprint
from shoestring.data.mixture import SourceMatcher, mixture_inputs
from shoestring.data.sources import resolve_sources
from shoestring.config import TOKENIZER_KINDS
from shoestring.errors import ShoestringError
from shoestring.fsutil import check_output_dir, output_error
from shoestring.fsutil import recover_interrupted_swap, swap_in_dir


def build_dir(out: Path) -> Path:
    """Where prep builds (and an interrupted prep keeps) the data dir ``out``."""
    return out.parent / f".{out.name}.partial"


def _is_data_dir(path: Path) -> bool:
    """What the one artifact opener calls a data dir (``artifacts.identify``)."""
    try:
        return identify(path).kind is Kind.DATA
    except ShoestringError:  # missing, not a folder, or no kind at all
        return False


def _check_not_deduped_against(out: Path, curate: CurateConfig | None) -> None:
    """Refuse an output that is, holds or lies inside a ``--dedup-against`` data dir: the
    build would replace the folder its own documents are checked against, and with
    ``--overwrite`` keep only what that folder did not already hold (2,900 documents became
    96, exit 0, in issue 52)."""
    target = out.resolve()
    for d in curate.dedup_against if curate is not None else []:
        earlier = Path(d).resolve()
        if not _is_data_dir(earlier):
            continue  # not a data dir: the curator's own check says so
        how = ("the same folder as" if target == earlier else
               "inside" if earlier in target.parents else
               "a folder holding" if target in earlier.parents else None)
        if how is not None:
            raise ShoestringError(
                f"-o {out} is {how} the --dedup-against data dir {d}: writing it would "
                "replace what it is deduplicated against", where="--dedup-against",
                fix="write the new data dir to another folder (-o), then point later preps "
                "at both")


def _check_settings(cfg: DataConfig, curate: CurateConfig | None) -> None:
    """Problems with the settings, found before any reading (a missing optional package
    included: docs/data.md promises every spec is checked before reading)."""
    if curate is not None and curate.dedup == "substring":
        from shoestring.prep.curate.substring import check_installed

        check_installed()
    path = cfg.tokenizer_file
    if path is not None and not Path(path).is_file():
        raise ShoestringError(
            f"data.tokenizer is neither a kind nor an existing file: {path!r}",
            where="data.tokenizer",
            fix=f"use auto, {', '.join(TOKENIZER_KINDS)}, or the path of a tokenizer.json",
        )
    kind = cfg.family.tokenizer_kind if cfg.tokenizer == "auto" else cfg.tokenizer
    if kind == "bpe" and cfg.vocab_size < 256 + 8:
        raise ShoestringError(
            f"byte-level BPE needs data.vocab_size above 256 (the bytes), got {cfg.vocab_size}",
            where="data.vocab_size", fix="raise data.vocab_size (e.g. 8192)",
        )
    if cfg.row_body <= 0:
        raise ShoestringError("data.seq_len must leave room for [CLS] and [SEP]",
                              where="data.seq_len")


def _check_mixture(cfg: DataConfig, curate: CurateConfig | None, files: list[str]) -> None:
    """What a data mixture cannot be combined with, and sources that could take no document
    (a file in two sources, value sources with no input of their own), found before any
    reading."""
    if cfg.mixture is None:
        return
    if curate is not None and curate.canaries:
        raise ShoestringError("--canaries with a data.mixture is not supported (a canary "
                              "document has no source)", where="curate.canaries",
                              fix="prep the canary audit corpus without --mix")
    SourceMatcher(cfg.mixture).check_inputs(files)


@contextlib.contextmanager
def _freed_on_disk_error(build: Path, out: Path) -> Iterator[None]:
    """A full or read-only disk: remove the build folder (it is what fills the disk; a
    re-run starts over) and raise the standard error naming ``out``. Other errors pass."""
    try:
        yield
    except OSError as e:
        refused = output_error(e, where=out)
        if refused is not None:
            shutil.rmtree(build, ignore_errors=True)
            raise refused from None
        raise


def prep(
    specs: list[str], out: str | Path, cfg: DataConfig, console: Console | None = None,
    curate: CurateConfig | None = None, overwrite: bool = False,
    executor: str | Executor = "local", executor_options: Any = None,
) -> dict:
    """Build a data dir at ``out`` from source specs; returns the manifest.

    An existing data dir at ``out`` is replaced only with ``overwrite`` (and only when it is
    a shoestring data dir).

    Resumes an interrupted build of the same inputs (see the module docstring).
    ``curate`` adds the curation blocks (filters, dedup, decontamination; see
    ``shoestring.prep.curate``); None runs none of them.

    ``executor`` runs the stages (``prep/executor.py``): an `Executor`, or the name of a
    registered one built with ``executor_options`` — ``"local"`` (this machine) or ``"ray"``
    (a Ray cluster; its options a ``RayOptions``; see docs/data.md), each found by name.
    """
    console = console or Console(stderr=True)
    out = Path(out)
    recover_interrupted_swap(out)
    check_output_dir(out, "data dir", owned=_is_data_dir(out), overwrite=overwrite)
    _check_not_deduped_against(out, curate)
    _check_settings(cfg, curate)
    runner = get_executor(executor, executor_options) if isinstance(executor, str) else executor
    runner.check(cfg, curate)  # refuses what it cannot run, before any writing
    specs = mixture_inputs(specs, cfg.mixture)
    files = resolve_sources(specs)
    _check_mixture(cfg, curate, files)
    out.parent.mkdir(parents=True, exist_ok=True)
    build = build_dir(out)
    fingerprint = data_fingerprint(specs, cfg, curate, files)
    fingerprint = runner.build_fingerprint(fingerprint)
    with ExitStack() as session:
        session.enter_context(runner.session())  # a cluster first: unreachable, no build
        with _freed_on_disk_error(build, out):
            journal = Journal.open(build, fingerprint)
        if journal.resumed:
            console.print(f"resuming an interrupted prep in {build} "
                          f"(finished: {', '.join(journal.resumed)})")
        try:
            with _freed_on_disk_error(build, out):
                manifest = runner.run(PrepPlan(specs, files, build, cfg, curate, console),
                                      journal)
        except ShoestringError:
            shutil.rmtree(build, ignore_errors=True)  # bad input: a re-run would fail the same
            raise
    # Anything else (Ctrl-C, a crash) keeps the build folder, so a re-run resumes.
    for name in os.listdir(build):
        if name.startswith(("spool-", "stream-", "docs-")) or name == JOURNAL:
            (build / name).unlink()
        elif name == WORK_DIR:  # executors' intermediate files
            shutil.rmtree(build / name)
    swap_in_dir(build, out)
    return manifest
