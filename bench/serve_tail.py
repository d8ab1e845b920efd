"""Server-side latency of `shoestring serve` under closed-loop load: where the tail comes from.

`bench/serve_load.py` measures latency at the client, which on a small machine also contains
the load generator's own scheduling. This script runs the real server (`ServerThread`, the
same app `shoestring serve` runs) in this process and records, for every /v1/fill-mask
request, its duration inside the server (the app's own latency measurement, before it is
folded into coarse histogram buckets) and, for every job, the time from entering the queue to
its result being handed back. The load generator is a separate process (32 keep-alive
clients by default, the benchmark's sentences), so the client-side figures are printed beside
the server's.

    python bench/serve_tail.py                              # the serve_load `cram` model
    python bench/serve_tail.py --max-batch-size 1 --repeats 3
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from prometheus_client import Histogram

from common import Bench, add_repeats, parser
from serve_load import make_texts
from shoestring.serve import batcher as batcher_module
from shoestring.serve.server import ServerThread, load
from shoestring.serve.settings import make_settings

CLIENT = """
import asyncio, json, sys, time
import httpx
url, warmup, n, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
texts = json.loads(sys.stdin.read())  # bench/serve_load.py's make_texts(300)
async def run(count, lat):
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as cl:
        sem = asyncio.Semaphore(c)
        async def one(i):
            async with sem:
                t = time.perf_counter()
                r = await cl.post("/v1/fill-mask", json={"inputs": texts[i % 300], "top_k": 5})
                r.raise_for_status()
                lat.append(time.perf_counter() - t)
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        return time.perf_counter() - t0
asyncio.run(run(warmup, []))
lat = []
wall = asyncio.run(run(n, lat))
print(json.dumps({"latencies": lat, "wall_s": wall}))
"""


def quantile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--model", type=Path,
                    default=Path(tempfile.gettempdir()) / "shoestring-serve-bench" / "run",
                    help="run dir to serve (default: the model bench/serve_load.py builds)")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    add_repeats(ap, 1, "timed runs, each printed")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--switch-interval", type=float,
                    help="sys.setswitchinterval for the server process, in seconds (default 0.005)")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if not (args.model / "final").is_dir():
        sys.exit(f"error: {args.model}: no trained run here; run bench/serve_load.py once "
                 "(it builds one) or pass --model RUN_DIR")

    server_s: list[float] = []
    queue_s: list[float] = []
    observe = Histogram.observe

    def capture(self: Histogram, value: float, *args: object, **kw: object) -> None:
        # prometheus-client: the labelled child of the request-duration histogram observes.
        if getattr(self, "_labelvalues", ()) == ("/v1/fill-mask",) and self._name.endswith(
            "request_duration_seconds"
        ):
            server_s.append(value)
        observe(self, value, *args, **kw)

    deliver = batcher_module._deliver

    def timed_deliver(jobs: list, results: list) -> None:
        now = batcher_module.time.monotonic()
        queue_s.extend(now - j.enqueued for j in jobs)
        deliver(jobs, results)

    Histogram.observe = capture  # type: ignore[method-assign]
    batcher_module._deliver = timed_deliver

    settings = make_settings(port=args.port, max_batch_size=args.max_batch_size)
    setting = (f"model {args.model}, --max-batch-size {args.max_batch_size}, "
               f"{args.concurrency} clients, {args.requests} requests after {args.warmup} warm-up")
    bench = Bench("serve_tail", args, precision="fp32")
    print(setting)
    texts = json.dumps(make_texts(300))
    rows = []
    with ServerThread(load(args.model, settings), settings) as server:
        for r in range(args.repeats):
            server_s.clear()
            queue_s.clear()
            out = subprocess.run(
                [sys.executable, "-c", CLIENT, server.url,
                 str(args.warmup), str(args.requests), str(args.concurrency)],
                input=texts, check=True, capture_output=True, text=True,
            )
            client = json.loads(out.stdout)
            timed, queued = server_s[-args.requests:], queue_s[-args.requests:]
            row = {"run": r + 1, "req/s": args.requests / client["wall_s"]}
            for side, xs in (("client", client["latencies"]), ("server", timed),
                             ("queue→result", queued)):
                row[f"{side} p50 ms"] = quantile(xs, .5) * 1e3
                row[f"{side} p99 ms"] = quantile(xs, .99) * 1e3
            rows.append(row)
            print(f"run {r + 1}: {row['req/s']:.1f} req/s; p50 / p99 ms: "
                  f"client {row['client p50 ms']:.1f} / {row['client p99 ms']:.1f}, "
                  f"server {row['server p50 ms']:.1f} / {row['server p99 ms']:.1f}, "
                  f"queue→result {row['queue→result p50 ms']:.1f} / "
                  f"{row['queue→result p99 ms']:.1f}")
    bench.table(rows, formats={k: ".1f" for k in rows[0] if k != "run"}, notes=[setting])
    bench.end()


if __name__ == "__main__":
    main()
