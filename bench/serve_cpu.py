"""The server's own CPU time per /v1/embed request, old code against new, in one run (issue 49).

On a GPU the model is fast and the server's CPU work per request (HTTP, parsing, tokenizing,
hand-offs, encoding the answer) bounds requests per second. On a CPU that work hides behind
the model unless the model is tiny, so this bench serves a tiny encoder (1 layer x 64 wide,
trained a few steps on builtin:pydocs) and measures, per one-sentence request at C
concurrent clients, the CPU seconds of every process of the server (user + system, from
/proc, per thread: the event loop's main thread and the rest), not wall time, so the other
work sharing a small machine moves the figures less.

The old code is a git commit's ``src`` (``git archive COMMIT src``, extracted once into
``.base/``, ignored by git) served with ``PYTHONPATH=.base/src``; the new is this checkout's
``src``. Each round starts both servers (same model, threads, texts and
clients) and then runs short bursts against each in turn, so drift on the machine hits both
alike. The new server is
also measured with clients asking for base64 embeddings, with clients sending token ids
(``input_ids``, tokenized in this process) and with OpenAI's ``/v1/embeddings`` (issue 59:
the same texts, float answers), and its ``/metrics`` stage counters give the CPU
per stage (`shoestring.inference.laps`); "other" is the rest of its CPU (the HTTP protocol, the
request layers, hand-offs between threads).

``--client httpx`` drives the servers with a real client instead of the raw saturating one
(``httpx.AsyncClient``, a keep-alive pool of a connection per client): the CPU per request a
deployment's clients cost the server, with the smaller batches they bring.

    python bench/serve_cpu.py                        # 64 clients, 2 rounds x 4 bursts
    python bench/serve_cpu.py --client httpx --clients 1 --no-variants
    python bench/serve_cpu.py --rounds 3 --bursts 6 --requests 2000 --base-commit 68c8409
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, Bench, format_load, load_average, parser
from serve_load import (Server, closed_loop, encode_post, httpx_closed_loop, make_texts,
                        scrape_metrics)

from shoestring.inference.laps import STAGES  # noqa: E402

CPU_STAGES = tuple(s for s in STAGES if s != "queue")  # queue: waiting


def build_tiny_model(work: Path) -> Path:
    """A 1 x 64 encoder (8k WordPiece vocabulary) trained 5 steps on builtin:pydocs: small
    enough that the server's own path, not the model, dominates its CPU time."""
    from shoestring.config import load_config
    from shoestring.prep.prep import prep
    from shoestring.train.loop import train

    run = work / "run-1x64"
    if (run / "final" / "model.safetensors").is_file():
        return run
    cfg = load_config(None, ["train.budget=null", "train.steps=5", "train.batch_size=8",
                             "model.hidden_size=64", "model.num_layers=1", "model.num_heads=1",
                             "model.intermediate_size=128"])
    if not (work / "data" / "manifest.json").is_file():
        prep(["builtin:pydocs"], work / "data", cfg.data)
    train(cfg, work / "data", run, overwrite=True)
    return run


def base_source(commit: str) -> Path:
    """``.base/src``: the ``src`` folder of ``commit`` (extracted on first use)."""
    base = ROOT / ".base"
    marker = base / "COMMIT"
    have = marker.read_text().strip() if marker.is_file() else None
    if not (base / "src").is_dir() or have != commit:
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        marker.write_text(commit + "\n")
    return base / "src"


# ---------------------------------------------------------------------------- CPU from /proc

TICK = os.sysconf("SC_CLK_TCK")
# A thread's CPU time is read in nanoseconds from /proc/PID/task/TID/schedstat (the
# scheduler's own sum of the thread's run time) where the kernel has it; else from
# /proc/PID/task/TID/stat in clock ticks (10 ms each at 100 Hz), too coarse for a few
# hundred requests: at 600, a 0.33 ms/request figure read over a few threads moves by ~7%
# per tick. `clock_resolution_ms` says what the figure printed can resolve.
SCHEDSTAT = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat")
CLOCK_S = 1e-9 if SCHEDSTAT else 1 / TICK


def _stat(path: str) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of one /proc stat file."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (replicas of ``--workers``)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(f"/proc/{name}/stat")) is not None:
            parents[int(name)] = st[0]
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def _thread_cpu(task: str) -> float | None:
    """CPU seconds so far of one thread (``/proc/PID/task/TID``), at `CLOCK_S` resolution."""
    if SCHEDSTAT:
        try:
            with open(f"{task}/schedstat") as f:
                return int(f.read().split()[0]) * 1e-9
        except (OSError, ValueError, IndexError):
            return None
    st = _stat(f"{task}/stat")
    return None if st is None else st[1]


