"""How `shoestring prep` scales with the corpus: wall time, MB/s, peak RSS, temp disk, dedup.

For each size (GB of UTF-8 text) a corpus is built from the real one by recombining its
paragraphs, with planted exact and near-duplicate clusters (Jaccard 0.7–0.95 on prep's
MinHash shingles; see bench/scale_corpus.py), cached under ``--cache`` and reused. Then,
each in a fresh process, ``python -m shoestring prep`` runs with the defaults and with
``--filters gopher --dedup fuzzy`` (both with ``--set curate.dropped_ids=true``, which
writes the ids of the documents curation dropped to ``dropped.tsv``; nothing else changes).
Measured per run:

* wall time and MB/s (text bytes / wall);
* peak RSS of the whole process tree (the sum of VmRSS over prep and its workers, sampled
  from /proc every ``--interval`` seconds), and of its anonymous part (RssAnon: without the
  pages of memory-mapped files, which the kernel may drop; the memory prep really holds)
  and its file-backed part (RssFile: mapped files, the interpreters' libraries among them);
  each also per stage (read, tokenizer, encode, pack; see ``stage_peaks``);
* peak disk of the build folder and of a private TMPDIR during the run, and what of it was
  temporary (peak minus the finished data dir);
* dedup precision and recall against the planted truth, by cluster (see ``score``): of a
  planted cluster's members that passed the filters, all but one should be dropped by the
  dedup blocks (exact or fuzzy); recall of exact and of near copies (and, in the JSON, per
  Jaccard band) is the share of copies not left as a second survivor.

``--peer datatrove`` adds datatrove's local executor on the same corpus with equivalent
blocks (bench/prep_peer_datatrove.py, run with ``--peer-python``, a separate venv),
interleaved with ours (fuzzy mode) ``--repeats`` times.

Then a least-squares line through (size, wall) per mode, extrapolated to ``--extrapolate``
GB (16: the Cramming corpus). The load average is printed before and after every run (and
``bench/common.py``'s machine header above them); the runs, the fits and the peer ratios are
recorded as three tables (``--record``).

    python bench/prep_scale.py                       # 0.34, 1.4, 5.5 GB (the lead's run)
    python bench/prep_scale.py --sizes 0.03,0.1      # a quick check
    python bench/prep_scale.py --sizes 0.03 --peer datatrove \\
        --peer-python /work/peers/datatrove-venv/bin/python

The peer's venv (datatrove 0.10.1 when last run; its Gopher filters need spacy, its JSONL
reader orjson): ``python3 -m venv /work/peers/datatrove-venv &&
/work/peers/datatrove-venv/bin/pip install "datatrove[processing]" orjson spacy tokenizers``.
    python bench/prep_scale.py --json scale.json     # also write every figure as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import scale_corpus as SC
from common import ROOT as REPO
from common import SHARED, Bench, add_repeats, format_load, load_average, parser
from shoestring.prep.curate.minhash import BANDS, ROWS, THRESHOLD

DEFAULT_CORPUS = SHARED / "corpora" / "wiki-books-en.jsonl.zst"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shoestring-bench"
MODES = {"default": [], "fuzzy": ["--filters", "gopher", "--dedup", "fuzzy"]}
DEDUP_BLOCKS = {"exact_dedup", "fuzzy_dedup"}
# Disk a run needs per GB of text: the corpus (.zst, ~0.35x), prep's spools (~1x), token
# streams and shards (~0.5x), the finished data dir kept until the next run, and headroom.
DISK_PER_GB = 3.0
JACCARD_BANDS = [(0.7, 0.8), (0.8, 0.9), (0.9, 0.95), (1.0, 1.0)]


def load_avg() -> str:
    """The load average now, as each row shows it before and after its run."""
    return format_load(load_average())


# --- measuring a process tree ----------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def tree_rss(pid: int) -> tuple[int, int, int]:
    """Bytes of resident memory of ``pid`` and all its descendants: (VmRSS, RssAnon,
    RssFile) summed.

    VmRSS counts the pages of memory-mapped files too (RssFile: prep's token streams and
    shards when it maps them), which the kernel can drop and re-read at will; RssAnon is the
    memory a process really holds (heap, arrays), the figure that must stay bounded.
    """
    total, anon, file, stack = 0, 0, 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                    elif line.startswith("RssAnon:"):
                        anon += int(line.split()[1]) * 1024
                    elif line.startswith("RssFile:"):
                        file += int(line.split()[1]) * 1024
        except OSError:
            continue
        stack += _children(p)
    return total, anon, file


def disk_usage(paths: list[Path]) -> int:
    """Bytes allocated on disk under ``paths`` (missing ones count 0)."""
    total = 0
    for root in paths:
        for dirpath, _, files in os.walk(root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    pass
    return total


# Files of prep's build folder that mark where tokenizing and packing are: encode creates
# the split's token stream first, pack the split's shard folder with its first shard.
PHASE_MARKS = [("stream-train.bin", "encode"), ("train", "pack"), ("stream-val.bin", "encode"),
               ("val", "pack")]


def build_phase(build: Path | None, seen: int) -> int:
    """How many of `PHASE_MARKS` have appeared in ``build`` (never fewer than ``seen``: the
    folder is renamed when prep ends)."""
    if build is None:
        return seen
    for k in range(len(PHASE_MARKS), seen, -1):
        if (build / PHASE_MARKS[k - 1][0]).exists():
            return k
    return seen


def run_measured(cmd: list[str], log: Path, watch: list[Path], env: dict[str, str],
                 interval: float, build: Path | None = None) -> dict[str, Any]:
    """Run ``cmd``; wall seconds, peak tree RSS and peak disk under ``watch``, and the
    samples (seconds since start, RSS, anonymous bytes, file-backed bytes, `build_phase`
    of prep's build folder ``build``) for `stage_peaks`, also written as they come to
    ``log`` with the suffix ``.samples.tsv`` (what a run stopped early leaves)."""
    peak = {"rss": 0, "anon": 0, "file": 0, "disk": 0}
    samples: list[tuple[float, int, int, int, int]] = []
    phase = [0]
    t0 = time.perf_counter()
    with open(log, "w") as out, open(log.with_suffix(".samples.tsv"), "w", buffering=1) as tsv:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        done = threading.Event()
        tsv.write("seconds\trss\tanon\tfile\tphase\n")

        def sample() -> None:
            while not done.is_set():
                rss, anon, file = tree_rss(proc.pid)
                phase[0] = build_phase(build, phase[0])
                samples.append((time.perf_counter() - t0, rss, anon, file, phase[0]))
                tsv.write("\t".join(map(str, samples[-1])) + "\n")
                peak["rss"], peak["anon"] = max(peak["rss"], rss), max(peak["anon"], anon)
                peak["file"] = max(peak["file"], file)
                peak["disk"] = max(peak["disk"], disk_usage(watch))
                done.wait(interval)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"command failed (exit {rc}): {' '.join(cmd)}\n{tail}")
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak["rss"] / 1e6, 1),
            "peak_anon_mb": round(peak["anon"] / 1e6, 1),
            "peak_file_mb": round(peak["file"] / 1e6, 1),
            "peak_disk_mb": round(peak["disk"] / 1e6, 1), "samples": samples}


def stage_peaks(samples: list[tuple[float, int, int, int, int]],
                stage_seconds: dict[str, float]) -> dict[str, float]:
    """Peak MB of the process tree in each of prep's stages: where the memory goes.
    ``rss_<stage>_mb`` is VmRSS, ``anon_<stage>_mb`` its anonymous part, ``file_<stage>_mb``
    its file-backed part (each its own peak within the stage).

    Read and tokenizer run first, back to back: their windows are ``manifest.stage_seconds``
    counted back from the end of the process (the start-up before the first stage counts
    to read). Encode and pack alternate per split (train, then val), so the samples after
    the tokenizer's window go to the stage their `build_phase` names (a sample before the
    first mark to encode; the manifest written at the end, to pack)."""
    if not samples or not stage_seconds:
        return {}
    start = samples[-1][0] - sum(stage_seconds.values())
    windows, lo = [], float("-inf")
    for name in ("read", "tokenizer"):
        if name in stage_seconds:
            hi = start + stage_seconds[name]
            windows.append((name, lo, hi))
            lo, start = hi, hi
    groups: dict[str, list[tuple]] = {}
    for s in samples:
        name = next((w for w, a, b in windows if a <= s[0] < b), None)
        if name is None:
            name = "encode" if s[4] == 0 else PHASE_MARKS[s[4] - 1][1]
        groups.setdefault(name, []).append(s)
    peaks = {}
    for name in [*stage_seconds, *(g for g in groups if g not in stage_seconds)]:
        inside = groups.get(name)
        if inside:
            for k, label in ((1, "rss"), (2, "anon"), (3, "file")):
                peaks[f"{label}_{name}_mb"] = round(max(s[k] for s in inside) / 1e6, 1)
    return peaks


# --- scoring dedup against the planted truth -------------------------------------------


def location(doc_id: str) -> str:
    """prep's document id (``path:line``, ``#k`` for pieces) as the corpus's ``file:line``."""
    path, line = doc_id.split("#")[0].rsplit(":", 1)
    return f"{Path(path).name}:{line}"


def score(truth: list[dict], dropped: dict[str, str], key: str = "loc",
          head_key: str = "copy_of_loc") -> dict[str, Any]:
    """Precision and recall of the dedup blocks' drops (``dropped``: doc → block), by cluster.

    A planted cluster is a head and its copies; of its members that passed the filters
    (not dropped by a non-dedup block), dedup should drop all but one — any one: shoestring
    keeps the first, datatrove the root of its union-find. Right drops: up to that many per
    cluster; every other dedup drop (outside the clusters, or the last member of one) is
    wrong. Precision = right / dedup drops; recall = right / drops needed. Per kind (exact,
    near, per Jaccard band): the share of copies not left behind as a second survivor (the
    survivor is the head if kept, else the kept copy most like it).
    """
    filtered = {d for d, block in dropped.items() if block not in DEDUP_BLOCKS}
    dedup = {d for d, block in dropped.items() if block in DEDUP_BLOCKS}
    clusters: dict[str, list[dict]] = {}
    for e in truth:
        clusters.setdefault(e[head_key], []).append(e)
    right = needed = 0
    seen = {"exact": [0, 0], "near": [0, 0]} | {f"{lo}-{hi}": [0, 0] for lo, hi in JACCARD_BANDS}
    for head, copies in clusters.items():
        members = [c for c in copies if c[key] not in filtered]
        head_in = head not in filtered
        if len(members) + head_in < 2:
            continue
        kept = [c for c in members if c[key] not in dedup]
        head_kept = head_in and head not in dedup
        needed += len(members) + head_in - 1
        right += len(members) + head_in - max(len(kept) + head_kept, 1)
        survivor = None if head_kept or not kept else max(kept, key=lambda c: c["jaccard"])
        for c in members:
            missed = c in kept and c is not survivor
            for name in (_kind(c["jaccard"]), _band(c["jaccard"])):
                seen[name][0] += 1
                seen[name][1] += missed
    out: dict[str, Any] = {"dedup_dropped": len(dedup), "planted": len(truth), "right": right,
                           "precision": round(right / len(dedup), 4) if dedup else None,
                           "recall": round(right / needed, 4) if needed else None}
    for name in ("exact", "near"):
        n, missed = seen[name]
        out[f"recall_{name}"] = round(1 - missed / n, 4) if n else None
        out[f"eligible_{name}"] = n
    out["recall_by_jaccard"] = {name: round(1 - m / n, 4) for name, (n, m) in seen.items()
                                if n and name not in ("exact", "near")}
    return out


def _kind(j: float) -> str:
    return "exact" if j >= 1.0 else "near"


def _band(j: float) -> str:
    for lo, hi in JACCARD_BANDS:
        if lo <= j < hi or j == hi:
            return f"{lo}-{hi}"
    return f"{JACCARD_BANDS[0][0]}-{JACCARD_BANDS[0][1]}"


def read_dropped(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """prep's dropped.tsv as (location → block, location → the partner's location, where
    the block named the earlier document it matched)."""
    dropped: dict[str, str] = {}
    partners: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            doc_id, block, of = line.rstrip("\n").rsplit("\t", 2)
            dropped[location(doc_id)] = block
            if of:
                partners[location(doc_id)] = location(of)
    return dropped, partners


def unplanted(corpus: Path, truth: list[dict], dropped: dict[str, str],
              partners: dict[str, str], threshold: float) -> dict[str, Any]:
    """The dedup drops outside every planted cluster, which ``score`` counts as wrong, with
    the true Jaccard (on the shingles fuzzy dedup hashes) of each against the earlier
    document it was matched with. A recombined corpus reuses its source's paragraphs, more
    often the larger it is, so documents can be near copies that nobody planted; this says
    whether such a "wrong" drop is a real near copy (at least ``threshold``) or a mistake.
    One streaming pass over the corpus for the texts of those drops and their partners."""
    members = {e["loc"] for e in truth} | {e["copy_of_loc"] for e in truth}
    outside = sorted(d for d, b in dropped.items() if b in DEDUP_BLOCKS and d not in members)
    pairs = {d: partners[d] for d in outside if d in partners}
    want = set(pairs) | set(pairs.values())
    texts: dict[str, str] = {}
    for shard in sorted((corpus / "shards").glob("*.jsonl.zst")):
        for line, rec in enumerate(SC.read_jsonl(shard), 1):
            loc = f"{shard.name}:{line}"
            if loc in want:
                texts[loc] = rec["text"]
    ngram = SC.CorpusSpec(size_bytes=0).ngram
    sims = sorted(SC.jaccard(SC.shingles(texts[a], ngram), SC.shingles(texts[b], ngram))
                  for a, b in pairs.items() if a in texts and b in texts)
    real = sum(j >= threshold for j in sims)
    return {"unplanted_drops": len(outside), "unplanted_with_partner": len(pairs),
            "unplanted_real": real,
            "unplanted_jaccard": {q: round(sims[int(q * (len(sims) - 1))], 4)
                                  for q in (0.0, 0.1, 0.5, 0.9, 1.0)} if sims else {}}


# --- the runs --------------------------------------------------------------------------


def run_prep(corpus: Path, meta: dict, mode: str, work: Path, args: argparse.Namespace) -> dict:
    """One prep in a fresh process; its measurements and dedup scores."""
    out = work / f"data-{mode}"
    tmp = work / f"tmp-{mode}"
    for p in (out, tmp, work / f".{out.name}.partial"):
        shutil.rmtree(p, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [sys.executable, "-m", "shoestring", "prep", str(corpus / "shards"), "-o", str(out),
           "--set", "curate.dropped_ids=true", *MODES[mode]]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO / "src")}
    before = load_avg()
    build = work / f".{out.name}.partial"
    m = run_measured(cmd, work / f"prep-{mode}.log", [build, tmp], env, args.interval, build)
    manifest = json.loads((out / "manifest.json").read_text())
    row = _row("shoestring", mode, meta, m, disk_usage([out]), before,
               tokens=sum(s["tokens"] for s in manifest["splits"].values()))
    row |= stage_peaks(m["samples"], manifest.get("stage_seconds") or {})
    truth = SC.load_truth(corpus)
    dropped, partners = read_dropped(out / "dropped.tsv")
    row |= score(truth, dropped)
    row |= unplanted(corpus, truth, dropped, partners, THRESHOLD)
    if row["dedup_dropped"]:  # the real near copies nobody planted counted as right drops
        row["precision_real"] = round((row["right"] + row["unplanted_real"])
                                      / row["dedup_dropped"], 4)
    row["tokenizer"] = str(shutil.copy(out / "tokenizer.json", work / f"tokenizer-{mode}.json"))
    if not args.keep:
        shutil.rmtree(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return row


def _row(tool: str, mode: str, meta: dict, m: dict, output_bytes: int, load_before: str,
         tokens: int) -> dict[str, Any]:
    """One table row: the run's measurements, MB/s, and temporary disk (peak − output)."""
    output_mb = output_bytes / 1e6
    return {"size_gb": meta["spec"]["size_bytes"] / 1e9, "tool": tool, "mode": mode,
            "text_mb": round(meta["text_bytes"] / 1e6, 1), "documents": meta["documents"],
            **{k: v for k, v in m.items() if k != "samples"},
            "mb_per_s": round(meta["text_bytes"] / 1e6 / m["wall_s"], 2),
            "output_mb": round(output_mb, 1),
            "temp_disk_mb": round(max(0.0, m["peak_disk_mb"] - output_mb), 1),
            "tokens": tokens, "load_before": load_before, "load_after": load_avg()}


