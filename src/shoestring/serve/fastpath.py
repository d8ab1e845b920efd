"""The model endpoints' common case answered in the HTTP protocol itself, in front of ASGI.

On a GPU the event loop's CPU per request is what bounds requests per second. Under uvicorn
every request costs an ASGI scope, a request-response cycle object, a task running the
app through each middleware layer, and message dicts for the body and for each part of the
answer: bench/serve_cpu.py measured that machinery as the larger part of what the event loop
did per ``/v1/embed`` request once FastAPI's own layers were out of the way. So the common
case is answered here, in uvicorn's httptools protocol (`protocol_class`), the moment its
headers are complete: a POST to a model endpoint, HTTP/1.1, a ``Content-Length`` within
``--max-body-bytes``, no ``Expect`` or ``Transfer-Encoding``, the API key right (checked on
the raw headers before anything else), a free `RequestGate` slot, and no other request in
progress on its connection. Its body is parsed and validated in one pass by pydantic's Rust
JSON parser (``model_validate_json``) against the request model FastAPI documents, the same
`handlers.Api` method FastAPI's route would call runs in one task, and the answer, written by
orjson (`encoding`), goes out in one write with its head.

Everything else goes through the ASGI layers (`app`: metering, admission, the body limit) to
FastAPI, which answers every refusal (401, 413, 429, 400) in its place; so does a body this
path took that does not validate (FastAPI's 422 names the field) or a streamed generation,
handed over whole with its body. Both ways answer errors from one table (`answers`), count
and time every answer in the same metrics (``record``), hold a slot of the same gate, answer
408 to a body that has not arrived within ``--body-timeout`` (and at once on shutdown), and
drop the queued inputs of a client that goes away. The stages of every request taken here
are timed (`stages`).

This module is the one place that reads uvicorn's private names (its httptools protocol's
callbacks and attributes, its request cycle's). It is used
only inside the uvicorn releases CI tests (`FAST_PATH_UVICORN`) and where every name it reads
exists (`refusal`); elsewhere, or with ``SHOESTRING_FAST_PATH=0``, the server runs on
uvicorn's own protocol, every request through ASGI (the same answers, more CPU per
request), and says so once at start.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ValidationError

from shoestring.inference.laps import Laps
from shoestring.serve.answers import CLIENT_CLOSED, Shape, error_answer
from shoestring.serve.connections import Connections, connection_cap
from shoestring.serve.encoding import dumps
from shoestring.serve.handlers import Api
from shoestring.serve.security import ApiKey, Receive, RequestGate

Handler = Callable[[Any, Receive, Laps], Awaitable[Any]]
Record = Callable[[str, int, float], None]
_STATUS = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}
_JSON_HEAD = b"content-type: application/json\r\ncontent-length: "
_log = logging.getLogger("uvicorn.error")

# The uvicorn releases the fast path is tested with: CI runs the pinned one (constraints.txt),
# `make test-floors` the lowest, 0.53 (before 0.45 the protocol reads ``cycle.run_asgi``, which
# the name check refuses; before 0.53 uvicorn's own HTTP/1.0 answers lack the `connection:
# close` the fast path's carry). pyproject.toml requires this range. Widen it only after
# tests/test_serve_fastpath.py passes on the new release.
FAST_PATH_UVICORN = ">=0.53,<0.55"
# ``SHOESTRING_FAST_PATH=0``: serve through plain ASGI whatever the version (to compare).
FAST_PATH_ENV = "SHOESTRING_FAST_PATH"
# What `protocol_class` reads or calls of uvicorn's HttpToolsProtocol (callbacks it extends,
# methods it calls, its instances' attributes) and what uvicorn reads of a connection's
# current request cycle, which a `_Direct` stands in for (``response_complete``, ...).
_PROTOCOL_NAMES = ("connection_made", "data_received", "on_message_begin", "on_headers_complete",
                   "on_body", "on_message_complete", "connection_lost", "on_response_complete",
                   "send_400_response", "pause_writing", "resume_writing", "loop", "url",
                   "expect_100_continue", "headers", "scope", "cycle", "parser", "transport",
                   "server_state", "tasks", "flow", "pipeline")
_CYCLE_NAMES = frozenset({"response_complete", "keep_alive", "disconnected", "message_event",
                          "body", "more_body"})
_CYCLE_READ = re.compile(r"self\.cycle\.(\w+)")
_PLAIN = "same answers, more CPU per request"


def in_range(version: str, spec: str = FAST_PATH_UVICORN) -> bool | None:
    """Whether ``version`` is inside ``spec`` (None: it cannot be read as a version)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(spec)
    except InvalidVersion:
        return None


