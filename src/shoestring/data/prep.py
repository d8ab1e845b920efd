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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from shoestring import __version__, families
from shoestring.config import CurateConfig, DataConfig
from shoestring.data.datadir import FORMAT
from shoestring.data.mixture import SourceMatcher, mixture_inputs, source_ranges, source_weights
from shoestring.data.packing import doc_offsets, pack_clm, pack_mlm, unigram_sort_order
from shoestring.data.shards import shard_intact, token_dtype, write_shard
from shoestring.data.sources import Document, ReadStats, iter_documents, resolve_sources
from shoestring.data.tokenizer import (
    CLS,
    KINDS,
    SEP,
    default_kind,
    file_sha256,
    load_for_objective,
    load_tokenizer,
    special_ids,
    tokenizer_kind,
    tokenizer_sample,
    train_tokenizer,
)
from shoestring.data.workers import WorkerPool, batched, clean_texts, encode_texts
from shoestring.errors import ShoestringError
from shoestring.fsutil import (
    check_output_dir,
    output_error,
    recover_interrupted_swap,
    swap_in_dir,
    write_json_atomic,
)
from shoestring.progress import progress_bar

CLEAN_BATCH = 256
ENCODE_BATCH = 1024
# Encodings cost ~150 bytes per token until converted: cap a batch at ~512K characters.
ENCODE_CHARS = 1 << 19
# Tokenizing is journaled (resumable) after about this many characters.
CHECKPOINT_CHARS = 1 << 23
_JOURNAL = "journal.json"
DROPPED_IDS = "dropped.tsv"  # curate.dropped_ids: the documents curation dropped
WORK_DIR = "work"  # executors' intermediate files other than the spools and streams
# Fewer validation documents than this: validation is the end of the text instead.
MIN_VAL_DOCUMENTS = 5
_STAGES = ("read", "tokenizer", "encode.train", "pack.train", "encode.val", "pack.val")
_FAULT_ENV = "SHOESTRING_PREP_FAULT"  # tests: "STAGE:N" hard-exits after N steps of STAGE
__all__ = ["data_fingerprint", "is_validation", "pack_clm", "pack_mlm", "prep",
           "unigram_sort_order"]


def is_validation(text: str, val_fraction: float) -> bool:
    """Deterministic split by the document's content hash (duplicates share a split)."""
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    return h / 2**64 < val_fraction


