"""The local executor: prep's stages in this process and its worker processes.

`LocalExecutor` runs the `driver.Driver` with `LocalStages`: the reader → blocks clean (in
``data.workers`` processes), canaries, curation → the split writer's spools; then
``stages.py``'s work: the tokenizer trained in a child process; encode (in the workers,
consumed in order, so the output is identical to 1 worker) into a token stream; pack into
shards. See ``prep.py``'s
docstring for the files each stage leaves and how each resumes.
"""

from __future__ import annotations

import itertools
import os
from functools import partial
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any, ContextManager

import numpy as np

from shoestring.config import CurateConfig, DataConfig
from shoestring.data.mixture import SourceMatcher
from shoestring.data.sources import Document, Read
from shoestring.prep.canaries import Canaries
from shoestring.prep.curate.normalize import Clean
from shoestring.prep.driver import Driver, ReadOutput, Split, read_spool, spool_documents
from shoestring.prep.executor import WORK_DIR, Journal, PrepPlan, fault_point, no_session, register
from shoestring.prep.packing import StreamRows, unigram_sort_order
from shoestring.prep.stages import (NO_COUNTS, encode, pack_record, pack_shard, shard_ranges,
                                    sorts, source_split, train_on_sample)
from shoestring.prep.workers import WorkerPool, die_with_parent
from shoestring.progress import progress_bar

# Tokenizing is journaled (resumable) after about this many characters.
CHECKPOINT_CHARS = 1 << 23
DROPPED_IDS = "dropped.tsv"  # curate.dropped_ids: the documents curation dropped


class LocalExecutor:
    """``--executor local``: this machine, ``data.workers`` processes."""

    name = "local"

    def check(self, cfg: DataConfig, curate: CurateConfig | None) -> None:
        """Every setting runs locally."""

    def session(self) -> ContextManager[Any]:
        return no_session()

    def build_fingerprint(self, data: str) -> str:
        return data  # its build folder holds only the files every executor writes

    def run(self, plan: PrepPlan, journal: Journal) -> dict:
        with WorkerPool(plan.cfg.workers).start() as pool:
            return Driver(plan, journal, LocalStages(plan, journal, pool)).run()


register("local", lambda options: LocalExecutor())  # no options: data.workers is a setting


