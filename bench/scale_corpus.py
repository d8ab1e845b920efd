"""Scaled corpora with planted near-duplicates, for bench/prep_scale.py (and its test).

A corpus of a given size (UTF-8 bytes of text) is made from a real one (by default
``shared/data/corpora/wiki-books-en.jsonl.zst``) by recombining its paragraphs: every new
document takes the source and the paragraph count of a random real document, and that many
random paragraphs of the same source (Wikipedia or Gutenberg), so documents look like the
real ones but are new text. Into that stream, clusters are planted at known rates:

* a document chosen as a cluster head gets 1–3 copies (a head needs ``MIN_NEAR_WORDS``
  words: one drawn on a shorter document passes to the next long enough one),
  each placed at a random later position (up to ``max_delay`` documents on), so prep's
  "keep the first of a cluster" keeps the head;
* a copy is exact, or a near copy: word-level edits (substitutions, deletions, insertions
  of words from the same corpus) at random places until the Jaccard similarity with the
  head, measured on the shingles prep's fuzzy dedup hashes (word ``ngram``-grams with
  ``curate.text``'s words), falls to a target drawn uniformly from ``[j_lo, j_hi]``.

Everything is drawn from one seeded ``numpy`` generator, so a seed gives the same bytes.
Written as ``shards/part-NNNNN.jsonl.zst`` (``{"id", "source", "text"}``), ``truth.jsonl``
(one line per planted copy: its id and location ``file:line``, the head's, the kind and
the measured Jaccard) and ``meta.json`` (counts; written last, so its presence means the
corpus is complete and can be reused).
"""

from __future__ import annotations

import heapq
import io
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from shoestring.prep.curate.text import ngram_hashes, word_hashes
from shoestring.fsutil import write_json_atomic

BUILDER_VERSION = 2
MIN_NEAR_WORDS = 300  # shorter heads cannot hit a Jaccard target finely (an edit moves it a lot)
_WS = re.compile(r"(\s+)")


@dataclass(frozen=True)
class CorpusSpec:
    """What to build; every field is part of the cache key."""

    size_bytes: int
    seed: int = 0
    near_frac: float = 0.03  # fraction of documents that are near copies (about)
    exact_frac: float = 0.01  # fraction that are exact copies (about)
    j_lo: float = 0.7
    j_hi: float = 0.95
    ngram: int = 5  # curate.minhash_ngram
    shard_bytes: int = 128 << 20
    max_delay: int = 5000

    def key(self) -> str:
        return (f"wb-{self.size_bytes / 1e9:g}gb-s{self.seed}-n{self.near_frac:g}-e{self.exact_frac:g}"
                f"-j{self.j_lo:g}_{self.j_hi:g}-g{self.ngram}-v{BUILDER_VERSION}")


@dataclass
class Pool:
    """The real corpus cut into paragraphs per source, and the paragraph counts of its docs."""

    paragraphs: dict[str, list[str]]
    templates: list[tuple[str, int]]  # (source, paragraphs) of every real document
    joiners: dict[str, str]
    vocabulary: list[str]


def read_jsonl(path: Path) -> Iterator[dict]:
    """Records of a .jsonl or .jsonl.zst file."""
    with open(path, "rb") as raw:
        stream = raw
        if path.name.endswith(".zst"):
            import zstandard

            stream = zstandard.ZstdDecompressor().stream_reader(raw)
        for line in io.TextIOWrapper(stream, encoding="utf-8"):
            if line.strip():
                yield json.loads(line)


