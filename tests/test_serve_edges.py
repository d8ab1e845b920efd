"""`shoestring serve` at its edges (issue 52): clients that send headers and a body late or
never, clients without the key, bodies that are not JSON, the default and limit of
--max-length, the ready line of several models, and the shutdown line. Every test talks to a
real `shoestring serve` process over real sockets."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import fails_cleanly, run_cli
from test_serve import KEY, announced, metric, run_dir, save_tiny_decoder, wait_for  # noqa: F401

AUTH = {"X-API-Key": KEY}
BODY_TIMEOUT = 1.5


class Served:
    """A `shoestring serve` process: its URL, port and the stderr lines read so far."""

    def __init__(self, args: list[str], key: bool = True) -> None:
        env = {**os.environ, "COLUMNS": "200"}
        if key:
            env["SHOESTRING_API_KEY"] = KEY
        self.proc = subprocess.Popen([sys.executable, "-m", "shoestring", "serve", "--port", "0",
                                      *args], stderr=subprocess.PIPE, text=True, env=env)
        m = announced(self.proc, r"^serving (.*) on (http://127\.0\.0\.1:(\d+))")
        assert m, "the server did not announce its address"
        self.ready_line, self.url, self.port = m.group(1), m.group(2), int(m.group(3))
        self.log: str | None = None

    def in_flight(self) -> float:
        text = httpx.get(self.url + "/metrics", headers=AUTH, timeout=30).text
        return metric(text, "shoestring_requests_in_flight")

    def stop(self) -> str:
        """SIGTERM, then the rest of its stderr (once; later calls return the same)."""
        if self.log is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.log = self.proc.communicate(timeout=60)[1]
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait()
        return self.log


@pytest.fixture(scope="module")
def server(run_dir: Path) -> Iterator[Served]:
    srv = Served([str(run_dir), "--max-concurrent-requests", "2",
                  "--body-timeout", str(BODY_TIMEOUT)])
    yield srv
    srv.stop()


def headers_only(port: int, path: str, length: int, key: bool = True) -> socket.socket:
    """A connection that sent a POST's headers, declaring ``length`` body bytes, and no body."""
    sock = socket.create_connection(("127.0.0.1", port))
    auth = f"X-API-Key: {KEY}\r\n" if key else ""
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode())
    return sock


def answer(sock: socket.socket, wait: float) -> tuple[int, bytes]:
    """The status and whole answer on ``sock`` once the server closes it (within ``wait``)."""
    sock.settimeout(wait)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    finally:
        sock.close()
    return int(data.split(b" ", 2)[1]), data


def test_a_declared_body_over_the_limit_is_413_at_once_unread(server: Served) -> None:
    sock = headers_only(server.port, "/v1/fill-mask", 2_000_000)  # over the 1 MiB default
    start = time.monotonic()
    status, data = answer(sock, wait=BODY_TIMEOUT / 2)  # not after the body timeout: at once
    assert status == 413 and b"max_body_bytes" in data and b"connection: close" in data
    assert time.monotonic() - start < BODY_TIMEOUT / 2
    assert server.in_flight() == 0


@pytest.mark.parametrize("path", ["/v1/fill-mask", "/v1/search"], ids=["fast", "fastapi"])
def test_a_body_that_never_arrives_is_408_and_gives_back_its_slot(
    server: Served, path: str
) -> None:
    # --max-concurrent-requests 2: two stalled clients hold both slots, for the body timeout.
    stalled = [headers_only(server.port, path, 200) for _ in range(2)]
    wait_for(lambda: server.in_flight() == 2)
    busy = httpx.post(server.url + "/v1/embed", json={"inputs": "x"}, headers=AUTH, timeout=30)
    assert busy.status_code == 429
    for sock in stalled:
        status, data = answer(sock, wait=BODY_TIMEOUT + 10)
        assert status == 408 and b"body_timeout" in data and b"connection: close" in data
    assert server.in_flight() == 0
    ok = httpx.post(server.url + "/v1/embed", json={"inputs": "x"}, headers=AUTH, timeout=30)
    assert ok.status_code == 200, ok.text


def test_a_client_that_leaves_mid_body_gives_back_its_slot(server: Served) -> None:
    sock = headers_only(server.port, "/v1/embed", 200)
    sock.sendall(b'{"inputs": ')
    wait_for(lambda: server.in_flight() == 1)
    sock.close()
    wait_for(lambda: server.in_flight() == 0)