class LocalStages:
    """The `driver.Stages` of the local executor, working in the build folder's spools."""

    def __init__(self, plan: PrepPlan, journal: Journal, pool: WorkerPool) -> None:
        self.pool, self.journal, self.specs, self.build = pool, journal, plan.specs, plan.build
        self.cfg, self.curate_cfg, self.console = plan.cfg, plan.curate, plan.console
        self.kept_shards = 0
        self.seconds: dict[str, float] = {}
        self.blocks: list[dict] = []  # the curation blocks' records
        self._dedup: dict[str, Any] = {}  # dedup_index / dedup_against, for the manifest
        self._examples: dict[str, dict[str, list[Any]]] = {}  # --explain's, from curation

    def describe(self) -> dict | None:
        return None

    # --- read: sources → clean → curate → split → spools --------------------------------

    def read(self) -> ReadOutput:
        cfg = self.cfg
        matcher = SourceMatcher(cfg.mixture) if cfg.mixture is not None else None
        read = Read(self.specs, cfg, matcher.label_field if matcher else None)
        clean = Clean(cfg.min_chars, self.pool.map)
        canaries = Canaries.from_config(self.curate_cfg)
        explain = self.curate_cfg is not None and bool(self.curate_cfg.explain)
        split = Split(self.build, cfg.val_fraction, matcher, canaries.hosts if canaries else (),
                      keep_ids=explain)
        with progress_bar(self.console) as bar:
            task = bar.add_task("read + clean", total=None, unit="docs")
            docs = clean.process(bar.update(task, advance=1) or doc for doc in read)
            split.write(self._curate(canaries.process(docs) if canaries else docs))
        split.close()
        if canaries is not None:  # its record follows curation's: it counts what they left
            canaries.finish(self.build, read_spool(self.build / "spool-train.jsonl"))
            self.blocks.append(canaries.report())
        return ReadOutput(read.stats, [clean.report(), *self.blocks], split, self._dedup,
                          self._examples)

    def _curate(self, docs: Iterator[Document]) -> Iterator[Document]:
        """The curation hook: cleaned documents in, kept documents out, in order.

        Curation blocks (quality filters, dedup, decontamination) go here and append one
        record per block to ``self.blocks`` (``block``, ``documents_in``,
        ``documents_out``, ``dropped``: reason → count).
        """
        if self.curate_cfg is None:
            yield from docs
            return
        from shoestring.prep.curate import Curator
        from shoestring.prep.curate.dedup_index import DIR

        # Cleaning and data.min_chars already ran (block clean, in the workers).
        index_dir = self.build / DIR if self.curate_cfg.dedup != "none" else None
        curator = Curator.from_config(self.curate_cfg, work_dir=self.build / WORK_DIR,
                                      index_dir=index_dir)
        with ExitStack() as stack:
            log = (stack.enter_context(open(self.build / DROPPED_IDS, "w", encoding="utf-8"))
                   if self.curate_cfg.dropped_ids else None)

            def on_drop(doc_id: str, block: str, of: str) -> None:
                log.write(f"{doc_id}\t{block}\t{of}\n")  # "id<TAB>block<TAB>of" per drop

            yield from curator.run(docs, on_drop if log is not None else None)
        self.blocks.extend(curator.stats()["blocks"])
        if index_dir is not None:  # persisted for a later prep's --dedup-against
            self._dedup["dedup_index"] = curator.finish_dedup_index(index_dir)
        if curator.against:
            self._dedup["dedup_against"] = curator.against_summary()
        if self.curate_cfg.explain:  # printed after the last stage (Driver._explain)
            self._examples.update(curator.examples())

    def train_texts(self) -> Iterator[str]:
        """The training documents, in order."""
        return read_spool(self.build / "spool-train.jsonl")

    def train_tokenizer(self, kind: str, n_train: int) -> tuple[Any, dict[str, int]]:
        """`stages.train_on_sample` over the training spool, in a child process of its own:
        the trainer's word counts grow with the sample, and memory a process has freed
        often stays with it, so training in prep's own process would carry that peak
        through tokenizing and packing. The child dies with prep (`die_with_parent`): killed
        here, prep left it training and then waiting forever, with its resource tracker."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        cfg, spool = self.cfg, self.build / "spool-train.jsonl"
        total = self.journal.get("read").get("train_characters")
        if total is None:  # a build folder journaled before the count was kept
            total = sum(len(t) for t in read_spool(spool))
        cap = cfg.tokenizer_sample_chars
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=die_with_parent, initargs=(os.getpid(),)) as child:
            return child.submit(_train_in_child, partial(read_spool, spool), cap, total, kind,
                                cfg.family, cfg.vocab_size, cfg.lowercase_resolved,
                                n_train if total <= cap else None).result()

    # --- encode: spool → token stream ---------------------------------------------------

    def encode(self, split: str, tok: Any, sep: int, dtype: np.dtype, n_docs: int,
               compress: Any) -> dict:
        """`stages.encode` over the split's spool, batches tokenized in the worker pool,
        appended to ``stream-SPLIT.bin`` / ``docs-SPLIT.bin`` and journaled every
        ``CHECKPOINT_CHARS`` (a resumed split goes on from there)."""
        state = self.journal.get(f"encode.{split}") or {**NO_COUNTS, "done": False}
        stream_path = self.build / f"stream-{split}.bin"
        docs_path = self.build / f"docs-{split}.bin"
        for path, size in ((stream_path, state["tokens"] * dtype.itemsize),
                           (docs_path, state["kept_documents"] * 8)):
            with open(path, "ab") as f:
                f.truncate(size)
        records = itertools.islice(spool_documents(self.build / f"spool-{split}.jsonl"),
                                   state["documents"], None)
        tokenizer: Any = tok if self.pool.workers <= 1 else str(self.build / "tokenizer.json")
        spooled = (self.journal.get("read") or {}).get("source_documents", {}).get(split)
        bounds = None if spooled is None else np.cumsum(spooled)  # spool line → source
        if bounds is not None:
            state = {"source_documents": [0] * len(bounds), **state}
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

            for tokens, ends, state, batch in encode(
                    records, self.pool.map, tokenizer, sep, dtype,
                    {k: v for k, v in state.items() if k != "done"}, compress, bounds):
                fs.write(tokens.tobytes())
                fd.write(ends.astype("<u8").tobytes())
                bar.update(task, advance=len(batch))
                unsaved += sum(len(t) for t in batch)
                if unsaved >= CHECKPOINT_CHARS:
                    checkpoint(done=False)
                    unsaved = 0
                    steps += 1
                    fault_point(f"encode.{split}", steps)
            checkpoint(done=True)
        return {**state, "done": True}

    # --- pack: token stream → shards ----------------------------------------------------

    def pack(self, split: str, enc: dict, dtype: np.dtype, ids: dict[str, int],
             vocab: int) -> dict:
        """`stages.pack_shard` for each shard in turn, journaled shard by shard."""
        cfg = self.cfg
        body = cfg.row_body
        # read in slices, not mapped: a map would keep every page of the stream resident
        bodies = StreamRows(self.build / f"stream-{split}.bin", dtype, body)
        doc_ends = np.fromfile(self.build / f"docs-{split}.bin", dtype="<u8").astype(np.int64)
        doc_starts = np.concatenate([np.zeros(min(1, len(doc_ends)), np.int64), doc_ends[:-1]])
        n = len(bodies)
        order = unigram_sort_order(bodies, vocab) if sorts(cfg, split) and n else None
        ranges = shard_ranges(n, cfg)
        previous = (self.journal.get(f"pack.{split}") or {}).get("shards", [])
        shards: list[dict] = []
        with progress_bar(self.console) as bar:
            task = bar.add_task(f"pack {split}", total=len(ranges), unit="shards")
            for k, (lo, hi) in enumerate(ranges):
                shard, kept = pack_shard(self.build, split, k, bodies, lo, hi, order,
                                         doc_starts, cfg, ids, dtype,
                                         previous[k] if k < len(previous) else None)
                shards.append(shard)
                self.kept_shards += kept
                bar.update(task, advance=1)
                if not kept:
                    self.journal.put(f"pack.{split}", {"shards": shards})
                    fault_point(f"pack.{split}", k + 1)
        del bodies
        return pack_record(cfg, split, enc, shards, source_split(cfg, split, enc, doc_ends, n))


def _train_in_child(*args: Any) -> tuple[Any, dict[str, int]]:
    """`stages.train_on_sample` in the tokenizer's child process (a fault point first, for
    the tests' kill while a tokenizer trains)."""
    fault_point("tokenizer.child", 1)
    return train_on_sample(*args)
