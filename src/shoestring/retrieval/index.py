"""`shoestring index` and the index it writes: passages, BM25, optional dense vectors.

An index dir (docs/retrieval.md)::

    .shoestring-index     marker: shoestring made this folder (--overwrite may replace it)
    manifest.json         sources and their fingerprint, settings, passage count, encoder
                          (path, sha256 of its weights, dimension), build timings
    passages.jsonl        one passage a line: source, doc_id, offset, text (row i = id i)
    bm25/                 the bm25s index
    dense.faiss           exact inner-product index of the encoder's embeddings (if any)

The folder is built beside its target and swapped in (complete or absent). Rebuilding is
incremental, as in prep: when the sources (paths, sizes, mtimes) and passage settings match
the existing index, passages and BM25 are kept and only a changed encoder is re-embedded;
when the encoder matches too, nothing is done.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shoestring import __version__
from shoestring.errors import ShoestringError
from shoestring.fsutil import building_dir, check_output_dir, write_json_atomic
from shoestring.retrieval.dense import DenseIndex, Embedder, encoder_hash
from shoestring.retrieval.fusion import reciprocal_rank_fusion
from shoestring.retrieval.lexical import LexicalIndex
from shoestring.retrieval.passages import Passage, split_documents
from shoestring.units import counted

FORMAT = "shoestring-index/1"
MARKER = ".shoestring-index"
MODES = ("bm25", "dense", "hybrid")
FUSION_DEPTH = 50  # hybrid fuses each mode's top max(4k, this)


@dataclass(frozen=True)
class Sources:
    """What an index is built from: source specs and how to read them."""

    specs: list[str]
    text_field: str = "text"
    split_on: str = "blank"

    @classmethod
    def resolve(cls, specs: list[str], text_field: str, split_on: str) -> Sources:
        """``specs``, or the sources a data dir was prepared from (with its read settings)."""
        from shoestring.data.datadir import FORMAT as DATA_FORMAT

        if len(specs) == 1 and (Path(specs[0]) / "manifest.json").is_file():
            path = Path(specs[0]) / "manifest.json"
            try:
                manifest = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ShoestringError(f"not valid JSON ({e})", where=str(path)) from None
            if isinstance(manifest, dict) and manifest.get("format") == DATA_FORMAT:
                cfg = manifest.get("config", {})
                return cls(list(manifest["sources"]), cfg.get("text_field", "text"),
                           cfg.get("split_on", "blank"))
        return cls(list(specs), text_field, split_on)

    def fingerprint(self) -> str:
        """prep's fingerprint of the same sources read the same way (paths, sizes, mtimes)."""
        from shoestring.config import DataConfig
        from shoestring.data.datadir import data_fingerprint

        return data_fingerprint(self.specs, DataConfig(text_field=self.text_field,
                                                       split_on=self.split_on))

    def passages(self, words: int) -> list[Passage]:
        from shoestring.data.sources import iter_documents

        return list(split_documents(iter_documents(self.specs, self.text_field,
                                                   split_on=self.split_on), words))


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of index dir ``folder``; anything else is a clear error."""
    path = folder / "manifest.json"
    if not (folder / MARKER).is_file() or not path.is_file():
        raise ShoestringError("not an index dir (no manifest.json / marker)", where=str(folder),
                              fix="build one with: shoestring index SOURCES -o INDEX_DIR")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ShoestringError(f"not valid JSON ({e})", where=str(path),
                              fix="rebuild the index (shoestring index ... --overwrite)") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ShoestringError(f"unknown index format (expected {FORMAT})", where=str(path),
                              fix="rebuild the index with this version (--overwrite)")
    return manifest


def _reusable(out: Path, sources_fp: str, settings: dict) -> dict | None:
    """The existing index's manifest when its passages can be kept as they are."""
    try:
        old = read_manifest(out)
    except ShoestringError:
        return None
    return old if old.get("fingerprint") == sources_fp and old.get("settings") == settings else None


