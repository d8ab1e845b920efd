"""The HTTP API: endpoints, error answers, and the layers every request passes.

A request passes, outermost first: metering (every answer counted by endpoint and status,
and timed), admission (an API request's key, 401 at once, then its concurrency slot, 429 +
Retry-After at once), the body limit (413 before parsing; 408 for a body that does not
arrive within --body-timeout), then FastAPI. The common case of a model endpoint (a plain
POST with a valid body, a free slot and the right key) does not pass these layers: the fast
path (`fastpath`) answers it in the HTTP protocol itself, through the same `handlers.Api`
methods the FastAPI routes call, with the same checks, metrics and answers; everything else
(status routes, the page, the API description, refusals, bodies that do not validate,
streams) comes here. A body is JSON whatever its ``Content-Type``
header says (``curl -d`` works as is).

A model request is validated by its pydantic model (422 on bad types or fields), split into
one batcher job per input and queued (429 + Retry-After at once when the queue is full; the
batcher splits a request larger than one batch across batches), tokenized and checked on the
batcher's worker (422 on over-length or a missing mask token). The handler then waits for
three things at once: its results, its client disconnecting (its queued jobs are dropped
before they cost compute), and its deadline (504). Inference itself happens on the batcher's
worker thread, never on the event loop.

A request's ``model`` field picks one of the server's models (`routing`); without it the
first answers. ``GET /`` is a page to browse the models and try them (`page`).

Status codes: 401 bad or missing API key · 404 an endpoint this model does not serve ·
408 the body did not arrive within --body-timeout · 413 body too large or more inputs than
--max-client-batch · 422 bad input · 429 at --max-concurrent-requests or a full queue ·
503 shutting down · 504 timed out. OpenAI's ``/v1/embeddings`` answers these in OpenAI's
error shape (a bad request there is a 400; `answers.ShapedErrors`), and it and
``/v1/rerank`` answer a model they lack 404.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from shoestring import __version__
from shoestring.serve.answers import ClientGone, ShapedErrors, Timeout, error_answer
from shoestring.serve.answers import openai_error
from shoestring.serve.batcher import BatcherClosed, QueueFull
from shoestring.serve.encoding import FastJSON
from shoestring.inference.engine import Engine, InputError
from shoestring.serve.fastpath import FastRoutes, Route
from shoestring.serve.handlers import Api
from shoestring.serve.prometheus import CONTENT_TYPE, ServeMetrics
from shoestring.serve.retrieval_routes import attach_retrieval
from shoestring.serve.page import PAGE
from shoestring.serve.routing import ModelRouter, ModelUnavailable
from shoestring.serve.schemas import ClassifyRequest, ClassifyResponse, EmbedRequest, EmbedResponse
from shoestring.serve.schemas import FillMaskRequest, FillMaskResponse, GenerateRequest
from shoestring.serve.schemas import EmbeddingsRequest, EmbeddingsResponse, GenerateResponse
from shoestring.serve.schemas import RerankRequest, RerankResponse
from shoestring.serve.security import Admission, ApiKey, ASGIApp, BodyLimit, Receive
from shoestring.serve.security import Refused, RequestGate, Scope, Send
from shoestring.serve.settings import ServeSettings
from shoestring.inference.laps import START

ENDPOINTS = {"/v1/fill-mask": "fill-mask", "/v1/embed": "embed", "/v1/classify": "classify",
             "/v1/generate": "generate", "/v1/embeddings": "embed", "/v1/rerank": "rerank"}
OTHER_PATHS = ("/", "/healthz", "/readyz", "/metrics", "/v1/model", "/v1/models", "/v1/search")
# Newer FastAPI looks up OpenTelemetry providers on every request: 0.5 ms of the event loop
# per request under load (cProfile of `serve` at 32 clients). This server keeps its own
# Prometheus metrics, so that check is switched off where FastAPI has it.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class _Metered:
    """ASGI middleware: every answer counted by endpoint and status, and timed; it also notes
    when a request entered the app (`stages.START`: where its ``parse`` stage begins).

    Paths outside the API are counted as ``other``, so random URLs cannot blow up the number
    of metric series.
    """

    def __init__(self, app: Any, metrics: ServeMetrics) -> None:
        self.app, self.metrics = app, metrics
        # Set by create_app: the app behind the layers, the requests being handled (what a
        # shutdown drains) and the body reader (what a shutdown stops waiting on).
        self.fastapi: FastAPI | None = None
        self.gate: RequestGate | None = None
        self.bodies: BodyLimit | None = None
        self.fast: FastRoutes | None = None  # what the HTTP protocol answers itself
        self.known = {*ENDPOINTS, *OTHER_PATHS}
        # prometheus-client's .labels() costs microseconds a call: each series once.
        self._counters: dict[tuple[str, int], Any] = {}
        self._timers: dict[str, Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        status = 500
        start = scope[START] = time.perf_counter()

        async def metered_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, metered_send)
        finally:
            self.record(path, status, start)

    def record(self, path: str, status: int, start: float) -> None:
        """Count an answer to ``path`` and time it from ``start`` (its perf_counter)."""
        endpoint = path if path in self.known else "other"
        counter = self._counters.get((endpoint, status))
        if counter is None:
            counter = self._counters[(endpoint, status)] = self.metrics.requests.labels(
                endpoint=endpoint, status=str(status))
        timer = self._timers.get(endpoint)
        if timer is None:
            timer = self._timers[endpoint] = self.metrics.latency.labels(endpoint=endpoint)
        counter.inc()
        timer.observe(time.perf_counter() - start)


class _JsonBody:
    """ASGI middleware: a POST body is JSON whatever its ``Content-Type`` says, as in
    Hugging Face's TEI. ``curl -d`` sends ``application/x-www-form-urlencoded``, which
    FastAPI would not parse as JSON (a confusing 422 "Input should be a valid dictionary")."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
            first: dict | None = await receive()
            if first["type"] == "http.request" and _not_utf8(first.get("body", b"")):
                # Python's json.loads would guess UTF-16 or -32; the fast path's parser, and
                # RFC 8259 (8.1), take UTF-8 only: both ways in refuse it alike
                error = {"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error",
                         "input": {}, "ctx": {"error": "the body is UTF-16 or UTF-32: JSON "
                                              "must be sent as UTF-8 (RFC 8259)"}}
                return await JSONResponse({"detail": [error]}, 422)(scope, receive, send)

            outer = receive

            async def again() -> dict:
                nonlocal first
                if first is not None:
                    message, first = first, None
                    return message
                return await outer()

            receive = again
        await self.app(scope, receive, send)


