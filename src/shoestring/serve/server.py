"""Run the app under uvicorn: from the CLI (blocking, SIGINT/SIGTERM drain) or in a thread.

The socket is bound here rather than by uvicorn so that ``--port 0`` works (the real port is
known and printed before the first request) and so a test or benchmark can start a server on
a free loopback port in-process with `ServerThread`.

Shutdown is graceful: uvicorn stops accepting connections, bodies still awaited are answered
408, in-flight requests get up to ``--shutdown-timeout`` (their queued inputs still run), and
only then the batcher's worker is drained and joined; the CLI then prints
``shoestring serve: stopped (SIGTERM): drained N in-flight requests``.
"""

from __future__ import annotations

import gc
import os
import queue
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from shoestring.consoles import err
from shoestring.errors import ShoestringError
from shoestring.model_repository import ModelRepository
from shoestring.serve.app import create_app
from shoestring.serve.fastpath import protocol_class
from shoestring.inference.engine import Engine, load_engine
from shoestring.serve import replicas
from shoestring.serve.prometheus import ServeMetrics
from shoestring.serve.routing import ModelRouter, served_from_arg
from shoestring.serve.settings import ServeSettings, make_settings


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
        raise ShoestringError(f"cannot listen on {host}:{port} ({e.strerror})", where="--port",
                              fix="pick another port, or --port 0 for any free one") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server, which on shutdown also stops waiting for request bodies (each still
    awaited is answered 408 at once: a slow client does not hold up the drain) and, once
    drained, says so in one line: how it stopped and how many requests it finished."""

    def __init__(self, config: uvicorn.Config, app: Any, announce: Any = None) -> None:
        super().__init__(config)
        self.served, self.announce = app, announce
        self.stop_signals: list[int] = []  # what stopped it, recorded here for any uvicorn

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.stop_signals.append(sig)
        super().handle_exit(sig, frame)

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve until stopped; stopped by a signal, end as that signal ends a process (the
        exit status says SIGTERM). uvicorn >= 0.29 raises it again itself once it has shut
        down; older ones (no ``_captured_signals``) return, so it is raised here."""
        super().run(sockets)
        if self.stop_signals and not hasattr(self, "_captured_signals"):
            end_as_signalled(self.stop_signals[-1], restore_default=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        in_flight = self.served.gate.active
        self.served.bodies.stop_waiting()
        self.served.fast.stop_waiting()
        await super().shutdown(sockets)
        if self.announce is not None:
            how = signal.Signals(self.stop_signals[-1]).name if self.stop_signals else "asked to"
            self.announce(f"shoestring serve: stopped ({how}): drained {in_flight} in-flight "
                          f"request{'' if in_flight == 1 else 's'}")


def end_as_signalled(signum: int, restore_default: bool = False) -> None:
    """End this process as ``signum`` would have without a handler (SIGTERM: killed by it;
    SIGINT: KeyboardInterrupt, which the CLI ends with 130), as uvicorn does after a drain:
    a supervisor reads from the exit status that the stop was asked for. With
    ``restore_default`` the signal's default handler is put back first; else the handler in
    place (the one this process had before serving) decides, unless that one ignores it: a
    process started in the background by a script inherits SIGINT ignored, and a stop it was
    asked for must still read as one."""
    if restore_default or signal.getsignal(signum) in (signal.SIG_IGN, None):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                      else signal.SIG_DFL)
    signal.raise_signal(signum)


def build_server(engine: Engine | ModelRouter, settings: ServeSettings,
                 announce: Any = None) -> uvicorn.Server:
    """The uvicorn server for ``engine``'s app; ``announce`` gets its shutdown line."""
    app = create_app(engine, settings)
    http = protocol_class(app.fast)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", http=http,
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
        # With the fast path's protocol, `connections` bounds and ages connections; on
        # uvicorn's own, its limit_concurrency answers 503 to every request past this many
        # connections or tasks (docs/security.md).
        limit_concurrency=None if http != "auto" else settings.max_connections,
        # (uvicorn's keep-alive timer a second later: the protocol's own closes and counts)
        timeout_keep_alive=settings.idle_timeout_s + (http != "auto"),
        ws="none",  # no route speaks WebSocket
        proxy_headers=False,  # loopback by default; a proxy in front sets its own headers
    )
    return _Server(config, app, announce)


