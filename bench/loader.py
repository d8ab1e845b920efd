"""Training-data loader throughput: tokens per second per CPU core, as ready-to-train batches.

What one measurement is: in a fresh process with ``torch.set_num_threads(1)`` (one core), the
trainer's own `BatchLoader` (prefetch 0: batches are assembled in the measuring thread, so the
time is all on that core) over the ``train`` split of a real data dir of ≥ 1,000 shards,
shuffled (random rows across all shards), followed by the objective's ``make_batch`` (for the
encoder: 80/10/10 masking at the default rate, train/objectives.py → data/masking.py) and, when
CUDA is present, pinning of every tensor of the batch (the loader gathers into pinned memory;
the masked tensors are pinned by a copy). Tokens counted are rows × seq_len of the batches
handed out in a fixed window after a warm-up, so the figure is the loader's capacity, not a
training run's.

Configurations: the encoder (MLM) at seq 128 and 512, the decoder (CLM) at seq 1024, with
32,768-token local batches (256, 64, 32 rows). ``--procs 1,2`` also runs N such processes at
once as the N ranks of a data-parallel world (each takes its contiguous slice of every global
batch, as under torchrun), started together; their sum is the node's rate, and sum / N the
rate per core (meaningful while N ≤ idle cores: the load average is printed).

Data dirs: the first run builds them under ``--cache`` (reused afterwards): a real
``shoestring prep`` of a small text (so the manifest, tokenizer and format are the project's),
whose train split is then replaced by ``--shards`` shards written with the project's shard
writer (data/shards.py) from random token ids of that vocabulary ([CLS] … [SEP] rows for MLM,
``<|endoftext|>`` every ~500 tokens for CLM). Which ids the rows hold does not change the
loader's speed. The shard files are read through the page cache (they are hot after the
first pass; a node training on a corpus that fits in RAM sees the same).

``--cold`` evicts the shard files from the page cache (``posix_fadvise(DONTNEED)``) before
each process opens them, so its window starts by reading from disk (a VM's host may still
cache them).

``--baseline-ref REF`` measures the loader and masking of an earlier commit on the same data
in the same run (a temporary git worktree), alternating with today's. ``--profile`` prints
cProfile's top functions for the seq-128 encoder pipeline.

    python bench/loader.py [--cache DIR] [--shards 1000] [--seconds 2] [--procs 1,2]
                           [--repeats 1] [--baseline-ref REF] [--profile] [--cold]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from common import ROOT, SHARED, Bench, add_repeats, parser

CONFIGS = {  # name: (objective, seq_len, local batch rows)
    "encoder seq 128": ("mlm", 128, 256),
    "encoder seq 512": ("mlm", 512, 64),
    "decoder seq 1024": ("clm", 1024, 32),
}


# --- the data dirs ---------------------------------------------------------------------


def _small_text(path: Path) -> None:
    """A few hundred KB of text for the tokenizer: the shared corpus when present, else
    generated words (the tokenizer only fixes the vocabulary; the rows are random ids)."""
    shared = SHARED / "corpora" / "mixed-en.jsonl"
    if shared.is_file():
        with open(shared, encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
            for i, line in zip(range(300), f):
                out.write(line)
        return
    import random

    rng = random.Random(0)
    words = ["".join(rng.choice("etaoinshrdlucmfwyp") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    with open(path, "w", encoding="utf-8") as out:
        for i in range(400):
            text = " ".join(rng.choice(words) for _ in range(300))
            out.write(json.dumps({"id": str(i), "text": text}) + "\n")


def build_data_dir(out: Path, objective: str, seq_len: int, shards: int,
                   shard_tokens: int) -> Path:
    """A real data dir whose train split is ``shards`` shards of random ids (see the module
    docstring); reused when its manifest already says so."""
    import numpy as np
    from rich.console import Console

    from shoestring.config import DataConfig
    from shoestring.data.datadir import DataDir
    from shoestring.prep.prep import prep
    from shoestring.data.shards import token_dtype, write_shard
    from shoestring.fsutil import write_json_atomic

    if out.is_dir() and (out / "manifest.json").is_file():
        manifest = json.loads((out / "manifest.json").read_text())
        if len(manifest["splits"]["train"]["shards"]) == shards and manifest.get(
                "bench_shard_tokens") == shard_tokens:
            return out
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.jsonl"
        _small_text(text)
        cfg = DataConfig(objective=objective, seq_len=seq_len, vocab_size=8192,
                         val_fraction=0.1)
        prep([str(text)], out, cfg, Console(stderr=True, quiet=True), overwrite=True)
    data = DataDir(out)
    vocab, ids = data.vocab_size, data.special_ids
    dtype = np.dtype(data.manifest["dtype"])
    assert dtype == token_dtype(vocab)
    rows = max(1, shard_tokens // seq_len)
    rng = np.random.default_rng(0)
    for old in (out / "train").glob("*"):
        old.unlink()
    infos = []
    for i in range(shards):
        if objective == "mlm":
            block = rng.integers(len(ids), vocab, (rows, seq_len))
            block[:, 0], block[:, -1] = ids["[CLS]"], ids["[SEP]"]
            block[:, 1:-1][rng.random((rows, seq_len - 2)) < 1 / 500] = ids["[SEP]"]
        else:
            block = rng.integers(len(ids), vocab, (rows, seq_len))
            block[rng.random((rows, seq_len)) < 1 / 500] = ids["<|endoftext|>"]
        infos.append(asdict(write_shard(out, "train", i, block, dtype)))
    train = data.manifest["splits"]["train"]
    train.update(shards=infos, sequences=rows * shards, tokens=rows * shards * seq_len)
    write_json_atomic(out / "manifest.json", {**data.manifest, "bench_shard_tokens":
                                              shard_tokens})
    return out


# --- one measurement (runs in a fresh process, against the sources on PYTHONPATH) -------

MEASURE = r"""
import json, os, sys, time
import torch
torch.set_num_threads(1)
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader
from shoestring import families
from shoestring.train.objectives import objective_for

