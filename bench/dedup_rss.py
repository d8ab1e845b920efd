"""Peak memory of prep's dedup blocks as the corpus grows, this tree against a git ref.

For each size (MB of text read from the start of the corpus), a fresh Python process runs
fuzzy dedup (``FuzzyDedup.process``, the block prep runs) over the corpus's documents or,
with ``--unit paragraph`` (the default), over its paragraphs (its lines: many
more, shorter documents for the same text, which is what per-document memory shows up in).
Documents are streamed from the zstd file, never held by the driver. Each process prints
its peak RSS (``VmHWM``), its peak RSS after the imports and before the first document (the
difference is what dedup took), the documents, those kept, and the seconds.

``--ref`` runs the same driver against ``git archive REF src`` (the code before a change),
interleaved with this tree, so both see the same machine load (printed before and after:
``bench/common.py``'s header; both tables are recorded, ``--record``).

It also measures, with tracemalloc, two per-document constants the docs state: the exact
dedup index (``ExactDedup`` over ``--exact-docs`` distinct texts) and the fuzzy decision
(``band_collisions`` over ``--decision-docs`` random documents' 14 band keys).

    python bench/dedup_rss.py --sizes 10 30 100 --ref c59df30
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from common import ROOT, SHARED, Bench, parser

CORPUS = SHARED / "corpora" / "wiki-books-en.jsonl.zst"

CHILD = r"""
import io, json, sys, time
import zstandard
from shoestring.prep.curate.minhash import FuzzyDedup
from shoestring.data.sources import Document

path, limit, unit = sys.argv[1], float(sys.argv[2]) * 1e6, sys.argv[3]

def docs():
    read = 0
    with open(path, "rb") as raw:
        stream = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), "utf-8")
        for line_no, line in enumerate(stream):
            text = json.loads(line)["text"]
            parts = text.split("\n") if unit == "paragraph" else [text]
            for k, part in enumerate(parts):
                if not part.strip():
                    continue
                read += len(part)
                yield Document(part, "corpus", f"{line_no}:{k}")
                if read >= limit:
                    return

def hwm_mb():
    # VmHWM: this process's peak RSS (ru_maxrss would include the forked parent's, which
    # Linux carries across exec).
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024

block = FuzzyDedup()
import rensa  # noqa: imported on first use; counted in the base
base = hwm_mb()
t = time.perf_counter()
n = kept = 0
for doc in block.process(d for d in docs()):
    kept += 1
n = block.stats.docs_in
seconds = time.perf_counter() - t
print(json.dumps({"docs": n, "kept": kept, "seconds": seconds, "base_mb": base,
                  "peak_mb": hwm_mb()}))
