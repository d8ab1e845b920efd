"""`shoestring serve --workers 2` while its replicas load (issue 62, major 7): `/readyz` is 503
on a serving replica until every replica has loaded, a SIGTERM then is a stop (the stop line,
the signal's exit status, no traceback), and a replica that really dies while loading is an
error that names how it ended. Real processes, real sockets; the ordering observed is the
real one: the first replica serves before the second starts loading."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_serve import announced, run_dir, wait_for  # noqa: F401

pytestmark = pytest.mark.slow  # two engine processes start, ~10-20 s each


class Workers:
    """`shoestring serve RUN --workers 2` on a free port, seen from its first line."""

    def __init__(self, run: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoestring", "serve", str(run), "--workers", "2", "--port",
             "0", "--max-length", "64", "--backend", "torch"],
            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
        m = announced(self.proc, r"^starting 2 workers for .* on (http://127\.0\.0\.1:\d+) ")
        assert m, "the server did not say where it will listen"
        self.url = m.group(1)

    def first_readyz(self) -> httpx.Response:
        """The first answer to /readyz: the first replica's, as soon as it serves."""
        answers: list[httpx.Response] = []

        def answered() -> bool:
            try:
                answers.append(httpx.get(self.url + "/readyz", timeout=30))
            except httpx.TransportError:  # nobody accepts yet (the socket is bound: queued)
                return False
            return True

        wait_for(answered, timeout=180)
        return answers[0]

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Send ``sig``; the rest of stderr once the parent has ended."""
        self.proc.send_signal(sig)
        return self.proc.communicate(timeout=120)[1]

    def children(self) -> list[int]:
        """The parent's spawned replicas (not multiprocessing's resource tracker)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        pids = [int(p) for p in path.read_text().split()]
        return [p for p in pids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


@pytest.fixture()
def workers(run_dir: Path) -> Iterator[Workers]:
    w = Workers(run_dir)
    yield w
    if w.proc.poll() is None:
        w.proc.kill()
        w.proc.wait()


def test_readyz_is_503_until_every_worker_has_loaded_then_200(workers: Workers) -> None:
    first = workers.first_readyz()
    assert first.status_code == 503, first.text
    assert first.json()["status"] == "loading"
    assert first.json()["workers"] == "1 of 2 workers loaded"
    assert announced(workers.proc, r"^serving .* with 2 workers"), "the second did not load"
    for _ in range(6):  # new connections: the kernel hands them to either replica
        r = httpx.get(workers.url + "/readyz", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "ready", r.text
    log = workers.stop()
    assert workers.proc.returncode == -signal.SIGTERM, log
    assert log.count("shoestring serve: stopped (SIGTERM): drained 0 in-flight requests") == 2
    assert "Traceback" not in log, log


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_workers_load_is_a_stop_not_a_failure(workers: Workers, sig: int) -> None:
    assert workers.first_readyz().status_code == 503  # the second is loading now
    log = workers.stop(sig)
    name = signal.Signals(sig).name
    # SIGTERM ends the parent as SIGTERM does; SIGINT as Ctrl-C does in the CLI (130).
    assert workers.proc.returncode == (-sig if sig == signal.SIGTERM else 130), log
    assert (f"shoestring serve: stopped ({name}) while the workers loaded (1 of 2 workers "
            "loaded)") in log, log
    # the first replica, serving, drained; the second just ended
    assert "shoestring serve: stopped (SIGTERM): drained 0 in-flight requests" in log, log
    assert "Traceback" not in log and "RuntimeError" not in log and "error" not in log, log


def test_a_worker_killed_while_loading_is_an_error_naming_the_signal(workers: Workers) -> None:
    assert workers.first_readyz().status_code == 503
    first = httpx.get(workers.url + "/v1/model", timeout=30).json()["worker"]
    wait_for(lambda: len(workers.children()) == 2)  # the second has been spawned
    [second] = [p for p in workers.children() if p != first]
    os.kill(second, signal.SIGKILL)
    log = workers.proc.communicate(timeout=120)[1]
    assert workers.proc.returncode == 2, log
    assert (f"error: --workers: worker shoestring-worker-1 (pid {second}) was killed by SIGKILL "
            "while loading its models") in log, log
    assert "out-of-memory" in log and "Traceback" not in log and "traceback" not in log, log