def cpu_by_thread(pid: int) -> dict[str, float]:
    """CPU seconds so far of every thread of the server's processes: ``main`` (each
    process's main thread: the event loop) and ``other`` (batcher, tokenizer and torch
    threads), and ``threads``, how many were read (each reading is off by up to one
    `CLOCK_S`). Threads that have exited are not counted: the servers keep theirs."""
    out = {"main": 0.0, "other": 0.0, "threads": 0}
    for proc in process_tree(pid):
        try:
            tids = os.listdir(f"/proc/{proc}/task")
        except OSError:
            continue
        for tid in tids:
            cpu = _thread_cpu(f"/proc/{proc}/task/{tid}")
            if cpu is not None:
                out["main" if int(tid) == proc else "other"] += cpu
                out["threads"] += 1
    return out


def clock_resolution_ms(threads: int, requests: int) -> float:
    """The most the CPU ms/request of a burst can be off by the clock alone: each thread's
    reading before and after rounds down by up to one `CLOCK_S`."""
    return 1000 * threads * CLOCK_S / requests


def resident_mb(pid: int) -> float:
    """Resident memory of the server's processes (VmRSS, /proc), in MB: what the garbage
    collector's thresholds trade CPU against."""
    total = 0
    for proc in process_tree(pid):
        try:
            with open(f"/proc/{proc}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
    return total / 1024


def start(side: str, source: Path, run: Path, threads: int | None,
          extra_env: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> Server:
    """``shoestring serve`` of ``run`` with the code in ``source``, on a free port, with
    ``threads`` torch threads (None: the server's own default) and ``extra`` flags."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), str(ROOT / "bench")]),
           **({"OMP_NUM_THREADS": str(threads)} if threads else {}), **(extra_env or {})}
    return Server(side, [sys.executable, "-m", "shoestring", "serve", str(run), "--port", "0",
                         *(["--threads", str(threads)] if threads else []), "--truncate",
                         *extra], env=env)


def measure(server: Server, label: str, requests: list, clients: int, count: int,
            drive: Any = closed_loop) -> dict:
    """One timed burst against a warm server: its CPU per request (total, event loop, other
    threads), per stage where it reports stages, and the clients' view."""
    load_before = load_average()
    m0, c0 = scrape_metrics(server.url), cpu_by_thread(server.proc.pid)
    latencies, errors, wall = asyncio.run(drive(server.url, requests, clients, count))
    c1, m1 = cpu_by_thread(server.proc.pid), scrape_metrics(server.url)
    n = len(latencies)
    if n < 2:
        raise RuntimeError(f"{label}: only {n} requests succeeded")
    q = statistics.quantiles(sorted(latencies), n=100, method="inclusive")
    per = {k: 1000 * (c1[k] - c0[k]) / n for k in ("main", "other")}
    resolution = clock_resolution_ms(int(max(c0["threads"], c1["threads"])), n)

    def delta(kind: str, stage: str) -> float:
        return m1[kind].get(stage, 0.0) - m0[kind].get(stage, 0.0)

    stages = {st: 1000 * delta("stage_cpu", st) / n for st in STAGES if delta("stage_n", st)}
    walls = {st: 1000 * delta("stage_wall", st) / max(delta("stage_n", st), 1)
             for st in STAGES if delta("stage_n", st)}
    batches = m1["batches"] - m0["batches"]
    out = {"label": label, "requests": n, "errors": errors, "cpu_ms": per["main"] + per["other"],
           "main_ms": per["main"], "other_ms": per["other"], "req_s": n / wall,
           "p50_ms": 1000 * q[49], "p99_ms": 1000 * q[98],
           "batch": (m1["inputs"] - m0["inputs"]) / batches if batches else float("nan"),
           "stage_cpu_ms": stages, "stage_wall_ms": walls,
           "rss_mb": resident_mb(server.proc.pid), "load": [load_before, load_average()],
           "resolution_ms": resolution}
    print(f"  {label}: {out['cpu_ms']:.3f} CPU ms/request (event loop {per['main']:.3f}, other "
          f"threads {per['other']:.3f}; clock resolution ±{resolution:.4f}, "
          f"{100 * resolution / max(out['cpu_ms'], 1e-9):.2f}%); "
          f"{out['req_s']:.0f} req/s, p50 {out['p50_ms']:.1f} ms, "
          f"p99 {out['p99_ms']:.1f} ms, {out['batch']:.1f} inputs/batch, errors {errors}, "
          f"resident {out['rss_mb']:.0f} MB; "
          f"load {format_load(load_before)} -> {format_load(load_average())}", flush=True)
    if stages:
        print("    stage CPU ms/request: " + ", ".join(f"{k} {v:.3f}" for k, v in stages.items())
              + f"; other {out['cpu_ms'] - sum(stages.values()):.3f}", flush=True)
    return out


# ---------------------------------------------------------------------------- report


def pooled(runs: list[dict]) -> dict:
    """Runs of one kind added up: CPU over all their requests, rates and latencies medians."""
    n = sum(r["requests"] for r in runs)
    mean = {k: sum(r[k] * r["requests"] for r in runs) / n for k in ("cpu_ms", "main_ms",
                                                                       "other_ms")}
    stages = {st: sum(r["stage_cpu_ms"].get(st, 0.0) * r["requests"] for r in runs) / n
              for st in STAGES if any(st in r["stage_cpu_ms"] for r in runs)}
    walls = {st: statistics.median(r["stage_wall_ms"][st] for r in runs if st in r["stage_wall_ms"])
             for st in STAGES if any(st in r["stage_wall_ms"] for r in runs)}
    return {**mean, "requests": n, "stage_cpu_ms": stages, "stage_wall_ms": walls,
            **{k: statistics.median(r[k] for r in runs) for k in ("req_s", "p50_ms", "p99_ms",
                                                                   "batch")},
            "errors": sum(r["errors"] for r in runs), "rss_mb": max(r["rss_mb"] for r in runs),
            # bursts' clock errors add up at most, spread over all their requests
            "resolution_ms": sum(r["resolution_ms"] * r["requests"] for r in runs) / n}


def report(results: dict[str, list[dict]], bench: Bench, args: object) -> None:
    rows = []
    for label, runs in results.items():
        p = pooled(runs)
        rows.append({"server": label, "CPU ms/request": p["cpu_ms"], "event loop": p["main_ms"],
                     "other threads": p["other_ms"], "req/s": p["req_s"], "p50 ms": p["p50_ms"],
                     "p99 ms": p["p99_ms"], "inputs/batch": p["batch"],
                     "requests": p["requests"], "errors": p["errors"],
                     "resident MB (max)": p["rss_mb"]})
    formats = {"CPU ms/request": ".3f", "event loop": ".3f", "other threads": ".3f",
               "req/s": ".0f", "p50 ms": ".1f", "p99 ms": ".1f", "inputs/batch": ".1f",
               "resident MB (max)": ".0f"}
    print()
    print("| " + " | ".join(rows[0]) + " |")
    print("|---|" + "---:|" * (len(rows[0]) - 1))
    for r in rows:
        print("| " + " | ".join(format(v, formats.get(k, "")) for k, v in r.items()) + " |")
    old, new = results["old (JSON)"], results["new (JSON)"]
    ratios = sorted(n["cpu_ms"] / o["cpu_ms"] for o, n in zip(old, new))
    ratio = pooled(new)["cpu_ms"] / pooled(old)["cpu_ms"]
    notes = [f"new / old CPU per request: {ratio:.3f} over all bursts ({len(ratios)} pairs of "
             f"adjacent bursts: {ratios[0]:.3f} to {ratios[-1]:.3f}, median "
             f"{statistics.median(ratios):.3f}); target <= 0.333: "
             + ("met" if ratio <= 1 / 3 else "not met"),
             "CPU clock resolution of each row's CPU ms/request (pooled): "
             + ", ".join(f"{label} ±{pooled(runs)['resolution_ms']:.4f}"
                         for label, runs in results.items())]
    stage_rows = []
    for label, runs in results.items():
        p = pooled(runs)
        if not p["stage_cpu_ms"]:
            continue
        row = {"server": label}
        for st in STAGES:
            row[st] = p["stage_cpu_ms"].get(st, float("nan"))
        row["other"] = p["cpu_ms"] - sum(v for v in p["stage_cpu_ms"].values())
        stage_rows.append(row)
        notes.append(f"{label} wall ms per input in each stage (median of rounds): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in p["stage_wall_ms"].items()))
    print()
    print("CPU ms per request by stage (new server, from its /metrics):")
    print("| " + " | ".join(stage_rows[0]) + " |")
    print("|---|" + "---:|" * (len(stage_rows[0]) - 1))
    for r in stage_rows:
        print("| " + " | ".join(format(v, ".3f") if isinstance(v, float) else v
                                 for v in r.values()) + " |")
    print()
    print("\n".join(notes))
    bench.table(rows, formats=formats, notes=notes)
    bench.table(stage_rows, name="stages", formats={k: ".3f" for k in (*STAGES, "other")})


def old_and_new_args(doc: str | None, base_commit: str) -> argparse.ArgumentParser:
    """The options of a bench that serves the tiny model with old code and new: the model,
    its work dir and the old code's commit."""
    ap = parser(doc)
    ap.add_argument("--model", type=Path, help="run dir (default: build the 1 x 64 encoder)")
    ap.add_argument("--work", type=Path,
                    default=Path(tempfile.gettempdir()) / "shoestring-serve-cpu")
    ap.add_argument("--base-commit", default=base_commit, help="the old code's commit")
    return ap


def main() -> None:
    ap = old_and_new_args(__doc__, "68c8409")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="raw: the saturating raw-socket client; httpx: httpx.AsyncClient")
    ap.add_argument("--requests", type=int, default=1500, help="timed requests per burst")
    ap.add_argument("--rounds", type=int, default=2, help="server starts")
    ap.add_argument("--bursts", type=int, default=4,
                    help="timed bursts of each kind per round, the kinds in turn")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of both servers")
    ap.add_argument("--no-variants", action="store_true",
                    help="skip the base64 and input_ids runs of the new server")
    ap.add_argument("--new-env", metavar="NAME=VALUE", action="append", default=[],
                    help="also measure the new code with this environment variable set "
                    "(e.g. TOKENIZERS_PARALLELISM=false); repeatable, one server each")
    ap.add_argument("--json", type=Path, help="also write every run's figures here")
    args = ap.parse_args()

    from shoestring.data.tokenizer import load_tokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    run = args.model or build_tiny_model(args.work)
    sources = {"old": base_source(args.base_commit), "new": ROOT / "src"}
    texts = make_texts(600)
    tok = load_tokenizer(run / "final" / "tokenizer.json")
    ids = [e.ids for e in tok.encode_batch(texts)]
    bench = Bench("serve_cpu", args, precision="fp32", threads=args.threads)
    print(f"model {run}; {len(texts)} one-sentence texts ({statistics.mean(map(len, ids)):.1f} "
          f"tokens on average); {args.clients} {args.client} clients; old = {args.base_commit}, new = "
          "this checkout", flush=True)
    print("CPU clock: " + ("/proc/PID/task/TID/schedstat, nanoseconds" if SCHEDSTAT else
                           f"/proc/PID/task/TID/stat, ticks of {1000 / TICK:.0f} ms (no schedstat "
                           "here): the more requests a burst, the finer its figure")
          + "; each burst prints its resolution", flush=True)

    results: dict[str, list[dict]] = {"old (JSON)": [], "new (JSON)": []}
    if not args.no_variants:
        results.update({"new (base64)": [], "new (input_ids)": [], "new (/v1/embeddings)": []})
    extra = {f"new {setting}": dict([setting.split("=", 1)]) for setting in args.new_env}
    results.update({f"{side} (JSON)": [] for side in extra})
    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds}: both servers started, then "
              f"{args.bursts} bursts of each run in turn", flush=True)
        servers = {side: start(side, sources[side], run, args.threads) for side in ("old", "new")}
        servers.update({side: start(side, sources["new"], run, args.threads, env)
                        for side, env in extra.items()})
        try:
            runs = []
            drive = closed_loop if args.client == "raw" else httpx_closed_loop
            for side, server in servers.items():
                host, port = server.url.removeprefix("http://").rsplit(":", 1)
                if args.client == "raw":
                    post = lambda body: encode_post(host, int(port), "/v1/embed", body)  # noqa: E731
                else:
                    post = lambda body: ("/v1/embed", json.dumps(body).encode())  # noqa: E731
                runs.append((f"{side} (JSON)", server, [post({"inputs": t}) for t in texts]))
                if side == "new" and not args.no_variants:
                    openai = [encode_post(host, int(port), "/v1/embeddings", {
                        "model": run.resolve().name, "input": t, "encoding_format": "float"})
                        for t in texts]
                    runs += [("new (base64)", server, [post({"inputs": t, "encoding_format":
                                                              "base64"}) for t in texts]),
                             ("new (input_ids)", server, [post({"input_ids": i}) for i in ids]),
                             ("new (/v1/embeddings)", server, openai)]
            for label, server, reqs in runs:  # warm-up: every path once
                asyncio.run(drive(server.url, reqs, args.clients, max(4 * args.clients, 400)))
            for b in range(args.bursts):
                # Rotate the order, so no kind always follows the same one.
                for label, server, reqs in runs[b % len(runs):] + runs[:b % len(runs)]:
                    results[label].append(measure(server, label, reqs, args.clients,
                                                  args.requests, drive))
        finally:
            for server in servers.values():
                server.stop()
    report(results, bench, args)
    bench.end()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
