"""The prep stages in order, as every executor runs them: `Driver` and its `Stages`.

The driver owns what does not depend on where the work runs: the order of the stages and
their journal entries, the train/val split rule (the `Split` writer), the tokenizer stage (a
given file, or one trained by the executor), the checks of what read and pack produced, and
the manifest. An executor supplies the `Stages` that run the work — the read stage (the
reader ``sources.Read`` → the blocks clean, canaries and curation → `Split`, their records
handed back as a `ReadOutput`), and ``stages.py``'s tokenizer training, encode and pack,
where and when it chooses; built from the plan and journal, they never call the driver — and runs
``Driver(plan, journal, stages).run()``: ``prep/local.py`` in this process and its workers,
``prep/ray/runner.py`` as Ray tasks.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Container, Iterable, Iterator
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from shoestring import __version__
from shoestring.data.datadir import FORMAT
from shoestring.prep.executor import Journal, PrepPlan
from shoestring.data.mixture import SourceMatcher
from shoestring.data.shards import token_dtype
from shoestring.data.sources import Document, ReadStats
from shoestring.data.tokenizer import (
    load_for_objective,
    load_tokenizer,
    special_ids,
    tokenizer_kind,
)
from shoestring.errors import ShoestringError
from shoestring.fsutil import file_sha256, write_json_atomic
from shoestring.units import counted

# Fewer validation documents than this: validation is the end of the text instead.
MIN_VAL_DOCUMENTS = 5


def is_validation(text: str, val_fraction: float) -> bool:
    """Deterministic split by the document's content hash (duplicates share a split)."""
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    return h / 2**64 < val_fraction


@dataclass(frozen=True)
class ReadOutput:
    """What a read stage hands the driver: the records of the reader (``stats``), its
    ``blocks`` (clean, curation, canaries) and ``split``; ``dedup``: the manifest's dedup
    entries, where kept; ``examples``: --explain's drops (block → reason → examples)."""

    stats: ReadStats
    blocks: list[dict]
    split: Split
    dedup: dict = field(default_factory=dict)
    examples: dict[str, dict[str, list[Any]]] = field(default_factory=dict)


class Stages(Protocol):
    """Where and when an executor runs each stage's work (``prep/stages.py``'s functions)
    for the `Driver`, which journals what they return."""

    kept_shards: int  # shards a resumed pack found intact
    seconds: dict[str, float]  # the executor's own timings, added to ``stage_seconds``

    def read(self) -> ReadOutput:
        """Sources → kept documents split into train and val, and their records."""

    def train_tokenizer(self, kind: str, n_train: int) -> tuple[Any, dict[str, int] | None]:
        """A ``kind`` tokenizer trained on the training documents, and its sample's size."""

    def train_texts(self) -> Iterator[str]:
        """The training documents, in order."""

    def encode(self, split: str, tok: Any, sep: int, dtype: np.dtype, n_docs: int,
               compress: Any) -> dict:
        """Tokenize a split (`stages.encode`, filtered by ``compress``); its journal entry."""

    def pack(self, split: str, enc: dict, dtype: np.dtype, ids: dict[str, int],
             vocab: int) -> dict:
        """Cut the split's stream into shards (`stages.pack_shard`); its `pack_record`."""

    def describe(self) -> dict | None:
        """The manifest's ``executor`` entry (None: none is written)."""


