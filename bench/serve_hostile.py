"""What a hostile client costs a server, old code against new, each with its default flags
(issue 62, majors 1-3).

Three clients, each against both servers in turn (the same tiny encoder as
bench/serve_cpu.py, one torch thread):

- **unread**: one keep-alive connection sends ``POST /v1/embed`` with 1,024 inputs (an answer
  of ~0.7 MB), the next once the server has answered it, and never reads: how many the server
  answered, its resident memory before and after, and whether it closed the connection.
- **idle**: 1,030 connections that send nothing; then ``/healthz`` on a new connection (its
  status), and after 35 s how many of the silent connections the server has closed.
- **header**: one request whose single header value grows to 16 MB in 64 KiB pieces: the
  status it gets and the server's memory growth.

    python bench/serve_hostile.py                       # old = 7ab5ac1, new = this checkout
    python bench/serve_hostile.py --base-commit 65b6e9b --unread-requests 100
"""

from __future__ import annotations

import socket
import time

import httpx
from common import ROOT, Bench
from serve_cpu import base_source, build_tiny_model, old_and_new_args, resident_mb, start
from serve_load import Server


def _connect(url: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    return sock


def _server_closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset waiting on it), without blocking."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def answered(url: str) -> float:
    """The server's count of 200 answers to /v1/embed (its /metrics)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith('shoestring_requests_total{endpoint="/v1/embed",status="200"}'):
            return float(line.split()[-1])
    return 0.0


def unread(server: Server, count: int) -> dict:
    """Each request is sent once the one before it was answered (or after 2 s): requests
    that arrive while one is in progress would be queued by uvicorn's pipelining, which
    waits for the client to read; answered one at a time they need the server's own
    backpressure."""
    body = b'{"inputs": [' + b", ".join([b'"a b"'] * 1024) + b"]}"
    request = (b"POST /v1/embed HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
               + body)
    before, done = resident_mb(server.proc.pid), answered(server.url)
    sock = _connect(server.url, rcvbuf=4096)
    sock.setblocking(False)
    total, pending, started = 0, b"", done
    for _ in range(count):
        pending += request
        try:
            sent = sock.send(pending)
            total, pending = total + sent, pending[sent:]
        except BlockingIOError:
            pass  # the server is not reading us: the request waits here
        except OSError:
            break
        deadline = time.monotonic() + 2.0
        while answered(server.url) <= done and time.monotonic() < deadline:
            time.sleep(0.05)
        done = answered(server.url)
    time.sleep(1.0)
    grown = resident_mb(server.proc.pid) - before
    closed = _server_closed(sock)
    sock.close()
    return {"unread: requests sent whole": total // len(request),
            "unread: answered": int(done - started), "unread: RSS growth MB": grown,
            "unread: closed by server": closed}


def idle(server: Server, count: int, wait_s: float) -> dict:
    silent = [_connect(server.url) for _ in range(count)]
    time.sleep(0.5)
    try:
        health = httpx.get(server.url + "/healthz", timeout=10).status_code
    except httpx.HTTPError as e:
        health = type(e).__name__
    time.sleep(wait_s)
    closed = sum(_server_closed(s) for s in silent)
    for s in silent:
        s.close()
    return {"idle: /healthz status": health, f"idle: closed after {wait_s:.0f} s": closed}


def header(server: Server, size: int) -> dict:
    before = resident_mb(server.proc.pid)
    sock = _connect(server.url)
    sock.settimeout(30)
    status: object = "no answer"
    try:
        sock.sendall(b"POST /v1/embed HTTP/1.1\r\nhost: x\r\nx-big: ")
        piece = b"v" * (1 << 16)
        for _ in range(size // len(piece)):
            sock.sendall(piece)
        sock.sendall(b"\r\ncontent-length: 2\r\n\r\n{}")
    except OSError:
        pass  # closed by the server while we sent: its answer, if any, is waiting
    try:
        line = sock.makefile("rb").readline()
        status = int(line.split()[1]) if line else "closed"
    except (OSError, IndexError, ValueError):
        status = "closed"
    grown = resident_mb(server.proc.pid) - before
    sock.close()
    return {"header: status": status, "header: RSS growth MB": grown}


def main() -> None:
    ap = old_and_new_args(__doc__, "7ab5ac1")
    ap.add_argument("--unread-requests", type=int, default=200)
    ap.add_argument("--idle-connections", type=int, default=1030)
    ap.add_argument("--idle-wait", type=float, default=35.0)
    ap.add_argument("--header-mb", type=int, default=16)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    run = args.model or build_tiny_model(args.work)
    bench = Bench("serve_hostile", args, precision="fp32", threads=1)
    rows = []
    for side, source in (("old", base_source(args.base_commit)), ("new", ROOT / "src")):
        server = start(side, source, run, 1)
        try:
            row = {"server": f"{side} ({args.base_commit if side == 'old' else 'this checkout'})"}
            row |= unread(server, args.unread_requests)
            row |= idle(server, args.idle_connections, args.idle_wait)
            row |= header(server, args.header_mb << 20)
            rows.append(row)
            print("; ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in row.items()), flush=True)
        finally:
            server.stop()
    bench.table(rows, formats={"unread: RSS growth MB": ".0f", "header: RSS growth MB": ".0f"},
                notes=["both servers: `shoestring serve RUN --port 0 --threads 1 --truncate`, "
                       "every other flag its default"])
    bench.end()


if __name__ == "__main__":
    main()
