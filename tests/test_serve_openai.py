"""The protocols clients speak (issue 59): OpenAI's ``/v1/embeddings`` through the official
``openai`` SDK, unchanged, and ``/v1/rerank`` in Jina's and Cohere's shape, with a real pair
classifier (a cross-encoder) and a real encoder; errors in each protocol's shape; the same
answers through the fast path and through ASGI.

One server on a loopback port serves four models: the tiny encoder run (``run``), a pair
classifier with two labels (``relevance``), a pair regressor (``sts``) and a single-text
classifier (``sentiment``, which cannot rerank). It takes an API key, so every SDK call also
checks ``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
from test_serve import KEY, metric, run_dir  # noqa: F401 (fixture: the tiny encoder run)
from test_serve_fastpath import _post, _raw

from shoestring.serve.server import ServerThread, load_router
from shoestring.serve.settings import make_settings

TEXTS = ["a list", "the function returns a value and then some more words follow it", "x"]
QUERY = "how to sort a list"
DOCS = ["sort the list in place", "open a file for reading", "a list", "the module imports"]
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_LENGTH = 64


def _classifier(run_dir: Path, out: Path, labels: list[str] | None, problem: str,
                pair: bool) -> Path:
    from shoestring.classifier import SequenceClassifier, save_classifier
    from shoestring.rundir import RunDir

    torch.manual_seed(len(out.name))
    encoder, meta = RunDir(run_dir).load_final()
    model = SequenceClassifier(encoder, num_labels=len(labels) if labels else 1)
    return save_classifier(out, model.eval(), meta, run_dir / "final" / "tokenizer.json",
                           labels=labels, problem=problem, max_length=MAX_LENGTH, pair=pair)


@pytest.fixture(scope="module")
def server(run_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("protocols")
    models = [str(run_dir),
              str(_classifier(run_dir, root / "relevance", ["irrelevant", "relevant"],
                              "classification", pair=True)),
              str(_classifier(run_dir, root / "sts", None, "regression", pair=True)),
              str(_classifier(run_dir, root / "sentiment", ["neg", "neutral", "pos"],
                              "classification", pair=False))]
    settings = make_settings(port=0, api_key=KEY, max_client_batch=8, max_queue=64,
                             max_length=MAX_LENGTH, max_batch_tokens=512,
                             max_body_bytes=65536)
    srv = ServerThread(load_router(models, settings), settings).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sdk(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture()
def http(server: ServerThread):
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(run_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(run_dir / "final" / "tokenizer.json"))


def f32(vectors: list) -> np.ndarray:
    return np.array(vectors, dtype=np.float32)


# --- OpenAI's embeddings through the SDK ---------------------------------------------------------


def test_the_sdk_embeds_each_input_shape_as_embed_does(sdk: openai.OpenAI, http: httpx.Client,
                                                       tokenizer) -> None:
    """A text, texts, token ids, lists of token ids: the vectors `/v1/embed` gives with its
    defaults, bit for bit, and the token positions the model read (special tokens in)."""
    want = f32(http.post("/v1/embed", json={"inputs": TEXTS}).json()["embeddings"])
    ids = [tokenizer.encode(t).ids for t in TEXTS]
    lists = sdk.embeddings.create(model="run", input=TEXTS, encoding_format="float")
    assert [d.index for d in lists.data] == [0, 1, 2] and lists.model == "run"
    assert lists.object == "list" and {d.object for d in lists.data} == {"embedding"}
    assert f32([d.embedding for d in lists.data]).tobytes() == want.tobytes()
    assert lists.usage.prompt_tokens == lists.usage.total_tokens == sum(map(len, ids))
    for i, text in enumerate(TEXTS):  # alone (a batch of one: equal to /v1/embed's alone)
        one = sdk.embeddings.create(model="run", input=text, encoding_format="float")
        alone = http.post("/v1/embed", json={"inputs": text}).json()["embeddings"]
        assert f32(one.data[0].embedding).tobytes() == f32(alone[0]).tobytes()
        assert one.usage.prompt_tokens == len(ids[i])
        single = sdk.embeddings.create(model="run", input=ids[i], encoding_format="float")
        assert f32(single.data[0].embedding).tobytes() == f32(alone[0]).tobytes()
    from_ids = sdk.embeddings.create(model="run", input=ids, encoding_format="float")
    assert f32([d.embedding for d in from_ids.data]).tobytes() == want.tobytes()
    assert from_ids.usage.total_tokens == sum(map(len, ids))
    # user is accepted and ignored; dimensions at the model's full width is allowed.
    same = sdk.embeddings.create(model="run", input=TEXTS, encoding_format="float",
                                 user="someone", dimensions=want.shape[1])
    assert f32([d.embedding for d in same.data]).tobytes() == want.tobytes()


def test_base64_decodes_bit_exactly_to_the_float_answer(sdk: openai.OpenAI,
                                                        http: httpx.Client) -> None:
    """The SDK asks for base64 unless told otherwise and decodes it itself: the same float32
    values as the numbers of the float answer; on the wire, little-endian float32 bytes."""
    floats = sdk.embeddings.create(model="run", input=TEXTS, encoding_format="float")
    decoded = sdk.embeddings.create(model="run", input=TEXTS)  # base64 on the wire
    assert (f32([d.embedding for d in decoded.data]).tobytes()
            == f32([d.embedding for d in floats.data]).tobytes())
    raw = http.post("/v1/embeddings", json={"model": "run", "input": TEXTS,
                                            "encoding_format": "base64"}).json()
    for item, want in zip(raw["data"], floats.data):
        got = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert got.tobytes() == f32(want.embedding).tobytes()


def _error(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value


def test_errors_come_in_openais_shape_through_the_sdks_exceptions(
        sdk: openai.OpenAI, server: ServerThread) -> None:
    embed = sdk.embeddings.create
    e = _error(lambda: embed(model="run", input="x", dimensions=32))
    assert isinstance(e, openai.BadRequestError) and e.status_code == 400
    assert e.body["param"] == "dimensions" and e.body["type"] == "invalid_request_error"
    assert "dimensions = 32" in e.body["message"] and "have 64" in e.body["message"]
    e = _error(lambda: embed(model="text-embedding-3-small", input="x"))
    assert isinstance(e, openai.NotFoundError)
    assert (e.body["code"], e.body["param"]) == ("model_not_found", "model")
    assert "'text-embedding-3-small'" in e.body["message"] and ": run" in e.body["message"]
    e = _error(lambda: embed(model="relevance", input="x"))  # a classifier cannot embed
    assert isinstance(e, openai.NotFoundError) and "a classifier" in e.body["message"]
    e = _error(lambda: embed(model="run", input=["a", ""]))
    assert isinstance(e, openai.BadRequestError) and e.body["param"] == "input"
    assert "input[1] is empty" in e.body["message"]
    e = _error(lambda: embed(model="run", input=[[2] * (MAX_LENGTH + 1)]))
    assert isinstance(e, openai.BadRequestError) and e.body["param"] == "input"
    assert e.body["message"].startswith("input[0]: input is 65 tokens, over this server's limit")
    e = _error(lambda: embed(model="run", input=[[2, 10**6]]))
    assert e.status_code == 400 and "outside this model's vocabulary" in e.body["message"]
    e = _error(lambda: embed(model="run", input=["x"] * 9))  # over --max-client-batch
    assert e.status_code == 413 and (e.body["code"], e.body["param"]) == ("max_client_batch",
                                                                           "input")
    e = _error(lambda: embed(model="run", input="x", extra_body={"pooling": "cls"}))
    assert isinstance(e, openai.BadRequestError) and e.body["param"] == "pooling"
    assert "Extra inputs are not permitted" in e.body["message"]
    e = _error(lambda: embed(model="run", input="x " * 40000))  # over --max-body-bytes
    assert e.status_code == 413 and e.body["code"] == "max_body_bytes"
    broken = httpx.post(server.url + "/v1/embeddings", content=b'{"model": "run", "input"',
                        headers=AUTH, timeout=60)
    assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY[:-1] + "x", max_retries=0)
    e = _error(lambda: wrong.embeddings.create(model="run", input="x"))
    assert isinstance(e, openai.AuthenticationError) and e.body["code"] == "invalid_api_key"
    assert set(e.body) == {"message", "type", "param", "code"}


def test_every_native_refusal_has_its_openai_form() -> None:
    """The refusals a test cannot provoke on demand here (a full queue, a shutdown, a
    deadline), as the table turns them into OpenAI's shape: status kept, the limit as code."""
    from shoestring.serve.answers import openai_error
    from shoestring.serve.security import Refused

    full = Refused(429, "the queue is full; retry after 1 s", "max_queue", 64)
    assert openai_error(429, full.body()) == (429, {"error": {
        "message": "the queue is full; retry after 1 s", "type": "rate_limit_error",
        "param": "input", "code": "max_queue"}})
    status, body = openai_error(503, {"detail": "the server is shutting down"})
    assert status == 503 and body["error"]["type"] == "server_error"
    assert openai_error(504, {"detail": "no answer"})[1]["error"]["code"] == "timeout"
    status, body = openai_error(408, {"detail": "late", "limit": "body_timeout", "value": 15})
    assert (status, body["error"]["code"], body["error"]["param"]) == (408, "body_timeout", None)
    status, body = openai_error(422, {"detail": [{"loc": ["body", "inputs", 2], "msg": "bad"},
                                                 {"loc": ["body"], "msg": "worse"}]})
    assert status == 400 and body["error"]["message"] == "input[2]: bad; worse"
    assert body["error"]["param"] == "input"


