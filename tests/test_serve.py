"""`shoestring serve` end to end: a real model, a real uvicorn server on a loopback port, a
real HTTP client. One tiny model is trained once for the module; each test group starts the
server settings it needs (in a thread; the shutdown test runs the CLI as a subprocess)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from conftest import tiny_config

from shoestring.serve.server import ServerThread, load
from shoestring.serve.settings import make_settings

KEY = "test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def run_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shoestring.train.loop import train

    pydocs_dir = request.getfixturevalue("pydocs_dir")
    out = tmp_path_factory.mktemp("serve") / "run"
    train(tiny_config(steps=8), pydocs_dir, out)
    return out


def start(path: Path, **settings: object) -> ServerThread:
    """A server on a free port. PyTorch unless ``backend`` is given: ``auto`` times the
    backends at load, and a test comparing answers must not be left to pick one by timing
    (tests/test_serve_backends.py covers auto and the ONNX backends)."""
    s = make_settings(port=0, **{"backend": "torch", **settings})
    return ServerThread(load(path, s), s).start()


@pytest.fixture(scope="module")
def server(run_dir: Path):
    srv = start(run_dir, max_wait_ms=50, max_client_batch=8, max_queue=64, max_length=64,
                max_batch_tokens=64)
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ServerThread):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" (\S+)$"
    for line in text.splitlines():
        m = re.match(pattern, line)
        if m:
            return float(m.group(1))
    return 0.0


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


# --- endpoints ---------------------------------------------------------------------------------


def test_fill_mask_matches_the_model_run_directly(client: httpx.Client, run_dir: Path) -> None:
    from tokenizers import Tokenizer

    from shoestring.rundir import RunDir

    texts = ["the [MASK] of a list", "a function returns a [MASK] value and [MASK] more words"]
    r = client.post("/v1/fill-mask", json={"inputs": texts, "top_k": 3})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [len(masks) for masks in results] == [1, 2]

    model, _ = RunDir(run_dir).load_final()
    tok = Tokenizer.from_file(str(run_dir / "final" / "tokenizer.json"))
    for text, masks in zip(texts, results):
        ids = tok.encode(text).ids
        with torch.no_grad():
            probs = model(torch.tensor([ids])).softmax(-1)[0]  # unpadded, alone
        for m in masks:
            assert ids[m["position"]] == 4  # [MASK]
            cands = m["candidates"]
            assert len(cands) == 3
            assert [c["score"] for c in cands] == sorted((c["score"] for c in cands), reverse=True)
            best = int(probs[m["position"]].argmax())
            assert cands[0]["id"] == best and cands[0]["token"] == tok.id_to_token(best)
            assert math.isclose(cands[0]["score"], float(probs[m["position"], best]), rel_tol=1e-4)


def test_embed_is_pooled_normalized_and_padding_invariant(client: httpx.Client) -> None:
    short, long = "a list", "a function returns a value and then some more words follow it"
    alone = client.post("/v1/embed", json={"inputs": short}).json()
    batched = client.post("/v1/embed", json={"inputs": [long, short]}).json()
    assert alone["dimensions"] == 64 == len(alone["embeddings"][0])
    # The short text padded beside a long one gives the same vector as alone.
    assert torch.allclose(
        torch.tensor(batched["embeddings"][1]), torch.tensor(alone["embeddings"][0]), atol=1e-5
    )
    assert math.isclose(float(torch.tensor(alone["embeddings"][0]).norm()), 1.0, rel_tol=1e-5)
    raw = client.post(
        "/v1/embed", json={"inputs": short, "normalize": False, "pooling": "cls"}
    ).json()
    assert not math.isclose(float(torch.tensor(raw["embeddings"][0]).norm()), 1.0, rel_tol=1e-3)


def test_health_readiness_and_model_info(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    info = client.get("/v1/model").json()
    assert info["kind"] == "encoder" and info["tasks"] == ["embed", "fill-mask"]


def test_endpoints_the_model_cannot_serve_say_so(client: httpx.Client) -> None:
    for path in ("/v1/generate", "/v1/classify"):
        r = client.post(path, json={"inputs": "hello"})
        assert r.status_code == 404
        assert "encoder" in r.json()["detail"] and "/v1/fill-mask" in r.json()["detail"]


BAD_INPUTS = [
    ({"inputs": ""}, "empty"),
    ({"inputs": ["a [MASK]", "   "]}, "inputs[1] is empty"),
    ({"inputs": []}, "empty list"),
    ({"inputs": 5}, "valid string"),
    ({"inputs": ["a [MASK]", 7]}, "valid string"),
    ({"inputs": "a [MASK]", "top_k": "3"}, "valid integer"),
    ({"inputs": "a [MASK]", "top_k": 0}, "greater than or equal to 1"),
    ({"inputs": "a [MASK]", "topk": 3}, "Extra inputs"),
    ({}, "Field required"),
    ({"inputs": "there is no mask here"}, "no [MASK] token"),
    ({"inputs": "a [mask] in lower case"}, "no [MASK] token"),
    ({"inputs": "[MASK] " + "word " * 100}, "over this server's limit of 64"),
]


@pytest.mark.parametrize("body,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_a_422_that_says_what(client: httpx.Client, body: dict, message: str) -> None:
    r = client.post("/v1/fill-mask", json=body)
    assert r.status_code == 422, r.text
    assert message in json.dumps(r.json())


def test_text_the_tokenizer_empties_is_the_empty_text(client: httpx.Client) -> None:
    """Characters a tokenizer's normaliser drops (NUL, a zero-width space, U+FFFD) make a
    text of special tokens only: 422 naming the input, as an empty text is, not an answer
    for the empty text."""
    for text in ("\u0000", "\u200b", "\ufffd", "\u200b\u0000\ufffd"):
        r = client.post("/v1/embed", json={"inputs": ["a b", text]})
        assert r.status_code == 422, (text, r.text)
        assert r.json()["detail"][0]["loc"] == ["body", "inputs", 1]
        assert "empty once this model's tokenizer" in r.json()["detail"][0]["msg"]
    assert client.post("/v1/embed", json={"inputs": "a\u200bb"}).status_code == 200


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_a_body_not_in_utf8_is_a_422_both_ways_in(client: httpx.Client, encoding: str) -> None:
    """JSON is UTF-8 (RFC 8259): a UTF-16 or -32 body, which Python's json.loads would have
    decoded by guessing, is refused on the fast path and through FastAPI (chunked) alike."""
    body = json.dumps({"inputs": "a b"}).encode(encoding)
    for headers in ({}, {"transfer-encoding": "chunked"}):
        content = body if not headers else iter([body])
        r = client.post("/v1/embed", content=content, headers=headers)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["type"] == "json_invalid"


def test_malformed_json_and_oversized_body(client: httpx.Client) -> None:
    r = client.post("/v1/embed", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = client.post(
        "/v1/embed", content=b"x" * ((1 << 20) + 1), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and "limit" in r.json()["detail"]
    assert r.json()["limit"] == "max_body_bytes" and r.json()["value"] == 1 << 20


def test_a_client_batch_over_one_batch_is_split_and_over_the_limit_is_a_413(
    client: httpx.Client,
) -> None:
    # 8 inputs of about 12 tokens do not fit one batch of 64 padded tokens (--max-batch-tokens).
    texts = [f"the [MASK] number {i} in a longer list of words" for i in range(8)]
    before = client.get("/metrics").text
    together = client.post("/v1/fill-mask", json={"inputs": texts, "top_k": 1})
    calls = metric(client.get("/metrics").text, "shoestring_batch_size_count", task="fill-mask")
    assert together.status_code == 200, together.text
    assert calls - metric(before, "shoestring_batch_size_count", task="fill-mask") >= 2
    alone = [
        client.post("/v1/fill-mask", json={"inputs": t, "top_k": 1}).json()["results"][0]
        for t in texts
    ]
    for got, want in zip(together.json()["results"], alone):
        assert got[0]["candidates"][0]["id"] == want[0]["candidates"][0]["id"]
        assert math.isclose(
            got[0]["candidates"][0]["score"], want[0]["candidates"][0]["score"], rel_tol=1e-4
        )
    r = client.post("/v1/fill-mask", json={"inputs": texts + ["one [MASK] more"]})
    assert r.status_code == 413
    assert r.json()["limit"] == "max_client_batch" and r.json()["value"] == 8
    assert "at most 8" in r.json()["detail"]


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_a_json_body_is_json_whatever_its_content_type(
    client: httpx.Client, content_type: str | None
) -> None:
    # What `curl -d '{...}'` sends (a form content type), and no header at all.
    body = b'{"inputs": "the [MASK] of a list", "top_k": 2}'
    headers = {"content-type": content_type} if content_type else {}
    r = client.post("/v1/fill-mask", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert len(r.json()["results"][0][0]["candidates"]) == 2


def test_curl_example_from_the_docs_works(server: ServerThread) -> None:
    import shutil

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    r = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", f"{server.url}/v1/fill-mask",
         "-d", '{"inputs": "the [MASK] of a list", "top_k": 2}'],
        capture_output=True, text=True, timeout=60,
    )
    body, code = r.stdout.rsplit("\n", 1)
    assert code == "200", body
    assert len(json.loads(body)["results"][0][0]["candidates"]) == 2


@pytest.mark.parametrize("path", ["/v1/fill-mask", "/v1/embed"])
def test_a_lone_surrogate_is_a_422_and_the_connection_lives_on(
    client: httpx.Client, path: str
) -> None:
    for inputs in ('"\\ud800 [MASK]"', '["a [MASK]", "\\udfff [MASK]"]'):
        raw = ('{"inputs": ' + inputs + "}").encode()
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert "lone surrogate (U+D" in r.text
    # The same keep-alive connection answers the next request.
    ok = client.post(path, json={"inputs": "a [MASK] list"})
    assert ok.status_code == 200, ok.text


def test_concurrent_requests_share_batches(server: ServerThread, client: httpx.Client) -> None:
    before = client.get("/metrics").text
    n = 16

    async def fire() -> list[int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            rs = await asyncio.gather(
                *(c.post("/v1/embed", json={"inputs": f"text number {i}"}) for i in range(n))
            )
        return [r.status_code for r in rs]

    assert asyncio.run(fire()) == [200] * n
    after = client.get("/metrics").text

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    batches = delta("shoestring_batch_size_count", task="embed")
    inputs = delta("shoestring_batch_size_sum", task="embed")
    assert inputs == n
    assert batches < n  # some model calls held more than one request
    assert delta("shoestring_batch_size_bucket", task="embed", le="1.0") < batches
    assert delta("shoestring_requests_total", endpoint="/v1/embed", status="200") == n
    assert metric(after, "shoestring_queue_depth") == 0
    assert metric(after, "shoestring_request_duration_seconds_count", endpoint="/v1/embed") >= n
    assert "# TYPE shoestring_batch_size histogram" in after


# --- other model folders -----------------------------------------------------------------------


def test_serves_the_hugging_face_export_identically(
    run_dir: Path, client: httpx.Client, tmp_path: Path
) -> None:
    from shoestring.export.hf import export_encoder

    hf = export_encoder(run_dir, tmp_path / "hf")
    body = {"inputs": ["the [MASK] of a list", "return [MASK] value"], "top_k": 4}
    with start(hf, max_length=64) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        got = c.post("/v1/fill-mask", json=body).json()
        assert c.get("/v1/model").json()["source"] == str(hf)
    want = client.post("/v1/fill-mask", json=body).json()
    for g, w in zip(got["results"], want["results"]):
        assert [c["id"] for c in g[0]["candidates"]] == [c["id"] for c in w[0]["candidates"]]


def test_classify_with_a_classifier_folder(run_dir: Path, tmp_path: Path) -> None:
    from shoestring.data.tokenizer import load_tokenizer
    from shoestring.classifier import (
        SequenceClassifier,
        load_classifier,
        predict,
        save_classifier,
    )
    from shoestring.rundir import RunDir

    torch.manual_seed(0)
    encoder, meta = RunDir(run_dir).load_final()
    model = SequenceClassifier(encoder, num_labels=2)
    folder = save_classifier(
        tmp_path / "clf",
        model.eval(),
        meta,
        run_dir / "final" / "tokenizer.json",
        labels=["negative", "positive"],
        problem="classification",
        max_length=64,
    )
    texts = ["a fine module", "this raises an error and fails badly"]
    with start(folder) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/classify", json={"inputs": texts})
        assert r.status_code == 200, r.text
        assert c.post("/v1/fill-mask", json={"inputs": "a [MASK]"}).status_code == 404
        assert c.post("/v1/classify", json={"inputs": "x", "pairs": ["y"]}).status_code == 422
    got = r.json()["results"]
    model, clf_meta = load_classifier(folder)
    want = predict(model, clf_meta, load_tokenizer(folder / "tokenizer.json"), texts)
    for g, w in zip(got, want):
        assert g["label"] == w["label"] and set(g["scores"]) == {"negative", "positive"}
        assert math.isclose(g["score"], w["score"], rel_tol=1e-4)


def save_tiny_decoder(encoder_run: Path, out: Path) -> Path:
    """A small untrained decoder saved as a run dir at ``out``, with the encoder run's
    tokenizer (the server's job is the same as for a trained one)."""
    from shoestring.config import ModelConfig
    from shoestring.model.decoder import CausalLM
    from shoestring.rundir import RunDir

    base = json.loads((encoder_run / "final" / "config.json").read_text())
    cfg = ModelConfig(
        objective="clm", hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128
    )
    torch.manual_seed(0)
    model = CausalLM(cfg, base["vocab_size"]).eval()
    meta = {
        "architecture": "shoestring-clm",
        "model": cfg.model_dump(mode="json"),
        "vocab_size": base["vocab_size"],
        "seq_len": 64,
        "special_ids": base["special_ids"],
    }
    RunDir(out).save_final(model, meta, encoder_run / "final" / "tokenizer.json")
    return out


def announced(proc: subprocess.Popen, pattern: str, wait: float = 180) -> re.Match | None:
    """The first stderr line of a starting server that matches ``pattern`` (None: none came)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            return None
        m = re.search(pattern, line)
        if m:
            return m
    return None


def test_generate_with_a_decoder_run(run_dir: Path, tmp_path: Path) -> None:
    run = save_tiny_decoder(run_dir, tmp_path / "clm")
    prompts = ["the list", "a function that returns a value and"]
    with start(run, max_wait_ms=50) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        both = c.post(
            "/v1/generate", json={"inputs": prompts, "max_new_tokens": 5, "temperature": 0}
        ).json()["results"]
        alone = [
            c.post(
                "/v1/generate", json={"inputs": p, "max_new_tokens": 5, "temperature": 0}
            ).json()["results"][0]
            for p in prompts
        ]
        sampled = c.post(
            "/v1/generate", json={"inputs": "the", "max_new_tokens": 3, "top_p": 0.9, "seed": 1}
        )
        too_many = c.post("/v1/generate", json={"inputs": "the", "max_new_tokens": 10_000})
        assert c.post("/v1/embed", json={"inputs": "x"}).status_code == 404
    assert both == alone  # left-padding in a shared batch changes nothing
    assert all(g["tokens"] <= 5 and g["finish_reason"] in ("stop", "length") for g in both)
    assert sampled.status_code == 200
    assert too_many.status_code == 422 and "max_new_tokens" in too_many.text


# --- security ---------------------------------------------------------------------------------


def test_api_key_is_required_where_it_should_be(run_dir: Path) -> None:
    with start(run_dir, api_key=KEY) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        body = {"inputs": "a [MASK]"}
        assert c.post("/v1/fill-mask", json=body).status_code == 401
        wrong = c.post("/v1/fill-mask", json=body, headers={"Authorization": "Bearer " + KEY[:-1]})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert c.get("/metrics").status_code == 401
        assert (
            c.post(
                "/v1/fill-mask", json=body, headers={"Authorization": f"Bearer {KEY}"}
            ).status_code
            == 200
        )
        assert c.post("/v1/fill-mask", json=body, headers={"X-API-Key": KEY}).status_code == 200
        assert c.get("/metrics", headers={"X-API-Key": KEY}).status_code == 200
        # an empty X-API-Key does not hide a valid bearer (issue 62), on both ways in: the
        # fast path (a plain POST) and ASGI (/metrics)
        both = {"X-API-Key": "", "Authorization": f"Bearer {KEY}"}
        assert c.post("/v1/fill-mask", json=body, headers=both).status_code == 200
        assert c.get("/metrics", headers=both).status_code == 200
        assert c.post("/v1/fill-mask", json=body, headers={"X-API-Key": ""}).status_code == 401
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
        # The API's description is behind the key too.
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers={"X-API-Key": KEY}).status_code == 200, path
        spec = c.get("/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert "/v1/fill-mask" in spec["paths"] and "/openapi.json" not in spec["paths"]
    with start(run_dir) as srv:  # without a key it is public, as FastAPI serves it
        assert httpx.get(srv.url + "/openapi.json", timeout=60).status_code == 200


def test_settings_refuse_a_short_key_and_name_the_flag() -> None:
    from shoestring.errors import ShoestringError

    with pytest.raises(ShoestringError, match="--api-key"):
        make_settings(api_key="short")
    with pytest.raises(ShoestringError, match="--max-batch-size"):
        make_settings(max_batch_size=0)
    # Limits that contradict each other name both flags' values.
    with pytest.raises(ShoestringError, match=r"--max-batch-tokens: \(100\) .*--max-length \(512\)"):
        make_settings(max_batch_tokens=100, max_length=512)
    with pytest.raises(ShoestringError, match=r"--max-queue: \(10\) .*--max-client-batch \(1024\)"):
        make_settings(max_queue=10)


def test_truncate_flag_cuts_instead_of_rejecting(run_dir: Path) -> None:
    with (
        start(run_dir, max_length=16, truncate=True) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        ok = c.post("/v1/fill-mask", json={"inputs": "[MASK] " + "word " * 50})
        assert ok.status_code == 200
        cut = c.post("/v1/fill-mask", json={"inputs": "word " * 50 + "[MASK]"})
        assert cut.status_code == 422 and "cut off" in cut.text


# --- overload, timeouts, disconnects ----------------------------------------------------------


def test_full_queue_429_timeout_504_and_disconnects_are_dropped(run_dir: Path) -> None:
    # One queue slot, and a batch that waits 2 s for mates: the first request holds the slot.
    with (
        start(
            run_dir, max_queue=1, max_client_batch=1, max_wait_ms=2000, request_timeout_s=1.0
        ) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        depth = lambda: metric(c.get("/metrics").text, "shoestring_queue_depth")
        first: list[httpx.Response] = []
        t = threading.Thread(
            target=lambda: first.append(
                httpx.post(srv.url + "/v1/embed", json={"inputs": "first"}, timeout=60)
            )
        )
        t.start()
        wait_for(lambda: depth() == 1)
        full = c.post("/v1/embed", json={"inputs": "second"})
        assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
        assert "queue is full" in full.json()["detail"]
        assert full.json()["limit"] == "max_queue" and full.json()["value"] == 1
        assert c.get("/readyz").status_code == 503
        t.join(60)
        assert first[0].status_code == 504  # its 1 s ran out before the 2 s batch window
        text = c.get("/metrics").text
        assert metric(text, "shoestring_dropped_inputs_total", reason="timeout") == 1
        assert metric(text, "shoestring_batch_size_count", task="embed") == 0  # never computed

        # A client that gives up: its input leaves the queue without being computed.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/embed", json={"inputs": "impatient"}, timeout=0.3)
        wait_for(
            lambda: (
                metric(
                    c.get("/metrics").text, "shoestring_dropped_inputs_total", reason="disconnected"
                )
                == 1
            )
        )
        assert depth() == 0
        assert metric(c.get("/metrics").text, "shoestring_batch_size_count", task="embed") == 0


def test_cli_serve_drains_in_flight_requests_on_sigterm(run_dir: Path) -> None:
    env = {**os.environ, "COLUMNS": "200", "SHOESTRING_API_KEY": KEY}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoestring",
            "serve",
            str(run_dir),
            "--port",
            "0",
            "--max-wait-ms",
            "1500",
            "--max-length",
            "64",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        m = announced(proc, r"on (http://127\.0\.0\.1:\d+)")
        url = m.group(1) if m else None
        assert url, "the server did not announce its address"
        headers = {"X-API-Key": KEY}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            wait_for(lambda: c.get("/healthz").status_code == 200)
            answers: list[int] = []

            def one(i: int) -> None:
                r = httpx.post(
                    url + "/v1/embed",
                    json={"inputs": f"in flight {i}"},
                    headers=headers,
                    timeout=60,
                )
                answers.append(r.status_code)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            wait_for(lambda: metric(c.get("/metrics").text, "shoestring_queue_depth") == 4)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert answers == [200] * 4  # queued when the signal came, answered all the same
        # uvicorn re-raises the signal once it has shut down, so the exit status says "ended
        # by SIGTERM" as it would without it: 0 or -SIGTERM are both a clean stop.
        assert proc.wait(60) in (0, -signal.SIGTERM)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/healthz", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_serve_bad_path_is_a_clear_error(tmp_path: Path) -> None:
    from conftest import run_cli

    r = run_cli("serve", str(tmp_path))
    assert r.returncode == 2 and "not a model folder" in r.stderr and "Traceback" not in r.stderr
