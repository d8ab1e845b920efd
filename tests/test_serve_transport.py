"""The fast path's adapter (serve/fastpath.py): used only inside the uvicorn releases CI tests
and where every name it reads exists; elsewhere the server answers the same bytes through
plain ASGI and says why once at start. Real servers on loopback ports (in-process and the CLI).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_serve import announced, run_dir, start  # noqa: F401 (fixtures: the same model)

from shoestring.serve import fastpath
from shoestring.serve.fastpath import FAST_PATH_UVICORN, in_range, missing_names, refusal

# Bodies whose answers are compared byte for byte: both fast-path kinds, a base64 answer, a
# fill-mask, and refusals the ASGI layers and FastAPI write (422 from each way in, a 404).
REQUESTS = [
    ("/v1/embed", b'{"inputs": "the function returns a value"}'),
    ("/v1/embed", b'{"inputs": ["a list", "x"], "encoding_format": "base64"}'),
    ("/v1/embed", b'{"input_ids": [[2, 40, 41, 3]]}'),
    ("/v1/fill-mask", b'{"inputs": "import the [MASK] by its name", "top_k": 2}'),
    ("/v1/embed", b'{"inputs": 3}'),
    ("/v1/embed", b'{"inputs": "a", "unknown": 1}'),
    ("/v1/generate", b'{"inputs": "x"}'),
]


def answers(url: str) -> list[tuple[int, str, bytes]]:
    with httpx.Client(base_url=url, timeout=60) as c:
        out = []
        for path, body in REQUESTS:
            r = c.post(path, content=body)
            out.append((r.status_code, r.headers["content-type"], r.content))
        return out


@pytest.fixture(scope="module")
def fast_answers(run_dir: Path) -> list[tuple[int, str, bytes]]:  # noqa: F811
    with start(run_dir, max_length=64) as srv:
        assert not isinstance(srv.server.config.http, str)  # the fast path's class
        return answers(srv.url)


def test_the_version_range_check() -> None:
    assert in_range("0.53.0") and in_range("0.54.0") and in_range("0.53.1.post1")
    assert in_range("0.55.0") is False and in_range("0.52.4") is False
    assert in_range("1.0.0") is False and in_range("0.60.0rc1") is False
    assert in_range("not a version") is None and in_range("") is None
    assert in_range("0.9", ">=0.8,<1") is True  # any range, one parser (packaging's)


def test_the_installed_uvicorn_is_inside_the_range_and_has_every_name() -> None:
    """What CI installs (constraints.txt) is what the range covers: the fast path is on."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert in_range(fastpath.installed_uvicorn()), (fastpath.installed_uvicorn(), FAST_PATH_UVICORN)
    assert missing_names(HttpToolsProtocol) == []
    assert refusal() is None


def test_a_release_that_renames_what_the_fast_path_reads_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Renamed(HttpToolsProtocol):  # a release that reads a new field of its cycle
        def on_message_complete(self) -> None:
            self.cycle.trailers_done = True

    assert missing_names(Renamed) == ["cycle.trailers_done"]
    bare = missing_names(type("Bare", (), {"loop": None}))
    assert "parser" in bare and "on_headers_complete" in bare and "loop" not in bare
    monkeypatch.setattr(fastpath, "missing_names", lambda protocol: ["parser"])
    assert refusal() == ("uvicorn " + fastpath.installed_uvicorn() + "'s HttpToolsProtocol "
                         "lacks parser, which the fast path reads: serving through plain "
                         "ASGI (same answers, more CPU per request)")


def test_refusals_name_the_version_and_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    assert refusal("0.60.0") == (
        f"uvicorn 0.60.0 is outside the fast path's tested range {FAST_PATH_UVICORN}: serving "
        "through plain ASGI (same answers, more CPU per request)")
    assert "cannot read uvicorn's version 'x.y'" in refusal("x.y")
    monkeypatch.setenv("SHOESTRING_FAST_PATH", "0")
    assert refusal("0.54.0") == ("SHOESTRING_FAST_PATH=0: serving through plain ASGI (same "
                                 "answers, more CPU per request)")
    monkeypatch.setenv("SHOESTRING_FAST_PATH", "1")
    assert refusal("0.54.0") is None


def test_outside_the_range_the_server_answers_the_same_bytes_through_asgi(
        run_dir: Path, fast_answers: list, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(fastpath, "installed_uvicorn", lambda: "0.60.0")
    with caplog.at_level(logging.WARNING, logger="uvicorn.error"):
        srv = start(run_dir, max_length=64)
    try:
        assert srv.server.config.http == "auto"  # uvicorn's own protocol
        lines = [r.getMessage() for r in caplog.records if "fast path" in r.getMessage()]
        assert lines == [f"shoestring serve: uvicorn 0.60.0 is outside the fast path's tested "
                         f"range {FAST_PATH_UVICORN}: serving through plain ASGI (same answers, "
                         "more CPU per request)"]
        assert answers(srv.url) == fast_answers
    finally:
        srv.stop()


@pytest.mark.slow
def test_the_cli_with_the_fast_path_off_says_so_and_answers_the_same_bytes(
        run_dir: Path, fast_answers: list) -> None:  # noqa: F811
    env = {**os.environ, "COLUMNS": "200", "SHOESTRING_FAST_PATH": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "shoestring", "serve", str(run_dir), "--port",
                             "0", "--max-length", "64", "--backend", "torch"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        said = announced(proc, r"shoestring serve: (SHOESTRING_FAST_PATH=0: .*)$")
        assert said and said.group(1) == ("SHOESTRING_FAST_PATH=0: serving through plain ASGI "
                                          "(same answers, more CPU per request)")
        m = announced(proc, r"on (http://127\.0\.0\.1:\d+)")
        assert m, "the server did not announce its address"
        assert answers(m.group(1)) == fast_answers
    finally:
        proc.terminate()
        proc.wait(60)