def _not_utf8(body: bytes) -> bool:
    """Whether a JSON body is UTF-16 or UTF-32: a byte-order mark, or a NUL among its first
    four bytes (valid UTF-8 JSON has none: RFC 8259's own way of telling them apart)."""
    return body[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in body[:4]


def create_app(engine: Engine | ModelRouter, settings: ServeSettings,
               metrics: ServeMetrics | None = None) -> ASGIApp:
    """The ASGI app serving one ``engine`` or a `ModelRouter`'s models: the request layers
    around the fast path and FastAPI; the batchers start and drain with its lifespan."""
    if isinstance(engine, ModelRouter):
        router = engine
        metrics = router.metrics
    else:
        metrics = metrics or ServeMetrics()
        router = ModelRouter.single(engine, settings, metrics)
    default = router.default_slot
    api = Api(router, settings, metrics,
              ApiKey(settings.api_key.get_secret_value()) if settings.api_key else None)
    gate = RequestGate(settings.max_concurrent_requests,
                       lambda: metrics.refused.labels(limit="max_concurrent_requests").inc())
    _add_gauges(metrics, router, settings, gate)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        router.start()
        try:
            yield
        finally:
            # Uvicorn calls this after in-flight requests have finished (or its grace period
            # ran out); anything still queued is run, not dropped.
            await asyncio.to_thread(router.close, True, settings.shutdown_timeout_s)

    # With a key, the API description is behind it too (added below, with the key check).
    docs = {"docs_url": None, "redoc_url": None, "openapi_url": None} if api.api_key else {}
    app = FastAPI(title="shoestring", version=__version__,
                  summary=f"Micro-batched inference for a shoestring {default.engine.kind}.",
                  lifespan=lifespan, **docs, **_NO_TELEMETRY)
    app.state.engine, app.state.batcher, app.state.metrics = (
        default.engine, default.batcher, metrics)
    app.state.settings, app.state.router = settings, router
    api.retrieval = attach_retrieval(app, settings.index, api.authorized)  # /v1/search
    if api.api_key is not None:
        _docs_behind_key(app, api.authorized)
    _add_error_handlers(app, settings, metrics)
    _add_inference_routes(app, api)
    _add_status_routes(app, api)
    # Outermost first: every answer is metered, including the 413s of the body limit. These
    # wrap the FastAPI app rather than sit in its middleware stack, so that a request the
    # fast path answers does not pass FastAPI's own layers.
    routes = {"/v1/fill-mask": Route("fill-mask", FillMaskRequest, api.fill_mask),
              "/v1/embed": Route("embed", EmbedRequest, api.embed),
              "/v1/classify": Route("classify", ClassifyRequest, api.classify),
              "/v1/generate": Route("generate", GenerateRequest, api.generate,
                                    hand_on=lambda body: body.stream),
              "/v1/embeddings": Route("embed", EmbeddingsRequest, api.openai_embeddings,
                                      shape=openai_error),
              "/v1/rerank": Route("rerank", RerankRequest, api.rerank)}
    bodies = BodyLimit(_JsonBody(app), max_bytes=settings.max_body_bytes,
                       timeout_s=settings.body_timeout_s)
    admitted = Admission(bodies, gate=gate, api_key=api.api_key)
    shapes = {path: route.shape for path, route in routes.items() if route.shape is not None}
    served = _Metered(ShapedErrors(admitted, shapes), metrics=metrics)
    served.fastapi, served.gate, served.bodies = app, gate, bodies
    served.fast = FastRoutes(api, routes, gate, served.record, lambda: bodies.refusal(408))
    return served


def _add_gauges(metrics: ServeMetrics, router: ModelRouter, settings: ServeSettings,
                gate: RequestGate) -> None:
    for name, doc, read in [
        ("shoestring_queue_depth", "Inputs waiting for the model.", lambda: router.queue_depth),
        ("shoestring_queue_capacity", "Inputs that may wait (--max-queue).",
         lambda: settings.max_queue),
        ("shoestring_inputs_in_flight", "Inputs the model is working on.",
         lambda: router.in_flight),
        ("shoestring_models_loaded", "Model versions loaded.", lambda: len(router.slots)),
        ("shoestring_requests_in_flight",
         "Requests being handled (429 at --max-concurrent-requests).", lambda: gate.active),
    ]:
        metrics.add_gauge(name, doc, read)


def _add_error_handlers(app: FastAPI, settings: ServeSettings, metrics: ServeMetrics) -> None:
    """Each error a request can meet, answered from the table the fast path uses too."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer, ASCII-escaped: an echoed lone surrogate cannot be UTF-8; an
        # echoed NaN or Infinity (JSON extensions Python parses) is sent as a string.
        return _AsciiJSON({"detail": _finite(jsonable_encoder(e.errors()))}, status_code=422)

    async def _answer(request: Request, e: Exception) -> Response:
        answer = error_answer(e, metrics, settings.request_timeout_s)
        if answer is None:
            raise e
        return FastJSON(answer.body, status_code=answer.status, headers=answer.headers)

    for kind in (InputError, ModelUnavailable, Refused, QueueFull, BatcherClosed, Timeout,
                 ClientGone, StarletteHTTPException):
        app.add_exception_handler(kind, _answer)


def _add_inference_routes(app: FastAPI, api: Api) -> None:
    """The /v1 endpoints that run a model, as FastAPI documents and (for what the fast path
    hands on) answers them. The response models document the answers; answering with
    `FastJSON` skips FastAPI's re-validation of them."""
    authorized = [Depends(api.authorized)]

    @app.post("/v1/fill-mask", response_model=FillMaskResponse, dependencies=authorized)
    async def fill_mask(body: FillMaskRequest, request: Request) -> Any:
        """Top-k tokens, with probabilities, for each [MASK] in each text."""
        return FastJSON(await api.fill_mask(body, request.receive))

    @app.post("/v1/embed", response_model=EmbedResponse, dependencies=authorized)
    async def embed(body: EmbedRequest, request: Request) -> Any:
        """One pooled vector per input (mean or [CLS], unit length or not: as asked, else
        the model's own), as numbers or base64 little-endian float32 (encoding_format)."""
        return FastJSON(await api.embed(body, request.receive))

    @app.post("/v1/classify", response_model=ClassifyResponse, dependencies=authorized,
              response_model_exclude_none=True)
    async def classify(body: ClassifyRequest, request: Request) -> Any:
        """Label probabilities (or a value) from a fine-tuned classifier."""
        return FastJSON(await api.classify(body, request.receive))

    @app.post("/v1/generate", response_model=GenerateResponse, dependencies=authorized)
    async def generate(body: GenerateRequest, request: Request) -> Any:
        """Continue each prompt (a decoder): up to max_new_tokens, sampled or greedy; with
        ``stream`` one prompt's tokens as server-sent events."""
        out = await api.generate(body, request.receive)
        return out if isinstance(out, Response) else FastJSON(out)

    @app.post("/v1/embeddings", response_model=EmbeddingsResponse, dependencies=authorized)
    async def embeddings(body: EmbeddingsRequest, request: Request) -> Any:
        """OpenAI's embeddings API: /v1/embed's vectors, OpenAI's request and answer (errors
        too: {"error": {"message", "type", "param", "code"}})."""
        return FastJSON(await api.openai_embeddings(body, request.receive))

    @app.post("/v1/rerank", response_model=RerankResponse, dependencies=authorized,
              response_model_exclude_none=True)
    async def rerank(body: RerankRequest, request: Request) -> Any:
        """Documents by relevance to a query, best first (Jina's and Cohere's shape): a pair
        classifier's positive probability, or an encoder's cosine."""
        return FastJSON(await api.rerank(body, request.receive))


def _add_status_routes(app: FastAPI, api: Api) -> None:
    """What is served and how it is doing: model info, the page, health, readiness, metrics."""
    router, settings = api.router, api.settings
    tasks = sorted(router.default_slot.engine.tasks)  # at start: readyz must not need a model
    authorized = [Depends(api.authorized)]

    @app.get("/v1/model", dependencies=authorized)
    async def model_info() -> dict:
        """What is loaded, what it serves, and the server's limits."""
        limits = ("max_batch_tokens", "max_batch_size", "max_wait_ms", "max_queue",
                  "max_concurrent_requests", "max_client_batch", "max_body_bytes",
                  "max_new_tokens", "request_timeout_s", "body_timeout_s")
        return {**router.default_slot.engine.describe(), "worker": os.getpid(),
                "limits": {name: getattr(settings, name) for name in limits}}

    @app.get("/v1/models", dependencies=authorized)
    async def models() -> dict:
        """The served models: current version, stored versions with eval metrics and tags;
        ``data``: the same names as OpenAI's model objects (``client.models.list()``)."""
        models, data = await asyncio.to_thread(lambda: (router.describe(), router.model_objects()))
        return {"object": "list", "data": data, "models": models, "worker": os.getpid()}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        """A page to browse the models and try them (plain HTML + JS, no build step)."""
        return HTMLResponse(PAGE)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness: the process answers and its inference workers are alive."""
        alive = all(s.batcher.alive for s in router.slots.values())
        return JSONResponse({"status": "ok" if alive else "worker stopped"},
                            status_code=200 if alive else 500)

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: accepting work, every ``--workers`` replica loaded, the queue has room,
        and every served model's current version can be served (else 503, with why: send
        traffic elsewhere)."""
        depth = router.queue_depth
        problems = await asyncio.to_thread(router.unservable)
        replicas = getattr(app.state, "replicas", None)  # --workers: `replicas.Loaded`
        loading = replicas.waiting() if replicas is not None else None
        if not router.accepting:
            state = "shutting down"
        elif loading:
            state = "loading"
        elif depth >= settings.max_queue:
            state = "queue full"
        else:
            state = "cannot serve a model" if problems else "ready"
        body = {"status": state, "queue_depth": depth, "tasks": tasks}
        if loading:
            body["workers"] = loading
        if problems:
            body["problems"] = problems
        return JSONResponse(body, status_code=200 if state == "ready" else 503)

    @app.get("/metrics", dependencies=authorized)
    async def prometheus() -> Response:
        """Prometheus text format: requests, latency, batch size and tokens, queue depth."""
        return Response(api.metrics.render(), media_type=CONTENT_TYPE)


def _docs_behind_key(app: FastAPI, authorized: Any) -> None:
    """``/openapi.json``, ``/docs`` and ``/redoc`` as FastAPI serves them, but only with the API
    key (the API's description is not for anyone who can reach the port). A browser does not
    send the key with the docs pages' own fetch of ``/openapi.json``: fetch that with the key."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    guarded = {"dependencies": [Depends(authorized)], "include_in_schema": False}

    @app.get("/openapi.json", **guarded)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", **guarded)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs")

    @app.get("/redoc", **guarded)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")


class _AsciiJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its name (``"nan"``, ``"inf"``), so
    it can be written as standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
