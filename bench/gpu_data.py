"""The data the GPU check's default-path and quality rows train on (docs/gpu.md): a
deterministic slice of the shared wiki-books corpus, prepared here on the CPU and carried to
the lent GPU machine in the ignored folder ``.gpu-data/`` (the machine has no network and
the device command's 10 minutes are too few to prep there as well).

The slice keeps every ``--every``-th document of each source, counted within the source
(the corpus is grouped by source, Wikipedia first, then Gutenberg), so both sources and
every Gutenberg book are represented in their corpus proportions; with the default stride of
4 that is about a quarter of the corpus. ``shoestring prep`` then packs it for the
BERT-base row: masked LM, seq 128, a 32,768-token WordPiece vocabulary. Everything that
travels must stay under the device tool's 64 MiB (tree + wheels + data), so the script ends
by printing the data dir's size and its token counts. Beside the data dir it writes
``glue/SST-2`` (the first 5,000 train rows and the dev split, ~0.4 MiB): the shared task of
the RTD-vs-MLM row (``GPU_PART=rtd``, issue 60).

    python bench/gpu_data.py                      # -> .gpu-data/wiki-books-32k (make gpu-data)
    python bench/gpu_data.py --every 8 --out /tmp/half   # a smaller slice

Exit 2 with what to do when the corpus is missing or the output exists (pass --overwrite).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from common import ROOT, SHARED

CORPUS = SHARED / "corpora" / "wiki-books-en.jsonl.zst"
OUT = ROOT / ".gpu-data" / "wiki-books-32k"
WORK = ROOT / "runs" / "gpu-data"  # the slice's JSONL (ignored; not carried, removed after)
VOCAB, SEQ_LEN = 32768, 128
GLUE_TASK, GLUE_ROWS = "SST-2", 5000  # the RTD-vs-MLM row's shared task (GPU_PART=rtd)


def write_slice(corpus: Path, every: int, out: Path, *, source: str | None = None,
                phase: int = 0, max_chars: int | None = None) -> Counter:
    """Every ``every``-th document of each source of ``corpus`` (JSONL, zstd) into ``out``
    (plain JSONL), in corpus order; returns the documents kept per source. ``source`` keeps
    one source only; ``phase`` which of each ``every`` (0: the first); ``max_chars`` stops
    adding documents of a source once the text kept from it reaches that many characters."""
    import zstandard

    kept: Counter = Counter()
    seen: Counter = Counter()
    chars: Counter = Counter()
    tmp = out.with_name(out.name + ".tmp")
    with open(corpus, "rb") as raw, open(tmp, "w", encoding="utf-8") as dst:
        src = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), encoding="utf-8")
        for n, line in enumerate(src, 1):
            try:
                doc = json.loads(line)
                name = doc["source"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SystemExit(f"error: {corpus}:{n}: not a JSON object with a 'source' "
                                 "field; is this the shared wiki-books corpus?") from None
            if (seen[name] % every == phase and source in (None, name)
                    and (max_chars is None or chars[name] < max_chars)):
                dst.write(line if line.endswith("\n") else line + "\n")
                kept[name] += 1
                chars[name] += len(doc.get("text", ""))
            seen[name] += 1
    tmp.replace(out)
    return kept


def glue_slice(glue: Path, out: Path, task: str = GLUE_TASK, rows: int = GLUE_ROWS) -> Path:
    """``glue/<task>`` beside the data dir, its train split cut to the first ``rows`` rows and
    its dev split whole: the shared task the RTD-vs-MLM row fine-tunes on (``--max-train``
    reads no further), small enough to travel with the slice. Returns the GLUE folder."""
    src, dst = glue / task, out / task
    dst.mkdir(parents=True, exist_ok=True)
    with open(src / "train.tsv", encoding="utf-8") as f:
        head = [line for _, line in zip(range(rows + 1), f)]  # the header and `rows` rows
    (dst / "train.tsv").write_text("".join(head), encoding="utf-8")
    (dst / "dev.tsv").write_bytes((src / "dev.tsv").read_bytes())
    return out


def du_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (what the device tool carries)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--every", type=int, default=4,
                    help="keep every N-th document of each source (default 4: ~17M tokens)")
    ap.add_argument("--out", type=Path, default=OUT, help="data dir to write")
    ap.add_argument("--workers", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    ap.add_argument("--overwrite", action="store_true", help="replace an existing data dir")
    ap.add_argument("--glue", type=Path, default=SHARED / "glue",
                    help=f"GLUE folder whose {GLUE_TASK} is sliced beside the data dir")
    args = ap.parse_args(argv)
    if args.every < 1:
        ap.error("--every must be at least 1")
    if not args.corpus.is_file():
        print(f"error: no corpus at {args.corpus}: the shared data (../shared/data, its "
              "README.md) is needed to build the slice; pass --corpus PATH", file=sys.stderr)
        return 2
    if (args.glue / GLUE_TASK / "train.tsv").is_file():
        glue = glue_slice(args.glue, args.out.parent / "glue")
        print(f"{glue / GLUE_TASK}: the first {GLUE_ROWS:,} train rows and the dev split "
              f"({du_bytes(glue) / 2**20:.1f} MiB)")
    else:
        print(f"warning: no {args.glue / GLUE_TASK}: the RTD-vs-MLM row (GPU_PART=rtd) will "
              "refuse without it", file=sys.stderr)
    if (args.out / "manifest.json").is_file() and not args.overwrite:
        print(f"{args.out} is already prepared (--overwrite builds it again)")
        report(args.out)
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    sliced = WORK / f"wiki-books-every{args.every}.jsonl"
    if not sliced.is_file():  # kept until prep succeeds, so an interrupted prep resumes
        kept = write_slice(args.corpus, args.every, sliced)
        print(f"slice: every {args.every}th document of each source: "
              + ", ".join(f"{k} {v:,}" for k, v in sorted(kept.items()))
              + f" ({sliced.stat().st_size / 2**20:.0f} MiB of JSONL)", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "shoestring", "prep", str(sliced), "-o", str(args.out),
           "--objective", "mlm", "--set", f"data.vocab_size={VOCAB}",
           "--set", f"data.seq_len={SEQ_LEN}", "-j", str(args.workers)]
    if args.overwrite:
        cmd.append("--overwrite")
    print("$ " + " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    if rc:
        print(f"error: shoestring prep exited {rc}; rerun this command to resume it",
              file=sys.stderr)
        return rc
    sliced.unlink()
    report(args.out)
    return 0


def report(out: Path) -> None:
    """The data dir's token counts and size: what the GPU rows train on and what travels."""
    from shoestring.data.datadir import DataDir

    data = DataDir(out)
    rows = {s: len(data.split(s)) for s in ("train", "val")}
    print(f"{out}: {rows['train'] * data.seq_len:,} train tokens, "
          f"{rows['val'] * data.seq_len:,} val tokens ({rows['train']:,} + {rows['val']:,} "
          f"sequences of {data.seq_len}), vocab {data.vocab_size:,}; "
          f"{du_bytes(out) / 2**20:.1f} MiB on disk")


if __name__ == "__main__":
    sys.exit(main())
