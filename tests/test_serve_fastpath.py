"""The serving path of issue 49: the fast path, tokenizing on the batcher's worker, token ids
as input, base64 embeddings, the stage metrics, and the replicas' memory check.

A real model and a real server on a loopback port, as in test_serve.py (which keeps checking
the promises the server made before: 413/429/504, drain, the API key, the page's metrics).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from test_serve import client, metric, run_dir, start  # noqa: F401 (fixtures: the same model and client)

from shoestring.serve.server import ServerThread


@pytest.fixture(scope="module")
def server(run_dir: Path):
    srv = start(run_dir, max_client_batch=8, max_queue=64, max_length=64, max_batch_tokens=256)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tokenizer(run_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(run_dir / "final" / "tokenizer.json"))


TEXTS = ["a list", "the function returns a value and then some more words follow it",
         "import the module [MASK] its name", "x"]


def embed(client: httpx.Client, **body: object) -> dict:
    r = client.post("/v1/embed", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_batched_answers_equal_single_ones(server: ServerThread, client: httpx.Client) -> None:
    alone = [embed(client, inputs=t)["embeddings"][0] for t in TEXTS]
    together = embed(client, inputs=TEXTS)["embeddings"]

    async def concurrent() -> list[list[float]]:  # separate requests sharing the worker's batches
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            rs = await asyncio.gather(*(c.post("/v1/embed", json={"inputs": t}) for t in TEXTS * 4))
        return [r.json()["embeddings"][0] for r in rs]

    for got in (together, (asyncio.run(concurrent()))[: len(TEXTS)]):
        np.testing.assert_allclose(np.array(got), np.array(alone), atol=1e-5)
    fill = client.post("/v1/fill-mask", json={"inputs": [TEXTS[2], "a [MASK]"], "top_k": 2})
    one = client.post("/v1/fill-mask", json={"inputs": TEXTS[2], "top_k": 2})
    assert fill.status_code == one.status_code == 200
    assert fill.json()["results"][0][0]["candidates"][0]["id"] == (
        one.json()["results"][0][0]["candidates"][0]["id"])


def test_base64_embeddings_decode_bit_exactly_to_the_json_numbers(client: httpx.Client) -> None:
    for pooling, normalize in (("mean", True), ("cls", False)):
        floats = embed(client, inputs=TEXTS, pooling=pooling, normalize=normalize)
        packed = embed(client, inputs=TEXTS, pooling=pooling, normalize=normalize,
                       encoding_format="base64")
        assert packed["dimensions"] == floats["dimensions"] == 64
        for number_list, text in zip(floats["embeddings"], packed["embeddings"]):
            raw = base64.b64decode(text)
            assert len(raw) == 4 * 64
            got = np.frombuffer(raw, dtype="<f4")
            want = np.array(number_list, dtype=np.float32)  # each number reads back exactly
            assert got.tobytes() == want.tobytes()
    bad = client.post("/v1/embed", json={"inputs": "x", "encoding_format": "binary"})
    assert bad.status_code == 422 and "encoding_format" in bad.text


def test_input_ids_answer_as_the_text_they_tokenize_from(client: httpx.Client,
                                                         tokenizer: object) -> None:
    ids = [tokenizer.encode(t).ids for t in TEXTS]
    from_text = embed(client, inputs=TEXTS, encoding_format="base64")["embeddings"]
    from_ids = embed(client, input_ids=ids, encoding_format="base64")["embeddings"]
    assert from_ids == from_text  # the same computation, bit for bit
    one = embed(client, input_ids=ids[1], encoding_format="base64")["embeddings"]
    assert one == [embed(client, inputs=TEXTS[1], encoding_format="base64")["embeddings"][0]]
    masked = client.post("/v1/fill-mask", json={"input_ids": ids[2], "top_k": 3}).json()
    assert masked == client.post("/v1/fill-mask", json={"inputs": TEXTS[2], "top_k": 3}).json()


BAD_IDS = [
    ({"input_ids": [[2, 5, 99999, 3]]}, ["body", "input_ids", 0], "token id 99999 at position 2"),
    ({"input_ids": [2, -1, 3]}, ["body", "input_ids"], "token id -1 at position 1"),
    ({"input_ids": [[2, 3], [2, 1.5]]}, ["body", "input_ids"], "input_ids[1][1] is 1.5"),
    ({"input_ids": [[2, 3], []]}, ["body", "input_ids"], "input_ids[1] is empty"),
    ({"input_ids": [2, True]}, ["body", "input_ids"], "input_ids[1] is True"),
    ({"input_ids": []}, ["body", "input_ids"], "non-empty list"),
    ({"input_ids": [[2] * 65]}, ["body", "input_ids", 0], "over this server's limit of 64"),
    ({"input_ids": [2, 3], "inputs": "x"}, ["body"], "not both"),
    ({}, ["body"], "Field required"),
]


@pytest.mark.parametrize("body,loc,message", BAD_IDS, ids=[m for _, _, m in BAD_IDS])
def test_bad_token_ids_are_a_422_naming_the_field(client: httpx.Client, body: dict, loc: list,
                                                   message: str) -> None:
    r = client.post("/v1/embed", json=body)
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == loc and message in error["msg"], error


def test_a_bad_input_fails_its_request_before_any_of_it_runs(client: httpx.Client) -> None:
    """Texts are tokenized and checked on the batcher's worker: one over the limit fails the
    request (422 naming it) and its other inputs leave the queue without being computed."""
    calls = lambda: metric(client.get("/metrics").text, "shoestring_batch_size_sum",  # noqa: E731
                           task="embed")
    before = calls()
    r = client.post("/v1/embed", json={"inputs": ["fine", "word " * 100, "also fine"]})
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "inputs", 1] and "over this server's limit" in error["msg"]
    assert calls() == before
    missing = client.post("/v1/fill-mask", json={"inputs": ["a [MASK]", "no mask here"]})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == [
        "body", "inputs", 1]


def test_stage_metrics_count_requests_and_inputs(client: httpx.Client) -> None:
    def stage(text: str, stage: str, kind: str = "count") -> float:
        name = ("shoestring_stage_cpu_seconds_total" if kind == "cpu"
                else f"shoestring_stage_seconds_{kind}")
        return metric(text, name, stage=stage, task="embed")

    embed(client, inputs=TEXTS[0])  # the loop stage starts counting at an answer
    before = client.get("/metrics").text
    for t in TEXTS:
        embed(client, inputs=t)
    embed(client, inputs=TEXTS[:2])  # one request, two inputs
    after = client.get("/metrics").text
    assert "# TYPE shoestring_stage_seconds histogram" in after
    for name, want in (("parse", 5), ("serialize", 5), ("send", 5), ("loop", 5), ("submit", 6),
                       ("tokenize", 6), ("queue", 6), ("batch", 6), ("forward", 6),
                       ("pooling", 6), ("deliver", 6)):
        assert stage(after, name) - stage(before, name) == want, name
        assert stage(after, name, "sum") > stage(before, name, "sum")
    for name in ("forward", "batch", "deliver", "submit"):
        assert stage(after, name, "cpu") > stage(before, name, "cpu"), name
    le = 'shoestring_stage_seconds_bucket{le="+Inf",stage="parse",task="embed"}'
    assert le in after  # histogram buckets, cumulative to the count


def test_fastapi_answers_what_the_fast_path_answers(server: ServerThread,
                                                    client: httpx.Client) -> None:
    """The FastAPI routes (the API description, and what the fast path hands on) run the
    same handlers: the same body gets the same answer from both."""
    inner = server.server.config.app.fastapi

    async def via_fastapi(path: str, body: dict) -> httpx.Response:
        transport = httpx.ASGITransport(app=inner)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            return await c.post(path, json=body)

    for path, body in (("/v1/embed", {"inputs": TEXTS[:2], "encoding_format": "base64"}),
                       ("/v1/fill-mask", {"inputs": TEXTS[2], "top_k": 2}),
                       ("/v1/embed", {"input_ids": [[2, 99999]]}),
                       ("/v1/generate", {"inputs": "x"})):
        slow = asyncio.run(via_fastapi(path, body))
        fast = client.post(path, json=body)
        assert (slow.status_code, slow.json()) == (fast.status_code, fast.json()), path
    spec = client.get("/openapi.json").json()
    embed_body = spec["components"]["schemas"]["EmbedRequest"]["properties"]
    assert {"inputs", "input_ids", "encoding_format"} <= set(embed_body)


def test_the_engine_measures_what_a_model_call_costs(run_dir: Path) -> None:
    from shoestring.inference.engine import load_engine

    engine = load_engine(run_dir, max_length=64)
    engine.warmup()
    assert engine.calibrate(repeats=2) == engine.call_overhead_tokens
    assert 1.0 <= engine.call_overhead_tokens <= 1e6
    assert engine.describe()["call_overhead_tokens"] == engine.call_overhead_tokens


def test_replicas_that_do_not_fit_are_refused_naming_what_fits() -> None:
    from shoestring.errors import ShoestringError
    from shoestring.serve.replicas import Footprint, check_fit

    gib = 1 << 30
    fp = Footprint("cuda:0", per_replica=10 * gib, available=35 * gib)
    check_fit(1, fp)
    check_fit(4, fp)  # three more need 30 GiB of the 31.5 GiB usable
    with pytest.raises(ShoestringError) as e:
        check_fit(5, fp)
    assert e.value.where == "--workers" and "use --workers 4 or fewer" in str(e.value.fix)
    assert "10.00 GiB of cuda:0 memory" in e.value.message
    check_fit(64, Footprint("cpu", 1, 0))  # the OS said nothing: nothing to check


def test_replica_footprint_is_measured_at_the_largest_batch(run_dir: Path) -> None:
    from shoestring.inference.engine import load_engine
    from shoestring.serve.replicas import measure

    engine = load_engine(run_dir, max_length=64)
    fp = measure([engine], max_batch_tokens=256, max_length=64)
    assert fp.device == "cpu" and fp.per_replica > 0 and fp.available > 0


def test_json_answers_are_compact_and_standard(client: httpx.Client) -> None:
    r = client.post("/v1/embed", json={"inputs": "x"})
    assert r.headers["content-type"] == "application/json"
    assert int(r.headers["content-length"]) == len(r.content)
    json.loads(r.content)  # standard JSON (no NaN), parsed by the standard library
    assert b" " not in r.content


def test_raw_keep_alive_answers_and_a_head_request(server: ServerThread) -> None:
    """The server sends a response's head and body in one write (server._OneWrite): on one
    keep-alive connection every answer arrives whole, in order, and a HEAD request (a head
    with no body after it) is still answered."""
    import socket

    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        reader = sock.makefile("rb")

        def answer() -> tuple[int, dict[str, str]]:
            return _head(reader)

        for text in TEXTS:
            body = json.dumps({"inputs": text}).encode()
            sock.sendall(b"POST /v1/embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                         b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            status, headers = answer()
            data = reader.read(int(headers["content-length"]))
            assert status == 200 and len(json.loads(data)["embeddings"][0]) > 0
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers = answer()
        assert status in (200, 405) and "content-length" in headers
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")  # the connection still works
        status, headers = answer()
        assert status == 200 and reader.read(int(headers["content-length"]))


def test_the_cli_server_tunes_the_garbage_collector_once_loaded(server: ServerThread,
                                                                 monkeypatch) -> None:
    """`serve` freezes what it loaded and raises the collector's first threshold before it
    starts answering; `ServerThread` leaves its host process's collector alone."""
    import gc
    import socket

    from shoestring.serve import server as srv
    from shoestring.serve.settings import ServeSettings

    seen: dict[str, object] = {}

    class Fake:
        def run(self, sockets: list) -> None:
            seen["threshold"], seen["frozen"] = gc.get_threshold(), gc.get_freeze_count()

    monkeypatch.setattr(srv, "load_router", lambda models, settings: object())
    monkeypatch.setattr(srv, "_describe", lambda router: "a model")
    monkeypatch.setattr(srv, "bind", lambda host, port: socket.socket())
    monkeypatch.setattr(srv, "build_server", lambda router, settings, announce: Fake())
    before = gc.get_threshold()
    assert before != srv.GC_THRESHOLDS  # this module's ServerThread left it as it was
    try:
        srv.serve("unused", ServeSettings(), announce=lambda line: None)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert seen["threshold"] == srv.GC_THRESHOLDS != before
    assert seen["frozen"] > 0