data_path, rows, rank, world, seconds, profile, cold = sys.argv[1:8]
rows, rank, world, seconds = int(rows), int(rank), int(world), float(seconds)
data = DataDir(data_path)
if cold == "1":  # drop the shard files from the page cache before anything maps them (pages
    # a process has mapped are not dropped); the 5 warm-up batches touch ~0.5% of the rows
    for shard in data.manifest["splits"]["train"]["shards"]:
        fd = os.open(os.path.join(data_path, shard["bin"]), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
split = data.split("train")
cuda = torch.cuda.is_available()
loader = BatchLoader(split, rows * world, seed=0, rank=rank, world=world, prefetch=0,
                     pin_memory=cuda)
objective = objective_for(families.get(data.objective), data.seq_len, data.vocab_size,
                          data.special_ids)
gen = torch.Generator().manual_seed(0)

def one():
    t0 = time.perf_counter()
    ids = next(loader)
    t1 = time.perf_counter()
    batch = objective.make_batch(ids, gen)
    if cuda:
        batch = tuple(t if t.is_pinned() else t.pin_memory() for t in batch)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1

for _ in range(5):
    one()
print("ready", flush=True)
sys.stdin.readline()  # every process of the world is warm: go
if profile == "1":
    import cProfile, io, pstats
    prof = cProfile.Profile()
    prof.enable()
n = read = prepare = 0.0
t = time.perf_counter()
while time.perf_counter() - t < seconds:
    a, b = one()
    n, read, prepare = n + 1, read + a, prepare + b
wall = time.perf_counter() - t
out = {"tokens_per_s": n * rows * data.seq_len / wall, "batches": n,
       "read_ms": 1e3 * read / n, "batch_ms": 1e3 * prepare / n,
       "load": os.getloadavg()[0], "cuda": cuda, "shards": len(split._parts)}
if profile == "1":
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    out["profile"] = s.getvalue()
print(json.dumps(out))
"""


def measure(src: Path, data: Path, rows: int, procs: int, seconds: float,
            profile: bool = False, cold: bool = False) -> list[dict]:
    """``procs`` processes at once, ranks of one world, each one thread; their results."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    running = [subprocess.Popen(
        [sys.executable, "-c", MEASURE, str(data), str(rows), str(r), str(procs), str(seconds),
         "1" if profile else "0", "1" if cold else "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env) for r in range(procs)]
    for p in running:  # each has imported torch, opened the data and warmed up
        assert p.stdout is not None
        p.stdout.readline()
    for p in running:  # then all start their window together
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
    results = []
    for p in running:
        out, err = p.communicate(timeout=120 + seconds)
        if p.returncode:
            raise SystemExit(f"measurement failed ({src}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


# --- the table -------------------------------------------------------------------------


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "shoestring-loader-bench"),
                    help="where the data dirs are built (and reused)")
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--shard-tokens", type=int, default=32768)
    ap.add_argument("--seconds", type=float, default=2.0, help="measured window per process")
    add_repeats(ap, 1, help="rounds per cell (median; odd counts)")
    ap.add_argument("--procs", default="1,2", help="process counts (ranks) to run at once")
    ap.add_argument("--baseline-ref", default=None,
                    help="also measure the loader and masking of this git commit")
    ap.add_argument("--profile", action="store_true",
                    help="print where the time goes (cProfile, seq-128 encoder, 1 process)")
    ap.add_argument("--cold", action="store_true",
                    help="evict the shard files from the page cache before each window "
                    "(posix_fadvise DONTNEED), so reads start from disk")
    ap.add_argument("--only", default=None, help="one configuration, e.g. 'encoder seq 128'")
    a = ap.parse_args()
    import torch

    cache = Path(a.cache)
    configs = {k: v for k, v in CONFIGS.items() if a.only in (None, k)}
    dirs = {}
    for name, (objective, seq, _rows) in configs.items():
        t = time.perf_counter()
        dirs[name] = build_data_dir(cache / f"{objective}-{seq}", objective, seq, a.shards,
                                    a.shard_tokens)
        print(f"data dir for {name}: {dirs[name]} ({time.perf_counter() - t:.1f} s)",
              file=sys.stderr)
    procs = [int(p) for p in a.procs.split(",")]
    bench = Bench("loader", a, threads=1, device="cuda (pinned batches)"
                  if torch.cuda.is_available() else "cpu")
    setting = (f"{a.shards} shards of {a.shard_tokens:,} tokens per data dir; rows drawn "
               f"shuffled across all of them; {a.seconds:g} s measured per process, 1 thread each"
               + ("; page cache dropped before each window (--cold)" if a.cold else ""))
    print(setting)
    sources = {"now": ROOT / "src"}
    with tempfile.TemporaryDirectory() as tmp:
        if a.baseline_ref:
            old = Path(tmp) / "baseline"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old),
                            a.baseline_ref], check=True, capture_output=True)
            sources[a.baseline_ref] = old / "src"
        try:
            rows_out = _table(configs, dirs, procs, sources, a.seconds, a.cold, a.repeats)
        finally:
            if a.baseline_ref:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(Path(tmp) / "baseline")], capture_output=True)
    _print_table(rows_out, list(sources))
    bench.table(rows_out, formats=FORMATS, notes=[setting])
    bench.end()
    if a.profile:
        name = "encoder seq 128"
        if name in dirs:
            r = measure(ROOT / "src", dirs[name], CONFIGS[name][2], 1, a.seconds, True)[0]
            print(f"\nprofile, {name}, 1 process ({r['tokens_per_s']:,.0f} tokens/s under "
                  f"cProfile):\n{r['profile']}")