class Driver:
    """One prep's stages in order over a build folder, with ``stages`` doing the work."""

    def __init__(self, plan: PrepPlan, journal: Journal, stages: Stages) -> None:
        self.specs, self.files, self.build, self.cfg = plan.specs, plan.files, plan.build, plan.cfg
        self.curate_cfg, self.console, self.journal = plan.curate, plan.console, journal
        self.seconds: dict[str, float] = {}
        self.tokenizer_sample: dict[str, int] | None = None  # set when the tokenizer trains
        self.encoded: dict[str, dict] = {}
        self.compress: Any = None  # built once the tokenizer is known (run)
        self.read_output: ReadOutput | None = None  # --explain's, when read ran (not resumed)
        self.stages = stages

    def run(self) -> dict:
        """Every stage not finished in the journal, then the manifest (written and returned)."""
        t0 = time.perf_counter()
        read = self.journal.get("read") or self.timed("read", self._read)
        tok_info = self.journal.get("tokenizer") or self.timed("tokenizer", self._tokenizer)
        tok = load_tokenizer(self.build / "tokenizer.json")
        if self.curate_cfg is not None:  # the threshold may depend on the corpus
            from shoestring.prep.curate.compress import Compressibility

            self.compress = Compressibility.from_config(self.curate_cfg,
                                                        tok_info.get("median_ratio"))
        ids = special_ids(tok, self.cfg.family)
        sep = ids[self.cfg.family.separator_token]
        dtype = token_dtype(tok.get_vocab_size())
        splits: dict[str, dict] = {}
        for split in ("train", "val"):
            enc = self.journal.get(f"encode.{split}")
            if not (enc and enc["done"]):
                self.journal.restart(f"pack.{split}")  # pack follows the stream anew
                enc = self.timed("encode", self.stages.encode, split, tok, sep, dtype,
                                 read["documents"][split], self.compress)
            self.encoded[split] = enc
            splits[split] = self.timed("pack", self.stages.pack, split, enc, dtype, ids,
                                       tok.get_vocab_size())
        self._explain()
        self._check_val(splits["val"], read)
        manifest = self._manifest(read, tok_info, ids, dtype, splits, time.perf_counter() - t0)
        write_json_atomic(self.build / "manifest.json", manifest)
        return manifest

    def timed(self, name: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, its seconds added to the manifest's ``stage_seconds[name]``."""
        t = time.perf_counter()
        result = fn(*args)
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t, 3)
        return result

    # --- read: what every executor's read stage ends with -------------------------------

    def _read(self) -> dict:
        """The executor's read stage, and its journal entry (and manifest part)."""
        self.journal.restart("read")
        out = self.read_output = self.stages.read()
        stats, blocks, split = out.stats, out.blocks, out.split
        records = [stats.record(self.cfg.max_document_chars), *blocks, split.report()]
        self._check_read(stats, split, records)
        result = {
            **({"source_documents": split.source_docs} if self.cfg.mixture is not None else {}),
            "files": stats.files,
            "documents": {
                "read": stats.documents,
                "skipped_bad_input": len(stats.skipped),
                "skipped_records": stats.skipped_records,
                "skipped_files": stats.skipped_files,
                "skipped_bytes": stats.skipped_bytes,
                "dropped_too_short": next(b["dropped"]["too_short"] for b in blocks
                                          if b["block"] == "clean"),
                "kept": split.kept,
                "train": split.n["train"],
                "val": split.n["val"],
                "characters": split.chars,
            },
            "skipped_examples": stats.skipped[:20],
            "blocks": records,
            "split": split.how,
            **out.dedup,
            "train_characters": split.train_chars,  # the tokenizer sample's total
        }
        self.journal.put("read", result)
        return result

    def _check_read(self, stats: ReadStats, split: Split, blocks: list[dict]) -> None:
        if split.kept == 0:
            dropped = "; ".join(
                f"{b['block']} dropped " + ", ".join(f"{v:,} {k}" for k, v in b["dropped"].items())
                for b in blocks if any(b.get("dropped", {}).values())
            )
            raise ShoestringError(
                f"the corpus is empty after cleaning: {counted(stats.documents, 'document')} read"
                + (f"; {dropped}" if dropped else "")
                + f" (data.min_chars={self.cfg.min_chars})",
                where=", ".join(self.specs),
                fix="check the sources (and data.text_field for JSON lines, CSV and Parquet)",
            )
        if split.n["train"] == 0:
            raise ShoestringError(
                f"all {counted(split.kept, 'document')} fell into the validation split",
                where=", ".join(self.specs),
                fix="add more text",
            )

    # --- tokenizer ----------------------------------------------------------------------

    def _tokenizer(self) -> dict:
        cfg = self.cfg
        self.journal.restart("tokenizer")
        path = cfg.tokenizer_file
        if path is not None:
            tok = load_for_objective(path, cfg.family)
            source = str(Path(path).resolve())
        else:
            kind = cfg.family.tokenizer_kind if cfg.tokenizer == "auto" else cfg.tokenizer
            n_train = self.journal.get("read")["documents"]["train"]
            docs = counted(n_train, "document")
            with self.console.status(f"training the {kind} tokenizer on {docs}"):
                tok, self.tokenizer_sample = self.stages.train_tokenizer(kind, n_train)
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
        if path is None:
            info["requested_vocab_size"] = cfg.vocab_size
            short = _short_vocabulary(info, self.tokenizer_sample)
            if short is not None:  # recorded (manifest) and said now, not buried in the table
                info["warning"] = short
                self.console.print("[bold yellow]warning:[/] ", end="")
                self.console.print(short, markup=False, highlight=False)
        from shoestring.prep.curate.compress import median_ratio, needs_median

        if needs_median(self.curate_cfg):  # for the compressibility threshold
            info["median_ratio"] = median_ratio(tok, self.stages.train_texts())
        self.journal.put("tokenizer", info)
        return info

    def _explain(self) -> None:
        """``--explain N``: every block's dropped-document examples in one report — the read
        stage's and the compressibility filter's (it runs while tokenizing) — printed after
        the last progress bar, not between the bars of the stages."""
        if self.curate_cfg is None or not self.curate_cfg.explain:
            return
        from shoestring.prep.curate.curator import format_explain

        read = self.read_output
        examples = dict(read.examples) if read else {}
        if self.compress is not None and self.compress.examples:
            examples[self.compress.name] = self.compress.examples
        lines = [format_explain(examples, self.curate_cfg.explain).rstrip()]
        if read is not None:  # what data.max_document_chars did
            lines.append(f"long documents (data.max_document_chars={self.cfg.max_document_chars:,}"
                         f"): {counted(read.stats.split_documents, 'document')} cut into "
                         f"{counted(read.stats.split_pieces, 'piece')}")
        self.console.print("\n".join(lines), markup=False, highlight=False)

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
        need = cfg.row_body
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
            f"complete sequence: {counted(val['documents'], 'document')} with "
            f"{counted(have, 'token')}, fewer "
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
        compress = [] if self.compress is None else [
            {"block": "compressibility", "documents_in": seen, "documents_out": kept,
             "dropped": {"ratio_too_high": seen - kept},
             "max_ratio": round(self.compress.max_ratio, 4),
             "median_ratio": tok_info.get("median_ratio")}]
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
                        "kept_shards": self.stages.kept_shards},
            "stage_seconds": {**self.seconds, **self.stages.seconds},
            "seconds": round(seconds, 3),
            **({} if (executor := self.stages.describe()) is None else {"executor": executor}),
        }


