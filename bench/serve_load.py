"""Serving under load, against the yardsticks that matter on a CPU (issue 20):

1. the engine's offline ceiling: sequences/s of the model alone (``Engine.run``, no server)
   at its best batch, on the same texts, sorted by length (its best case);
2. `shoestring serve` at C concurrent clients (one text per request, /v1/embed) as a
   percentage of that ceiling;
3. a single request's latency (C=1) against one forward pass of the same text offline;
4. ``--workers 2`` against ``--workers 1`` at the highest concurrency, with the core count;
5. the peer: Infinity (``infinity-emb``, TEI's Python cousin) serving the same exported
   model when it is installed (``--infinity PATH/infinity_emb``: its console script in an
   environment of its own, since its pins conflict with this project's), else a plain FastAPI server around the transformers
   model with mean pooling, as a user would write it.

Every server is a real process on loopback; the load generator is this process, a minimal
HTTP/1.1 keep-alive client on raw asyncio streams (pre-encoded requests), so that on a
2-core machine the clients cost the server as little CPU as possible.

    python bench/serve_load.py                                  # cram-size model, built once
    python bench/serve_load.py --requests 600 --concurrency 1 32
    python bench/serve_load.py --infinity /tmp/infvenv/bin/infinity_emb
"""

from __future__ import annotations

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

from common import Bench, format_load, load_average, parser

PEER = textwrap.dedent('''
    """A minimal embedding server, as a user would write it with transformers."""
    import sys

    import torch
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    model = AutoModel.from_pretrained(sys.argv[1]).eval()
    app = FastAPI()


    class Req(BaseModel):
        inputs: str | list[str]


    @app.post("/v1/embed")
    def embed(req: Req):
        texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        enc = tok(texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
        v = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
        return {"embeddings": v.tolist()}


    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}


    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
''')


def build_model(work: Path, preset: str | None, shape: dict[str, int] | None = None) -> Path:
    """The `cram` model size (256 hidden, 4 layers, 8k vocab), a named encoder preset, or
    ``shape`` (``model.*`` fields, e.g. ``{"hidden_size": 384, "num_layers": 6, ...}``),
    briefly trained on pydocs (serving speed does not depend on the weights' quality)."""
    from shoestring.config import load_config
    from shoestring.prep.prep import prep
    from shoestring.train.loop import train

    name = "x".join(str(v) for v in shape.values()) if shape else preset
    run = work / (f"run-{name}" if name else "run")
    if (run / "final" / "model.safetensors").is_file():
        return run
    sets = ["train.budget=null", "train.steps=10"]
    if preset or shape:
        sets = ["train.budget=null", "train.steps=2", "train.batch_size=8"]
        sets += [f"model.preset={preset}"] if preset else []
        sets += [f"model.{k}={v}" for k, v in (shape or {}).items()]
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

    def __init__(
        self,
        name: str,
        cmd: list[str],
        url: str | None = None,
        env: dict | None = None,
        health: str = "/healthz",
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
        )
        if url is None:  # ours announces its port on stderr
            seen = []
            while line := self.proc.stderr.readline():
                seen.append(line)
                if m := re.search(r"on (http://127\.0\.0\.1:\d+)", line):
                    url = m.group(1)
                    break
            if url is None:
                raise RuntimeError(f"{name} did not start: {''.join(seen)[-3000:]}")
        self.url = url
        self.log: list[str] = []  # keep draining stderr so the server never blocks on it
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(url + health, timeout=2).status_code == 200:
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


class RawClient:
    """One keep-alive HTTP/1.1 connection sending pre-encoded POSTs (a tiny ``wrk``)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, request: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        m = re.search(rb"(?i)content-length: *(\d+)", head)
        if m:
            await self.reader.readexactly(int(m.group(1)))
        else:  # chunked (not sent by the servers here) or close: read to the end
            await self.reader.read()
            self.writer.close()
            self.writer = None
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def encode_post(host: str, port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def closed_loop(url: str, requests: list[bytes], clients: int,
                      count: int) -> tuple[list[float], int, float]:
    """``count`` requests from ``clients`` keep-alive connections, each sending its next as
    soon as its answer is in: latencies, non-200 answers, wall seconds."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conns = [RawClient(host, int(port)) for _ in range(clients)]
    latencies: list[float] = []
    errors, next_i = 0, 0

    async def one(conn: RawClient) -> None:
        nonlocal next_i, errors
        while next_i < count:
            i = next_i
            next_i += 1
            t = time.perf_counter()
            try:
                status = await conn.post(requests[i % len(requests)])
            except (OSError, asyncio.IncompleteReadError):
                errors += 1
                conn.writer = None
                continue
            latencies.append(time.perf_counter() - t)
            errors += status != 200

    t0 = time.perf_counter()
    await asyncio.gather(*(one(c) for c in conns))
    wall = time.perf_counter() - t0
    for c in conns:
        c.close()
    return latencies, errors, wall


