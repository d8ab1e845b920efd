"""The local executor: prep's stages in this process and its worker processes.

`LocalExecutor` runs the `driver.Driver` with `LocalStages`: the reader → blocks clean (in
``data.workers`` processes), canaries, curation → the split writer's spools; the
tokenizer trained in a child process; encode (in the workers, consumed in order, so the
output is identical to 1 worker) into a token stream; pack into shards. See ``prep.py``'s
docstring for the files each stage leaves and how each resumes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any, ContextManager

import numpy as np

from shoestring import families
from shoestring.config import CurateConfig, DataConfig
from shoestring.prep.canaries import Canaries
from shoestring.prep.curate.normalize import Clean
from shoestring.prep.driver import Driver, Split, read_spool, spool_documents
from shoestring.prep.executor import WORK_DIR, Journal, PrepPlan, fault_point, no_session, register
from shoestring.data.mixture import SourceMatcher
from shoestring.prep.packing import StreamRows, doc_offsets, unigram_sort_order
from shoestring.data.shards import shard_intact, token_dtype, write_shard
from shoestring.data.sources import Document, Read, ReadStats
from shoestring.data.tokenizer import CLS, SEP
from shoestring.prep.tokenizer_training import tokenizer_sample, train_tokenizer
from shoestring.prep.workers import WorkerPool, batched, encode_texts
from shoestring.progress import progress_bar
from shoestring.units import counted

ENCODE_BATCH = 1024
# Encodings cost ~150 bytes per token until converted: cap a batch at ~512K characters.
ENCODE_CHARS = 1 << 19
# Tokenizing is journaled (resumable) after about this many characters.
CHECKPOINT_CHARS = 1 << 23
DROPPED_IDS = "dropped.tsv"  # curate.dropped_ids: the documents curation dropped


class LocalExecutor:
    """``--executor local``: this machine, ``data.workers`` processes."""

    name = "local"

    def __init__(self, options: Any = None) -> None:
        del options  # nothing to choose: data.workers is a setting

    def check(self, cfg: DataConfig, curate: CurateConfig | None) -> None:
        """Every setting runs locally."""

    def session(self) -> ContextManager[Any]:
        return no_session()

    def run(self, plan: PrepPlan, journal: Journal) -> dict:
        with WorkerPool(plan.cfg.workers).start() as pool:
            return Driver(plan, journal, lambda d: LocalStages(d, pool)).run()


register("local", LocalExecutor)


class LocalStages:
    """The `driver.Stages` of the local executor, working in the build folder's spools."""

    def __init__(self, driver: Driver, pool: WorkerPool) -> None:
        self.d, self.pool = driver, pool
        self.specs, self.build, self.cfg = driver.specs, driver.build, driver.cfg
        self.curate_cfg, self.console, self.journal = driver.curate_cfg, driver.console, driver.journal
        self.kept_shards = 0
        self.blocks: list[dict] = []  # the curation blocks' records
        self._dedup: dict[str, Any] = {}  # dedup_index / dedup_against, for the manifest

    def describe(self) -> dict | None:
        return None

    # --- read: sources → clean → curate → split → spools --------------------------------

    def read(self) -> dict:
        cfg = self.cfg
        self.journal.restart("read")
        matcher = SourceMatcher(cfg.mixture) if cfg.mixture is not None else None
        read = Read(self.specs, cfg, matcher.label_field if matcher else None)
        clean = Clean(cfg.min_chars, self.pool.map)
        canaries = Canaries.from_config(self.curate_cfg)
        explain = self.curate_cfg is not None and bool(self.curate_cfg.explain)
        split = Split(self.build, cfg.val_fraction, matcher, canaries.hosts if canaries else (),
                      keep_ids=explain)
        self.blocks = []
        with progress_bar(self.console) as bar:
            task = bar.add_task("read + clean", total=None, unit="docs")
            docs = clean.process(bar.update(task, advance=1) or doc for doc in read)
            split.write(self._curate(canaries.process(docs) if canaries else docs))
        if explain:  # printed with the examples, after the last stage (Driver._explain)
            self.d.explain_lines.append(_long_documents_line(cfg.max_document_chars,
                                                             read.stats))
        split.close()
        if canaries is not None:  # its record follows curation's: it counts what they left
            canaries.finish(self.build, read_spool(self.build / "spool-train.jsonl"))
            self.blocks.append(canaries.report())
        return self.d.read_result(read.stats, [clean.report(), *self.blocks], split,
                                  self._dedup)

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
            self.d.examples.update(curator.examples())

    def train_texts(self) -> Iterator[str]:
        """The training documents, in order."""
        return read_spool(self.build / "spool-train.jsonl")

    def train_tokenizer(self, kind: str, n_train: int) -> tuple[Any, dict[str, int]]:
        """The tokenizer trained on the training documents, in order: all of them, or a
        uniform sample of at most ``data.tokenizer_sample_chars`` characters
        (`tokenizer_sample`), and what it used.

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
        return Tokenizer.from_str(saved), {"documents": seen["documents"],
                                           "characters": seen["characters"],
                                           "max_characters": cfg.tokenizer_sample_chars,
                                           "of_characters": seen["of_characters"]}

    # --- encode: spool → token stream ---------------------------------------------------

    def encode(self, split: str, tok: Any, ids: dict[str, int], n_docs: int) -> dict:
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
        records = spool_documents(self.build / f"spool-{split}.jsonl")
        for _ in range(state["documents"]):
            next(records)
        tokenizer: Any = tok if self.pool.workers <= 1 else str(self.build / "tokenizer.json")
        pending: list[tuple[list[str], list[str | None]]] = []  # (texts, ids) in flight
        ids: list[str | None] = []  # the ids of the batch being gathered

        def texts() -> Iterator[str]:
            for text, doc_id in records:
                ids.append(doc_id)
                yield text

        spooled = (self.journal.get("read") or {}).get("source_documents", {}).get(split)
        bounds = None if spooled is None else np.cumsum(spooled)  # spool line → source
        if bounds is not None:
            state = {"source_documents": [0] * len(bounds), **state}
        kept_per_source = state.get("source_documents", [])

        def batches() -> Iterator[list[str]]:
            for batch in batched(texts(), ENCODE_BATCH, ENCODE_CHARS):  # reads no further
                pending.append((batch, ids[:]))
                ids.clear()
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
                batch, batch_ids = pending.pop(0)
                keep = self._keep_encoded(batch, lengths, batch_ids)
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
                    fault_point(f"encode.{split}", steps)
            checkpoint(done=True)
        return {**state, "done": True}


    def _keep_encoded(self, texts: list[str], lengths: np.ndarray,
                      ids: list[str | None]) -> np.ndarray | None:
        """Hook for checks that need token counts (Cramming's compressibility filter):
        a boolean keep-mask over the batch's documents, or None to keep all. Runs in order in
        the main process; dropped documents leave no tokens in the stream. ``ids``: the
        documents' ``file:line`` ids where the spool kept them (``--explain``)."""
        if self.d.compress is None:
            return None
        docs = None
        if self.d.compress.keep_examples:  # --explain: the dropped texts as examples
            seen = self.d.compress.stats.docs_in  # a spool of an earlier run has no ids
            docs = [Document(t, "", doc_id or f"tokenized document {seen + i + 1:,}")
                    for i, (t, doc_id) in enumerate(zip(texts, ids))]
        return self.d.compress.check_batch(lengths, [len(t) for t in texts], docs)

    # --- pack: token stream → shards ----------------------------------------------------

    def pack(self, split: str, enc: dict, dtype: np.dtype, ids: dict[str, int],
              vocab: int) -> dict:
        cfg = self.cfg
        frame = families.get(cfg.objective).row_frame
        body = cfg.seq_len - frame
        # read in slices, not mapped: a map would keep every page of the stream resident
        bodies = StreamRows(self.build / f"stream-{split}.bin", dtype, body)
        doc_ends = np.fromfile(self.build / f"docs-{split}.bin", dtype="<u8").astype(np.int64)
        doc_starts = np.concatenate([np.zeros(min(1, len(doc_ends)), np.int64), doc_ends[:-1]])
        n = len(bodies)
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
                chunk = bodies[lo:hi] if order is None else bodies.take(src)
                if frame:  # [CLS] body [SEP]
                    rows = np.empty((len(src), cfg.seq_len), dtype=dtype)
                    rows[:, 0], rows[:, -1] = ids[CLS], ids[SEP]
                    rows[:, 1:-1] = chunk
                    del chunk  # one shard's buffer at a time
                else:
                    rows = chunk
                starts = doc_offsets(doc_starts, src, body, cfg.seq_len, frame // 2)
                shards.append(asdict(write_shard(self.build, split, k, rows, dtype, starts)))
                del rows
                self.journal.put(f"pack.{split}", {"shards": shards})
                bar.update(task, advance=1)
                fault_point(f"pack.{split}", k + 1)
        del bodies
        sources = self.d.source_split(split, enc, doc_ends, body, n)
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



def _train_from_spool(spool: str, cap: int, total: int | None, kind: str, objective: str,
                      vocab_size: int, lowercase: bool, n_train: int
                      ) -> tuple[str, dict[str, int]]:
    """`LocalStages.train_tokenizer`'s child process: the tokenizer (as JSON) trained on the
    spool's documents or their uniform sample, and what it read."""
    if total is None:  # a build folder journaled before the count was kept
        total = sum(len(t) for t in read_spool(Path(spool)))
    seen = {"documents": 0, "characters": 0, "of_characters": total}

    def sample() -> Iterator[str]:  # read once, or twice (WordPiece): count one pass
        seen["documents"] = seen["characters"] = 0
        for text in tokenizer_sample(read_spool(Path(spool)), cap, total):
            seen["documents"] += 1
            seen["characters"] += len(text)
            yield text

    tok = train_tokenizer(sample, kind, objective, vocab_size, lowercase,
                          length=n_train if total <= cap else None)
    return tok.to_str(), seen


def _long_documents_line(max_chars: int, stats: ReadStats) -> str:
    """What ``data.max_document_chars`` did (for ``--explain``)."""
    return (f"long documents (data.max_document_chars={max_chars:,}): "
            f"{counted(stats.split_documents, 'document')} cut into "
            f"{counted(stats.split_pieces, 'piece')}")