def test_the_sdk_lists_the_served_models(sdk: openai.OpenAI, http: httpx.Client) -> None:
    listed = sdk.models.list()
    assert [m.id for m in listed.data] == ["run", "relevance", "sts", "sentiment"]
    assert {(m.object, m.owned_by) for m in listed.data} == {("model", "shoestring")}
    assert all(m.created > 0 for m in listed.data)
    raw = http.get("/v1/models").json()  # what the page and earlier clients read is kept
    assert [m["name"] for m in raw["models"]] == [m.id for m in listed.data]
    assert raw["worker"] > 0 and raw["object"] == "list"


# --- rerank --------------------------------------------------------------------------------------


def _rerank(http: httpx.Client, **body: object) -> dict:
    r = http.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_rerank_with_a_pair_classifier_is_its_positive_probability(http: httpx.Client,
                                                                   tokenizer) -> None:
    documents = [DOCS[0], {"text": DOCS[1]}, DOCS[2], {"text": DOCS[3], "id": 7}]  # Cohere's
    got = _rerank(http, model="relevance", query=QUERY, documents=documents)
    classified = http.post("/v1/classify", json={"model": "relevance", "inputs": [QUERY] * 4,
                                                 "pairs": DOCS}).json()["results"]
    positive = [c["scores"]["relevant"] for c in classified]
    assert [r["index"] for r in got["results"]] == sorted(range(4), key=lambda i: -positive[i])
    for r in got["results"]:
        assert r["relevance_score"] == pytest.approx(positive[r["index"]], rel=1e-6)
        assert "document" not in r
    assert got["model"] == "relevance"
    assert got["usage"]["total_tokens"] == sum(len(tokenizer.encode(QUERY, d).ids) for d in DOCS)
    top = _rerank(http, model="relevance", query=QUERY, documents=DOCS, top_n=2,
                  return_documents=True)["results"]
    assert [r["index"] for r in top] == [r["index"] for r in got["results"][:2]]
    assert [r["document"]["text"] for r in top] == [DOCS[r["index"]] for r in top]
    regression = _rerank(http, model="sts", query=QUERY, documents=DOCS)["results"]
    values = [c["value"] for c in http.post("/v1/classify", json={
        "model": "sts", "inputs": [QUERY] * 4, "pairs": DOCS}).json()["results"]]
    for r in regression:
        assert r["relevance_score"] == pytest.approx(values[r["index"]], rel=1e-6)


