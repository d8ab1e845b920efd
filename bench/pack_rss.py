"""The pack stage's memory against the token stream's size, without the stages before it.

Writes a token stream of ``--tokens`` random ids (uint16, as prep's default vocabulary
stores them) and its document ends (one every ~``--doc-tokens`` tokens) into a fresh build
folder, then runs the local executor's real `LocalStages.pack` on it (the defaults: MLM,
seq_len 128, 2**24 tokens a shard; ``--order sort`` for Cramming's ordering) while a thread
samples this process's /proc/self/status: peak VmRSS, RssAnon and RssFile. Run it with
``PYTHONPATH`` at the code to measure (e.g. an older checkout's ``src``) to compare.

    python bench/pack_rss.py --tokens 1.4e9   # ~5.5 GB of text's tokens (2.8 GB of stream)
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from common import Bench, parser


def status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) * 1024
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--tokens", type=float, default=1.4e9)
    ap.add_argument("--doc-tokens", type=int, default=3000)
    ap.add_argument("--order", choices=["none", "sort"], default="none")
    ap.add_argument("--work", type=Path, default=None,
                    help="where the build folder goes (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="also append the row to this JSON-lines file")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="pack-rss-"))

    from rich.console import Console

    import shoestring
    from shoestring.config import DataConfig
    from shoestring.prep.executor import PrepPlan
    from shoestring.prep.local import LocalStages
    from shoestring.families.spec import CLS, SEP

    n = int(args.tokens)
    build = work / "build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with open(build / "stream-train.bin", "wb") as f:
        for at in range(0, n, 1 << 26):
            rng.integers(5, 8192, size=min(1 << 26, n - at), dtype=np.uint16).tofile(f)
    ends = np.arange(args.doc_tokens, n + 1, args.doc_tokens, dtype="<u8")
    ends.tofile(build / "docs-train.bin")
    cfg = DataConfig(order=args.order)
    journal = SimpleNamespace(get=lambda key: None, put=lambda key, value: None)
    plan = PrepPlan([], [], build, cfg, None, Console(quiet=True))
    stages = LocalStages(plan, journal, SimpleNamespace(workers=1))
    base = status()
    peak = dict(base)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for k, v in status().items():
                peak[k] = max(peak[k], v)
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    out = stages.pack("train", {"tokens": n, "document_tokens": n - len(ends),
                               "kept_documents": len(ends)},
                      np.dtype(np.uint16), {CLS: 2, SEP: 3}, 8192)
    seconds = time.perf_counter() - t
    done.set()
    sampler.join()
    row = {"code": str(Path(shoestring.__file__).parent.parent), "tokens": n,
           "stream_mb": round(2 * n / 1e6), "order": args.order, "shards": len(out["shards"]),
           "seconds": round(seconds, 1),
           **{f"before_{k}_mb": round(v / 1e6) for k, v in base.items()},
           **{f"peak_{k}_mb": round(v / 1e6) for k, v in peak.items()}}
    print(json.dumps(row))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    shutil.rmtree(build)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    # the record's machine header imports torch: only now, so as not to count it
    bench = Bench("pack_rss", args)
    bench.table([row])
    bench.end()


if __name__ == "__main__":
    main()
