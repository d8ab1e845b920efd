"""End-to-end `shoestring prep` throughput against the bare `tokenizers` batch encoder.

What is compared, on the same text (the documents' text fields, counted in UTF-8 bytes):

* ceiling: `Tokenizer.encode_batch_fast` over all documents already in memory, in batches of
  1,024, with its own thread pool on every core — what tokenizing alone costs;
* prep: the whole pipeline with that same tokenizer given as ``data.tokenizer=PATH`` (read the
  JSON lines, clean, split, spool, tokenize, pack, checksum, write the manifest), with 1 and
  with 2 ``--workers``; runs are interleaved with the ceiling and the median is kept;
* prep including training the tokenizer (the default), for reference;
* peak RSS of a default prep in a fresh process (main process, and the largest worker).

The machine may be shared: the load average is printed before and after; compare ratios.

    python bench/prep.py [--corpus PATH] [--repeats 2] [--max-mb 0]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from shoestring.config import DataConfig
from shoestring.data.prep import prep

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "corpora" / "mixed-en.jsonl"


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def subset(corpus: Path, max_mb: float, tmp: Path) -> Path:
    if max_mb <= 0:
        return corpus
    out = tmp / "subset.jsonl"
    budget = int(max_mb * 1e6)
    with corpus.open("rb") as f, out.open("wb") as g:
        for line in f:
            if budget <= 0:
                break
            g.write(line)
            budget -= len(line)
    return out


def texts_of(corpus: Path) -> list[str]:
    with corpus.open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def time_ceiling(tokenizer_path: Path, texts: list[str]) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    t = time.perf_counter()
    for i in range(0, len(texts), 1024):
        tok.encode_batch_fast(texts[i : i + 1024], add_special_tokens=False)
    return time.perf_counter() - t


def time_prep(corpus: Path, out: Path, cfg: DataConfig) -> tuple[float, dict]:
    quiet = Console(file=io.StringIO())
    t = time.perf_counter()
    manifest = prep([str(corpus)], out, cfg, console=quiet)
    return time.perf_counter() - t, manifest


_RSS_SCRIPT = """
import json, resource, sys
from shoestring.config import DataConfig
from shoestring.data.prep import prep
from rich.console import Console
import io
prep([sys.argv[1]], sys.argv[2], DataConfig(workers=int(sys.argv[3])), console=Console(file=io.StringIO()))
print(json.dumps([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))
"""


def peak_rss(corpus: Path, out: Path, workers: int) -> tuple[float, float]:
    proc = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(corpus), str(out), str(workers)],
                          capture_output=True, text=True, check=True)
    main_kb, child_kb = json.loads(proc.stdout.strip().splitlines()[-1])
    return main_kb / 1024, child_kb / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-mb", type=float, default=0.0, help="use only the first N MB (0: all)")
    args = ap.parse_args()
    if not args.corpus.is_file():
        sys.exit(f"corpus not found: {args.corpus}")
    print(f"load average before: {load_avg()}  (cores: {os.cpu_count()})")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        corpus = subset(args.corpus, args.max_mb, tmp)
        texts = texts_of(corpus)
        mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
        print(f"corpus: {corpus} — {len(texts):,} documents, {mb:.1f} MB of text")

        full_s, manifest = time_prep(corpus, tmp / "full", DataConfig())
        tok_path = tmp / "full" / "tokenizer.json"
        print(f"prep with tokenizer training: {full_s:.1f} s; stages {manifest['stage_seconds']}")

        times: dict[str, list[float]] = {"ceiling": [], "prep w1": [], "prep w2": []}
        for r in range(args.repeats):
            times["ceiling"].append(time_ceiling(tok_path, texts))
            for w in (1, 2):
                s, m = time_prep(corpus, tmp / f"w{w}-{r}", DataConfig(tokenizer=str(tok_path),
                                                                       workers=w))
                times[f"prep w{w}"].append(s)
                print(f"  repeat {r}: workers={w} {s:.1f} s, stages {m['stage_seconds']}")
            print(f"  repeat {r}: ceiling {times['ceiling'][-1]:.1f} s")
        main_mb, _ = peak_rss(corpus, tmp / "rss", 1)
        main2_mb, child2_mb = peak_rss(corpus, tmp / "rss2", 2)

    ceiling = statistics.median(times["ceiling"])
    print()
    print(f"| run | seconds (median of {args.repeats}) | MB/s of text | vs ceiling |")
    print("|---|---|---|---|")
    print(f"| bare `tokenizers` encode_batch_fast (ceiling) | {ceiling:.1f} | {mb / ceiling:.2f} | 100% |")
    for w in (1, 2):
        s = statistics.median(times[f"prep w{w}"])
        print(f"| prep, given tokenizer, --workers {w} | {s:.1f} | {mb / s:.2f} | {ceiling / s:.0%} |")
    print(f"| prep incl. WordPiece training, --workers 1 (one run) | {full_s:.1f} | {mb / full_s:.2f} "
          f"| {ceiling / full_s:.0%} |")
    print()
    print(f"peak RSS, default prep: {main_mb:.0f} MB (--workers 1); "
          f"{main2_mb:.0f} MB main + {child2_mb:.0f} MB largest worker (--workers 2)")
    print(f"load average after: {load_avg()}")


if __name__ == "__main__":
    main()
