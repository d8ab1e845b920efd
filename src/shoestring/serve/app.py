"""The HTTP API (FastAPI): endpoints, error answers, and the request's path through the batcher.

A request body is JSON whatever its ``Content-Type`` header says (``curl -d`` works as is).
It is validated by its pydantic model (422 on bad types or fields), tokenized and
checked by the engine (422 on over-length or a missing mask token), split into one batcher
job per input and queued (429 + Retry-After at once when the queue is full; the batcher
splits a request larger than one batch across batches). The handler
then waits for three things at once: its results, its client disconnecting (its queued jobs
are dropped before they cost compute), and its deadline (504). Inference itself happens on
the batcher's worker thread, never on the event loop.

A request's ``model`` field picks one of the server's models (`routing`); without it the
first answers. ``GET /`` is a page to browse the models and try them (`page`).

Status codes: 401 bad or missing API key · 404 an endpoint this model does not serve ·
413 body too large or more inputs than --max-client-batch · 422 bad input · 429 at
--max-concurrent-requests or a full queue · 503 shutting down · 504 timed out.
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
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from shoestring import __version__
from shoestring.serve.batcher import BatcherClosed, Job, QueueFull
from shoestring.serve.engine import Engine, InputError
from shoestring.serve.metrics import CONTENT_TYPE, ServeMetrics
from shoestring.serve.retrieval_routes import attach_retrieval, need
from shoestring.serve.page import PAGE
from shoestring.serve.routing import ModelRouter, ModelUnavailable, Slot
from shoestring.serve.schemas import ClassifyRequest, ClassifyResponse, EmbedRequest, EmbedResponse
from shoestring.serve.schemas import FillMaskRequest, FillMaskResponse, GenerateRequest
from shoestring.serve.schemas import GenerateResponse
from shoestring.serve.security import ApiKey, BodyLimit, ConcurrencyLimit, Receive, Refused
from shoestring.serve.security import RequestGate, Scope, Send
from shoestring.serve.settings import ServeSettings
from shoestring.serve.streaming import TokenStream, events

ENDPOINTS = {"/v1/fill-mask": "fill-mask", "/v1/embed": "embed", "/v1/classify": "classify",
             "/v1/generate": "generate"}
OTHER_PATHS = ("/", "/healthz", "/readyz", "/metrics", "/v1/model", "/v1/models")
# Newer FastAPI looks up OpenTelemetry providers on every request: 0.5 ms of the event loop
# per request under load (cProfile of `serve` at 32 clients). This server keeps its own
# Prometheus metrics, so that check is switched off where FastAPI has it.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)
CLIENT_CLOSED = 499  # nginx's code for "client closed the request"; only ever seen in metrics


class _Timeout(Exception):
    pass


class _ClientGone(Exception):
    pass


class _Metered:
    """ASGI middleware: every answer counted by endpoint and status, and timed.

    Paths outside the API are counted as ``other``, so random URLs cannot blow up the number
    of metric series.
    """

    def __init__(self, app: Any, metrics: ServeMetrics) -> None:
        self.app, self.metrics = app, metrics
        self.known = {*ENDPOINTS, *OTHER_PATHS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in self.known else "other"
        status = 500
        start = time.perf_counter()

        async def metered_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, metered_send)
        finally:
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
            self.metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - start)


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
        await self.app(scope, receive, send)


@dataclass
class _Api:
    """What every handler of one app shares: the models, the limits, the metrics and the key;
    its methods are the steps of a request's path (authorize, pick the model, check the input
    count, run it through the batcher)."""

    router: ModelRouter
    settings: ServeSettings
    metrics: ServeMetrics
    api_key: ApiKey | None
    retrieval: Any = None  # the /v1/search index, when --index was given

    async def authorized(self, request: Request) -> None:  # async: a sync one costs a thread hop
        if self.api_key is not None and not self.api_key.check(request.headers):
            raise HTTPException(401, "missing or wrong API key: send 'Authorization: Bearer KEY' "
                                "or 'X-API-Key: KEY'", headers={"WWW-Authenticate": "Bearer"})

    async def slot_for(self, body: Any, task: str) -> Slot:
        """The model ``body.model`` names, once the input count is within the limit (413) and
        that model can do ``task`` (404)."""
        # More inputs than one batch holds are split across batches; above the client-batch
        # limit the request is refused whole (TEI's 413).
        limit = self.settings.max_client_batch
        if len(body.texts) > limit:
            self.metrics.refused.labels(limit="max_client_batch").inc()
            raise Refused(413, f"{len(body.texts)} inputs in one request; this server takes at "
                          f"most {limit} (--max-client-batch): split the request",
                          "max_client_batch", limit)
        slot = await self.router.slot_for(body.model)
        engine = slot.engine
        if task not in engine.tasks:
            served = ", ".join(f"/v1/{t}" for t in sorted(engine.tasks))
            raise HTTPException(404, f"this server's model is {_article(engine.kind)} "
                                f"{engine.kind}, which does not do {task}; it serves {served}")
        return slot

    async def infer(self, request: Request, key: tuple, payloads: list[Any],
                    lengths: list[int], many: bool, slot: Slot) -> list[Any]:
        """Queue one job per input on ``slot``'s batcher and wait for the first of: the
        results, the client going away (jobs dropped), the deadline (504)."""
        jobs = [Job(key, n, p) for p, n in zip(payloads, lengths)]
        batcher = slot.batcher
        futures = batcher.submit(jobs)
        results = asyncio.gather(*futures, return_exceptions=True)
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            done, _ = await asyncio.wait({results, gone}, timeout=self.settings.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server gave up on this request (forced shutdown)
            batcher.cancel(jobs, "cancelled")
            results.cancel()
            raise
        finally:
            gone.cancel()
        if results not in done:
            reason = "disconnected" if gone in done else "timeout"
            batcher.cancel(jobs, reason)
            results.cancel()
            raise _ClientGone() if reason == "disconnected" else _Timeout()
        out = results.result()
        for i, r in enumerate(out):
            if isinstance(r, InputError):
                raise r
            if isinstance(r, BaseException):
                where = f"inputs[{i}]" if many else "the input"
                raise HTTPException(500, f"inference failed for {where}: {type(r).__name__}: {r}")
        return out

    def stream_generation(self, slot: Slot, options: tuple, ids: list[int]) -> StreamingResponse:
        """One prompt's tokens as server-sent events, as the batcher produces them."""
        stream = TokenStream(asyncio.get_running_loop())
        job = Job(("generate-stream", *options, stream.id), len(ids), (ids, stream))
        (future,) = slot.batcher.submit([job])
        metrics = self.metrics

        def record(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is None:
                result = f.result()
                metrics.streams.labels(finish_reason=result["finish_reason"]).inc()
                metrics.streamed_tokens.inc(result["tokens"])

        future.add_done_callback(record)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in events(stream, future):
                    yield chunk
            finally:
                slot.batcher.cancel([job], "disconnected")  # if it had not started yet

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})