async def httpx_closed_loop(url: str, bodies: list[tuple[str, bytes]], clients: int,
                            count: int) -> tuple[list[float], int, float]:
    """`closed_loop` with a real client: ``count`` POSTs of ``(path, JSON body)`` from
    ``clients`` tasks sharing one ``httpx.AsyncClient`` whose keep-alive pool holds a
    connection per task. httpx costs its side more CPU per request than `RawClient`, so at
    the same concurrency the server sees requests spread more thinly (smaller batches)."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    latencies: list[float] = []
    errors, next_i = 0, 0
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one() -> None:
            nonlocal next_i, errors
            while next_i < count:
                path, body = bodies[next_i % len(bodies)]
                next_i += 1
                t = time.perf_counter()
                try:
                    r = await client.post(path, content=body, headers=headers)
                except httpx.TransportError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t)
                errors += r.status_code != 200

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return latencies, errors, wall


async def load(url: str, requests_: list[bytes], concurrency: int, count: int) -> dict:
    """``count`` requests from ``concurrency`` clients (after a warm-up): latencies, errors,
    wall time."""
    await closed_loop(url, requests_, concurrency, max(2 * concurrency, 32))
    latencies, errors, wall = await closed_loop(url, requests_, concurrency, count)
    return {"latencies": latencies, "errors": errors, "wall_s": wall}


def scrape_metrics(url: str, task: str = "embed") -> dict:
    """Totals from a server's /metrics for ``task``: per stage (`shoestring.inference.laps`)
    CPU seconds, wall seconds and count, and model calls and inputs (zeros if absent: a
    server without stage metrics, or with another task)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {"stage_cpu": {}, "stage_wall": {}, "stage_n": {}, "batches": 0.0,
                 "inputs": 0.0}
    names = {"shoestring_stage_cpu_seconds_total": "stage_cpu",
             "shoestring_stage_seconds_sum": "stage_wall",
             "shoestring_stage_seconds_count": "stage_n"}
    text = httpx.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("task") != task:
                continue
            if s.name in names:
                out[names[s.name]][s.labels["stage"]] = s.value
            elif s.name == "shoestring_batch_size_count":
                out["batches"] = s.value
            elif s.name == "shoestring_batch_size_sum":
                out["inputs"] = s.value
    return out


def stage_summary(before: dict, after: dict, requests: int) -> dict:
    """Per stage between two `scrape_metrics`: CPU ms per request and wall ms per input, in
    a request's order."""
    from shoestring.inference.laps import STAGES

    out = {}
    for stage, n in sorted(after["stage_n"].items(),
                           key=lambda kv: STAGES.index(kv[0]) if kv[0] in STAGES else 99):
        count = n - before["stage_n"].get(stage, 0.0)
        if count:
            cpu = after["stage_cpu"][stage] - before["stage_cpu"].get(stage, 0.0)
            wall = after["stage_wall"][stage] - before["stage_wall"].get(stage, 0.0)
            out[stage] = {"cpu_ms_per_request": 1000 * cpu / requests,
                          "wall_ms": 1000 * wall / count}
    return out


def summarize(parts: list[dict]) -> dict:
    latencies = sorted(x for p in parts for x in p["latencies"])
    if len(latencies) < 2:
        raise RuntimeError(f"only {len(latencies)} requests succeeded")
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "throughput": len(latencies) / sum(p["wall_s"] for p in parts),
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "errors": sum(p["errors"] for p in parts),
    }