class Split:
    """Prep's writer, block ``split``: kept documents in, ``spool-{train,val}.jsonl`` out.

    By document (content hash) when that holds out at least ``MIN_VAL_DOCUMENTS``; otherwise
    (one file, a few documents) the last ``val_fraction`` of the text, as nanoGPT does,
    cutting the document at the boundary at a line break. Which rule applies is known only at
    the end, so `write` spools the documents and `close` splits them. With a data mixture
    (``matcher``), each split's documents are grouped by source, in the recipe's order
    (``source_docs``: documents per split and source). ``hosts`` (canary hosts' doc ids)
    stay in train, outside the position cut."""

    name = "split"

    def __init__(self, build: Path, val_fraction: float, matcher: SourceMatcher | None = None,
                 hosts: Container[str] = (), keep_ids: bool = False) -> None:
        self.build, self.fraction, self.matcher, self.hosts = build, val_fraction, matcher, hosts
        self.keep_ids = keep_ids  # spool each document's id with it (`spool_documents`)
        self.n_sources = len(matcher.names) if matcher else 0
        self.kept = self.chars = self.by_hash = self.forced_chars = 0
        self.forced: set[int] = set()  # spool lines kept in train (canary hosts)
        self.n = {"train": 0, "val": 0}
        self.train_chars = 0
        self.source_docs: dict[str, list[int]] = {}
        self.how: dict = {"method": "document", "val_fraction": val_fraction}
        self.spool = build / "spool-all.jsonl"

    def write(self, docs: Iterable[Document]) -> None:
        """Spool the kept documents (and, with a mixture, each one's source)."""
        with open(self.spool, "w", encoding="utf-8") as f, \
                (open(self.spool.with_suffix(".src"), "wb") if self.matcher
                 else nullcontext()) as fsrc:
            for doc in docs:
                if doc.doc_id in self.hosts:
                    self.forced.add(self.kept)
                    self.forced_chars += len(doc.text)
                else:
                    self.by_hash += is_validation(doc.text, self.fraction)
                self.kept += 1
                self.chars += len(doc.text)
                f.write(_spool_line(doc.text, doc.doc_id if self.keep_ids else None))
                if self.matcher is not None:  # 2 bytes a document
                    fsrc.write(self.matcher.index(doc).to_bytes(2, "little"))
        if self.matcher is not None:
            self.matcher.check()

    def close(self) -> None:
        """Split the spool into train and val (``how``: which rule, for the manifest)."""
        by_position = self.by_hash < MIN_VAL_DOCUMENTS
        cut = round((self.chars - self.forced_chars) * (1 - self.fraction))
        position = 0
        n_sources = self.n_sources
        sources = (np.fromfile(self.spool.with_suffix(".src"), dtype="<u2") if n_sources
                   else np.zeros(0, dtype="<u2"))
        self.source_docs = {"train": [0] * n_sources, "val": [0] * n_sources}
        parts = [(split, k) for split in ("train", "val") for k in range(max(n_sources, 1))]
        with ExitStack() as files:
            out = {p: files.enter_context(open(self._part(*p), "w", encoding="utf-8"))
                   for p in parts}

            def write(split: str, text: str, k: int, doc_id: str | None) -> None:
                if text:
                    self.n[split] += 1
                    if n_sources:
                        self.source_docs[split][k] += 1
                    if split == "train":
                        self.train_chars += len(text)
                    out[split, k].write(_spool_line(text, doc_id))

            for line, (text, doc_id) in enumerate(spool_documents(self.spool)):
                k = int(sources[line]) if n_sources else 0
                if line in self.forced:  # canary hosts: train, outside the position cut
                    write("train", text, k, doc_id)
                    continue
                if not by_position:
                    split = "val" if is_validation(text, self.fraction) else "train"
                    write(split, text, k, doc_id)
                    continue
                at = min(max(cut - position, 0), len(text))
                if 0 < at < len(text):
                    at = _line_break_near(text, at)
                write("train", text[:at].strip(), k, doc_id)
                write("val", text[at:].strip(), k, doc_id)
                position += len(text)
        if n_sources:
            self._join_source_spools()
        self.spool.unlink()
        self.spool.with_suffix(".src").unlink(missing_ok=True)
        if by_position:
            self.how = {"method": "position", "val_fraction": self.fraction,
                        "reason": f"{counted(self.kept, 'document')} kept: fewer than "
                        f"{MIN_VAL_DOCUMENTS} would be held out by document"}

    def report(self) -> dict:
        return {"block": self.name, "documents_in": self.kept,
                "documents_out": self.n["train"] + self.n["val"], **self.n, **self.how}

    def _part(self, split: str, k: int) -> Path:
        """The spool of ``split`` (of its ``k``-th source's part, with a mixture)."""
        return self.build / (f"spool-{split}.{k}.jsonl" if self.n_sources
                             else f"spool-{split}.jsonl")

    def _join_source_spools(self) -> None:
        """Concatenate each split's per-source spools, in the recipe's order."""
        for split in ("train", "val"):
            with open(self.build / f"spool-{split}.jsonl", "wb") as joined:
                for k in range(self.n_sources):
                    with open(self._part(split, k), "rb") as f:
                        shutil.copyfileobj(f, joined, 1 << 20)
                    self._part(split, k).unlink()