def _fingerprint(specs: list[str], files: list[str], cfg: DataConfig) -> str:
    """What the output depends on: specs, files (size, mtime), settings (not ``workers``)."""
    h = hashlib.sha256()
    settings = cfg.model_dump(mode="json", exclude={"workers"})
    h.update(json.dumps({"specs": specs, "cfg": settings}, sort_keys=True).encode())
    paths = list(files)
    if _tokenizer_path(cfg) is not None:
        paths.append(cfg.tokenizer)
    for f in paths:
        p = Path(f)
        if p.is_file():
            st = p.stat()
            h.update(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
        else:
            h.update(f.encode())
    return h.hexdigest()


def data_fingerprint(specs: list[str], cfg: DataConfig, curate: CurateConfig | None = None,
                     files: list[str] | None = None) -> str:
    """What a data dir was built from (sources, data settings, curation); `cram` reuses a
    data dir whose fingerprint matches, and an interrupted prep resumes only on a match."""
    fingerprint = _fingerprint(specs, resolve_sources(specs) if files is None else files, cfg)
    if curate is not None:  # curation changes the output (and so do the dedup-against dirs)
        settings = json.dumps(curate.model_dump(mode="json", exclude={"explain"}), sort_keys=True)
        if curate.dedup_against:
            settings += json.dumps(_manifest_fingerprints(curate.dedup_against))
        fingerprint = hashlib.sha256(f"{fingerprint}:{settings}".encode()).hexdigest()
    return fingerprint


def _manifest_fingerprints(dirs: list[str]) -> list[str | None]:
    """The fingerprints of data dirs (None where there is no readable manifest)."""
    out: list[str | None] = []
    for d in dirs:
        try:
            out.append(json.loads((Path(d) / "manifest.json").read_text()).get("fingerprint"))
        except (OSError, ValueError):
            out.append(None)
    return out


def build_dir(out: Path) -> Path:
    """Where prep builds (and an interrupted prep keeps) the data dir ``out``."""
    return out.parent / f".{out.name}.partial"


def _is_data_dir(path: Path) -> bool:
    try:
        return json.loads((path / "manifest.json").read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _tokenizer_path(cfg: DataConfig) -> str | None:
    return None if cfg.tokenizer in ("auto", *KINDS) else cfg.tokenizer


def _check_settings(cfg: DataConfig) -> None:
    """Problems with the settings, found before any reading."""
    path = _tokenizer_path(cfg)
    if path is not None and not Path(path).is_file():
        raise ShoestringError(
            f"data.tokenizer is neither a kind nor an existing file: {path!r}",
            where="data.tokenizer",
            fix=f"use auto, {', '.join(KINDS)}, or the path of a tokenizer.json",
        )
    kind = default_kind(cfg.objective) if cfg.tokenizer == "auto" else cfg.tokenizer
    if kind == "bpe" and cfg.vocab_size < 256 + 8:
        raise ShoestringError(
            f"byte-level BPE needs data.vocab_size above 256 (the bytes), got {cfg.vocab_size}",
            where="data.vocab_size", fix="raise data.vocab_size (e.g. 8192)",
        )
    if cfg.seq_len <= families.get(cfg.objective, "data.objective").row_frame:
        raise ShoestringError("data.seq_len must leave room for [CLS] and [SEP]",
                              where="data.seq_len")


def _check_mixture(cfg: DataConfig, curate: CurateConfig | None, executor: str) -> None:
    """What a data mixture cannot be combined with, found before any reading."""
    if cfg.mixture is None:
        return
    if executor != "local":
        raise ShoestringError("data.mixture is prepared by the local executor only",
                              where="--executor", fix="drop --executor ray, or the mixture")
    if curate is not None and curate.canaries:
        raise ShoestringError("--canaries with a data.mixture is not supported (a canary "
                              "document has no source)", where="curate.canaries",
                              fix="prep the canary audit corpus without --mix")


def _drop_on_disk_error(e: OSError, build: Path, out: Path) -> None:
    """A full or read-only disk: remove the build folder (it is what fills the disk; a
    re-run starts over) and raise the standard error naming ``out``. Other errors return."""
    refused = output_error(e, where=out)
    if refused is not None:
        shutil.rmtree(build, ignore_errors=True)
        raise refused from None


@contextlib.contextmanager
def _freed_on_disk_error(build: Path, out: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        _drop_on_disk_error(e, build, out)
        raise


# --- the journal -----------------------------------------------------------------------


class Journal:
    """Finished stages of one build folder, keyed by the inputs' fingerprint."""

    def __init__(self, build: Path, fingerprint: str) -> None:
        self.path = build / _JOURNAL
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
        for name in _STAGES[_STAGES.index(stage) :]:
            self.stages.pop(name, None)
        self._save()

    def _save(self) -> None:
        write_json_atomic(self.path, {"fingerprint": self.fingerprint, "stages": self.stages})


def _fault_point(stage: str, count: int) -> None:
    """Test hook: die like a killed process (no cleanup) after ``count`` steps of ``stage``;
    with ``STAGE:N:wait``, wait there (for a signal) instead."""
    spec = os.environ.get(_FAULT_ENV)
    if spec == f"{stage}:{count}:wait":
        time.sleep(3600)
    if spec and spec == f"{stage}:{count}":
        os._exit(137)


# --- the pipeline ----------------------------------------------------------------------


def prep(
    specs: list[str], out: str | Path, cfg: DataConfig, console: Console | None = None,
    curate: CurateConfig | None = None, overwrite: bool = False, executor: str = "local",
    ray_options: Any = None,
) -> dict:
    """Build a data dir at ``out`` from source specs; returns the manifest.

    An existing data dir at ``out`` is replaced only with ``overwrite`` (and only when it is
    a shoestring data dir).

    Resumes an interrupted build of the same inputs (see the module docstring).
    ``curate`` adds the curation blocks (filters, dedup, decontamination; see
    ``shoestring.data.curate``); None runs none of them.

    ``executor="ray"`` runs the same stages as Ray Data stages on a Ray cluster
    (``ray_options``: a ``shoestring.data.distributed.RayOptions``; see docs/data.md).
    """
    console = console or Console(stderr=True)
    out = Path(out)
    recover_interrupted_swap(out)
    check_output_dir(out, "data dir", owned=_is_data_dir(out), overwrite=overwrite)
    _check_settings(cfg)
    _check_mixture(cfg, curate, executor)
    specs = mixture_inputs(specs, cfg.mixture)
    ray_plan = None
    if executor == "ray":
        from shoestring.data.distributed import RayOptions, plan_ray

        ray_options = ray_options or RayOptions()
        ray_plan = plan_ray(cfg, curate)  # refuses what it cannot run, before any writing
    elif executor != "local":
        raise ShoestringError(f"unknown executor {executor!r}", where="--executor",
                              fix="use local or ray")
    files = resolve_sources(specs)
    out.parent.mkdir(parents=True, exist_ok=True)
    build = build_dir(out)
    fingerprint = data_fingerprint(specs, cfg, curate, files)
    if executor != "local":  # its build folder holds other intermediate files
        fingerprint = hashlib.sha256(f"{fingerprint}:{executor}".encode()).hexdigest()
    with ExitStack() as session:
        if ray_plan is not None:  # connect first: an unreachable cluster touches no build
            from shoestring.data.distributed.executor import ray_session

            session.enter_context(ray_session(ray_options.address))
        with _freed_on_disk_error(build, out):
            journal = Journal.open(build, fingerprint)
        if journal.resumed:
            console.print(f"resuming an interrupted prep in {build} "
                          f"(finished: {', '.join(journal.resumed)})")
        try:
            if ray_plan is not None:
                from shoestring.data.distributed import run_ray

                manifest = run_ray(ray_plan, ray_options, specs, files, build, cfg, console,
                                   journal, curate)
            else:
                with WorkerPool(cfg.workers).start() as pool:
                    manifest = _Pipeline(specs, files, build, cfg, console, journal, pool,
                                         curate).run()
        except ShoestringError:
            shutil.rmtree(build, ignore_errors=True)  # bad input: a re-run would fail the same
            raise
        except OSError as e:  # a full or read-only disk: free what the build took, say why
            _drop_on_disk_error(e, build, out)
            raise
    # Anything else (Ctrl-C, a crash) keeps the build folder, so a re-run resumes.
    for name in os.listdir(build):
        if name.startswith(("spool-", "stream-", "docs-")) or name == _JOURNAL:
            (build / name).unlink()
        elif name == WORK_DIR:  # the ray executor's intermediate files
            shutil.rmtree(build / name)
    swap_in_dir(build, out)
    return manifest


class _Pipeline:
    def __init__(self, specs: list[str], files: list[str], build: Path, cfg: DataConfig,
                 console: Console, journal: Journal, pool: WorkerPool,
                 curate: CurateConfig | None = None) -> None:
        self.specs, self.files, self.build, self.cfg = specs, files, build, cfg
        self.curate_cfg = curate
        self.console, self.journal, self.pool = console, journal, pool
        self.seconds: dict[str, float] = {}
        self.tokenizer_sample: dict[str, int] | None = None  # set when the tokenizer trains
        self.kept_shards = 0
        self.encoded: dict[str, dict] = {}
        self._forced_train: set[int] = set()  # spool lines kept in train (canary hosts)
        self._compress = None  # built once the tokenizer is known (run)
        self._dedup: dict[str, Any] = {}  # dedup_index / dedup_against, for the manifest
        self.median_ratio: float | None = None

    def run(self) -> dict:
        t0 = time.perf_counter()
        read = self.journal.get("read") or self._timed("read", self._read)
        tok_info = self.journal.get("tokenizer") or self._timed("tokenizer", self._tokenizer)
        tok = load_tokenizer(self.build / "tokenizer.json")
        if self.curate_cfg is not None:  # the threshold may depend on the corpus
            from shoestring.data.curate.compress import Compressibility

            self.median_ratio = tok_info.get("median_ratio")
            self._compress = Compressibility.from_config(self.curate_cfg, self.median_ratio)
        ids = special_ids(tok, self.cfg.objective)
        dtype = token_dtype(tok.get_vocab_size())
        splits: dict[str, dict] = {}
        for split in ("train", "val"):
            enc = self.journal.get(f"encode.{split}")
            if not (enc and enc["done"]):
                enc = self._timed("encode", self._encode, split, tok, ids, read["documents"][split])
            self.encoded[split] = enc
            splits[split] = self._timed("pack", self._pack, split, enc, dtype, ids,
                                        tok.get_vocab_size())
        self._explain_compressibility()
        self._check_val(splits["val"], read)
        manifest = self._manifest(read, tok_info, ids, dtype, splits, time.perf_counter() - t0)
        write_json_atomic(self.build / "manifest.json", manifest)
        return manifest

    def _timed(self, name: str, fn: Any, *args: Any) -> Any:
        t = time.perf_counter()
        result = fn(*args)
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t, 3)
        return result

    # --- read: sources → clean → curate → split → spools --------------------------------

    def _read(self) -> dict:
        cfg = self.cfg
        self.journal.restart("read")
        stats = ReadStats()
        counts = {"read": 0, "too_short": 0, "kept": 0, "train": 0, "val": 0, "chars": 0}
        self.blocks: list[dict] = []
        matcher = SourceMatcher(cfg.mixture) if cfg.mixture is not None else None
        docs = iter_documents(self.specs, text_field=cfg.text_field, on_error=cfg.on_error,
                              stats=stats, split_on=cfg.split_on,
                              max_chars=cfg.max_document_chars,
                              label_field=matcher.label_field if matcher else None)
        kept = self.build / "spool-all.jsonl"
        with progress_bar(self.console) as bar, open(kept, "w", encoding="utf-8") as f, \
                (open(kept.with_suffix(".src"), "wb") if matcher  # each line's source
                 else contextlib.nullcontext()) as fsrc:
            task = bar.add_task("read + clean", total=None, unit="docs")

            def counted(stream: Iterator[Document]) -> Iterator[Document]:
                for doc in stream:
                    counts["read"] += 1
                    bar.update(task, advance=1)
                    yield doc

            cleaned = self._clean(counted(docs), counts)
            canaries = self._canary_inserter()
            if canaries is not None:
                cleaned = canaries(cleaned)
            self._forced_train = set()
            forced_chars = 0
            for doc in self._curate(cleaned):
                if canaries is not None and doc.doc_id in canaries.hosts:
                    self._forced_train.add(counts["kept"])
                    forced_chars += len(doc.text)
                else:
                    counts["val"] += is_validation(doc.text, cfg.val_fraction)
                counts["kept"] += 1
                counts["chars"] += len(doc.text)
                f.write(json.dumps(doc.text, ensure_ascii=False) + "\n")
                if matcher is not None:  # 2 bytes a document
                    fsrc.write(matcher.index(doc).to_bytes(2, "little"))
        if matcher is not None:
            matcher.check()
        if self.curate_cfg is not None and self.curate_cfg.explain:
            self.console.print(_long_documents_line(cfg.max_document_chars, stats),
                               markup=False, highlight=False)
        split = self._split(kept, counts, forced_chars, len(matcher.names) if matcher else 0)
        if canaries is not None:
            self.blocks.append(self._write_canaries(canaries))
        return self._read_result(counts, stats, split, self.blocks)

    def _read_result(self, counts: dict[str, int], stats: ReadStats, split: dict,
                     curation: list[dict]) -> dict:
        """The read stage's journal entry (and manifest part) from its counts."""
        self.blocks = [
            {"block": "read", "documents_out": counts["read"],
             "dropped": {"bad_input": len(stats.skipped)},
             "skipped": stats.skipped_summary(),
             "long_documents": {"max_chars": self.cfg.max_document_chars,
                                "cut": stats.split_documents, "pieces": stats.split_pieces}},
            {"block": "clean", "documents_in": counts["read"],
             "documents_out": counts["read"] - counts["too_short"],
             "dropped": {"too_short": counts["too_short"]}},
            *curation,
            {"block": "split", "documents_in": counts["kept"],
             "documents_out": counts["train"] + counts["val"],
             "train": counts["train"], "val": counts["val"], **split},
        ]
        self._check_read(counts, stats)
        result = {
            **({"source_documents": self._source_docs} if self.cfg.mixture is not None else {}),
            "files": stats.files,
            "documents": {
                "read": counts["read"],
                "skipped_bad_input": len(stats.skipped),
                "skipped_records": stats.skipped_records,
                "skipped_files": stats.skipped_files,
                "skipped_bytes": stats.skipped_bytes,
                "dropped_too_short": counts["too_short"],
                "kept": counts["kept"],
                "train": counts["train"],
                "val": counts["val"],
                "characters": counts["chars"],
            },
            "skipped_examples": stats.skipped[:20],
            "blocks": self.blocks,
            "split": split,
            **self._dedup,
            "train_characters": counts.get("train_chars"),  # the tokenizer sample's total
        }
        self.journal.put("read", result)
        return result

    def _split(self, kept: Path, counts: dict[str, int], forced_chars: int = 0,
               n_sources: int = 0) -> dict:
        """Spool the kept documents into train and val; returns how (for the manifest).

        By document (content hash) when that holds out at least ``MIN_VAL_DOCUMENTS``;
        otherwise (one file, a few documents) the last ``val_fraction`` of the text, as
        nanoGPT does, cutting the document at the boundary at a line break. With a data
        mixture (``n_sources``), each split's documents are grouped by source, in the
        recipe's order (``self._source_docs``: documents per split and source)."""
        fraction = self.cfg.val_fraction
        by_position = counts["val"] < MIN_VAL_DOCUMENTS
        cut = round((counts["chars"] - forced_chars) * (1 - fraction))
        counts["train"] = counts["val"] = counts["train_chars"] = counts["val_chars"] = 0
        position = 0
        sources = (np.fromfile(kept.with_suffix(".src"), dtype="<u2") if n_sources
                   else np.zeros(0, dtype="<u2"))
        self._source_docs = {"train": [0] * n_sources, "val": [0] * n_sources}
        parts = [(split, k) for split in ("train", "val") for k in range(max(n_sources, 1))]
        with ExitStack() as files:
            out = {p: files.enter_context(open(self._spool_part(*p, n_sources), "w",
                                               encoding="utf-8")) for p in parts}

            def write(split: str, text: str, k: int) -> None:
                if text:
                    counts[split] += 1
                    if n_sources:
                        self._source_docs[split][k] += 1
                    counts[f"{split}_chars"] += len(text)
                    out[split, k].write(json.dumps(text, ensure_ascii=False) + "\n")

            for line, text in enumerate(_read_spool(kept)):
                k = int(sources[line]) if n_sources else 0
                if line in self._forced_train:  # canary hosts: train, outside the position cut
                    write("train", text, k)
                    continue
                if not by_position:
                    write("val" if is_validation(text, fraction) else "train", text, k)
                    continue
                at = min(max(cut - position, 0), len(text))
                if 0 < at < len(text):
                    at = _line_break_near(text, at)
                write("train", text[:at].strip(), k)
                write("val", text[at:].strip(), k)
                position += len(text)
        if n_sources:
            self._join_source_spools(n_sources)
        kept.unlink()
        kept.with_suffix(".src").unlink(missing_ok=True)
        if not by_position:
            return {"method": "document", "val_fraction": fraction}
        return {"method": "position", "val_fraction": fraction,
                "reason": f"{counts['kept']:,} document(s) kept: fewer than "
                f"{MIN_VAL_DOCUMENTS} would be held out by document"}

    def _spool_part(self, split: str, k: int, n_sources: int) -> Path:
        """The spool of ``split`` (of its ``k``-th source's part, with a mixture)."""
        return self.build / (f"spool-{split}.{k}.jsonl" if n_sources else f"spool-{split}.jsonl")

    def _join_source_spools(self, n_sources: int) -> None:
        """Concatenate each split's per-source spools, in the recipe's order."""
        for split in ("train", "val"):
            with open(self.build / f"spool-{split}.jsonl", "wb") as joined:
                for k in range(n_sources):
                    part = self._spool_part(split, k, n_sources)
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, joined, 1 << 20)
                    part.unlink()

    def _clean(self, docs: Iterator[Document], counts: dict[str, int]) -> Iterator[Document]:
        """Block ``clean``: normalize (in the workers) and drop documents under min_chars."""
        min_chars = self.cfg.min_chars
        batches = batched(docs, CLEAN_BATCH)
        pending: list[list[Document]] = []

        def texts() -> Iterator[list[str]]:
            for batch in batches:
                pending.append(batch)
                yield [d.text for d in batch]

        for cleaned in self.pool.map(clean_texts, texts()):
            batch = pending.pop(0)
            for doc, text in zip(batch, cleaned):
                if len(text) < min_chars:
                    counts["too_short"] += 1
                else:
                    yield replace(doc, text=text)

    def _curate(self, docs: Iterator[Document]) -> Iterator[Document]:
        """The curation hook: cleaned documents in, kept documents out, in order.

        Curation blocks (quality filters, dedup, decontamination) go here and append one
        record per block to ``self.blocks`` (``block``, ``documents_in``,
        ``documents_out``, ``dropped``: reason → count).
        """
        if self.curate_cfg is None:
            yield from docs
            return
        from shoestring.data.curate import Curator

        from shoestring.data.curate.dedup_index import DIR

        # Cleaning and data.min_chars already ran in _clean (in the workers).
        index_dir = self.build / DIR if self.curate_cfg.dedup != "none" else None
        curator = Curator.from_config(self.curate_cfg, clean=False,
                                      work_dir=self.build / WORK_DIR, index_dir=index_dir)
        with ExitStack() as stack:
            on_drop = None
            if self.curate_cfg.dropped_ids:  # one "id<TAB>block" line per dropped document
                log = stack.enter_context(open(self.build / DROPPED_IDS, "w", encoding="utf-8"))
                on_drop = lambda doc_id, block: log.write(f"{doc_id}\t{block}\n")  # noqa: E731
            yield from curator.run(docs, on_drop)
        self.blocks.extend(b for b in curator.stats()["blocks"] if b["block"] != "compressibility")
        if index_dir is not None:  # persisted for a later prep's --dedup-against
            self._dedup["dedup_index"] = curator.finish_dedup_index(index_dir)
        if curator.against:
            self._dedup["dedup_against"] = curator.against_summary()
        if self.curate_cfg.explain:
            self.console.print(curator.explain(self.curate_cfg.explain), markup=False,
                               highlight=False)

    def _canary_inserter(self) -> Any:
        """``prep --canaries K``: the stream wrapper that plants them (None when off)."""
        cur = self.curate_cfg
        if cur is None or not cur.canaries:
            return None
        from shoestring.data.canaries import CanaryInserter, make_canaries

        inserted, self._canary_refs = make_canaries(cur.canaries, cur.canary_seed)
        return CanaryInserter(inserted, cur.canary_repeats, cur.canary_seed)

    def _write_canaries(self, inserter: Any) -> dict:
        """Count the copies that reached train (dedup may cut some) and write canaries.json."""
        from shoestring.data import canaries as C

        found = C.count_in(_read_spool(self.build / "spool-train.jsonl"), inserter.canaries)
        planted = [replace(c, inserted=r, in_train=n)
                   for c, r, n in zip(inserter.canaries, inserter.copies(), found)]
        C.write(self.build / C.FILE, planted, self._canary_refs, inserter.repeats,
                inserter.seed)
        return {"block": "canaries", "canaries": len(planted), "references": len(planted),
                "copies_inserted": sum(inserter.copies()),
                "copies_in_train": sum(found), "file": C.FILE}

    def _check_read(self, counts: dict[str, int], stats: ReadStats) -> None:
        if counts["kept"] == 0:
            dropped = "; ".join(
                f"{b['block']} dropped " + ", ".join(f"{v:,} {k}" for k, v in b["dropped"].items())
                for b in self.blocks if any(b.get("dropped", {}).values())
            )
            raise ShoestringError(
                f"the corpus is empty after cleaning: {counts['read']} documents read"
                + (f"; {dropped}" if dropped else "")
                + f" (data.min_chars={self.cfg.min_chars})",
                where=", ".join(self.specs),
                fix="check the sources (and data.text_field for JSON lines, CSV and Parquet)",
            )
        if counts["train"] == 0:
            raise ShoestringError(
                f"all {counts['kept']} documents fell into the validation split",
                where=", ".join(self.specs),
                fix="add more text",
            )

    # --- tokenizer ----------------------------------------------------------------------

    def _tokenizer(self) -> dict:
        cfg = self.cfg
        self.journal.restart("tokenizer")
        path = _tokenizer_path(cfg)
        if path is not None:
            tok = load_for_objective(path, cfg.objective)
            source = str(Path(path).resolve())
        else:
            kind = default_kind(cfg.objective) if cfg.tokenizer == "auto" else cfg.tokenizer
            n_train = self.journal.get("read")["documents"]["train"]
            with self.console.status(f"training the {kind} tokenizer on {n_train:,} documents"):
                tok = self._train_tokenizer(kind, n_train)
            source = "trained"
        tok.save(str(self.build / "tokenizer.json"))
        info = {
            "file": "tokenizer.json",
            "kind": tokenizer_kind(tok),
            "source": source,
            "vocab_size": tok.get_vocab_size(),
            "sha256": file_sha256(self.build / "tokenizer.json"),
        }
        if path is None and self.tokenizer_sample is not None:
            info["sample"] = self.tokenizer_sample
        from shoestring.data.curate.compress import median_ratio, needs_median

        if needs_median(self.curate_cfg):  # for the compressibility threshold
            info["median_ratio"] = median_ratio(tok, self._train_texts())
        self.journal.put("tokenizer", info)
        return info

    def _train_texts(self) -> Iterator[str]:
        """The training documents, in order."""
        return _read_spool(self.build / "spool-train.jsonl")

    def _train_tokenizer(self, kind: str, n_train: int) -> Any:
        """The tokenizer trained on the training documents, in order: all of them, or a
        uniform sample of at most ``data.tokenizer_sample_chars`` characters
        (`tokenizer_sample`); what it used goes to ``self.tokenizer_sample``.

        It trains in a child process of its own: the trainer's word counts grow with the
        sample, and memory a process has freed often stays with it, so training in prep's
        own process would carry that peak through tokenizing and packing."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        from tokenizers import Tokenizer

        cfg = self.cfg
        total = self.journal.get("read").get("train_characters")
        args = (str(self.build / "spool-train.jsonl"), cfg.tokenizer_sample_chars, total, kind,
                cfg.objective, cfg.vocab_size, cfg.lowercase_resolved, n_train)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
            saved, seen = child.submit(_train_from_spool, *args).result()
        self.tokenizer_sample = {"documents": seen["documents"],
                                 "characters": seen["characters"],
                                 "max_characters": cfg.tokenizer_sample_chars,
                                 "of_characters": seen["of_characters"]}
        return Tokenizer.from_str(saved)

    # --- encode: spool → token stream ---------------------------------------------------

    def _encode(self, split: str, tok: Any, ids: dict[str, int], n_docs: int) -> dict:
        sep = ids[families.get(self.cfg.objective).separator_token]
        state = self.journal.get(f"encode.{split}") or {
            "documents": 0, "kept_documents": 0, "tokens": 0, "document_tokens": 0, "done": False}
        self.journal.restart(f"pack.{split}")
        stream_path = self.build / f"stream-{split}.bin"
        docs_path = self.build / f"docs-{split}.bin"
        dtype = token_dtype(tok.get_vocab_size())
        for path, size in ((stream_path, state["tokens"] * dtype.itemsize),
                           (docs_path, state["kept_documents"] * 8)):
            with open(path, "ab") as f:
                f.truncate(size)
        texts = _read_spool(self.build / f"spool-{split}.jsonl")
        for _ in range(state["documents"]):
            next(texts)
        tokenizer: Any = tok if self.pool.workers <= 1 else str(self.build / "tokenizer.json")
        pending: list[list[str]] = []
        spooled = (self.journal.get("read") or {}).get("source_documents", {}).get(split)
        bounds = None if spooled is None else np.cumsum(spooled)  # spool line → source
        if bounds is not None:
            state = {"source_documents": [0] * len(bounds), **state}
        kept_per_source = state.get("source_documents", [])

        def batches() -> Iterator[list[str]]:
            for batch in batched(texts, ENCODE_BATCH, ENCODE_CHARS):
                pending.append(batch)
                yield batch

        steps = 0
        with progress_bar(self.console) as bar, open(stream_path, "ab") as fs, \
                open(docs_path, "ab") as fd:
            task = bar.add_task(f"tokenize {split}", total=n_docs, unit="docs",
                                completed=state["documents"])
            unsaved = 0

            def checkpoint(done: bool) -> None:
                for f in (fs, fd):  # the data is on disk before the journal says so
                    f.flush()
                    os.fsync(f.fileno())
                self.journal.put(f"encode.{split}", {**state, "done": done})

            for flat, lengths in self.pool.map(encode_texts, batches(), tokenizer, sep):
                batch = pending.pop(0)
                keep = self._keep_encoded(batch, lengths)
                if keep is not None and not keep.all():
                    flat = flat[np.repeat(keep, lengths + 1)]
                    lengths = lengths[keep]
                if bounds is not None:  # kept documents per source
                    at = np.arange(state["documents"], state["documents"] + len(batch))
                    src = np.searchsorted(bounds, at, side="right")
                    kept_per_source = (np.asarray(kept_per_source) + np.bincount(
                        src if keep is None else src[keep], minlength=len(bounds))).tolist()
                ends = state["tokens"] + np.cumsum(lengths + 1, dtype=np.int64)
                fs.write(flat.astype(dtype, copy=False).tobytes())
                fd.write(ends.astype("<u8").tobytes())
                state = {"documents": state["documents"] + len(batch),
                         "kept_documents": state["kept_documents"] + len(lengths),
                         "tokens": int(state["tokens"] + flat.size),
                         "document_tokens": int(state["document_tokens"] + lengths.sum()),
                         "done": False,
                         **({"source_documents": kept_per_source} if bounds is not None else {})}
                bar.update(task, advance=len(batch))
                unsaved += sum(len(t) for t in batch)
                if unsaved >= CHECKPOINT_CHARS:
                    checkpoint(done=False)
                    unsaved = 0
                    steps += 1
                    _fault_point(f"encode.{split}", steps)
            checkpoint(done=True)
        return {**state, "done": True}

    def _explain_compressibility(self) -> None:
        """``--explain``: the compressibility filter's examples (it runs while tokenizing,
        after the other blocks have been explained)."""
        if self._compress is None or not self._compress.keep_examples:
            return
        from shoestring.data.curate.pipeline import format_explain

        examples = {self._compress.name: self._compress.examples}
        self.console.print(format_explain(examples if self._compress.examples else {},
                                          self.curate_cfg.explain), markup=False,
                           highlight=False)

    def _keep_encoded(self, texts: list[str], lengths: np.ndarray) -> np.ndarray | None:
        """Hook for checks that need token counts (Cramming's compressibility filter):
        a boolean keep-mask over the batch's documents, or None to keep all. Runs in order in
        the main process; dropped documents leave no tokens in the stream."""
        if self._compress is None:
            return None
        docs = None
        if self._compress.keep_examples:  # --explain: the dropped texts as examples
            seen = self._compress.stats.docs_in
            docs = [Document(t, "", f"tokenized document {seen + i + 1:,}")
                    for i, t in enumerate(texts)]
        return self._compress.check_batch(lengths, [len(t) for t in texts], docs)

    # --- pack: token stream → shards ----------------------------------------------------

    def _pack(self, split: str, enc: dict, dtype: np.dtype, ids: dict[str, int],
              vocab: int) -> dict:
        cfg = self.cfg
        frame = families.get(cfg.objective).row_frame
        body = cfg.seq_len - frame
        stream_path = self.build / f"stream-{split}.bin"
        stream = (np.memmap(stream_path, dtype=dtype, mode="r") if enc["tokens"]
                  else np.zeros(0, dtype=dtype))
        doc_ends = np.fromfile(self.build / f"docs-{split}.bin", dtype="<u8").astype(np.int64)
        doc_starts = np.concatenate([np.zeros(min(1, len(doc_ends)), np.int64), doc_ends[:-1]])
        n = len(stream) // body
        bodies = stream[: n * body].reshape(n, body)
        ordered = cfg.order == "sort" and split == "train"
        order = unigram_sort_order(bodies, vocab) if ordered and n else None
        per_shard = max(1, cfg.shard_tokens // cfg.seq_len)
        n_shards = -(-n // per_shard)
        previous = (self.journal.get(f"pack.{split}") or {}).get("shards", [])
        shards: list[dict] = []
        with progress_bar(self.console) as bar:
            task = bar.add_task(f"pack {split}", total=n_shards, unit="shards")
            for k in range(n_shards):
                lo, hi = k * per_shard, min(n, (k + 1) * per_shard)
                if k < len(previous) and shard_intact(self.build, previous[k]):
                    shards.append(previous[k])
                    self.kept_shards += 1
                    bar.update(task, advance=1)
                    continue
                src = np.arange(lo, hi) if order is None else order[lo:hi]
                chunk = bodies[lo:hi] if order is None else bodies[src]
                if frame:  # [CLS] body [SEP]
                    rows = np.empty((len(src), cfg.seq_len), dtype=dtype)
                    rows[:, 0], rows[:, -1] = ids[CLS], ids[SEP]
                    rows[:, 1:-1] = chunk
                else:
                    rows = np.asarray(chunk)
                starts = doc_offsets(doc_starts, src, body, cfg.seq_len, frame // 2)
                shards.append(asdict(write_shard(self.build, split, k, rows, dtype, starts)))
                self.journal.put(f"pack.{split}", {"shards": shards})
                bar.update(task, advance=1)
                _fault_point(f"pack.{split}", k + 1)
        del bodies, stream
        sources = self._source_split(split, enc, doc_ends, body, n)
        return {
            **({"sources": sources} if sources is not None else {}),
            "sequences": n,
            "tokens": n * cfg.seq_len,
            "documents": len(doc_ends),
            "document_tokens": int(enc["document_tokens"]),
            "dropped_tail_tokens": int(enc["tokens"] - n * body),
            "order": "sort" if ordered else "none",
            "shards": shards,
        }

    def _source_split(self, split: str, enc: dict, doc_ends: np.ndarray, body: int,
                      n: int) -> dict | None:
        """A mixture's per-source part of a split (None without a mixture): documents,
        tokens and the range of sequences of each source; a source without a training
        sequence is an error (the loader could not sample it)."""
        mix = self.cfg.mixture
        if mix is None:
            return None
        ranges = source_ranges(doc_ends, enc["source_documents"], body, n)
        out = {}
        for name, r in zip(mix.sources, ranges):
            lo, hi = r["sequences"]
            out[name] = {**r, "tokens": (hi - lo) * self.cfg.seq_len}
            if split == "train" and hi == lo:
                raise ShoestringError(
                    f"{r['documents']:,} training documents with "
                    f"{r['document_tokens']:,} tokens do not fill one sequence of "
                    f"{self.cfg.seq_len}", where=f"data.mixture.sources.{name}",
                    fix="add text to this source, or drop it from the mixture")
        if split == "train":
            weights = source_weights(mix, {k: v["tokens"] for k, v in out.items()})
            for name, w in weights.items():
                out[name]["weight"] = w
        return out

    def _mixture_manifest(self, splits: dict[str, dict]) -> dict:
        """The manifest's ``mixture``: the recipe, and per source its share (weight), what
        it takes, and its tokens in train and val (for `epochs_at`)."""
        mix = self.cfg.mixture
        assert mix is not None
        sources = {}
        for name, src in mix.sources.items():
            train, val = splits["train"]["sources"][name], splits["val"]["sources"][name]
            sources[name] = {
                "weight": train["weight"],
                "given": ({"weight": src.weight} if src.weight is not None
                          else {"epochs": src.epochs}),
                "takes": ({"files": src.files} if src.files
                          else {"field": mix.field, "value": src.value or name}),
                "train_tokens": train["tokens"], "val_tokens": val["tokens"],
                # training tokens (all sources) per pass over this one: epochs = budget / this
                "budget_per_epoch": round(train["tokens"] / train["weight"]),
                "train_documents": train["documents"], "val_documents": val["documents"],
            }
        return {"field": mix.field, "sources": sources}

    def _check_val(self, val: dict, read: dict) -> None:
        if val["sequences"] > 0:
            return
        cfg = self.cfg
        have = self.encoded["val"]["tokens"]  # the stream packing cuts into sequences
        need = cfg.seq_len - families.get(cfg.objective).row_frame
        fixes = ["add more text"]
        if have > 0:  # held-out text grows about in proportion to val_fraction
            fraction = round(cfg.val_fraction * need / have * 1.2 + 0.005, 2)
            if fraction < 0.5:
                fixes.append(f"--set data.val_fraction={fraction}")
        longest = 1 << max(0, (have + cfg.seq_len - need).bit_length() - 1)
        if have and longest >= 8:
            fixes.append(f"--set data.seq_len={longest}")
        how = ("by document" if read["split"]["method"] == "document"
               else "the end of the text")
        raise ShoestringError(
            f"the validation split ({how}, data.val_fraction={cfg.val_fraction}) has no "
            f"complete sequence: {val['documents']} documents with {have} tokens, fewer "
            f"than one sequence of {cfg.seq_len}",
            where=", ".join(self.specs),
            fix=" or ".join(fixes),
        )

    def _manifest(self, read: dict, tok_info: dict, ids: dict[str, int], dtype: np.dtype,
                  splits: dict[str, dict], seconds: float) -> dict:
        cfg = self.cfg
        tokens_out = sum(s["tokens"] for s in splits.values())
        seen = sum(e["documents"] for e in self.encoded.values())
        kept = sum(e["kept_documents"] for e in self.encoded.values())
        compress = [] if self._compress is None else [
            {"block": "compressibility", "documents_in": seen, "documents_out": kept,
             "dropped": {"ratio_too_high": seen - kept},
             "max_ratio": round(self._compress.max_ratio, 4),
             "median_ratio": self.median_ratio}]
        blocks = [
            *read["blocks"],
            {"block": "tokenize", "documents_in": seen, "documents_out": seen,
             "tokens": sum(s["document_tokens"] for s in splits.values())},
            *compress,
            {"block": "pack", "sequences": sum(s["sequences"] for s in splits.values()),
             "tokens": tokens_out,
             "dropped": {"tail_tokens": sum(s["dropped_tail_tokens"] for s in splits.values())}},
        ]
        return {
            "format": FORMAT,
            "shoestring_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "sources": self.specs,
            "files": len(self.files),
            "fingerprint": self.journal.fingerprint,
            "config": cfg.model_dump(mode="json"),
            **({"curate": self.curate_cfg.model_dump(mode="json")} if self.curate_cfg else {}),
            # One source for the counts: what is in the shards (after every block).
            "documents": {**read["documents"], "kept": kept,
                          **{name: splits[name]["documents"] for name in ("train", "val")}},
            "split": read["split"],
            **{k: read[k] for k in ("dedup_index", "dedup_against") if k in read},
            "skipped_examples": read["skipped_examples"],
            "blocks": blocks,
            "tokenizer": {**tok_info, "special_ids": ids},
            "objective": cfg.objective,
            "seq_len": cfg.seq_len,
            "dtype": dtype.str,
            "order": cfg.order,
            "splits": splits,
            **({"mixture": self._mixture_manifest(splits)} if cfg.mixture is not None else {}),
            "resumed": {"stages": [s for s in self.journal.resumed if not s.startswith("pack")],
                        "kept_shards": self.kept_shards},
            "stage_seconds": self.seconds,
            "seconds": round(seconds, 3),
        }


def _train_from_spool(spool: str, cap: int, total: int | None, kind: str, objective: str,
                      vocab_size: int, lowercase: bool, n_train: int
                      ) -> tuple[str, dict[str, int]]:
    """`_Pipeline._train_tokenizer`'s child process: the tokenizer (as JSON) trained on the
    spool's documents or their uniform sample, and what it read."""
    if total is None:  # a build folder journaled before the count was kept
        total = sum(len(t) for t in _read_spool(Path(spool)))
    seen = {"documents": 0, "characters": 0, "of_characters": total}

    def sample() -> Iterator[str]:  # read once, or twice (WordPiece): count one pass
        seen["documents"] = seen["characters"] = 0
        for text in tokenizer_sample(_read_spool(Path(spool)), cap, total):
            seen["documents"] += 1
            seen["characters"] += len(text)
            yield text

    tok = train_tokenizer(sample, kind, objective, vocab_size, lowercase,
                          length=n_train if total <= cap else None)
    return tok.to_str(), seen


def _long_documents_line(max_chars: int, stats: ReadStats) -> str:
    """What ``data.max_document_chars`` did (for ``--explain``)."""
    return (f"long documents (data.max_document_chars={max_chars:,}): "
            f"{stats.split_documents:,} cut into {stats.split_pieces:,} pieces")


def _line_break_near(text: str, at: int) -> int:
    """A cut point near ``at``: the next line break, else the previous, else the next space."""
    for found in (text.find("\n", at), text.rfind("\n", 0, at), text.find(" ", at)):
        if 0 < found < len(text):
            return found
    return at


def _read_spool(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)