def _raw(server: ServerThread, payload: bytes, answers: int,
         rest: bytes = b"") -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``payload`` (then, after a pause, ``rest``) on one connection; read ``answers``."""
    import socket
    import time

    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    out = []
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(payload)
        if rest:
            time.sleep(0.3)
            sock.sendall(rest)
        reader = sock.makefile("rb")
        for _ in range(answers):
            status, headers = _head(reader)
            out.append((status, headers, reader.read(int(headers.get("content-length", 0)))))
    return out


def _head(reader) -> tuple[int, dict[str, str]]:
    """The status and headers of the next answer on a connection's reader."""
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def _post(path: str, body: dict, extra: str = "", version: str = "1.1") -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/{version}\r\nhost: x\r\n{extra}content-length: {len(data)}\r\n\r\n"
            .encode() + data)


def test_pipelined_requests_are_answered_in_order(server: ServerThread,
                                                  client: httpx.Client) -> None:
    """Requests sent back to back on one connection, before any answer: the fast path's,
    FastAPI's and a refusal each answered in the order asked."""
    alone = [embed(client, inputs=t)["embeddings"][0] for t in TEXTS[:2]]
    payload = (_post("/v1/embed", {"inputs": TEXTS[0]}) + b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
               + _post("/v1/embed", {"inputs": TEXTS[1]}) + _post("/v1/embed", {"inputs": 3})
               + _post("/v1/embed", {"inputs": TEXTS[0]}))
    got = _raw(server, payload, 5)
    assert [g[0] for g in got] == [200, 200, 200, 422, 200]
    assert json.loads(got[1][2])["status"] == "ok"
    for (_, _, data), want in zip((got[0], got[2]), alone):
        np.testing.assert_allclose(json.loads(data)["embeddings"][0], want, atol=1e-5)
    assert json.loads(got[3][2])["detail"][0]["loc"] == ["body", "inputs", "str"]