def create_app(engine: Engine | ModelRouter, settings: ServeSettings,
               metrics: ServeMetrics | None = None) -> FastAPI:
    """The FastAPI app serving one ``engine`` or a `ModelRouter`'s models; their batchers
    start and drain with the app's lifespan."""
    if isinstance(engine, ModelRouter):
        router = engine
        metrics = router.metrics
    else:
        metrics = metrics or ServeMetrics()
        router = ModelRouter.single(engine, settings, metrics)
    default = router.default_slot
    api = _Api(router, settings, metrics,
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
    # Outermost first: every answer is metered, including the 413s of the body limit.
    app.add_middleware(_JsonBody)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(ConcurrencyLimit, gate=gate)
    app.add_middleware(_Metered, metrics=metrics)
    return app


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
    """Each error a request can meet, as the status code and body the module docstring lists."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer, ASCII-escaped: an echoed lone surrogate cannot be UTF-8; an
        # echoed NaN or Infinity (JSON extensions Python parses) is sent as a string.
        return _AsciiJSON({"detail": _finite(jsonable_encoder(e.errors()))}, status_code=422)

    @app.exception_handler(InputError)
    async def _bad_input(request: Request, e: InputError) -> JSONResponse:
        return JSONResponse({"detail": [{"type": "value_error", "loc": list(e.loc),
                                         "msg": e.message}]}, status_code=422)

    @app.exception_handler(ModelUnavailable)
    async def _unavailable(request: Request, e: ModelUnavailable) -> JSONResponse:
        return JSONResponse({"detail": e.message, "model": e.model}, status_code=503)

    @app.exception_handler(Refused)
    async def _refused(request: Request, e: Refused) -> JSONResponse:
        return refusal(e)

    @app.exception_handler(QueueFull)
    async def _full(request: Request, e: QueueFull) -> JSONResponse:
        metrics.refused.labels(limit="max_queue").inc()
        return refusal(Refused(429, f"{e}; retry after 1 s", "max_queue", e.capacity))

    @app.exception_handler(BatcherClosed)
    async def _closed(request: Request, e: BatcherClosed) -> JSONResponse:
        return JSONResponse({"detail": "the server is shutting down; retry on another replica"},
                            status_code=503, headers={"Retry-After": "1", "Connection": "close"})

    @app.exception_handler(_Timeout)
    async def _timeout(request: Request, e: _Timeout) -> JSONResponse:
        return JSONResponse({"detail": f"no answer within {settings.request_timeout_s:g} s "
                             "(--request-timeout); the server is overloaded"}, status_code=504)

    @app.exception_handler(_ClientGone)
    async def _gone(request: Request, e: _ClientGone) -> JSONResponse:
        return JSONResponse({"detail": "client disconnected"}, status_code=CLIENT_CLOSED)


def _add_inference_routes(app: FastAPI, api: _Api) -> None:
    """The /v1 endpoints that run a model. The engine's results are plain JSON-ready Python
    already: answering with a `JSONResponse` skips FastAPI's re-validation of them (the
    response models still document them)."""
    authorized = [Depends(api.authorized)]

    @app.post("/v1/fill-mask", response_model=FillMaskResponse, dependencies=authorized)
    async def fill_mask(body: FillMaskRequest, request: Request) -> Any:
        """Top-k tokens, with probabilities, for each [MASK] in each text."""
        slot = await api.slot_for(body, "fill-mask")
        payloads = slot.engine.prepare_fill_mask(body.texts, body.top_k, body.many)
        lengths = [len(p[0]) for p in payloads]
        out = await api.infer(request, ("fill-mask",), payloads, lengths, body.many, slot)
        return JSONResponse({"results": out})

    @app.post("/v1/embed", response_model=EmbedResponse, dependencies=authorized)
    async def embed(body: EmbedRequest, request: Request) -> Any:
        """One pooled vector per text (mean or [CLS]; unit length unless normalize=false)."""
        slot = await api.slot_for(body, "embed")
        payloads = slot.engine.prepare_embed(body.texts, body.pooling, body.normalize, body.many)
        lengths = [len(p[0]) for p in payloads]
        out = await api.infer(request, ("embed",), payloads, lengths, body.many, slot)
        return JSONResponse({"embeddings": out, "dimensions": len(out[0]) if out else 0})

    @app.post("/v1/classify", response_model=ClassifyResponse, dependencies=authorized,
              response_model_exclude_none=True)
    async def classify(body: ClassifyRequest, request: Request) -> Any:
        """Label probabilities (or a value) from a fine-tuned classifier."""
        slot = await api.slot_for(body, "classify")
        payloads = slot.engine.prepare_classify(body.texts, body.pairs, body.many)
        lengths = [len(p) for p in payloads]
        out = await api.infer(request, ("classify",), payloads, lengths, body.many, slot)
        return JSONResponse({"results": out})

    @app.post("/v1/generate", response_model=GenerateResponse, dependencies=authorized)
    async def generate(body: GenerateRequest, request: Request) -> Any:
        """Continue each prompt (a decoder): up to max_new_tokens, sampled or greedy; with
        ``stream`` one prompt's tokens as server-sent events."""
        slot = await api.slot_for(body, "generate")
        limit = api.settings.max_new_tokens
        if body.max_new_tokens > limit:
            raise InputError(f"max_new_tokens = {body.max_new_tokens} is over this server's "
                             f"limit of {limit} (--max-new-tokens)", ("body", "max_new_tokens"))
        texts, passages = body.texts, None
        if body.retrieve is not None:  # questions → prompts with retrieved passages
            texts, passages = await need(api.retrieval).prompts(
                body.texts, body.retrieve.k, body.retrieve.mode, body.max_new_tokens, slot.engine)
        payloads = slot.engine.prepare_generate(texts, body.many)
        options = (body.max_new_tokens, body.temperature, body.top_k, body.top_p, body.seed)
        if body.stream:
            if len(payloads) != 1:
                raise InputError(f"stream takes one prompt, got {len(payloads)}: send one per "
                                 "request", ("body", "inputs"))
            return api.stream_generation(slot, options, payloads[0])
        lengths = [len(p) for p in payloads]
        out = await api.infer(request, ("generate", *options), payloads, lengths, body.many, slot)
        if passages is not None:
            out = [{**o, "passages": p} for o, p in zip(out, passages)]
        return JSONResponse({"results": out})