def run_peer(corpus: Path, meta: dict, tokenizer: str, work: Path, args: argparse.Namespace) -> dict:
    """datatrove on the same corpus, in its own venv (bench/prep_peer_datatrove.py)."""
    peer_work = work / "datatrove"
    shutil.rmtree(peer_work, ignore_errors=True)
    # datatrove's workers talk over a Unix socket under TMPDIR, whose path must stay under
    # ~107 characters: a short folder of its own in the system's temporary folder
    tmp = Path(tempfile.mkdtemp(prefix="dt-"))
    cmd = [args.peer_python, str(REPO / "bench" / "prep_peer_datatrove.py"),
           "--input", str(corpus / "shards"), "--work", str(peer_work),
           "--tokenizer", tokenizer, "--workers", str(args.workers or 1), "--no-record",
           "--bands", str(BANDS), "--rows", str(ROWS)]  # prep's own LSH shape
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TMPDIR": str(tmp)}
    before = load_avg()
    m = run_measured(cmd, work / "peer-datatrove.log", [peer_work, tmp], env, args.interval)
    result = json.loads((peer_work / "result.json").read_text())
    row = _row("datatrove", "fuzzy", meta, m, disk_usage([peer_work / "tokenized"]), before,
               tokens=result["tokens"])
    row |= score(SC.load_truth(corpus), result["dropped"], key="id", head_key="copy_of")
    if not args.keep:
        shutil.rmtree(peer_work)
    shutil.rmtree(tmp, ignore_errors=True)
    return row