def load(path: str | Path, settings: ServeSettings) -> Engine:
    """Load and warm up the model behind ``path`` with the server's limits."""
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    engine = load_engine(path, max_length=settings.max_length, truncate=settings.truncate,
                         precision=settings.precision, backend=settings.backend)
    if engine.backend.warning:
        print(f"warning: {path}: {engine.backend.warning}", file=sys.stderr, flush=True)
    _check_length(engine, settings, path)
    engine.warmup()
    engine.calibrate()  # what one more model call costs: how the batcher splits a batch
    return engine


def _check_length(engine: Engine, settings: ServeSettings, path: str | Path) -> None:
    """An explicit --max-length past the model's training context is refused (its default is
    that context); the default is checked against --max-batch-tokens as a given one is."""
    context = engine.context
    if settings.max_length is not None and context is not None and settings.max_length > context:
        raise ShoestringError(
            f"{settings.max_length} tokens is more than {path} was trained on ({context} "
            "tokens): positions past its training context are not ones it has learned",
            where="--max-length", fix=f"leave --max-length out (it is then {context}) or give "
            "at most that")
    if engine.max_length > settings.max_batch_tokens:
        raise ShoestringError(
            f"({settings.max_batch_tokens}) must be at least {path}'s --max-length "
            f"({engine.max_length}, its training context): one input of the longest length "
            "must fit a batch", where="--max-batch-tokens")


def load_router(models: list[str], settings: ServeSettings,
                repository: ModelRepository | None = None) -> ModelRouter:
    """Every model named on the command line (folders or repository references), loaded."""
    repo = repository or ModelRepository()
    served = [served_from_arg(m, repo) for m in models]
    names = [s.name for s in served]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ShoestringError(f"two models are named {dup!r}", fix="serve each name once (one "
                              "server may serve several versions of a name: requests pick them "
                              "with model=NAME:VERSION)")
    router = ModelRouter(served, settings, ServeMetrics(), lambda p: load(p, settings), repo)
    router.load_initial()
    return router


# The cyclic garbage collector's thresholds while serving (`tune_gc`): a collection after
# every 100,000 net allocations of container objects instead of Python's 700.
GC_THRESHOLDS = (100_000, 20, 10)