def _add_status_routes(app: FastAPI, api: _Api) -> None:
    """What is served and how it is doing: model info, the page, health, readiness, metrics."""
    router, settings = api.router, api.settings
    tasks = sorted(router.default_slot.engine.tasks)  # at start: readyz must not need a model
    authorized = [Depends(api.authorized)]

    @app.get("/v1/model", dependencies=authorized)
    async def model_info() -> dict:
        """What is loaded, what it serves, and the server's limits."""
        limits = ("max_batch_tokens", "max_batch_size", "max_wait_ms", "max_queue",
                  "max_concurrent_requests", "max_client_batch", "max_body_bytes",
                  "max_new_tokens", "request_timeout_s")
        return {**router.default_slot.engine.describe(), "worker": os.getpid(),
                "limits": {name: getattr(settings, name) for name in limits}}

    @app.get("/v1/models", dependencies=authorized)
    async def models() -> dict:
        """The served models: current version, stored versions with eval metrics and tags."""
        return {"models": await asyncio.to_thread(router.describe), "worker": os.getpid()}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        """A page to browse the models and try them (plain HTML + JS, no build step)."""
        return HTMLResponse(PAGE)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness: the process answers and its inference workers are alive."""
        threads = [s.batcher._thread for s in router.slots.values()]
        alive = all(t is not None and t.is_alive() for t in threads)
        return JSONResponse({"status": "ok" if alive else "worker stopped"},
                            status_code=200 if alive else 500)

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: accepting work, the queue has room, and every served model's current
        version can be served (else 503, with why: send traffic elsewhere)."""
        depth = router.queue_depth
        problems = await asyncio.to_thread(router.unservable)
        if not router.accepting:
            state = "shutting down"
        elif depth >= settings.max_queue:
            state = "queue full"
        else:
            state = "cannot serve a model" if problems else "ready"
        body = {"status": state, "queue_depth": depth, "tasks": tasks}
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


def refusal(e: Refused) -> JSONResponse:
    headers = {k.decode(): v.decode() for k, v in e.headers()}
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


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


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone (the request body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