def build_index(specs: list[str], out: str | Path, *, encoder: str | Path | None = None,
                passage_words: int = 100, text_field: str = "text", split_on: str = "blank",
                overwrite: bool = False,
                announce: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Build (or bring up to date) the index dir ``out``; returns its manifest, whose
    ``"rebuilt"`` lists the parts this call computed (empty: it was up to date)."""
    if passage_words < 1:
        raise ShoestringError(f"passage size must be at least 1 word, got {passage_words}",
                              where="--passage-words")
    out = Path(out)
    sources = Sources.resolve(specs, text_field, split_on)
    settings = {"passage_words": passage_words, "text_field": sources.text_field,
                "split_on": sources.split_on}
    fp = sources.fingerprint()  # resolves the specs: a bad path fails before any work
    enc_hash = encoder_hash(Path(encoder)) if encoder is not None else None
    old = _reusable(out, fp, settings)
    if old is None:
        check_output_dir(out, "index dir", owned=(out / MARKER).is_file(), overwrite=overwrite)
    elif (old.get("encoder") or {}).get("sha256") == enc_hash:
        announce(f"{out}: up to date (same sources, settings and encoder)")
        return {**old, "rebuilt": []}
    # The encoder is loaded (and a decoder refused) before anything is announced or built:
    # a refusal after "keeping N passages" read as if the index had been updated.
    embedder = Embedder(encoder) if encoder is not None else None
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    rebuilt: list[str] = []
    with building_dir(out) as tmp:
        (tmp / MARKER).write_text("shoestring index dir\n", encoding="utf-8")
        if old is not None:
            announce(f"{out}: sources unchanged, keeping {counted(old['passages'], 'passage')} "
                     "and BM25")
            shutil.copyfile(out / "passages.jsonl", tmp / "passages.jsonl")
            shutil.copytree(out / "bm25", tmp / "bm25")
            passages = read_passages(tmp)
            seconds.update(old.get("seconds", {}))
        else:
            t = time.perf_counter()
            passages = sources.passages(passage_words)
            if not passages:
                raise ShoestringError("the sources hold no text to index",
                                      where=", ".join(sources.specs))
            _write_passages(tmp / "passages.jsonl", passages)
            seconds["passages"] = round(time.perf_counter() - t, 3)
            t = time.perf_counter()
            LexicalIndex.build([p.text for p in passages]).save(tmp)
            seconds["bm25"] = round(time.perf_counter() - t, 3)
            rebuilt += ["passages", "bm25"]
            announce(f"{counted(len(passages), 'passage')}; BM25 in {seconds['bm25']:.1f}s")
        enc_info = None
        seconds.pop("dense", None)
        if embedder is not None:
            t = time.perf_counter()
            vectors = embedder.embed([p.text for p in passages],
                                     progress=embedding_progress(announce))
            DenseIndex.build(vectors).save(tmp)
            seconds["dense"] = round(time.perf_counter() - t, 3)
            enc_info = {"path": str(Path(encoder).resolve()), "sha256": enc_hash,
                        "dim": embedder.dim, "pooling": embedder.pooling}
            rebuilt.append("dense")
            announce(f"dense: {embedder.dim}-dim embeddings in {seconds['dense']:.1f}s")
        manifest = {
            "format": FORMAT,
            "shoestring_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "sources": sources.specs,
            "fingerprint": fp,
            "settings": settings,
            "documents": len({(p.source, p.doc_id) for p in passages}),
            "passages": len(passages),
            "encoder": enc_info,
            "bm25": {"library": "bm25s", "method": "lucene", "k1": 1.5, "b": 0.75,
                     "stopwords": "en"},
            "dense": {"library": "faiss", "index": "IndexFlatIP (exact)"} if enc_info else None,
            "seconds": seconds,
            "build_seconds": round(time.perf_counter() - t0, 3),
        }
        write_json_atomic(tmp / "manifest.json", manifest)
    return {**manifest, "rebuilt": rebuilt}


PROGRESS_EVERY_S = 10.0


def embedding_progress(announce: Callable[[str], None],
                       every_s: float = PROGRESS_EVERY_S) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` for dense embedding that announces a status line (count,
    rate, time left) on the first batch, every ``every_s`` seconds, and at the end: plain
    lines, so they also show in logs and CI, where a live progress bar would not."""
    t0 = time.perf_counter()
    last: list[float] = []  # when the last line was announced (none yet: empty)

    def progress(done: int, total: int) -> None:
        now = time.perf_counter() - t0
        if last and done < total and now - last[-1] < every_s:
            return
        last.append(now)
        rate = done / now if now > 0 else 0.0
        left = f", {(total - done) / rate:.0f}s left" if rate > 0 and done < total else ""
        announce(f"dense: embedded {done:,}/{total:,} passages ({rate:,.1f}/s{left})")

    return progress


def check_query(query: str, where: str = "query") -> None:
    """Refuse a query with no words: BM25 would return nothing and dense search the passages
    nearest an empty text, i.e. arbitrary ones, both looking like a real answer."""
    if not query.strip():
        raise ShoestringError(f"the query is empty ({query!r})", where=where,
                              fix="give some words to search for")


def _write_passages(path: Path, passages: list[Passage]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps(p.to_dict(), ensure_ascii=False) + "\n")


def read_passages(folder: Path) -> list[Passage]:
    path = folder / "passages.jsonl"
    with path.open(encoding="utf-8") as f:
        return [Passage(**json.loads(line)) for line in f]


@dataclass(frozen=True)
class Hit:
    """One retrieved passage: its row in the index, score under the mode, rank from 1."""

    id: int
    rank: int
    score: float
    passage: Passage

    def to_dict(self) -> dict:
        return {"id": self.id, "rank": self.rank, "score": self.score, **self.passage.to_dict()}


class RetrievalIndex:
    """An index dir opened for search (BM25 always; dense when built with an encoder)."""

    def __init__(self, folder: str | Path, encoder: str | Path | None = None) -> None:
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        self.passages = read_passages(self.folder)
        self.lexical = LexicalIndex.load(self.folder, len(self.passages))
        self._encoder_arg = Path(encoder) if encoder is not None else None
        self._embedder: Embedder | None = None
        self._dense: DenseIndex | None = None
        if self._encoder_arg is not None:
            self._check_encoder(self._encoder_arg, "--encoder")

    @property
    def has_dense(self) -> bool:
        return self.manifest.get("encoder") is not None

    def _check_encoder(self, path: Path, where: str) -> None:
        recorded = self.manifest.get("encoder")
        if recorded is None:
            raise ShoestringError(
                "this index has no dense part (it was built without --encoder)",
                where=str(self.folder / "manifest.json"),
                fix=f"rebuild it with: shoestring index {' '.join(self.manifest['sources'])} "
                f"-o {self.folder} --encoder {path}, or search with --mode bm25")
        got = encoder_hash(path)
        if got != recorded["sha256"]:
            raise ShoestringError(
                f"encoder mismatch: the index was built with the encoder at {recorded['path']} "
                f"(weights sha256 {recorded['sha256'][:12]}…), but {path} has weights sha256 "
                f"{got[:12]}… — query embeddings would not be comparable with the index's",
                where=where,
                fix=f"pass the encoder the index was built with, or rebuild the dense part: "
                f"shoestring index {' '.join(self.manifest['sources'])} -o {self.folder} "
                f"--encoder {path}")

    def embedder(self) -> Embedder:
        if self._embedder is None:
            path = self._encoder_arg
            if path is None:
                if not self.has_dense:
                    self._check_encoder(Path("ENCODER"), "--mode")
                path = Path(self.manifest["encoder"]["path"])
                self._check_encoder(path, str(self.folder / "manifest.json") + ": encoder.path")
            self._embedder = Embedder(path)
            self._dense = DenseIndex.load(self.folder)
        return self._embedder

    def search(self, query: str, k: int = 5, mode: str = "hybrid",
               where: str = "query") -> list[Hit]:
        return self.search_many([query], k, mode, where)[0]

    def search_many(self, queries: list[str], k: int = 5, mode: str = "hybrid",
                    where: str = "query") -> list[list[Hit]]:
        """Per query, the ``k`` best passages under ``mode`` (bm25, dense, or their RRF).
        ``where`` names the queries in errors (the CLI argument or API field they came from)."""
        for q in queries:
            check_query(q, where)
        if mode not in MODES:
            raise ShoestringError(f"unknown retrieval mode {mode!r}", where="--mode",
                                  fix=f"use one of: {', '.join(MODES)}")
        if k < 1:
            raise ShoestringError(f"k must be at least 1, got {k}", where="-k")
        depth = k if mode != "hybrid" else max(4 * k, FUSION_DEPTH)
        lexical = self.lexical.search(queries, depth) if mode != "dense" else None
        dense = None
        if mode != "bm25":
            vectors = self.embedder().embed(queries)
            assert self._dense is not None
            dense = self._dense.search(vectors, depth)
        out = []
        for i in range(len(queries)):
            if mode == "bm25":
                ranked = lexical[i]  # type: ignore[index]
            elif mode == "dense":
                ranked = dense[i]  # type: ignore[index]
            else:
                ranked = reciprocal_rank_fusion(
                    [[r for r, _ in lexical[i]], [r for r, _ in dense[i]]], k)  # type: ignore[index]
            out.append([Hit(r, n, s, self.passages[r]) for n, (r, s) in enumerate(ranked[:k], 1)])
        return out

    def embed_passages(self, rows: list[int]) -> np.ndarray:
        """Stored embeddings of passages ``rows`` (for tests and benchmarks)."""
        self.embedder()
        assert self._dense is not None
        return np.stack([self._dense._index.reconstruct(int(r)) for r in rows])