def offline(run: Path, texts: list[str], batches: list[int], threads: int, seconds: float) -> dict:
    """The engine alone, in a fresh process with the servers' thread count: sequences/s at
    each batch size (texts sorted by length, padded per batch, the engine's best case), and
    the latency of one forward pass of one text (tokenizing included, as a request does)."""
    code = textwrap.dedent(f"""
        import json, statistics, sys, time, torch
        torch.set_num_threads({threads})
        from shoestring.inference.engine import load_engine
        e = load_engine({str(run)!r}, truncate=True)  # the trained context, as the server
        e.warmup()
        texts = json.loads(sys.stdin.read())
        prep = e.prepare_embed(texts, "mean", True, True)
        prep.sort(key=lambda p: len(p[0]))
        out = {{"sps": {{}}}}
        for b in {batches!r}:
            chunks = [prep[i:i + b] for i in range(0, len(prep), b)]
            e.run(("embed",), chunks[0])
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < {seconds}:
                for c in chunks:
                    e.run(("embed",), c)
                    n += len(c)
                    if time.perf_counter() - t0 >= {seconds}:
                        break
            out["sps"][b] = n / (time.perf_counter() - t0)
        one = []
        for i in range(200):
            t = time.perf_counter()
            e.run(("embed",), e.prepare_embed([texts[i % len(texts)]], "mean", True, False))
            one.append(time.perf_counter() - t)
        out["one_ms"] = statistics.median(one) * 1000
        print(json.dumps(out))
    """)
    r = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(texts),
        text=True,
        capture_output=True,
        check=True,
    )
    data = json.loads(r.stdout.strip().splitlines()[-1])
    data["sps"] = {int(k): v for k, v in data["sps"].items()}
    return data


def ours_cmd(run: Path, threads: int, workers: int, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "shoestring",
        "serve",
        str(run),
        "--port",
        "0",
        "--threads",
        str(threads),
        "--workers",
        str(workers),
        "--truncate",  # texts past the model's trained context are cut, as offline
        *extra,
    ]


def infinity_cmd(exe: str, hf: Path, port: int) -> list[str]:
    """Infinity's own CLI on our export: torch engine on CPU, fp32, batches of up to 32
    (its default), no BetterTransformer (it needs optimum and does not know ModernBERT)."""
    return [
        exe,
        "v2",
        "--model-id",
        str(hf),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--no-bettertransformer",
        "--batch-size",
        "32",
        "--served-model-name",
        "m",
    ]


