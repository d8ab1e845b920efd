"""What a hostile client meets before its request is parsed (issue 62, majors 1-3 and the
protocol minors): connections that never send, trickle a head, send huge heads, never read
their answers, or send what is not HTTP/1.1 after a good request.

A real model behind a real server on a loopback port, spoken to over raw sockets; the
limits are set small (``--idle-timeout`` 1.5 s, 16 connections, 2 KiB heads) so that each
test shows its limit in seconds.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from test_serve import metric, run_dir, start, wait_for  # noqa: F401 (fixtures: the same model)
from test_serve_fastpath import _head, _post

from shoestring.serve.server import ServerThread

IDLE_S, MAX_CONNECTIONS, MAX_HEADER = 1.5, 16, 2048


@pytest.fixture(scope="module")
def server(run_dir: Path):
    srv = start(run_dir, max_length=64, max_batch_tokens=4096, max_client_batch=1024,
                max_body_bytes=1 << 20, idle_timeout_s=IDLE_S, max_connections=MAX_CONNECTIONS,
                max_header_bytes=MAX_HEADER, body_timeout_s=30)
    yield srv
    srv.stop()


def _connect(server: ServerThread, rcvbuf: int | None = None) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect, so the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    return sock


def _answers(sock: socket.socket, n: int) -> list[tuple[int, dict, bytes]]:
    reader = sock.makefile("rb")
    out = []
    for _ in range(n):
        status, headers = _head(reader)
        out.append((status, headers, reader.read(int(headers.get("content-length", 0)))))
    return out


def _closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``timeout``; data is read
    past."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def _closed(server: ServerThread, reason: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return metric(text, "shoestring_closed_connections_total", reason=reason)


def test_a_client_that_never_reads_stops_being_read_and_is_dropped(run_dir: Path) -> None:
    """Major 1: requests sent on one connection whose answers are never read. The server
    answers until the connection's write buffer is full, then reads no more of it (the
    client's sends block: nothing is buffered for it without bound), and after
    --idle-timeout with the answer unread it drops the connection. (Its own server: the
    idle timeout must outlast the sending, or dropping the client would hide the rest.)"""
    with start(run_dir, max_length=64, max_batch_tokens=4096, idle_timeout_s=10) as server:
        _never_read(server)


def _never_read(server: ServerThread) -> None:
    body = {"inputs": ["a b"] * 1024}  # an answer of ~0.7 MB
    request = _post("/v1/embed", body)
    answered = lambda: metric(httpx.get(server.url + "/metrics", timeout=30).text,
                              "shoestring_requests_total", endpoint="/v1/embed", status="200")
    before, unread = answered(), _closed(server, "unread")
    sock = _connect(server, rcvbuf=4096)
    sock.settimeout(2)
    tries, got = 40, 0
    for _ in range(tries):  # one at a time, each once the one before was answered
        try:
            sock.sendall(request)
        except TimeoutError:
            break  # the server has stopped reading us
        try:
            wait_for(lambda: answered() - before > got, timeout=2)
        except AssertionError:
            break  # nor answering: it waits for us to read
        got += 1
    # without backpressure every request is answered and ~28 MB wait in the server for us
    assert got < tries, "the server kept answering a client that does not read"
    assert got <= 10  # what the kernel's socket buffers took, no more
    wait_for(lambda: _closed(server, "unread") == unread + 1, timeout=30)
    assert _closed_by_server(sock, 10)
    sock.close()


def test_silent_connections_are_closed_and_health_checks_get_in(server: ServerThread) -> None:
    """Major 2: more silent connections than --max-connections. Each new one closes the
    longest-waiting (the health check gets in), and the rest are closed after
    --idle-timeout."""
    evicted = _closed(server, "evicted")
    silent = [_connect(server) for _ in range(MAX_CONNECTIONS + 4)]
    time.sleep(0.2)
    r = httpx.get(server.url + "/healthz", timeout=10)  # a new connection, beyond the limit
    assert r.status_code == 200
    assert _closed(server, "evicted") >= evicted + 4
    assert _closed_by_server(silent[0], 5)  # the oldest made room
    assert all(_closed_by_server(s, IDLE_S + 10) for s in silent)  # the rest aged out
    for s in silent:
        s.close()


def test_a_trickled_head_gets_408_after_the_idle_timeout(server: ServerThread) -> None:
    """Slowloris: a head sent a few bytes at a time never completes; the server answers 408
    --idle-timeout after the connection opened, however often bytes arrive."""
    sock = _connect(server)
    sock.sendall(b"POST /v1/embed HTTP/1.1\r\nhost: x\r\n")
    opened = time.monotonic()
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        while time.monotonic() - opened < IDLE_S + 20:
            sock.sendall(b"x-a: b\r\n")
            time.sleep(0.2)
    status, _, body = _answers(sock, 1)[0]
    assert status == 408 and json.loads(body)["limit"] == "idle_timeout"
    sock.close()


@pytest.mark.parametrize("head", [
    b"POST /v1/embed HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-%d: %s\r\n" % (i, b"v" * 60)
                                                        for i in range(64)),
    b"POST /v1/embed HTTP/1.1\r\nhost: x\r\nx-big: " + b"v" * (1 << 20),  # one huge value
], ids=["many-lines", "one-value"])
def test_an_oversized_head_gets_431(server: ServerThread, head: bytes) -> None:
    """Major 3: a request line and headers over --max-header-bytes are answered 431 and the
    connection closed, whether in many lines or one value still arriving."""
    sock = _connect(server)
    try:
        sock.sendall(head)
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed while we were still sending: the answer is in our receive buffer
    status, headers, body = _answers(sock, 1)[0]
    assert status == 431 and headers["connection"] == "close"
    assert json.loads(body) == {"detail": f"the request line and headers are over {MAX_HEADER} "
                                "bytes", "limit": "max_header_bytes", "value": MAX_HEADER}
    sock.close()
    ok = _connect(server)  # a head under the limit is served as ever
    ok.sendall(_post("/v1/embed", {"inputs": "a b"}, "x-pad: " + "v" * 1500 + "\r\n"))
    assert _answers(ok, 1)[0][0] == 200
    ok.close()


def test_when_every_connection_is_busy_a_new_one_gets_503(server: ServerThread) -> None:
    """At --max-connections with every connection in a request (headers sent, body pending),
    nothing can be closed for room: the new connection is answered 503 naming the limit."""
    busy = []
    for _ in range(MAX_CONNECTIONS):
        s = _connect(server)
        s.sendall(b"POST /v1/embed HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        busy.append(s)
    time.sleep(0.3)
    extra = _connect(server)
    status, _, body = _answers(extra, 1)[0]
    assert status == 503 and json.loads(body)["limit"] == "max_connections"
    for s in busy + [extra]:
        s.close()
    wait_for(lambda: httpx.get(server.url + "/healthz", timeout=10).status_code == 200)


def test_a_good_request_followed_by_garbage_is_answered_first(server: ServerThread) -> None:
    """RFC 9112: answers in the order asked. A valid request and bytes that are not HTTP in
    the same packet: the request's 200, then the 400, then the connection is closed."""
    sock = _connect(server)
    sock.sendall(_post("/v1/embed", {"inputs": "a b"}) + b"\x00\x01 garbage\r\n\r\n")
    (ok, _, body), (bad, headers, _) = _answers(sock, 2)
    assert ok == 200 and json.loads(body)["embeddings"]
    assert bad == 400 and headers["connection"] == "close"
    assert _closed_by_server(sock, 10)
    sock.close()