def linear_fit(points: list[tuple[float, float]], at: float) -> dict[str, float] | None:
    """Least-squares wall = a + b * size, evaluated at ``at`` (through 0 with one size)."""
    if not points:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if len(set(xs)) < 2:
        b = sum(ys) / sum(xs)
        return {"intercept_s": 0.0, "s_per_gb": round(b, 2), "at_gb": at, "wall_s": round(b * at, 1)}
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    return {"intercept_s": round(a, 1), "s_per_gb": round(b, 2), "at_gb": at,
            "wall_s": round(a + b * at, 1), "points": n}


def print_table(rows: list[dict]) -> None:
    head = (f"{'size GB':>8} {'tool':>10} {'mode':>7} {'wall s':>8} {'MB/s':>6} "
            f"{'peak RSS MB':>11} {'anon MB':>8} {'temp MB':>8} {'dedup drops':>11} {'precision':>9} "
            f"{'recall':>6} {'rec exact':>9} {'rec near':>8}  load before/after")
    print(head)
    for r in rows:
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

        print(f"{r['size_gb']:>8.3g} {r['tool']:>10} {r['mode']:>7} {r['wall_s']:>8.1f} "
              f"{r['mb_per_s']:>6.2f} {r['peak_rss_mb']:>11.0f} {r.get('peak_anon_mb', 0):>8.0f} "
              f"{r['temp_disk_mb']:>8.0f} "
              f"{r['dedup_dropped']:>11} {f(r['precision']):>9} {f(r['recall']):>6} {f(r['recall_exact']):>9} "
              f"{f(r['recall_near']):>8}  {r['load_before']} / {r['load_after']}")
    for r in rows:
        if r.get("unplanted_drops"):
            q = r["unplanted_jaccard"]
            print(f"{r['size_gb']:>8.3g} {r['mode']:>7}: {r['unplanted_drops']} dedup drops "
                  f"outside the planted clusters; {r['unplanted_with_partner']} with a named "
                  f"partner, {r['unplanted_real']} of them at true Jaccard >= {THRESHOLD:g}; "
                  f"precision counting those right {r.get('precision_real')}"
                  + (f" (quantiles 0/10/50/90/100%: "
                     + " ".join(f"{v:.3f}" for v in q.values()) + ")" if q else ""))
        for label, words in (("rss", "RSS"), ("anon", "anonymous"), ("file", "file-backed")):
            stages = {k[len(label) + 1:-3]: v for k, v in r.items()
                      if k.startswith(f"{label}_") and k.endswith("_mb")}
            if stages:
                print(f"{r['size_gb']:>8.3g} {r['mode']:>7}: {words} MB by stage: " + ", ".join(
                    f"{name} {mb:.0f}" for name, mb in stages.items()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = parser(__doc__)
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--sizes", default="0.34,1.4,5.5", help="GB of text, comma-separated")
    ap.add_argument("--modes", default="default,fuzzy", help=f"of {', '.join(MODES)}")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE / "prep_scale")
    ap.add_argument("--work", type=Path, default=None, help="where data dirs go (default: cache/runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--near-frac", type=float, default=0.03)
    ap.add_argument("--exact-frac", type=float, default=0.01)
    ap.add_argument("--workers", type=int, default=0, help="prep --workers (0: prep's default)")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("--peer", choices=["datatrove"], default=None)
    ap.add_argument("--peer-python", default="/work/peers/datatrove-venv/bin/python")
    add_repeats(ap, 1, help="interleaved runs per size (peer mode)")
    ap.add_argument("--extrapolate", type=float, default=16.0, help="GB for the linear fit")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the data dirs after scoring")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    work_root = args.work or args.cache / "runs"
    bench = Bench("prep_scale", args)
    pool: list[SC.Pool] = []

    def pool_loader() -> SC.Pool:
        if not pool:
            pool.append(SC.load_pool(SC.read_jsonl(args.corpus)))
        return pool[0]

    rows: list[dict] = []
    for size in sizes:
        rows += run_size(size, modes, pool_loader, work_root, args)
    print()
    print_table(rows)
    fits = {}
    for tool, mode in sorted({(r["tool"], r["mode"]) for r in rows}):
        fit = linear_fit([(r["text_mb"] / 1e3, r["wall_s"]) for r in rows
                          if (r["tool"], r["mode"]) == (tool, mode)], args.extrapolate)
        fits[f"{tool}/{mode}"] = fit
        print(f"linear fit {tool}/{mode}: wall ≈ {fit['intercept_s']} s + {fit['s_per_gb']} s/GB "
              f"→ {fit['wall_s']:,.0f} s ({fit['wall_s'] / 3600:.2f} h) at {args.extrapolate:g} GB")
    ratios = peer_ratios(rows)
    for r in ratios:
        print(f"{r['size_gb']:g} GB, shoestring fuzzy / datatrove (medians of {r['runs']}): "
              f"wall {r['wall_ratio']:.2f}x, peak RSS {r['rss_ratio']:.2f}x")
    record(bench, rows, fits, ratios)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "fits": fits, "peer_ratios": ratios,
                                         "cpus": os.cpu_count(), "load_avg_end": load_avg(),
                                         "argv": sys.argv[1:]}, indent=1))