def test_rerank_with_an_encoder_is_the_cosine_of_its_embeddings(http: httpx.Client,
                                                                tokenizer) -> None:
    vectors = f32(http.post("/v1/embed", json={"inputs": [QUERY, *DOCS]}).json()["embeddings"])
    q, d = vectors[0].astype(np.float64), vectors[1:].astype(np.float64)
    cosine = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    got = _rerank(http, query=QUERY, documents=DOCS, return_documents=True)  # default: run
    assert got["model"] == "run"
    assert [r["index"] for r in got["results"]] == list(np.argsort(-cosine, kind="stable"))
    for r in got["results"]:
        assert r["relevance_score"] == pytest.approx(cosine[r["index"]], abs=1e-6)
        assert r["document"] == {"text": DOCS[r["index"]]}
    assert got["usage"]["total_tokens"] == sum(len(tokenizer.encode(t).ids)
                                               for t in [QUERY, *DOCS])


def test_rerank_errors_name_the_field_and_the_models_that_can(http: httpx.Client) -> None:
    r = http.post("/v1/rerank", json={"model": "sentiment", "query": QUERY, "documents": DOCS})
    assert r.status_code == 404
    assert r.json()["detail"] == ("model 'sentiment' is a classifier, which cannot rerank; send "
                                  "model set to one that can: run, relevance, sts")
    r = http.post("/v1/rerank", json={"model": "nope", "query": QUERY, "documents": DOCS})
    assert r.status_code == 404 and "serves no model 'nope'" in r.json()["detail"]
    long = "word " * 80
    for model, body, loc in (("run", {"query": QUERY, "documents": ["a", long]},
                              ["body", "documents", 1]),
                             ("run", {"query": long, "documents": ["a"]}, ["body", "query"]),
                             ("relevance", {"query": QUERY, "documents": ["a", long]},
                              ["body", "documents", 1])):
        r = http.post("/v1/rerank", json={"model": model, **body})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == loc and "over this server's limit" in r.text
    r = http.post("/v1/rerank", json={"query": QUERY, "documents": []})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "documents"]
    r = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 0})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "top_n"]
    r = http.post("/v1/rerank", json={"query": QUERY, "documents": ["a"] * 9})
    assert r.status_code == 413 and r.json()["limit"] == "max_client_batch"


