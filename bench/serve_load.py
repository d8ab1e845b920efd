"""Serving under load: `shoestring serve` micro-batched vs batch size 1 vs a plain FastAPI
server around the `transformers` fill-mask pipeline, all real servers on loopback.

Each server runs in its own process; this process is the load generator: C concurrent
clients (keep-alive connections) send a fixed number of fill-mask requests, one text each,
texts of realistic, varied length (sentences of the built-in corpus with one word masked).
Reports throughput and p50/p99 latency per server and concurrency, and the ratios.

    python bench/serve_load.py                     # builds the `cram`-size model if needed
    python bench/serve_load.py --model RUN_DIR --requests 600 --concurrency 1 8 32
    python bench/serve_load.py --preset base       # a BERT-base-size encoder (110M)

The peer is what a user would write: FastAPI + `pipeline("fill-mask", model=EXPORT_DIR)` in a
sync endpoint (FastAPI runs it in its thread pool). Same model weights (our export), same
texts, same precision (fp32), same client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import httpx

PEER = textwrap.dedent('''
    """A minimal fill-mask server, as a user would write it with transformers."""
    import sys

    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    from transformers import pipeline

    fill = pipeline("fill-mask", model=sys.argv[1], device="cpu")
    app = FastAPI()


    class Req(BaseModel):
        inputs: str
        top_k: int = 5


    @app.post("/v1/fill-mask")
    def fill_mask(req: Req):
        return fill(req.inputs, top_k=req.top_k)


    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}


    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
''')


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def build_model(work: Path, preset: str | None) -> Path:
    """The `cram` model size (256 hidden, 4 layers, 8k vocab) or a named encoder preset,
    briefly trained on pydocs (serving speed does not depend on the weights' quality)."""
    from shoestring.config import load_config
    from shoestring.data.prep import prep
    from shoestring.train.loop import train

    run = work / (f"run-{preset}" if preset else "run")
    if (run / "final" / "model.safetensors").is_file():
        return run
    sets = ["train.budget=null", "train.steps=10"]
    if preset:
        sets = ["train.budget=null", "train.steps=2", "train.batch_size=8",
                f"model.preset={preset}"]
    cfg = load_config(None, sets)
    if not (work / "data" / "manifest.json").is_file():
        prep(["builtin:pydocs"], work / "data", cfg.data)
    train(cfg, work / "data", run, overwrite=True)
    return run


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Sentences of the built-in corpus (6-60 words), one word replaced by [MASK]."""
    from shoestring.data.builtin import iter_pydocs

    rng = random.Random(seed)
    sentences = []
    for doc in iter_pydocs():
        for s in re.split(r"(?<=[.!?])\s+", doc.text):
            words = s.split()
            if 6 <= len(words) <= 60 and any(w.isalpha() for w in words):
                sentences.append(words)
        if len(sentences) > 20 * n:
            break
    rng.shuffle(sentences)
    texts = []
    for words in sentences[:n]:
        words = list(words)
        i = rng.choice([k for k, w in enumerate(words) if w.isalpha()])
        words[i] = "[MASK]"
        texts.append(" ".join(words))
    return texts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process; ``url`` once it answers /healthz."""

    def __init__(self, name: str, cmd: list[str], url: str | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        if url is None:  # ours announces its port on stderr
            while line := self.proc.stderr.readline():
                if m := re.search(r"on (http://127\.0\.0\.1:\d+)", line):
                    url = m.group(1)
                    break
            if url is None:
                raise RuntimeError(f"{name} did not start: {self.proc.stderr.read()}")
        self.url = url
        self.log: list[str] = []  # keep draining stderr so the server never blocks on it
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {''.join(self.log)[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def load(url: str, texts: list[str], concurrency: int, requests: int) -> dict:
    """``requests`` fill-mask calls from ``concurrency`` clients (after a short warm-up):
    the latencies, the errors and the wall time."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def run(count: int) -> tuple[list[float], int, float]:
            latencies: list[float] = []
            errors = 0
            next_i = 0

            async def worker() -> None:
                nonlocal next_i, errors
                while next_i < count:
                    i = next_i
                    next_i += 1
                    t = time.perf_counter()
                    try:
                        r = await client.post(
                            "/v1/fill-mask", json={"inputs": texts[i % len(texts)], "top_k": 5}
                        )
                    except httpx.HTTPError:
                        errors += 1
                        continue
                    latencies.append(time.perf_counter() - t)
                    errors += r.status_code != 200

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return latencies, errors, time.perf_counter() - t0

        await run(warmup_count(concurrency))  # connections, caches, thread pools
        latencies, errors, wall = await run(requests)
    return {"latencies": latencies, "errors": errors, "wall_s": wall}


def warmup_count(concurrency: int) -> int:
    return max(2 * concurrency, 16)


def summarize(parts: list[dict], requests: int) -> dict:
    """One figure from the rounds of one server at one concurrency."""
    latencies = sorted(x for p in parts for x in p["latencies"])
    if len(latencies) < 2:
        raise RuntimeError(f"only {len(latencies)} of {requests} requests succeeded")
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    cpu = [p["cpu_s"] for p in parts]
    served = sum(p["served"] for p in parts)
    out = {
        "throughput": requests / sum(p["wall_s"] for p in parts),
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "errors": sum(p["errors"] for p in parts),
        "cpu_ms_per_request": None if None in cpu else sum(cpu) * 1000 / served,
        "load": [p["load"] for p in parts],
    }
    if all("inputs" in p for p in parts):
        out["mean_batch"] = sum(p["inputs"] for p in parts) / max(sum(p["calls"] for p in parts), 1)
    return out


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc), None elsewhere.

    On a shared machine wall-clock throughput depends on the neighbours; the server's CPU
    time per request does not, so it is reported beside it.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch_totals(url: str) -> tuple[float, float]:
    """(inputs, model calls) so far, from the server's /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    vals = dict(
        re.findall(
            r'^shoestring_batch_size_(sum|count)\{task="fill-mask"\} (\S+)$', text, re.MULTILINE
        )
    )
    return float(vals.get("sum", 0)), float(vals.get("count", 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", type=Path, help="run dir to serve (default: build the cram-size model)"
    )
    ap.add_argument("--preset", help="build this encoder preset instead (e.g. base)")
    ap.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "shoestring-serve-bench"
    )
    ap.add_argument("--requests", type=int, default=400, help="timed requests per measurement")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds they are split in")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads in every server (OMP_NUM_THREADS); default: torch's choice",
    )
    ap.add_argument("--no-peer", action="store_true", help="skip the transformers pipeline server")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    from shoestring.model.hf import export_encoder

    if args.threads:  # inherited by the server processes, ours and the peer alike
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    run = args.model or build_model(args.work, args.preset)
    hf = export_encoder(run, args.work / "hf", overwrite=True)
    texts = make_texts(max(args.requests, 200))
    print(
        f"model {run} (exported to {hf}); {len(texts)} texts; torch threads per server: "
        f"{args.threads or 'default'}; load average {loadavg()}"
    )

    ours = [
        sys.executable,
        "-m",
        "shoestring",
        "serve",
        str(run),
        "--port",
        "0",
        "--max-wait-ms",
        str(args.max_wait_ms),
        "--precision",
        args.precision,
    ]
    peer_script = args.work / "peer_server.py"
    peer_script.write_text(PEER, encoding="utf-8")
    servers = [
        ("shoestring (batch 32)", ours + ["--max-batch-size", "32"], None),
        ("shoestring (batch 1)", ours + ["--max-batch-size", "1"], None),
    ]
    if not args.no_peer:
        port = free_port()
        servers.append(
            (
                "transformers pipeline",
                [sys.executable, str(peer_script), str(hf), str(port)],
                f"http://127.0.0.1:{port}",
            )
        )

    # All servers run at once and take turns, round by round: on a shared machine the load
    # drifts, and interleaving spreads that drift over every server alike.
    started: list[Server] = []
    parts: dict[str, dict[int, list[dict]]] = {name: {} for name, _, _ in servers}
    try:
        for name, cmd, url in servers:
            started.append(Server(name, cmd, url))
        per_round = -(-args.requests // args.rounds)
        for c in args.concurrency:
            for rnd in range(args.rounds):
                for server in started:
                    ours = server.name.startswith("shoestring")
                    totals0 = batch_totals(server.url) if ours else None
                    cpu0 = cpu_seconds(server.proc.pid)
                    part = asyncio.run(load(server.url, texts, c, per_round))
                    cpu1 = cpu_seconds(server.proc.pid)
                    part["cpu_s"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
                    part["served"] = per_round + warmup_count(c)  # CPU time covers the warm-up
                    part["load"] = loadavg()
                    if totals0 is not None:
                        totals1 = batch_totals(server.url)
                        part["inputs"] = totals1[0] - totals0[0]
                        part["calls"] = totals1[1] - totals0[1]
                    parts[server.name].setdefault(c, []).append(part)
                print(f"C={c} round {rnd + 1}/{args.rounds} done; load {loadavg()}", flush=True)
    finally:
        for server in started:
            server.stop()
    results = {
        name: {c: summarize(ps, per_round * len(ps)) for c, ps in by_c.items()}
        for name, by_c in parts.items()
    }

    print("\n| server | clients | req/s | p50 ms | p99 ms | server CPU ms/req | mean batch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, by_c in results.items():
        for c, r in by_c.items():
            mb = f"{r['mean_batch']:.1f}" if "mean_batch" in r else "–"
            cpu = f"{r['cpu_ms_per_request']:.1f}" if r["cpu_ms_per_request"] is not None else "–"
            print(
                f"| {name} | {c} | {r['throughput']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
                f"| {cpu} | {mb} |"
            )
    base, one = results.get("shoestring (batch 32)"), results.get("shoestring (batch 1)")
    peer = results.get("transformers pipeline")
    print()
    for c in args.concurrency:
        gain = base[c]["throughput"] / one[c]["throughput"]
        line = (
            f"C={c}: micro-batching vs batch 1: {gain:.2f}x "
            f"throughput, p99 {base[c]['p99_ms']:.1f} vs {one[c]['p99_ms']:.1f} ms"
        )
        if peer:
            line += (
                f"; vs transformers pipeline: {base[c]['throughput'] / peer[c]['throughput']:.2f}x "
                f"throughput, p99 {base[c]['p99_ms']:.1f} vs {peer[c]['p99_ms']:.1f} ms"
            )
        print(line)
    print(f"load average at the end: {loadavg()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