ROW_FORMATS = {"size_gb": ".3g", "wall_s": ".1f", "mb_per_s": ".2f", "peak_rss_mb": ".0f",
               "peak_anon_mb": ".0f", "peak_file_mb": ".0f",
               "temp_disk_mb": ".0f", "precision": ".3f", "recall": ".3f",
               "recall_exact": ".3f", "recall_near": ".3f"}


def record(bench: Bench, rows: list[dict], fits: dict, ratios: list[dict]) -> None:
    """The runs (without the tokenizer's temporary path), the linear fits and the peer
    ratios as the record's tables; then the load average at the end."""
    bench.table([_flat(r) for r in rows], formats=ROW_FORMATS)
    if fits:
        bench.table([{"tool/mode": k, **(v or {})} for k, v in fits.items()], "fits",
                    formats={"intercept_s": ".1f", "s_per_gb": ".2f", "wall_s": ",.0f"})
    if ratios:
        bench.table(ratios, "peer_ratios", formats={"wall_ratio": ".2f", "rss_ratio": ".2f"})
    bench.end()


def _flat(row: dict) -> dict:
    """A run's row for the record: recall per Jaccard band as columns of its own, without
    the tokenizer's path (a file of the work folder)."""
    flat = {k: v for k, v in row.items()
            if k not in ("tokenizer", "recall_by_jaccard", "unplanted_jaccard")}
    if row.get("unplanted_jaccard"):
        flat["unplanted J median"] = row["unplanted_jaccard"][0.5]
    return flat | {f"recall J {band}": v for band, v in row["recall_by_jaccard"].items()}