def measure(name: str, server: Server, requests_: list[bytes], c: int, n: int, rounds: int) -> dict:
    parts = []
    for _ in range(rounds):
        parts.append(asyncio.run(load(server.url, requests_, c, -(-n // rounds))))
    out = summarize(parts)
    out["load"] = format_load(load_average())
    print(
        f"  {name} C={c}: {out['throughput']:.1f} req/s, p50 {out['p50_ms']:.1f} ms, "
        f"p99 {out['p99_ms']:.1f} ms, errors {out['errors']}, load {out['load']}",
        flush=True,
    )
    return out


def report(results: dict, off: dict, best: int, top: int, threads: int, cores: int | None
           ) -> tuple[list[dict], dict[str, str], list[str]]:
    """Print the servers' table and each yardstick's line; returns the table's rows, their
    formats and the yardstick lines (the record's)."""
    ours, ceiling = results["servers"]["shoestring"], results["ceiling"]
    print()
    rows = [{"server": name, "clients": c, "req/s": r["throughput"],
             "% of engine ceiling": r["throughput"] / ceiling, "p50 ms": r["p50_ms"],
             "p99 ms": r["p99_ms"]} for name, by_c in results["servers"].items()
            for c, r in by_c.items()]
    formats = {"req/s": ".0f", "% of engine ceiling": ".0%", "p50 ms": ".1f", "p99 ms": ".1f"}
    print("| " + " | ".join(rows[0]) + " |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(format(v, formats.get(k, "")) for k, v in r.items()) + " |")
    notes = [f"engine ceiling: {ceiling:.0f} seq/s (batch {best}); server at C={top}: "
             f"{100 * ours[top]['throughput'] / ceiling:.0f}% of it (target >= 90%)"]
    if 1 in ours:
        gap = ours[1]["p50_ms"] - off["one_ms"]
        notes.append(f"single request p50 {ours[1]['p50_ms']:.2f} ms vs one forward pass "
                     f"{off['one_ms']:.2f} ms: +{gap:.2f} ms (target <= 5 ms)")
    w2 = results["servers"].get("shoestring --workers 2")
    if w2:
        notes.append(f"--workers 2 ({max(1, threads // 2)} threads each) vs 1 "
                     f"({threads} threads) on {cores} cores at C={top}: "
                     f"{w2[top]['throughput'] / ours[top]['throughput']:.2f}x throughput, "
                     f"p99 {w2[top]['p99_ms']:.1f} vs {ours[top]['p99_ms']:.1f} ms")
    for name in ("infinity-emb", "transformers + FastAPI"):
        peer = results["servers"].get(name)
        if peer:
            notes.append(f"vs {name} at C={top}: "
                         f"{ours[top]['throughput'] / peer[top]['throughput']:.2f}x throughput, "
                         f"p99 {ours[top]['p99_ms']:.1f} vs {peer[top]['p99_ms']:.1f} ms")
    print()
    print("\n".join(notes))
    return rows, formats, notes


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--model", type=Path, help="run dir (default: build the cram-size model)")
    ap.add_argument("--preset", help="build this encoder preset instead (e.g. base)")
    ap.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "shoestring-serve-bench"
    )
    ap.add_argument("--requests", type=int, default=600, help="timed requests per measurement")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads of the engine, every server and the offline run",
    )
    ap.add_argument(
        "--infinity",
        metavar="INFINITY_EMB",
        help="the infinity_emb executable of an environment with infinity-emb[server,torch] "
        "(its peer then replaces the transformers one)",
    )
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-workers", action="store_true", help="skip --workers 2")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from shoestring.export.hf import export_encoder

    args.work.mkdir(parents=True, exist_ok=True)
    run = args.model or build_model(args.work, args.preset)
    hf = export_encoder(run, args.work / "hf", overwrite=True)
    texts = make_texts(max(args.requests, 400))
    cores = os.cpu_count()
    bench = Bench("serve_load", args, precision="fp32", threads=args.threads)
    print(f"model {run} (export {hf}); {len(texts)} texts", flush=True)

    off = offline(run, texts, args.batches, args.threads, seconds=3.0)
    best = max(off["sps"], key=off["sps"].get)
    ceiling = off["sps"][best]
    print(
        "offline engine (sorted by length): "
        + ", ".join(f"batch {b}: {v:.0f} seq/s" for b, v in off["sps"].items())
    )
    print(
        f"ceiling {ceiling:.0f} seq/s at batch {best}; one text: {off['one_ms']:.2f} ms "
        f"(median of 200)",
        flush=True,
    )

    results: dict = {"machine": bench.header, "offline": off, "ceiling": ceiling, "servers": {}}
    top = max(args.concurrency)
    servers: list[tuple[str, list[str], str | None, str]] = [
        ("shoestring", ours_cmd(run, args.threads, 1, []), None, "ours")
    ]
    if not args.no_workers:
        per = max(1, args.threads // 2)
        servers.append(("shoestring --workers 2", ours_cmd(run, per, 2, []), None, "ours"))
    if not args.no_peer:
        port = free_port()
        if args.infinity:
            servers.append(
                (
                    "infinity-emb",
                    infinity_cmd(args.infinity, hf, port),
                    f"http://127.0.0.1:{port}",
                    "infinity",
                )
            )
        else:
            peer_script = args.work / "peer_server.py"
            peer_script.write_text(PEER, encoding="utf-8")
            servers.append(
                (
                    "transformers + FastAPI",
                    [sys.executable, str(peer_script), str(hf), str(port)],
                    f"http://127.0.0.1:{port}",
                    "ours",
                )
            )
    for name, cmd, url, api in servers:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(args.threads),
            "HF_HUB_OFFLINE": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1",
        }
        server = Server(
            name, cmd, url, env=env, health="/health" if api == "infinity" else "/healthz"
        )
        host, port_ = server.url.removeprefix("http://").rsplit(":", 1)
        if api == "infinity":
            reqs = [
                encode_post(host, int(port_), "/embeddings", {"model": "m", "input": [t]})
                for t in texts
            ]
        else:
            reqs = [encode_post(host, int(port_), "/v1/embed", {"inputs": t}) for t in texts]
        try:
            by_c = {}
            for c in args.concurrency if "workers" not in name else [top]:
                n = args.requests if c > 1 else 200
                before = scrape_metrics(server.url) if name == "shoestring" else None
                by_c[c] = measure(name, server, reqs, c, n, args.rounds)
                if before is not None:  # where the server's time went (issue 49's stages)
                    sent = args.rounds * (-(-n // args.rounds) + max(2 * c, 32))  # + warm-ups
                    stages = stage_summary(before, scrape_metrics(server.url), sent)
                    by_c[c]["stages"] = stages
                    print("    stages, CPU ms/request (wall ms per input): " + ", ".join(
                        f"{k} {v['cpu_ms_per_request']:.3f} ({v['wall_ms']:.3f})"
                        for k, v in stages.items()), flush=True)
            results["servers"][name] = by_c
        finally:
            server.stop()

    rows, formats, notes = report(results, off, best, top, args.threads, cores)
    bench.table(rows, formats=formats, notes=notes)
    bench.end()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