# --- both ways in ----------------------------------------------------------------------------------


def _chunked(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
            "transfer-encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (
                len(data), data)


SAME_EITHER_WAY = [
    ("/v1/embeddings", {"model": "run", "input": TEXTS}),
    ("/v1/embeddings", {"model": "run", "input": [[2, 5, 3], [2, 3]], "encoding_format": "base64"}),
    ("/v1/embeddings", {"model": "nope", "input": "x"}),
    ("/v1/embeddings", {"model": "run", "input": "x", "dimensions": 8}),
    ("/v1/embeddings", {"model": "run", "input": [[2] * 70]}),
    ("/v1/embeddings", {"model": "run", "input": 3}),
    ("/v1/rerank", {"model": "relevance", "query": QUERY, "documents": DOCS, "top_n": 3}),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "return_documents": True}),
    ("/v1/rerank", {"model": "sentiment", "query": QUERY, "documents": DOCS}),
    ("/v1/rerank", {"query": QUERY, "documents": ["a", "word " * 80]}),
]


@pytest.mark.parametrize("path,body", SAME_EITHER_WAY,
                         ids=[f"{p}-{i}" for i, (p, _) in enumerate(SAME_EITHER_WAY)])
def test_the_fast_path_and_asgi_answer_alike(server: ServerThread, http: httpx.Client,
                                             path: str, body: dict) -> None:
    """The same body, once as the fast path takes it (a plain POST) and once chunked (which
    goes through the ASGI layers and FastAPI): the same status and the same answer."""
    task = "embed" if path == "/v1/embeddings" else "rerank"
    parsed = lambda: metric(http.get("/metrics").text,  # noqa: E731
                            "shoestring_stage_seconds_count", stage="parse", task=task)
    before = parsed()
    [(fast_status, _, fast)] = _raw(server, _post(path, body, f"authorization: Bearer {KEY}\r\n"),
                                    1)
    valid = fast_status != 400 or "must be a text" not in fast.decode()
    assert parsed() == before + valid  # a body that does not validate is handed to FastAPI
    [(slow_status, _, slow)] = _raw(server, _chunked(path, body), 1)
    assert parsed() == before + valid  # chunked: not the fast path's
    assert (fast_status, json.loads(fast)) == (slow_status, json.loads(slow))