def tune_gc() -> None:
    """Make the garbage collector cheap for a server that has finished loading.

    Python collects its youngest generation after every 700 net allocations of container
    objects. A request allocates dozens (coroutines, futures, dicts of its ASGI messages), so
    under load the collector ran every few requests and each run walked every object still
    alive: the in-flight requests' and, in its older generations, everything loaded. That was
    a fifth of the event loop's CPU per `/v1/embed` request in bench/serve_cpu.py. Here,
    once the models are loaded, what is alive is moved out of the collector's sight for good
    (``gc.freeze``: the models, modules and app are never garbage) and the youngest
    generation is collected after `GC_THRESHOLDS`' 100,000 allocations (some hundreds of
    requests; 10,000 left a measurable share): a request's garbage is still freed at once by
    reference counting, only reference cycles wait for the next collection. Called
    by the CLI's server processes only (`serve`, each ``--workers`` replica), not by
    `ServerThread`, whose process is someone else's."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _describe(router: ModelRouter) -> str:
    """Every served model with its kind and tasks, the default (a request naming none) first."""
    return ", ".join(f"{slot.engine.kind} {slot.key} ({', '.join(sorted(slot.engine.tasks))}) "
                     f"[{slot.engine.backend.summary()}]" for slot in router.current_slots())


def serve(models: str | Path | list[str], settings: ServeSettings, announce: Any = print) -> None:
    """Serve ``models`` until SIGINT/SIGTERM, then drain and return (``--workers`` > 1: in
    that many processes sharing one listening socket)."""
    models = [str(m) for m in models] if isinstance(models, list) else [str(models)]
    if settings.workers > 1:
        stopped_by = serve_workers(models, settings, announce)
        if stopped_by is not None:  # here, once its queue and counter are freed (not leaked)
            end_as_signalled(stopped_by)
        return
    router = load_router(models, settings)
    sock = bind(settings.host, settings.port)
    server = build_server(router, settings, announce)
    tune_gc()
    announce(f"serving {_describe(router)} on {url_of(sock)}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def serve_command(models: list[str], *, request_timeout: float, body_timeout: float,
                  shutdown_timeout: float, idle_timeout: float, index: Path | None,
                  **options: Any) -> None:
    """`shoestring serve`: its options (named as its flags; the timeouts and the index dir are
    renamed and converted to their settings here) as `ServeSettings`, a warning when the server
    listens beyond this machine with no key, then the server until it is stopped."""
    settings = make_settings(
        **options, request_timeout_s=request_timeout, body_timeout_s=body_timeout,
        shutdown_timeout_s=shutdown_timeout, idle_timeout_s=idle_timeout,
        index=str(index) if index else None)
    if not settings.loopback and settings.api_key is None:
        err.print(f"[yellow]warning:[/] listening on {options['host']} without --api-key: anyone "
                  "who can reach this machine can use the model")
    serve(models, settings,
          announce=lambda msg: err.print(msg, markup=False, highlight=False, soft_wrap=True))


def _worker_main(models: list[str], settings: ServeSettings, sock: socket.socket,
                 ready: Any, loaded: replicas.Loaded, measure_memory: bool = False) -> None:
    """One replica: its own models, batchers and event loop on the shared socket. The
    first of several also reports its memory at its largest batch (`replicas`); each counts
    itself in ``loaded`` once loaded, and its ``/readyz`` answers 503 until all have."""
    # Ctrl-C in a terminal reaches every process of the group: the parent decides, and
    # passes on a SIGTERM (a replica still loading just ends; one serving drains).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        router = load_router(models, settings)
        server = build_server(router, settings, lambda line: print(
            f"worker {os.getpid()}: {line}", file=sys.stderr, flush=True))
    except ShoestringError as e:
        ready.put(("error", e.message))
        return
    server.served.fastapi.state.replicas = loaded  # what its /readyz waits for
    footprint = None
    if measure_memory:
        footprint = replicas.measure([s.engine for s in router.slots.values()],
                                     settings.max_batch_tokens)
    tune_gc()
    loaded.add()
    ready.put(("ready", (os.getpid(), footprint)))
    server.run(sockets=[sock])


def _died_while_loading(proc: Any) -> ShoestringError:
    """A replica that ended before it reported loaded, and no stop was asked for: how it
    ended (a signal by name; a Python traceback is printed above only for status 1, an
    exception that escaped)."""
    code = proc.exitcode
    if code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
        fix = ("SIGKILL is what the kernel's out-of-memory killer sends: see `dmesg`, and try "
               "fewer --workers or a lower --max-batch-tokens" if -code == signal.SIGKILL
               else "see what sent it the signal")
    else:
        how = f"exited with status {code}" + (" (its traceback is above)" if code == 1 else "")
        fix = "see its output above"
    return ShoestringError(f"worker {proc.name} (pid {proc.pid}) {how} while loading its models",
                           where="--workers", fix=fix)


def serve_workers(models: list[str], settings: ServeSettings,
                  announce: Any = print) -> int | None:
    """``--workers N``: N replica processes (cortex's scaling) accept on one socket.

    The kernel hands each new connection to one of them. The first replica starts alone and
    measures its memory at its largest batch; the others start only if they fit beside it
    (`replicas.check_fit`: else an error, exit 2). Every replica answers ``/readyz`` 503 until
    all have loaded (`replicas.Loaded`). SIGTERM or SIGINT to this process is passed to every
    replica, each drains (in-flight requests finish, queued inputs run; one still loading just
    ends), and once all have exited this returns that signal (`serve` then ends the process
    as the signal would, as a single server does): a stop asked for while they load is a
    stop, not a failure. None: the replicas ended without being asked.
    """
    import multiprocessing as mp

    repo = ModelRepository()
    for m in models:  # a bad name or path fails here, once, before any worker starts
        served_from_arg(m, repo)
    if settings.threads is None:  # the cores shared out, not N × all of them
        threads = max(1, (os.cpu_count() or 1) // settings.workers)
        settings = settings.model_copy(update={"threads": threads})
    sock = bind(settings.host, settings.port)
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    loaded = replicas.Loaded(ctx, settings.workers)
    procs = [ctx.Process(target=_worker_main,
                         args=(models, settings, sock, ready, loaded, i == 0),
                         name=f"shoestring-worker-{i}") for i in range(settings.workers)]
    stopped: list[int] = []  # the signals asked to stop, in order

    def stop_workers() -> None:
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    def forward(signum: int, frame: Any) -> None:
        stopped.append(signum)
        stop_workers()

    def await_ready(started: list[Any]) -> list[tuple[int, Any]] | None:
        """Each of ``started``'s pid and footprint once loaded (None: a stop was asked)."""
        out: list[tuple[int, Any]] = []
        while len(out) < len(started):
            if stopped:
                return None
            try:
                status, value = ready.get(timeout=0.25)
            except queue.Empty:  # a worker that died while loading never reports
                dead = next((p for p in started if p.exitcode is not None), None)
                if dead is not None and not stopped:
                    stop_workers()
                    raise _died_while_loading(dead) from None
                continue
            if status == "error":
                stop_workers()
                raise ShoestringError(value)
            out.append(value)
        return None if stopped else out

    announce(f"starting {settings.workers} workers for {', '.join(models)} on {url_of(sock)} "
             f"(/readyz answers 503 until all have loaded)")
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        procs[0].start()
        first = await_ready(procs[:1])
        if first is not None:
            footprint = first[0][1]
            try:
                replicas.check_fit(settings.workers, footprint)
            except ShoestringError:
                stop_workers()
                raise
            for p in procs[1:]:
                if not stopped:
                    p.start()
            rest = await_ready(procs[1:])
            if rest is not None:
                pids = [first[0][0]] + [pid for pid, _ in rest]
                announce(f"serving {', '.join(models)} with {settings.workers} workers "
                         f"(pids {', '.join(map(str, pids))}, {settings.threads} threads each; "
                         f"{footprint.describe()}) on {url_of(sock)}")
        if stopped:  # a worker started as the signal came gets it too
            stop_workers()
        for p in procs:
            if p.pid is not None:
                p.join()
        if stopped and loaded.count < settings.workers:
            announce(f"shoestring serve: stopped ({signal.Signals(stopped[-1]).name}) while "
                     f"the workers loaded ({loaded.waiting()})")
    finally:
        for p in procs:
            if p.is_alive():
                p.join(settings.shutdown_timeout_s + 10)
            if p.is_alive():
                p.kill()
        for s, h in old.items():
            signal.signal(s, h)
        sock.close()
    return stopped[-1] if stopped else None


class ServerThread:
    """A real server on a loopback port in a background thread (tests, benchmarks, notebooks).

    ``with ServerThread(engine, settings) as s: httpx.get(s.url + "/healthz")``. ``stop()``
    shuts down exactly as SIGTERM does (drain included).
    """

    def __init__(self, engine: Engine | ModelRouter, settings: ServeSettings) -> None:
        self.settings = settings
        self.sock = bind(settings.host, settings.port)
        self.url = url_of(self.sock)
        self.server = build_server(engine, settings)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                        name="shoestring-server", daemon=True)

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

    def __enter__(self) -> ServerThread:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