def load_pool(records: Iterator[dict], max_bytes: int | None = None) -> Pool:
    """Paragraphs (non-empty lines) per source; ``max_bytes`` stops reading early."""
    paragraphs: dict[str, list[str]] = {}
    templates: list[tuple[str, int]] = []
    joiners: dict[str, str] = {}
    seen = 0
    for rec in records:
        text, source = rec["text"], rec.get("source", "text")
        parts = [p for p in text.split("\n") if p.strip()]
        if not parts:
            continue
        paragraphs.setdefault(source, []).extend(parts)
        templates.append((source, len(parts)))
        joiners.setdefault(source, "\n\n" if "\n\n" in text else "\n")
        seen += len(text.encode("utf-8"))
        if max_bytes is not None and seen >= max_bytes:
            break
    if not templates:
        raise ValueError("the source corpus has no text")
    rng = np.random.default_rng(0)
    words: list[str] = []
    for source, paras in sorted(paragraphs.items()):
        for i in rng.integers(0, len(paras), min(2000, len(paras))):
            words.extend(w for w in paras[i].split() if w.isalpha())
    return Pool(paragraphs, templates, joiners, words or ["word"])


def shingles(text: str, ngram: int) -> np.ndarray:
    """The distinct shingle hashes fuzzy dedup sees (word ``ngram``-grams, curate.text words)."""
    return np.unique(ngram_hashes(word_hashes(text), ngram))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted, distinct hash arrays."""
    if a.size == 0 and b.size == 0:
        return 1.0
    inter = np.intersect1d(a, b, assume_unique=True).size
    return inter / (a.size + b.size - inter)


def near_copy(text: str, target: float, rng: np.random.Generator, vocabulary: list[str],
              ngram: int) -> tuple[str, float]:
    """A copy of ``text`` with word edits: the fewest edits of a random edit sequence that
    bring the shingle Jaccard to ``target`` or just above it; returns (text, Jaccard)."""
    tokens = _WS.split(text)  # words at even indices, whitespace at odd ones
    words_at = [i for i in range(0, len(tokens), 2) if tokens[i]]
    base = shingles(text, ngram)
    # Each edit changes about ``ngram`` shingles: J ≈ (S - n k) / (S + n k); allow 3x that.
    need = base.size * (1 - target) / (ngram * (1 + target))
    m = min(len(words_at), int(3 * need) + 8)
    places = rng.choice(words_at, size=m, replace=False)
    ops = rng.choice(3, size=m, p=[0.6, 0.2, 0.2])  # substitute, delete, insert
    fresh = rng.integers(0, len(vocabulary), size=m)

    def edited(k: int) -> str:
        out = list(tokens)
        for place, op, w in zip(places[:k], ops[:k], fresh[:k]):
            word = vocabulary[w]
            out[place] = word if op == 0 else "" if op == 1 else f"{out[place]} {word}"
        return "".join(out)

    lo, hi = 0, m  # J(lo) >= target; find the largest such k (J falls as edits accumulate)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if jaccard(base, shingles(edited(mid), ngram)) >= target:
            lo = mid
        else:
            hi = mid - 1
    copy = edited(lo)
    return copy, jaccard(base, shingles(copy, ngram))


class _Writer:
    """jsonl.zst shards of about ``shard_bytes`` of text each; locations are ``file:line``."""

    def __init__(self, folder: Path, shard_bytes: int) -> None:
        import zstandard

        self.folder, self.shard_bytes = folder, shard_bytes
        self._zstd = zstandard.ZstdCompressor(level=3)
        folder.mkdir(parents=True, exist_ok=True)
        self.shards, self.docs, self.bytes = 0, 0, 0
        self._open = None
        self._raw = None
        self._in_shard = 0
        self._line = 0

    def write(self, doc_id: str, source: str, text: str) -> str:
        if self._open is None or self._in_shard >= self.shard_bytes:
            self._roll()
        line = json.dumps({"id": doc_id, "source": source, "text": text}, ensure_ascii=False)
        self._open.write(line.encode("utf-8") + b"\n")
        n = len(text.encode("utf-8"))
        self._in_shard += n
        self.bytes += n
        self.docs += 1
        self._line += 1
        return f"{self.name}:{self._line}"

    def _roll(self) -> None:
        self.close()
        self.name = f"part-{self.shards:05d}.jsonl.zst"
        self._raw = open(self.folder / self.name, "wb")
        self._open = self._zstd.stream_writer(self._raw)
        self.shards += 1
        self._in_shard = self._line = 0

    def close(self) -> None:
        if self._open is not None:
            self._open.close()  # closes the file too
            self._open = None


def _new_document(pool: Pool, rng: np.random.Generator) -> tuple[str, str]:
    source, n = pool.templates[int(rng.integers(len(pool.templates)))]
    paras = pool.paragraphs[source]
    picks = rng.integers(0, len(paras), size=max(3, n))
    return source, pool.joiners[source].join(paras[i] for i in picks)


def build_corpus(pool: Pool, spec: CorpusSpec, out: Path) -> dict:
    """Write the corpus of ``spec`` to ``out`` (see the module docstring); returns meta."""
    rng = np.random.default_rng(spec.seed)
    planted = spec.near_frac + spec.exact_frac
    head_p = planted / (2 * (1 - planted))  # 2 copies per head on average
    near_share = spec.near_frac / planted if planted else 0.0
    writer = _Writer(out / "shards", spec.shard_bytes)
    pending: list[tuple[int, int, str, str, dict]] = []  # (due, seq, source, text, truth)
    counts = {"near": 0, "exact": 0, "heads": 0, "near_failed": 0}
    seq = owed = 0
    with open(out / "truth.jsonl", "w", encoding="utf-8") as truth:
        while writer.bytes < spec.size_bytes or pending:
            if pending and (pending[0][0] <= writer.docs or writer.bytes >= spec.size_bytes):
                _, _, source, text, entry = heapq.heappop(pending)
                entry["id"] = f"d{writer.docs:09d}"
                entry["loc"] = writer.write(entry["id"], source, text)
                truth.write(json.dumps(entry) + "\n")
                continue
            source, text = _new_document(pool, rng)
            doc_id = f"d{writer.docs:09d}"
            loc = writer.write(doc_id, source, text)
            owed += rng.random() < head_p  # a head drawn on a short document waits for
            if not owed or len(text.split()) < MIN_NEAR_WORDS:  # the next long one
                continue
            owed -= 1
            counts["heads"] += 1
            for _ in range(int(rng.integers(1, 4))):
                entry = {"copy_of": doc_id, "copy_of_loc": loc}
                if rng.random() < near_share:
                    copy, j = near_copy(text, float(rng.uniform(spec.j_lo, spec.j_hi)), rng,
                                        pool.vocabulary, spec.ngram)
                    if not spec.j_lo <= j <= spec.j_hi:
                        counts["near_failed"] += 1
                        continue
                    entry |= {"kind": "near", "jaccard": round(j, 4)}
                else:
                    copy, entry = text, entry | {"kind": "exact", "jaccard": 1.0}
                counts[entry["kind"]] += 1
                due = writer.docs + int(rng.integers(1, spec.max_delay + 1))
                heapq.heappush(pending, (due, seq, source, copy, entry))
                seq += 1
    writer.close()
    meta = {"spec": asdict(spec), "key": spec.key(), "documents": writer.docs,
            "text_bytes": writer.bytes, "shards": writer.shards, "planted": counts}
    write_json_atomic(out / "meta.json", meta)
    return meta


def cached_corpus(pool_loader, spec: CorpusSpec, cache: Path) -> tuple[Path, dict]:
    """The corpus of ``spec`` under ``cache`` (built when absent or incomplete)."""
    out = cache / spec.key()
    if (out / "meta.json").is_file():
        return out, json.loads((out / "meta.json").read_text())
    if out.exists():
        import shutil

        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out, build_corpus(pool_loader(), spec, out)


def load_truth(folder: Path) -> list[dict]:
    with open(folder / "truth.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


__all__ = ["CorpusSpec", "Pool", "build_corpus", "cached_corpus", "jaccard", "load_pool",
           "load_truth", "near_copy", "read_jsonl", "shingles"]