"""


def source_of(ref: str | None, tmp: Path) -> Path:
    """``src`` of this tree, or of ``ref`` extracted with git archive."""
    if ref is None:
        return ROOT / "src"
    out = tmp / ref
    out.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], check=True,
                         capture_output=True).stdout
    tar_path = tmp / f"{ref}.tar"
    tar_path.write_bytes(tar)
    with tarfile.open(tar_path) as t:
        t.extractall(out)
    return out / "src"


def run_child(src: Path, corpus: Path, mb: float, unit: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(corpus), str(mb), unit],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def exact_bytes_per_doc(n: int) -> float:
    """Traced memory ExactDedup holds per distinct document (its key set)."""
    import tracemalloc

    from shoestring.prep.curate.dedup import ExactDedup
    from shoestring.data.sources import Document

    block = ExactDedup()
    docs = (Document(f"document number {i}", "t", str(i)) for i in range(n))
    tracemalloc.start()
    for _ in block.process(docs):
        pass
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held / n


def decision_bytes_per_doc(n: int, bands: int = 14) -> float:
    """Traced peak of ``band_collisions`` per document (random keys, 1% duplicates)."""
    import numpy as np

    rng = np.random.default_rng(0)
    keys = rng.integers(0, 1 << 63, (n, bands), dtype=np.uint64)
    for b in range(bands):
        dup = rng.choice(n, n // 100, replace=False)
        keys[dup, b] = keys[rng.integers(0, n, len(dup)), b]
    return band_decision_peak(keys)


def band_decision_peak(keys: Any) -> float:
    """Traced peak bytes per document of ``band_collisions`` on ``keys`` (documents × bands),
    spilled one file per band as FuzzyDedup spills them; consumes ``keys``."""
    import tracemalloc

    import numpy as np

    from shoestring.prep.curate.minhash import band_collisions

    n = len(keys)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"band-{b}.u64" for b in range(keys.shape[1])]
        for b, path in enumerate(paths):
            np.ascontiguousarray(keys[:, b]).tofile(path)
        del keys
        tracemalloc.start()
        band_collisions(paths, n)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / n


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--sizes", type=float, nargs="+", default=[10, 30, 100],
                    help="MB of text (million characters) per run")
    ap.add_argument("--unit", choices=["paragraph", "document"], default="paragraph")
    ap.add_argument("--ref", default=None, help="git ref to compare against (e.g. c59df30)")
    ap.add_argument("--exact-docs", type=int, default=200_000)
    ap.add_argument("--decision-docs", type=int, default=1_000_000)
    args = ap.parse_args()
    if not args.corpus.is_file():
        raise SystemExit(f"corpus not found: {args.corpus} (see ../shared/data/README.md)")
    bench = Bench("dedup_rss", args)
    setting = f"corpus {args.corpus.name}, unit: {args.unit}"
    print(f"{os.cpu_count()} CPUs; {setting}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"this tree": source_of(None, Path(tmp))}
        if args.ref:
            sides[args.ref] = source_of(args.ref, Path(tmp))
        print(f"{'side':>12} {'MB':>6} {'docs':>9} {'kept':>9} {'s':>7} {'RSS base':>9} "
              f"{'RSS peak':>9} {'dedup MB':>9}")
        for mb in args.sizes:
            for name, src in sides.items():  # interleaved: both see the same load
                r = run_child(src, args.corpus, mb, args.unit)
                print(f"{name:>12} {mb:>6g} {r['docs']:>9,} {r['kept']:>9,} {r['seconds']:>7.1f} "
                      f"{r['base_mb']:>9.0f} {r['peak_mb']:>9.0f} "
                      f"{r['peak_mb'] - r['base_mb']:>9.0f}", flush=True)
                rows.append({"side": name, "MB": mb, "docs": r["docs"], "kept": r["kept"],
                             "s": r["seconds"], "RSS base": r["base_mb"],
                             "RSS peak": r["peak_mb"], "dedup MB": r["peak_mb"] - r["base_mb"]})
    bench.table(rows, "rss", formats={"MB": "g", "s": ".1f", "RSS base": ".0f",
                                      "RSS peak": ".0f", "dedup MB": ".0f"}, notes=[setting])
    exact = exact_bytes_per_doc(args.exact_docs)
    print(f"exact dedup index: {exact:,.0f} bytes per distinct "
          f"document (tracemalloc, {args.exact_docs:,} documents)")
    decision = decision_bytes_per_doc(args.decision_docs)
    print(f"fuzzy decision (band_collisions, 14 bands): "
          f"{decision:,.0f} bytes per document at peak "
          f"(tracemalloc, {args.decision_docs:,} documents)")
    bench.table([{"structure": "exact dedup index (per distinct document)", "bytes/doc": exact,
                  "documents": args.exact_docs},
                 {"structure": "fuzzy decision, band_collisions, 14 bands (at peak)",
                  "bytes/doc": decision, "documents": args.decision_docs}], "per_document",
                formats={"bytes/doc": ",.0f"}, notes=["tracemalloc"])
    bench.end()


if __name__ == "__main__":
    main()