@pytest.mark.parametrize("hosts,extra,version,status", [
    ("", "", "1.1", 400),
    ("host: x\r\nhost: y\r\n", "", "1.1", 400),
    ("host: x\r\n", "transfer-encoding: identity, chunked\r\n", "1.1", 501),
    ("host: x\r\n", "connection: upgrade\r\nupgrade: websocket\r\n", "1.1", 400),
    ("", "", "1.0", 200),  # HTTP/1.0 needs no Host
], ids=["no-host", "two-hosts", "identity-chunked", "upgrade-with-body", "http10-no-host"])
def test_heads_the_rfc_refuses(server: ServerThread, hosts: str, extra: str, version: str,
                               status: int) -> None:
    """No Host or two (RFC 9112 3.2), a coding other than chunked alone (6.1), a body on a
    request asking to switch protocols: refused by name and closed, where they were served
    (or left unanswered) before."""
    data = json.dumps({"inputs": "a b"}).encode()
    length = f"content-length: {len(data)}\r\n"
    if "chunked" in extra:
        length, data = "", b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
    sock = _connect(server)
    sock.sendall(f"POST /v1/embed HTTP/{version}\r\n{hosts}{extra}{length}\r\n".encode() + data)
    got, _, body = _answers(sock, 1)[0]
    assert got == status, body
    if status != 200:
        assert json.loads(body)["detail"]
        assert _closed_by_server(sock, 10)
    sock.close()
