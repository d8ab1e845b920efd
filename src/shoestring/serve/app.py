"""The HTTP API (FastAPI): endpoints, error answers, and the request's path through the batcher.

A request body is JSON whatever its ``Content-Type`` header says (``curl -d`` works as is).
It is validated by its pydantic model (422 on bad types or fields), tokenized and
checked by the engine (422 on over-length or a missing mask token), split into one batcher
job per input and queued (503 + Retry-After at once when the queue is full). The handler
then waits for three things at once: its results, its client disconnecting (its queued jobs
are dropped before they cost compute), and its deadline (504). Inference itself happens on
the batcher's worker thread, never on the event loop.

Status codes: 401 bad or missing API key · 404 an endpoint this model does not serve ·
413 body too large · 422 bad input · 503 queue full or shutting down · 504 timed out.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from shoestring import __version__
from shoestring.serve.batcher import BatcherClosed, Job, MicroBatcher, QueueFull
from shoestring.serve.engine import Engine, InputError
from shoestring.serve.metrics import CONTENT_TYPE, ServeMetrics
from shoestring.serve.retrieval_routes import attach_retrieval, need
from shoestring.serve.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    EmbedRequest,
    EmbedResponse,
    FillMaskRequest,
    FillMaskResponse,
    GenerateRequest,
    GenerateResponse,
)
from shoestring.serve.security import ApiKey, BodyLimit, Receive, Scope, Send
from shoestring.serve.settings import ServeSettings

ENDPOINTS = {
    "/v1/fill-mask": "fill-mask",
    "/v1/embed": "embed",
    "/v1/classify": "classify",
    "/v1/generate": "generate",
}
OTHER_PATHS = ("/healthz", "/readyz", "/metrics", "/v1/model")
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
            self.metrics.requests.inc(endpoint=endpoint, status=str(status))
            self.metrics.latency.observe(time.perf_counter() - start, endpoint=endpoint)


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


def create_app(
    engine: Engine, settings: ServeSettings, metrics: ServeMetrics | None = None
) -> FastAPI:
    """The FastAPI app serving ``engine``; the batcher starts and drains with the app's lifespan."""
    metrics = metrics or ServeMetrics()
    batcher = MicroBatcher(
        engine.run,
        max_batch_size=settings.max_batch_size,
        max_wait_s=settings.max_wait_ms / 1000.0,
        max_queue=settings.max_queue,
        pad=engine.pad_batches,
        metrics=metrics,
    )
    metrics.add_gauge(
        "shoestring_queue_depth", "Inputs waiting for the model.", lambda: batcher.queue_depth
    )
    metrics.add_gauge(
        "shoestring_queue_capacity",
        "Inputs that may wait (--max-queue).",
        lambda: settings.max_queue,
    )
    metrics.add_gauge(
        "shoestring_inputs_in_flight", "Inputs the model is working on.", lambda: batcher.in_flight
    )
    api_key = ApiKey(settings.api_key.get_secret_value()) if settings.api_key else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            # Uvicorn calls this after in-flight requests have finished (or its grace period
            # ran out); anything still queued is run, not dropped.
            await asyncio.to_thread(batcher.close, True, settings.shutdown_timeout_s)

    app = FastAPI(
        title="shoestring",
        version=__version__,
        summary=f"Micro-batched inference for a shoestring {engine.kind}.",
        lifespan=lifespan,
    )
    app.state.engine, app.state.batcher, app.state.metrics = engine, batcher, metrics
    app.state.settings = settings

    async def authorized(request: Request) -> None:  # async: a sync one costs a thread hop
        if api_key is not None and not api_key.check(request.headers):
            raise HTTPException(
                401,
                "missing or wrong API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    retrieval = attach_retrieval(app, engine, settings.index, authorized)  # /v1/search

    def require(task: str) -> None:
        if task not in engine.tasks:
            served = ", ".join(f"/v1/{t}" for t in sorted(engine.tasks))
            raise HTTPException(
                404,
                f"this server's model is {_article(engine.kind)} {engine.kind}, which does "
                f"not do {task}; "
                f"it serves {served}",
            )

    # --- errors ------------------------------------------------------------------------------

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer, ASCII-escaped: an echoed lone surrogate cannot be UTF-8.
        return _AsciiJSON({"detail": jsonable_encoder(e.errors())}, status_code=422)

    @app.exception_handler(InputError)
    async def _bad_input(request: Request, e: InputError) -> JSONResponse:
        return JSONResponse(
            {"detail": [{"type": "value_error", "loc": list(e.loc), "msg": e.message}]},
            status_code=422,
        )

    @app.exception_handler(QueueFull)
    async def _full(request: Request, e: QueueFull) -> JSONResponse:
        # A rough time for the queue to move: one batch's worth of waiting, at least 1 s.
        retry = max(1, math.ceil(settings.max_wait_ms / 1000))
        return JSONResponse(
            {"detail": f"{e}; retry after {retry} s"},
            status_code=503,
            headers={"Retry-After": str(retry)},
        )

    @app.exception_handler(BatcherClosed)
    async def _closed(request: Request, e: BatcherClosed) -> JSONResponse:
        return JSONResponse(
            {"detail": "the server is shutting down; retry on another replica"},
            status_code=503,
            headers={"Retry-After": "1", "Connection": "close"},
        )

    @app.exception_handler(_Timeout)
    async def _timeout(request: Request, e: _Timeout) -> JSONResponse:
        return JSONResponse(
            {
                "detail": f"no answer within {settings.request_timeout_s:g} s "
                "(--request-timeout); the server is overloaded"
            },
            status_code=504,
        )

    @app.exception_handler(_ClientGone)
    async def _gone(request: Request, e: _ClientGone) -> JSONResponse:
        return JSONResponse({"detail": "client disconnected"}, status_code=CLIENT_CLOSED)

    # --- the path through the batcher ----------------------------------------------------------

    def check_count(texts: list[str]) -> None:
        # A request larger than the whole queue could never be admitted: 422, not 503.
        limit, flag = min(
            (settings.max_inputs, "--max-inputs"), (settings.max_queue, "--max-queue")
        )
        if len(texts) > limit:
            raise InputError(
                f"{len(texts)} inputs in one request; this server takes at most "
                f"{limit} ({flag}): split the request",
                ("body", "inputs"),
            )

    async def infer(
        request: Request, key: tuple, payloads: list[Any], lengths: list[int], many: bool
    ) -> list[Any]:
        jobs = [Job(key, n, p) for p, n in zip(payloads, lengths)]
        futures = batcher.submit(jobs)
        results = asyncio.gather(*futures, return_exceptions=True)
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            done, _ = await asyncio.wait(
                {results, gone},
                timeout=settings.request_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
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

    # --- endpoints -----------------------------------------------------------------------------

    @app.post("/v1/fill-mask", response_model=FillMaskResponse, dependencies=[Depends(authorized)])
    async def fill_mask(body: FillMaskRequest, request: Request) -> Any:
        """Top-k tokens, with probabilities, for each [MASK] in each text."""
        require("fill-mask")
        check_count(body.texts)
        payloads = engine.prepare_fill_mask(body.texts, body.top_k, body.many)
        out = await infer(
            request, ("fill-mask",), payloads, [len(p[0]) for p in payloads], body.many
        )
        return _json({"results": out})

    @app.post("/v1/embed", response_model=EmbedResponse, dependencies=[Depends(authorized)])
    async def embed(body: EmbedRequest, request: Request) -> Any:
        """One pooled vector per text (mean or [CLS]; unit length unless normalize=false)."""
        require("embed")
        check_count(body.texts)
        payloads = engine.prepare_embed(body.texts, body.pooling, body.normalize, body.many)
        out = await infer(request, ("embed",), payloads, [len(p[0]) for p in payloads], body.many)
        return _json({"embeddings": out, "dimensions": len(out[0]) if out else 0})

    @app.post(
        "/v1/classify",
        response_model=ClassifyResponse,
        dependencies=[Depends(authorized)],
        response_model_exclude_none=True,
    )
    async def classify(body: ClassifyRequest, request: Request) -> Any:
        """Label probabilities (or a value) from a fine-tuned classifier."""
        require("classify")
        check_count(body.texts)
        payloads = engine.prepare_classify(body.texts, body.pairs, body.many)
        out = await infer(request, ("classify",), payloads, [len(p) for p in payloads], body.many)
        return _json({"results": out})

    @app.post("/v1/generate", response_model=GenerateResponse, dependencies=[Depends(authorized)])
    async def generate(body: GenerateRequest, request: Request) -> Any:
        """Continue each prompt (a decoder): up to max_new_tokens, sampled or greedy."""
        require("generate")
        check_count(body.texts)
        if body.max_new_tokens > settings.max_new_tokens:
            raise InputError(
                f"max_new_tokens = {body.max_new_tokens} is over this server's "
                f"limit of {settings.max_new_tokens} (--max-new-tokens)",
                ("body", "max_new_tokens"),
            )
        texts, passages = body.texts, None
        if body.retrieve is not None:  # questions → prompts with retrieved passages
            texts, passages = await need(retrieval).prompts(
                body.texts, body.retrieve.k, body.retrieve.mode, body.max_new_tokens)
        payloads = engine.prepare_generate(texts, body.many)
        key = ("generate", body.max_new_tokens, body.temperature, body.top_k, body.top_p, body.seed)
        out = await infer(request, key, payloads, [len(p) for p in payloads], body.many)
        if passages is not None:
            out = [{**o, "passages": p} for o, p in zip(out, passages)]
        return _json({"results": out})

    @app.get("/v1/model", dependencies=[Depends(authorized)])
    async def model_info() -> dict:
        """What is loaded, what it serves, and the server's limits."""
        return {
            **engine.describe(),
            "limits": {
                "max_batch_size": settings.max_batch_size,
                "max_wait_ms": settings.max_wait_ms,
                "max_queue": settings.max_queue,
                "max_inputs": settings.max_inputs,
                "max_body_bytes": settings.max_body_bytes,
                "max_new_tokens": settings.max_new_tokens,
                "request_timeout_s": settings.request_timeout_s,
            },
        }

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness: the process answers and its inference worker is alive."""
        thread = batcher._thread
        alive = thread is not None and thread.is_alive()
        return JSONResponse(
            {"status": "ok" if alive else "worker stopped"}, status_code=200 if alive else 500
        )

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: accepting work and the queue has room (else 503: send traffic elsewhere)."""
        depth = batcher.queue_depth
        ready = batcher.accepting and depth < settings.max_queue
        state = "ready" if ready else ("shutting down" if not batcher.accepting else "queue full")
        return JSONResponse(
            {"status": state, "queue_depth": depth, "tasks": sorted(engine.tasks)},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics", dependencies=[Depends(authorized)])
    async def prometheus() -> PlainTextResponse:
        """Prometheus text format: requests, latency and batch-size histograms, queue depth."""
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE)

    # Outermost first: every answer is metered, including the 413s of the body limit.
    app.add_middleware(_JsonBody)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(_Metered, metrics=metrics)
    return app


class _AsciiJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def _json(content: dict) -> JSONResponse:
    """The engine's results are plain JSON-ready Python already: answering with a response
    object skips FastAPI's re-validation of them (the response models still document them)."""
    return JSONResponse(content)


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone (the request body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