def test_requests_the_fast_path_leaves_to_fastapi_get_the_same_answers(
        server: ServerThread, client: httpx.Client) -> None:
    """A chunked body, ``Expect: 100-continue``, HTTP/1.0, a query string, a body sent in two
    pieces: the same vectors, whichever way each went; only the plain ones are the fast
    path's (its parse stage counts them)."""
    want = embed(client, inputs=TEXTS[1])["embeddings"][0]
    data = json.dumps({"inputs": TEXTS[1]}).encode()
    chunked = (b"POST /v1/embed HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
    parsed = lambda: metric(client.get("/metrics").text, "shoestring_stage_seconds_count",
                            stage="parse", task="embed")
    before = parsed()
    answers = [_raw(server, chunked, 1)[0],
               _raw(server, _post("/v1/embed", {"inputs": TEXTS[1]}, "expect: 100-continue\r\n"),
                    2)[1],
               _raw(server, _post("/v1/embed", {"inputs": TEXTS[1]}, version="1.0"), 1)[0],
               _raw(server, _post("/v1/embed?x=1", {"inputs": TEXTS[1]}), 1)[0]]
    assert parsed() == before  # none of these took the fast path
    whole = _post("/v1/embed", {"inputs": TEXTS[1]})
    answers.append(_raw(server, whole[:-7], 1, rest=whole[-7:])[0])  # the body in two pieces
    assert parsed() == before + 1
    for status, headers, body in answers:
        assert status == 200, body
        np.testing.assert_allclose(json.loads(body)["embeddings"][0], want, atol=1e-5)
    assert answers[2][1].get("connection") == "close"  # HTTP/1.0: no keep-alive


def test_a_request_leaves_no_reference_cycle(server: ServerThread) -> None:
    """What a request allocates is freed by reference counting when it is answered: no
    cycle is left for the garbage collector to find (with a cycle per request, the
    collector's passes were a measurable share of the event loop's CPU)."""
    import gc

    from shoestring.serve.batcher import Job, JobGroup
    from shoestring.serve.fastpath import _Direct

    payload = b"".join(_post("/v1/embed", {"inputs": t}) for t in TEXTS * 5)
    gc.collect()
    gc.disable()
    try:
        got = _raw(server, payload, len(TEXTS) * 5)  # one keep-alive connection, pipelined
        assert all(status == 200 for status, _, _ in got)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, (Job, JobGroup, _Direct))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []
