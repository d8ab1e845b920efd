"""Streaming generation (server-sent events) and overload answers, on a real server.

A small untrained decoder saved as a run dir is enough: the server's job is the same."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from conftest import tiny_config
from test_serve import metric, save_tiny_decoder, start, wait_for


@pytest.fixture(scope="module")
def decoder_run(pydocs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shoestring.train.loop import train

    # The tokenizer of a (tiny) trained encoder run, and a decoder over its vocabulary.
    base_run = tmp_path_factory.mktemp("stream") / "base"
    train(tiny_config(steps=2), pydocs_dir, base_run)
    return save_tiny_decoder(base_run, base_run.parent / "clm")


def sse_events(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_a_stream_sends_each_token_then_the_same_result_as_without(decoder_run: Path) -> None:
    body = {"inputs": "the list", "max_new_tokens": 12, "temperature": 0}
    with start(decoder_run) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        plain = c.post("/v1/generate", json=body).json()["results"][0]
        with c.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.iter_lines())
        two = c.post("/v1/generate", json={**body, "inputs": ["a", "b"], "stream": True})
    tokens, final, done = events[:-2], events[-2], events[-1]
    assert done == "[DONE]" and final["done"] is True
    assert {k: final[k] for k in ("text", "tokens", "finish_reason")} == plain
    assert len(tokens) == plain["tokens"] and all("token" in t for t in tokens)
    assert "".join(t["text"] for t in tokens) == plain["text"]
    assert two.status_code == 422 and "one prompt" in two.text


def test_a_client_that_disconnects_stops_its_generation(decoder_run: Path) -> None:
    n = 1000
    body = {"inputs": "the list", "max_new_tokens": n, "temperature": 0}
    with (
        start(decoder_run, max_new_tokens=n) as srv,
        httpx.Client(base_url=srv.url, timeout=120) as c,
    ):
        # Greedy decoding of this prompt runs the full length when nobody stops it ...
        full = c.post("/v1/generate", json=body).json()["results"][0]
        assert full["finish_reason"] == "length" and full["tokens"] == n
        # ... and stops soon after a streaming client goes away after its first token.
        with c.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
        count = lambda reason: metric(
            c.get("/metrics").text, "shoestring_streams_total", finish_reason=reason
        )
        wait_for(lambda: count("cancelled") == 1)
        streamed = metric(c.get("/metrics").text, "shoestring_streamed_tokens_total")
        assert count("length") == 0
    assert 1 <= streamed < n


def test_over_the_concurrent_request_limit_is_a_429_naming_it(decoder_run: Path) -> None:
    # One request at a time: a long generation holds the only place.
    n = 2000
    with start(decoder_run, max_concurrent_requests=1, max_new_tokens=n) as srv:
        c = httpx.Client(base_url=srv.url, timeout=120)
        held: list[int] = []
        t = threading.Thread(
            target=lambda: held.append(
                c.post(
                    "/v1/generate", json={"inputs": "the", "max_new_tokens": n, "temperature": 0}
                ).status_code
            )
        )
        t.start()
        inflight = lambda: metric(c.get("/metrics").text, "shoestring_requests_in_flight")
        wait_for(lambda: inflight() == 1)
        r = httpx.post(srv.url + "/v1/generate", json={"inputs": "x"}, timeout=60)
        t.join(120)
        text = c.get("/metrics").text
        c.close()
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["limit"] == "max_concurrent_requests" and r.json()["value"] == 1
    assert held == [200]
    assert metric(text, "shoestring_refused_requests_total", limit="max_concurrent_requests") == 1


# --- bad numbers -------------------------------------------------------------------------------

BAD_NUMBERS = [  # (endpoint, raw JSON body, the field the answer must name)
    ("/v1/generate", '{"inputs": "a", "temperature": NaN}', "temperature"),
    ("/v1/generate", '{"inputs": "a", "temperature": Infinity}', "temperature"),
    ("/v1/generate", '{"inputs": "a", "temperature": 1e-300}', "temperature"),
    ("/v1/generate", '{"inputs": "a", "temperature": -Infinity}', "temperature"),
    ("/v1/generate", '{"inputs": "a", "top_p": NaN}', "top_p"),
    ("/v1/generate", '{"inputs": "a", "top_p": 1e-300}', "top_p"),
    ("/v1/generate", '{"inputs": "a", "top_k": 1e400}', "top_k"),
    ("/v1/generate", '{"inputs": "a", "seed": NaN}', "seed"),
    ("/v1/generate", '{"inputs": "a", "max_new_tokens": Infinity}', "max_new_tokens"),
    ("/v1/generate", '{"inputs": "a", "retrieve": {"k": NaN}}', "k"),
    ("/v1/fill-mask", '{"inputs": "a [MASK]", "top_k": NaN}', "top_k"),
    ("/v1/search", '{"query": "a", "k": -Infinity}', "k"),
]


def test_non_finite_and_out_of_range_numbers_are_a_422_on_a_connection_that_stays_open(
    decoder_run: Path,
) -> None:
    """JSON NaN/Infinity (which Python's parser accepts) and numbers that would overflow the
    sampler: 422 naming the field, and the same keep-alive connection answers the next,
    valid request (one socket, checked by its identity)."""
    import http.client

    good = json.dumps({"inputs": "the", "max_new_tokens": 2, "temperature": 0.5, "top_p": 0.9})
    with start(decoder_run) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("POST", "/v1/generate", good)
            assert conn.getresponse().read() and conn.sock is not None
            sock = conn.sock
            for endpoint, body, field in BAD_NUMBERS:
                conn.request("POST", endpoint, body)
                r = conn.getresponse()
                answer = json.loads(r.read())
                assert r.status == 422, (body, answer)
                assert r.getheader("connection") != "close"
                assert field in [str(x) for x in answer["detail"][0]["loc"]], (body, answer)
                conn.request("POST", "/v1/generate", good)
                ok = conn.getresponse()
                assert ok.status == 200, ok.read()
                assert json.loads(ok.read())["results"][0]["tokens"] >= 1
                assert conn.sock is sock, f"the connection was closed after {body}"
        finally:
            conn.close()