def _short_vocabulary(info: dict, sample: dict[str, int] | None) -> str | None:
    """Why a trained vocabulary is smaller than ``data.vocab_size`` (None when it is not):
    the trainers stop when the text has no more pair to merge (seen at least twice), so a
    tiny corpus gives, say, 59 tokens of 8,192 — a model sized for the asked-for vocabulary
    without a word said about it (issue 52)."""
    got, asked = info["vocab_size"], info["requested_vocab_size"]
    if got >= asked:
        return None
    text = f" ({counted(sample['characters'], 'character')})" if sample else ""
    return (f"the {info['kind']} tokenizer learned {got:,} tokens, not the {asked:,} asked "
            f"for (data.vocab_size): too little training text{text} to hold more; add "
            "text, or lower data.vocab_size")


def _line_break_near(text: str, at: int) -> int:
    """A cut point near ``at``: the next line break, else the previous, else the next space."""
    for found in (text.find("\n", at), text.rfind("\n", 0, at), text.find(" ", at)):
        if 0 < found < len(text):
            return found
    return at


def _spool_line(text: str, doc_id: str | None) -> str:
    """A spool line: the text as a JSON string, or ``[text, doc_id]`` when ids are kept."""
    return json.dumps(text if doc_id is None else [text, doc_id], ensure_ascii=False) + "\n"


def spool_documents(path: Path) -> Iterator[tuple[str, str | None]]:
    """The (text, document id) of a spool's lines; the id is None where it was not kept
    (ids are spooled for ``--explain``, so that a block that runs after the split — the
    compressibility filter — names its drops ``file:line`` like the others)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            value = json.loads(line)
            yield (value, None) if isinstance(value, str) else (value[0], value[1])


def read_spool(path: Path) -> Iterator[str]:
    """The documents of a spool, their texts only."""
    return (text for text, _ in spool_documents(path))