def peer_ratios(rows: list[dict]) -> list[dict]:
    """Per size: median wall and peak RSS of our fuzzy runs over datatrove's."""
    out = []
    for size in sorted({r["size_gb"] for r in rows if r["tool"] == "datatrove"}):
        ours = [r for r in rows if r["size_gb"] == size and (r["tool"], r["mode"]) == ("shoestring", "fuzzy")]
        peer = [r for r in rows if r["size_gb"] == size and r["tool"] == "datatrove"]
        if not ours:
            continue

        def med(rs: list[dict], k: str) -> float:
            return statistics.median(r[k] for r in rs)

        out.append({"size_gb": size, "runs": min(len(ours), len(peer)),
                    "wall_ratio": round(med(ours, "wall_s") / med(peer, "wall_s"), 3),
                    "rss_ratio": round(med(ours, "peak_rss_mb") / med(peer, "peak_rss_mb"), 3)})
    return out


def run_size(size: float, modes: list[str], pool_loader: Any, work_root: Path,
             args: argparse.Namespace) -> list[dict]:
    """The corpus of ``size`` GB (built or reused), then its runs, interleaved with the peer."""
    rows: list[dict] = []
    spec = SC.CorpusSpec(size_bytes=int(size * 1e9), seed=args.seed,
                         near_frac=args.near_frac, exact_frac=args.exact_frac)
    args.cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.cache).free / 1e9
    if free < DISK_PER_GB * size:
        print(f"size {size:g} GB skipped: it needs about {DISK_PER_GB * size:.0f} GB of "
              f"disk (corpus, spools, token streams, shards), {free:.0f} GB are free")
        return rows
    t = time.perf_counter()
    corpus, meta = SC.cached_corpus(pool_loader, spec, args.cache)
    print(f"corpus {corpus} ({meta['documents']:,} docs, {meta['text_bytes'] / 1e6:,.0f} MB, "
          f"planted {meta['planted']}; ready in {time.perf_counter() - t:.0f} s)", flush=True)
    work = work_root / spec.key()
    work.mkdir(parents=True, exist_ok=True)
    for repeat in range(args.repeats if args.peer else 1):
        for mode in modes:
            rows.append(run_prep(corpus, meta, mode, work, args) | {"repeat": repeat})
            print_table(rows[-1:])
        if args.peer:
            tok = next((r["tokenizer"] for r in reversed(rows) if r["tool"] == "shoestring"))
            rows.append(run_peer(corpus, meta, tok, work, args) | {"repeat": repeat})
            print_table(rows[-1:])
    return rows


if __name__ == "__main__":
    main()