def test_without_the_key_no_slot_is_taken_and_no_body_is_awaited(server: Served) -> None:
    # More unauthenticated stalled clients than there are slots: each is refused at once.
    for _ in range(4):
        sock = headers_only(server.port, "/v1/fill-mask", 200, key=False)
        status, data = answer(sock, wait=BODY_TIMEOUT / 2)
        assert status == 401 and b"www-authenticate: Bearer" in data
    assert server.in_flight() == 0
    ok = httpx.post(server.url + "/v1/embed", json={"inputs": "x"}, headers=AUTH, timeout=30)
    assert ok.status_code == 200, ok.text


def test_idle_keep_alive_connections_hold_no_slot(server: Served) -> None:
    clients = [httpx.Client(base_url=server.url, headers=AUTH, timeout=30) for _ in range(3)]
    try:
        for c in clients:  # three kept-alive connections, more than the two slots, now idle
            assert c.post("/v1/embed", json={"inputs": "x"}).status_code == 200
        assert server.in_flight() == 0
        ok = httpx.post(server.url + "/v1/embed", json={"inputs": "y"}, headers=AUTH, timeout=30)
        assert ok.status_code == 200
    finally:
        for c in clients:
            c.close()


NOT_JSON = {
    "not JSON": b"hello",
    "not UTF-8": b'{"inputs": "\xff"}',
    "nested 50,000 deep": b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "a bare array nested 50,000 deep": b"[" * 50_000 + b"]" * 50_000,
}


@pytest.mark.parametrize("body", NOT_JSON.values(), ids=NOT_JSON.keys())
@pytest.mark.parametrize("path", ["/v1/fill-mask", "/v1/embed"])
def test_a_body_that_is_not_json_is_a_422(server: Served, path: str, body: bytes) -> None:
    r = httpx.post(server.url + path, content=body, headers=AUTH, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["type"] == "json_invalid"


def test_max_length_defaults_to_the_trained_context_and_cannot_pass_it(
    server: Served, run_dir: Path
) -> None:
    info = httpx.get(server.url + "/v1/model", headers=AUTH, timeout=30).json()
    assert info["max_length"] == 64  # the tests' runs train on 64-token sequences
    fails_cleanly(run_cli("serve", str(run_dir), "--port", "0", "--max-length", "512"),
                  "--max-length", "512", "64")
    # The default is checked against the batch limit as a given value is.
    fails_cleanly(run_cli("serve", str(run_dir), "--port", "0", "--max-batch-tokens", "32"),
                  "--max-batch-tokens", "32", "64")


def test_the_server_log_has_no_traceback(server: Served) -> None:
    # Last in the module's use of the server: what every request above left in its log.
    log = server.stop()
    assert "Traceback" not in log and "RecursionError" not in log, log
    assert "stopped (SIGTERM): drained 0 in-flight requests" in log


def test_ready_line_lists_every_model_and_sigterm_drains_with_one_line(
    run_dir: Path, tmp_path: Path
) -> None:
    decoder = save_tiny_decoder(run_dir, tmp_path / "clm")
    srv = Served([str(run_dir), str(decoder), "--max-wait-ms", "1500"], key=False)
    try:
        # each model with its tasks and its backend (tests/test_serve_backends.py: the figures)
        assert re.fullmatch(rf"encoder {re.escape(str(run_dir))} \(embed, fill-mask\) "
                            r"\[backend [^\]]+\], "
                            rf"decoder {re.escape(str(decoder))} \(generate\) "
                            r"\[backend torch: decoders run on PyTorch\]", srv.ready_line)
        answers: list[int] = []

        def one(i: int) -> None:
            r = httpx.post(srv.url + "/v1/embed", json={"inputs": f"in flight {i}"}, timeout=60)
            answers.append(r.status_code)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        wait_for(lambda: srv.in_flight() == 3)
    finally:
        log = srv.stop()
    for t in threads:
        t.join(60)
    assert answers == [200] * 3
    assert "shoestring serve: stopped (SIGTERM): drained 3 in-flight requests" in log, log
    assert "never retrieved" not in log and "Traceback" not in log and "ERROR" not in log, log
