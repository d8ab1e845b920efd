"""Run the app under uvicorn: from the CLI (blocking, SIGINT/SIGTERM drain) or in a thread.

The socket is bound here rather than by uvicorn so that ``--port 0`` works (the real port is
known and printed before the first request) and so a test or benchmark can start a server on
a free loopback port in-process with `ServerThread`.

Shutdown is graceful: uvicorn stops accepting connections, waits up to
``--shutdown-timeout`` for in-flight requests (their queued inputs still run), and only then
the batcher's worker is drained and joined.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from shoestring.errors import ShoestringError
from shoestring.serve.app import create_app
from shoestring.serve.engine import Engine, load_engine
from shoestring.serve.settings import ServeSettings


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; a taken port or unknown host is a ShoestringError."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ShoestringError(f"cannot resolve host {host!r} ({e})", where="--host") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise ShoestringError(
            f"cannot listen on {host}:{port} ({e.strerror})",
            where="--port",
            fix="pick another port, or --port 0 for any free one",
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def build_server(engine: Engine, settings: ServeSettings) -> uvicorn.Server:
    app = create_app(engine, settings)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
        # A safety net under the batcher's own queue bound: connections beyond this are
        # answered 503 by uvicorn before any parsing.
        limit_concurrency=settings.max_queue + 512,
        timeout_keep_alive=30,
    )
    return uvicorn.Server(config)


def load(path: str | Path, settings: ServeSettings) -> Engine:
    """Load and warm up the model behind ``path`` with the server's limits."""
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    engine = load_engine(
        path,
        max_length=settings.max_length,
        truncate=settings.truncate,
        precision=settings.precision,
    )
    engine.warmup()
    return engine


def serve(path: str | Path, settings: ServeSettings, announce: Any = print) -> None:
    """Serve the model at ``path`` until SIGINT/SIGTERM, then drain and return."""
    engine = load(path, settings)
    sock = bind(settings.host, settings.port)
    server = build_server(engine, settings)
    announce(f"serving {engine.kind} {path} ({', '.join(sorted(engine.tasks))}) on {url_of(sock)}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


class ServerThread:
    """A real server on a loopback port in a background thread (tests, benchmarks, notebooks).

    ``with ServerThread(engine, settings) as s: httpx.get(s.url + "/healthz")``. ``stop()``
    shuts down exactly as SIGTERM does (drain included).
    """

    def __init__(self, engine: Engine, settings: ServeSettings) -> None:
        self.settings = settings
        self.sock = bind(settings.host, settings.port)
        self.url = url_of(self.sock)
        self.server = build_server(engine, settings)
        self.app = self.server.config.app
        self._thread = threading.Thread(
            target=self.server.run,
            kwargs={"sockets": [self.sock]},
            name="shoestring-server",
            daemon=True,
        )

    def start(self, timeout: float = 60.0) -> ServerThread:
        if self._thread.ident is not None:  # already started
            return self
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.sock.close()

    @property
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    def __enter__(self) -> ServerThread:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