def installed_uvicorn() -> str:
    """The installed uvicorn's version string."""
    import uvicorn

    return str(getattr(uvicorn, "__version__", "unknown"))


def _names(cls: type) -> set[str]:
    """The names ``cls`` has or its own functions' code uses: ``self.x = ...`` in any method
    puts ``x`` there, so an instance attribute a release renames is missing from it."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        for value in vars(klass).values():
            code = getattr(value, "__code__", None)
            if code is not None:
                names.update(code.co_names)
    return names


def missing_names(protocol: type) -> list[str]:
    """What the fast path reads of ``protocol`` (uvicorn's HttpToolsProtocol) that it lacks,
    and what it reads of its request cycle that a `_Direct` does not answer."""
    have = _names(protocol)
    missing = [name for name in _PROTOCOL_NAMES if name not in have]
    try:
        source = inspect.getsource(protocol)
    except (OSError, TypeError):
        source = ""  # no source installed: the names above are all there is to check
    missing += sorted({f"cycle.{n}" for n in _CYCLE_READ.findall(source)} -
                      {f"cycle.{n}" for n in _CYCLE_NAMES})
    return missing


def refusal(version: str | None = None) -> str | None:
    """Why the fast path is not used in this process (None: it is): turned off by hand,
    httptools missing, uvicorn outside `FAST_PATH_UVICORN`, or a name it reads gone."""
    if os.environ.get(FAST_PATH_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{FAST_PATH_ENV}={os.environ[FAST_PATH_ENV]}: serving through plain ASGI ({_PLAIN})"
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return f"httptools is not installed: serving through uvicorn's h11 protocol ({_PLAIN})"
    version = installed_uvicorn() if version is None else version
    inside = in_range(version)
    if inside is None:
        return (f"cannot read uvicorn's version {version!r} to check it against the fast "
                f"path's tested range {FAST_PATH_UVICORN}: serving through plain ASGI ({_PLAIN})")
    if not inside:
        return (f"uvicorn {version} is outside the fast path's tested range {FAST_PATH_UVICORN}: "
                f"serving through plain ASGI ({_PLAIN})")
    missing = missing_names(HttpToolsProtocol)
    if missing:
        return (f"uvicorn {version}'s HttpToolsProtocol lacks {', '.join(missing)}, which the "
                f"fast path reads: serving through plain ASGI ({_PLAIN})")
    return None


@dataclass(frozen=True)
class Route:
    """A model endpoint: its task (the stage metrics' label), body model and handler, which
    valid bodies FastAPI answers instead (a streamed generation), and the shape of its error
    answers when it speaks another protocol (`answers.openai_error`)."""

    task: str
    model: type[BaseModel]
    handle: Handler
    hand_on: Callable[[Any], bool] | None = None
    shape: Shape | None = None


class FastRoutes:
    """What the protocol needs of the app: the endpoints it answers, the gate and key it
    checks, the body limits, and where answers are counted (``record(path, status, start)``)."""

    def __init__(self, api: Api, routes: dict[str, Route], gate: RequestGate, record: Record,
                 late_body: Callable[[], dict]) -> None:
        self.api, self.gate, self.record, self.late_body = api, gate, record, late_body
        self.routes = {path.encode(): (path, route) for path, route in routes.items()}
        self.key: ApiKey | None = api.api_key
        settings = api.settings
        self.max_body_bytes, self.body_timeout_s = settings.max_body_bytes, settings.body_timeout_s
        self.max_header_bytes = settings.max_header_bytes
        self.connections = Connections(connection_cap(settings.max_connections),
                                       settings.idle_timeout_s, api.metrics.closed)
        self.reading: set[_Direct] = set()  # requests whose body is late (a timer each)
        self._defaults: tuple[Any, bytes] = (None, b"")  # uvicorn's header list, joined
        # The event loop's thread time and the stage CPU it had recorded at the last answer.
        self._loop_mark: tuple[float, float] | None = None

    def head_lines(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The server's default headers (its date and name) as head lines: uvicorn replaces
        the list once a second, so it is joined once a second, not per answer."""
        if self._defaults[0] is not headers:
            self._defaults = (headers, b"".join(b"%s: %s\r\n" % pair for pair in headers))
        return self._defaults[1]

    def answer_bytes(self, status: int, data: bytes, headers: dict[str, str], keep: bool,
                     defaults: list[tuple[bytes, bytes]]) -> bytes:
        """A whole JSON answer, head and body; ``keep`` False adds ``connection: close``."""
        line = _STATUS.get(status) or f"HTTP/1.1 {status} \r\n".encode()
        parts = [line, _JSON_HEAD, str(len(data)).encode(), b"\r\n", self.head_lines(defaults)]
        for name, value in headers.items():
            parts += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
        if not keep:
            parts.append(b"connection: close\r\n")
        parts += [b"\r\n", data]
        return b"".join(parts)

    def loop_lap(self, task: str) -> None:
        """The ``loop`` stage: the event loop's CPU since the previous answer that no other
        stage recorded (its poll, socket reads, waking on a batch's results, switching
        tasks, the server's ticks), observed once per answer."""
        stages = self.api.metrics.stages
        now, recorded = time.thread_time(), stages.thread_cpu()
        if self._loop_mark is not None:
            own = max(0.0, (now - self._loop_mark[0]) - (recorded - self._loop_mark[1]))
            stages.observe(task, "loop", own, own)
            recorded += own
        self._loop_mark = (now, recorded)

    def stop_waiting(self) -> None:
        """On shutdown: every body still awaited gets its 408 now."""
        for request in list(self.reading):
            request.late()


class _Direct:
    """One request answered by the fast path. uvicorn's connection code sees it as the
    connection's current cycle (``response_complete``, ``keep_alive``, ``disconnected``,
    ``message_event``), so its pipelining, keep-alive and shutdown logic applies unchanged."""

    __slots__ = ("proto", "path", "route", "keep_alive", "body", "timer", "start", "held",
                 "response_complete", "disconnected", "gone")

    def __init__(self, proto: Any, path: str, route: Route, keep_alive: bool) -> None:
        self.proto, self.path, self.route, self.keep_alive = proto, path, route, keep_alive
        self.body: list[bytes] | None = []  # None once read
        self.timer: asyncio.TimerHandle | None = None
        self.start = time.perf_counter()
        self.held = True  # a gate slot
        self.response_complete = self.disconnected = False
        self.gone: asyncio.Future | None = None

    @property
    def message_event(self) -> _Direct:  # uvicorn calls message_event.set() on its cycle
        return self

    def set(self) -> None:
        pass

    def release(self) -> None:
        if self.held:
            self.held = False
            self.proto.fast.gate.active -= 1

    def late(self) -> None:
        """The body has not arrived in time (or the server is stopping): 408, and close."""
        if self.body is None:
            return
        self.body = None
        self._stop_timer()
        status, content = 408, self.proto.fast.late_body()
        if self.route.shape is not None:
            status, content = self.route.shape(status, content)
        self.respond(status, dumps(content), {"connection": "close"})

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.proto.fast.reading.discard(self)

    def lost(self) -> None:
        """The client went away: a body being read is given up; a waiting handler sees it."""
        self.disconnected = True
        if self.body is not None:
            self.body = None
            self._stop_timer()
            self.finish(CLIENT_CLOSED, keep=False)
        elif self.gone is not None and not self.gone.done():
            self.gone.set_result(None)

    async def receive(self) -> dict:
        """The ASGI ``receive`` the handlers watch for a disconnect (the body is read)."""
        if not self.disconnected:
            if self.gone is None:
                self.gone = self.proto.loop.create_future()
            await self.gone
        return {"type": "http.disconnect"}

    def begin(self, body: bytes) -> None:
        """The body is in: validate it, then answer in a task (or hand it to FastAPI)."""
        self._stop_timer()
        route, proto = self.route, self.proto
        cpu = proto.cpu_in  # the thread time when its bytes began to be read
        try:
            request = route.model.model_validate_json(body)
        except ValidationError:
            request = None
        if request is None or (route.hand_on is not None and route.hand_on(request)):
            self.release()
            proto.hand_over(body)
            return
        laps = Laps(proto.fast.api.metrics.stages, route.task, self.start, cpu)
        laps.lap("parse")
        task = proto.loop.create_task(self.answer(request, laps))
        proto.tasks.add(task)
        task.add_done_callback(proto.tasks.discard)
        proto.cpu_in = time.thread_time()  # a request pipelined behind it starts here

    async def answer(self, request: Any, laps: Laps) -> None:
        api = self.proto.fast.api
        headers: dict[str, str] = {}
        try:
            content, status = await self.route.handle(request, self.receive, laps), 200
        except asyncio.CancelledError:  # a forced shutdown
            self.finish(500, keep=False)
            raise
        except Exception as e:
            answer = error_answer(e, api.metrics, api.settings.request_timeout_s)
            if answer is None:
                _log.exception("Exception answering %s", self.path)
                content, status = {"detail": "Internal Server Error"}, 500
            else:
                content, status, headers = answer.body, answer.status, answer.headers
            if self.route.shape is not None:
                status, content = self.route.shape(status, content)
            laps.skip()
        data = dumps(content)
        laps.lap("serialize")
        self.respond(status, data, headers)
        laps.lap("send")
        self.proto.fast.loop_lap(self.route.task)

    def respond(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        """Head and body in one write, then the connection goes on (or closes) once the
        client has taken the answer: while the transport's buffer is over its high-water mark
        the connection reads no further request (as uvicorn's own cycle awaits its drain), so
        a client that never reads cannot grow the server's memory."""
        proto = self.proto
        transport = proto.transport
        keep = self.keep_alive and not self.disconnected
        if headers:
            headers = {k.lower(): v for k, v in headers.items()}
            if headers.pop("connection", "").lower() == "close":
                keep = False
        if not transport.is_closing():
            transport.write(proto.fast.answer_bytes(status, data, headers, keep,
                                                    proto.server_state.default_headers))
        self.release()
        if proto.flow.write_paused and not transport.is_closing():
            task = proto.loop.create_task(self._taken(status, keep))
            proto.tasks.add(task)
            task.add_done_callback(proto.tasks.discard)
            return
        self.finish(status, keep)

    async def _taken(self, status: int, keep: bool) -> None:
        await self.proto.flow.drain()  # the connection's loss or --idle-timeout ends it too
        self.finish(status, keep)

    def finish(self, status: int, keep: bool) -> None:
        """The request is over: its slot back, counted, and the connection's next step."""
        if self.response_complete:
            return
        self.release()
        self.response_complete = True
        proto = self.proto
        if proto.direct is self:
            proto.direct = None
        proto.fast.record(self.path, status, self.start)
        if not keep:
            proto.transport.close()
        proto.on_response_complete()  # the next pipelined request, or the keep-alive timer


def head_problem(headers: list[tuple[bytes, bytes]], version: str, upgrade: bool
                 ) -> tuple[int, dict] | None:
    """Why a request head must not be served (its status and answer), or None: an HTTP/1.1
    request without exactly one ``Host`` (RFC 9112 §3.2: 400), a transfer coding other than
    ``chunked`` alone (§6.1: 501; ``identity`` is no longer one), or a body on a request that
    asks to switch protocols (the parser stops at the switch, so the body could never be
    read: 400 rather than no answer)."""
    hosts = sum(name == b"host" for name, _ in headers)
    if hosts != 1 and (version != "1.0" or hosts > 1):
        return 400, {"detail": f"an HTTP/{version} request needs exactly one Host header, this "
                     f"one has {hosts}"}
    codings = [value for name, value in headers if name == b"transfer-encoding"]
    if codings and [c.strip().lower() for c in b",".join(codings).split(b",")] != [b"chunked"]:
        shown = b", ".join(codings).decode("latin-1")
        return 501, {"detail": f"Transfer-Encoding {shown!r} is not supported: send the body "
                     "with a Content-Length, or with 'chunked' alone"}
    if upgrade and (codings or any(name == b"content-length" and value.strip() not in (b"", b"0")
                                   for name, value in headers)):
        return 400, {"detail": "this server does not switch protocols, and a request that asks "
                     "to (Connection: upgrade) cannot carry a body here: send it without "
                     "the Upgrade and Connection: upgrade headers"}
    return None


def protocol_class(fast: FastRoutes | None) -> Any:
    """uvicorn's httptools protocol with the fast path for ``fast``'s endpoints and
    `_OneWrite` transports; where `refusal` says why not, uvicorn's own protocol ("auto":
    every request through ASGI), and a log line saying so."""
    why = refusal()
    if why is not None:
        _log.warning("shoestring serve: %s", why)
        return "auto"
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class FastProtocol(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            self.fast, self.direct = fast, None
            # A whole answer owed in place of the next request (an error: then close), the
            # bytes of the request head being read (`in_head`: between requests or inside
            # one's head), and the timer of an answer the client is not reading.
            self.refusal: bytes | None = None
            self.in_head, self.head_bytes, self.unread = True, 0, None
            super().connection_made(_OneWrite(transport, self.loop))
            if not fast.connections.opened(self):
                n = fast.connections.max_connections
                self.refuse(503, {"detail": f"the server holds its limit of {n} connections, "
                                  "every one with a request in progress: retry shortly",
                                  "limit": "max_connections", "value": n}, "refused")

        def data_received(self, data: bytes) -> None:
            if self.refusal is not None:
                return  # an error is owed: nothing after it is read
            self.cpu_in = time.thread_time()  # the parse stage's CPU starts here
            if self.in_head:
                self.head_bytes += len(data)
            super().data_received(data)
            limit = self.fast.max_header_bytes
            if self.in_head and self.head_bytes > limit and self.refusal is None:
                self.refuse(431, {"detail": f"the request line and headers are over {limit} "
                                  "bytes", "limit": "max_header_bytes", "value": limit},
                            "header_too_large")
            direct = self.direct
            if direct is not None and direct.body is not None and direct.timer is None:
                direct.timer = self.loop.call_later(self.fast.body_timeout_s, direct.late)
                self.fast.reading.add(direct)

        def on_message_begin(self) -> None:
            # uvicorn builds the request's ASGI scope here; only a request that goes to ASGI
            # needs one, and `_to_asgi` builds it then.
            self.url, self.expect_100_continue, self.headers = b"", False, []

        def on_headers_complete(self) -> None:
            self.in_head, self.head_bytes = False, 0
            self.fast.connections.busy(self)
            parser = self.parser
            problem = head_problem(self.headers, parser.get_http_version(),
                                   parser.should_upgrade())
            if problem is not None:
                return self.refuse(*problem, reason="bad_request")
            direct = self._take()
            if direct is None:
                return self._to_asgi()
            self.direct = self.cycle = direct

        def _to_asgi(self) -> None:
            """uvicorn's own start of a request: its scope, cycle and task."""
            url, headers, expect = self.url, self.headers, self.expect_100_continue
            super().on_message_begin()
            self.url, self.expect_100_continue = url, expect
            self.headers = self.scope["headers"] = headers
            super().on_headers_complete()

        def _take(self) -> _Direct | None:
            """A `_Direct` for this request if the fast path answers it (a slot taken)."""
            fast = self.fast
            found = None if fast is None else fast.routes.get(self.url)
            if found is None or self.direct is not None or self.expect_100_continue:
                return None
            if self.cycle is not None and not self.cycle.response_complete:
                return None  # an answer still owed on this connection: queue behind it
            parser = self.parser
            if (parser.get_method() != b"POST" or parser.get_http_version() != "1.1"
                    or parser.should_upgrade()):
                return None
            length = None
            for name, value in self.headers:
                if name == b"content-length":
                    length = value
                elif name == b"transfer-encoding":
                    return None
            if length is None or not length.isdigit() or int(length) > fast.max_body_bytes:
                return None
            if fast.key is not None and not fast.key.check_raw(self.headers):
                return None
            gate = fast.gate
            if gate.active >= gate.max_requests:
                return None
            gate.active += 1
            return _Direct(self, *found, keep_alive=parser.should_keep_alive())

        def on_body(self, body: bytes) -> None:
            direct = self.direct
            if direct is None or direct.body is None:
                if self.refusal is None:
                    super().on_body(body)
                return
            direct.body.append(body)

        def on_message_complete(self) -> None:
            self.in_head = True
            direct = self.direct
            if direct is None or direct.body is None:
                if self.refusal is None:
                    super().on_message_complete()
                return
            body, direct.body = b"".join(direct.body), None
            direct.begin(body)

        def hand_over(self, body: bytes) -> None:
            """The request this path took goes to the ASGI app after all, body included."""
            self.direct = self.cycle = None
            self._to_asgi()
            self.cycle.body, self.cycle.more_body = body, False
            self.cycle.message_event.set()

        def connection_lost(self, exc: Exception | None) -> None:
            direct = self.direct
            self.fast.connections.gone(self)
            self._stop_unread()
            super().connection_lost(exc)
            if direct is not None:
                direct.lost()

        def owed(self) -> bool:
            """Whether an answer is still owed on this connection (in progress or queued)."""
            return (self.cycle is not None and not self.cycle.response_complete) or bool(
                self.pipeline)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing() or self.owed():
                return
            if self.refusal is not None:
                self._send_refusal()
            else:
                self.fast.connections.wait(self)

        def refuse(self, status: int, content: dict, reason: str) -> None:
            """Answer ``status`` with ``content`` and close, after every answer still owed
            on this connection (pipelined requests are answered in order, RFC 9112)."""
            if self.refusal is not None:
                return
            self.fast.connections.count(reason)
            self.refusal = self.fast.answer_bytes(status, dumps(content), {}, False,
                                                  self.server_state.default_headers)
            if not self.owed():
                self._send_refusal()

        def _send_refusal(self) -> None:
            if not self.transport.is_closing():
                self.transport.write(self.refusal)
                self.transport.close()

        def send_400_response(self, msg: str) -> None:  # uvicorn's answer to unparsable bytes
            self.refuse(400, {"detail": f"{msg.rstrip('.')}: the bytes after the last whole "
                              "request are not HTTP/1.1"}, "bad_request")

        def idle_expired(self) -> None:
            """No whole request head within --idle-timeout: a silent connection is closed; one
            that began a head is answered 408 first."""
            if self.transport.is_closing() or self.owed():
                return
            fast = self.fast
            if self.head_bytes == 0:
                fast.connections.count("idle")
                self.transport.close()
                return
            fast.connections.gone(self)
            t = fast.connections.idle_timeout_s
            self.refuse(408, {"detail": f"the request head did not arrive within {t:g} s",
                              "limit": "idle_timeout", "value": t}, "head_timeout")

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.unread is None:
                self.unread = self.loop.call_later(self.fast.connections.idle_timeout_s,
                                                   self._unread)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._stop_unread()

        def _stop_unread(self) -> None:
            if self.unread is not None:
                self.unread.cancel()
                self.unread = None

        def _unread(self) -> None:
            """An answer unread for --idle-timeout: the client is not reading; drop it."""
            self.unread = None
            self.fast.connections.count("unread")
            self.transport.abort()

    return FastProtocol


class _OneWrite:
    """A connection's transport that sends an ASGI response's head and body in one write.

    uvicorn writes the status line and headers as soon as the app sends
    ``http.response.start``, and the body on the next message: two send() calls and two TCP
    segments per answer, each costing the server a system call and (on loopback) the
    receiving side's network stack. The head is held here instead and goes out with the next
    write; a head nothing follows in the same turn of the event loop (a HEAD request's)
    goes out on its own at the end of that turn, and before the connection closes. (The
    fast path writes its answers whole.)"""

    __slots__ = ("_transport", "_loop", "_head")

    def __init__(self, transport: Any, loop: Any) -> None:
        self._transport, self._loop, self._head = transport, loop, None

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():
            # uvicorn marks only a connection's newest cycle disconnected: a pipelined one
            # woken from its drain by the loss writes on, which uvloop's transport refuses
            self._head = None
            return
        head = self._head
        if head is not None:
            self._head = None
            self._transport.writelines((head, data))
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n":
            self._head = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():  # the client may have gone meanwhile
                self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._head = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # everything else is the transport's own
        return getattr(self._transport, name)