FORMATS = {"total": ",.0f", "per_core": ",.0f", "read_ms": ".2f", "batch_ms": ".2f",
           "load": ".2f", "rounds": ",.0f"}


def _table(configs: dict, dirs: dict, procs: list[int], sources: dict[str, Path],
           seconds: float, cold: bool, repeats: int) -> list[dict]:
    """One row per (configuration, process count, code): the median of ``repeats`` rounds,
    the codes alternated within each round so that load drifts hit both."""
    out = []
    for name, (_objective, seq, rows) in configs.items():
        for n in procs:
            runs: dict[str, list[dict]] = {label: [] for label in sources}
            for _ in range(repeats):
                for label, src in sources.items():
                    res = measure(src, dirs[name], rows, n, seconds, cold=cold)
                    total = sum(r["tokens_per_s"] for r in res)
                    runs[label].append({
                        "config": name, "rows": rows, "seq": seq, "procs": n, "code": label,
                        "total": total, "per_core": total / n,
                        "read_ms": sum(r["read_ms"] for r in res) / n,
                        "batch_ms": sum(r["batch_ms"] for r in res) / n,
                        "load": max(r["load"] for r in res)})
                    print(f"  {name:17s} {n} proc {label:>10s}: {total:>13,.0f} tokens/s",
                          file=sys.stderr)
            for label, got in runs.items():
                got.sort(key=lambda r: r["total"])  # the median (the lower middle if even)
                out.append({**got[(len(got) - 1) // 2], "rounds": [r["total"] for r in got]})
    return out


def _print_table(rows: list[dict], labels: list[str]) -> None:
    print("\n| configuration | batch | processes | code | tokens/s (all) | tokens/s per core "
          "| gather ms/batch | make_batch ms/batch | load avg | rounds (all, tokens/s) |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['config']} | {r['rows']} × {r['seq']} | {r['procs']} | {r['code']} | "
              f"{r['total']:,.0f} | {r['per_core']:,.0f} | {r['read_ms']:.2f} | "
              f"{r['batch_ms']:.2f} | {r['load']:.2f} | "
              f"{', '.join(f'{x / 1e6:.2f} M' for x in r['rounds'])} |")
    if len(labels) > 1:
        print()
        for key in dict.fromkeys((r["config"], r["procs"]) for r in rows):
            got = {r["code"]: r["per_core"] for r in rows if (r["config"], r["procs"]) == key}
            if all(lab in got for lab in labels):
                print(f"{key[0]}, {key[1]} proc: now / {labels[1]} = "
                      f"{got[labels[0]] / got[labels[1]]:.2f}×")


if __name__ == "__main__":
    main()
