"""A model request's path, whichever way it came in: authorize, pick the model, check the
input count, queue one job per input, wait, and build the answer.

Both ways in call these methods: the fast path (`fastpath`, in the HTTP protocol itself) for
the common case and the FastAPI routes (`app`) for the rest, so both give the same answers.
Texts are queued as text: the batcher's worker tokenizes everything queued at once, off the
event loop (`batcher`, `inference.engine.Engine.tokenize`). Token ids a client sent
(``input_ids``) are checked here on the event loop (inside the vocabulary, within
``--max-length``), which costs microseconds.

While a request waits for its results it also watches for its client disconnecting (once it
has waited `WATCH_AFTER_S`; its queued jobs are then dropped before they cost compute) and
for its deadline (504).

Two other protocols' routes run on the same steps: OpenAI's ``/v1/embeddings`` is
`/v1/embed` with its defaults, answered in OpenAI's shape with the token count; ``/v1/rerank``
(Jina's and Cohere's shape) scores each document against the query with a pair classifier
(the positive label's probability, or the regression value) or an encoder (cosine).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse

from shoestring.serve.answers import ClientGone, Timeout
from shoestring.serve.batcher import Job
from shoestring.serve.encoding import embeddings_answer, openai_embeddings_answer
from shoestring.inference.engine import Engine, InputError, input_loc
from shoestring.serve.prometheus import ServeMetrics
from shoestring.serve.retrieval_routes import need
from shoestring.serve.routing import ModelRouter, Slot, UnknownModel
from shoestring.serve.schemas import ClassifyRequest, EmbeddingsRequest, EmbedRequest
from shoestring.serve.schemas import FillMaskRequest, GenerateRequest, RerankRequest
from shoestring.serve.security import MISSING_KEY, ApiKey, Receive, Refused
from shoestring.serve.settings import ServeSettings
from shoestring.inference.laps import Laps
from shoestring.serve.streaming import TokenStream, events

# A request waiting longer than this for its results starts watching for its client leaving.
WATCH_AFTER_S = 0.05


@dataclass
class Api:
    """What every handler of one app shares: the models, the limits, the metrics and the key;
    its methods are the steps of a request's path."""

    router: ModelRouter
    settings: ServeSettings
    metrics: ServeMetrics
    api_key: ApiKey | None
    retrieval: Any = None  # the /v1/search index, when --index was given

    async def authorized(self, request: Request) -> None:  # async: a sync one costs a thread hop
        if self.api_key is not None and not self.api_key.check(request.headers):
            raise HTTPException(401, MISSING_KEY, headers={"WWW-Authenticate": "Bearer"})

    async def slot_for(self, body: Any, task: str | None) -> Slot:
        """The model ``body.model`` names, once the input count is within the limit (413) and
        that model can do ``task`` (404; None: not checked here)."""
        # More inputs than one batch holds are split across batches; above the client-batch
        # limit the request is refused whole (TEI's 413).
        limit, count = self.settings.max_client_batch, body.count
        if count > limit:
            self.metrics.refused.labels(limit="max_client_batch").inc()
            raise Refused(413, f"{count} inputs in one request; this server takes at "
                          f"most {limit} (--max-client-batch): split the request",
                          "max_client_batch", limit)
        slot = self.router.loaded(body.model) or await self.router.slot_for(body.model)
        engine = slot.engine
        if task is not None and task not in engine.tasks:
            served = ", ".join(f"/v1/{t}" for t in sorted(engine.tasks))
            raise HTTPException(404, f"this server's model is {_article(engine.kind)} "
                                f"{engine.kind}, which does not do {task}; it serves {served}")
        return slot

    def jobs(self, slot: Slot, key: tuple, body: Any, admit: Callable[..., tuple[Any, int]],
             options: tuple = (), texts: list[Any] | None = None) -> list[Job]:
        """One job per input: token ids admitted now (422 here on a bad one), texts (or
        ``texts``, e.g. (text, pair) tuples) queued for the worker to tokenize and admit."""
        many = body.many
        if body.input_ids is not None:
            check = slot.engine.check_ids
            out = []
            for i, ids in enumerate(body.id_lists):
                loc = input_loc(i, many, "input_ids")
                payload, length = admit(check(ids, loc), loc, *options)
                out.append(Job(key, length, payload))
            return out
        field = body.field
        return [Job(key, -1, None, text=t, finish=admit, loc=input_loc(i, many, field),
                    options=options) for i, t in enumerate(texts or body.texts)]

    async def infer(self, receive: Receive, jobs: list[Job], many: bool, slot: Slot,
                    field: str = "inputs", laps: Laps | None = None) -> list[Any]:
        """Queue ``jobs`` on ``slot``'s batcher and wait for the first of: the results, the
        client going away (jobs dropped), the deadline (504)."""
        batcher = slot.batcher
        results = batcher.submit_request(jobs)
        if laps is not None:
            laps.lap("submit", len(jobs))
        try:
            first = await _first_of(results, receive, self.settings.request_timeout_s)
        except asyncio.CancelledError:  # the server gave up on this request (forced shutdown)
            batcher.cancel(jobs, "cancelled")
            results.cancel()
            raise
        if first != "results":
            batcher.cancel(jobs, first)
            results.cancel()
            raise ClientGone() if first == "disconnected" else Timeout()
        out = results.result()  # raises the admission error that refused an input (422)
        for i, r in enumerate(out):
            if isinstance(r, InputError):
                raise r
            if isinstance(r, BaseException):
                where = f"{field}[{i}]" if many else "the input"
                raise HTTPException(500, f"inference failed for {where}: {type(r).__name__}: {r}")
        return out

    async def _run(self, task: str, body: Any, receive: Receive, laps: Laps | None,
                   admit_name: str, key: tuple, options: tuple = (),
                   texts: list[Any] | None = None, slot: Slot | None = None) -> list[Any]:
        return (await self._run_jobs(task, body, receive, laps, admit_name, key, options,
                                     texts, slot))[0]

    async def _run_jobs(self, task: str, body: Any, receive: Receive, laps: Laps | None,
                        admit_name: str, key: tuple, options: tuple = (),
                        texts: list[Any] | None = None,
                        slot: Slot | None = None) -> tuple[list[Any], list[Job]]:
        """The results of ``body``'s inputs, and their jobs (each with the token positions
        the model read: what the usage counts of other protocols report)."""
        slot = slot or await self.slot_for(body, task)
        if laps is not None:
            laps.resume()  # the loop may have run other requests since this one's last lap
        jobs = self.jobs(slot, key, body, getattr(slot.engine, admit_name), options, texts)
        if laps is not None and body.input_ids is not None:
            laps.lap("tokenize", len(jobs))  # token ids admitted on the event loop
        out = await self.infer(receive, jobs, body.many, slot, body.field, laps)
        if laps is not None:
            laps.skip()  # waiting: the other stages are timed where they run
        return out, jobs

    async def able_slot(self, body: Any, can: Callable[[Engine], bool], doing: str) -> Slot:
        """The model ``body.model`` names if it ``can``; else 404 naming the served models
        that can (what OpenAI's and the rerank protocols answer for a model they lack)."""
        try:
            slot: Slot | None = await self.slot_for(body, None)
        except UnknownModel:
            slot = None
        if slot is None or not can(slot.engine):
            name = body.model or self.router.default.name
            able = self.router.able(can)
            kind = "" if slot is None else slot.engine.kind
            why = (f"this server serves no model {name!r}" if slot is None else
                   f"model {name!r} is {_article(kind)} {kind}, which cannot {doing}")
            raise HTTPException(404, f"{why}; " + (
                f"send model set to one that can: {', '.join(able)}" if able
                else f"no model this server serves can {doing}"))
        return slot

    # --- the endpoints: a validated body in, the answer's content out ----------------------

    async def fill_mask(self, body: FillMaskRequest, receive: Receive,
                        laps: Laps | None = None) -> dict[str, Any]:
        out = await self._run("fill-mask", body, receive, laps, "admit_fill_mask",
                              ("fill-mask",), (body.top_k,))
        return {"results": out}

    async def embed(self, body: EmbedRequest, receive: Receive,
                    laps: Laps | None = None) -> dict[str, Any]:
        out, _ = await self._embed(body, receive, laps)
        return embeddings_answer(out, body.encoding_format)

    async def _embed(self, body: EmbedRequest, receive: Receive, laps: Laps | None,
                     slot: Slot | None = None) -> tuple[list[Any], int]:
        """The vectors of ``body``'s inputs and the token positions the model read."""
        out, jobs = await self._run_jobs("embed", body, receive, laps, "admit_embed", ("embed",),
                                         (body.pooling, body.normalize), slot=slot)
        return out, sum(j.length for j in jobs)

    async def openai_embeddings(self, body: EmbeddingsRequest, receive: Receive,
                                laps: Laps | None = None) -> dict[str, Any]:
        """OpenAI's embeddings: `/v1/embed`'s vectors (its defaults) in OpenAI's answer."""
        request = body.embed_request()
        slot = await self.able_slot(request, _embeds, "embed")
        out, tokens = await self._embed(request, receive, laps, slot)
        width = len(out[0])
        if body.dimensions is not None and body.dimensions != width:
            raise InputError(f"dimensions = {body.dimensions}, but this model's embeddings "
                             f"have {width} and it was not trained to shorten them (no "
                             f"Matryoshka training): leave dimensions out or send {width}",
                             ("body", "dimensions"))
        return openai_embeddings_answer(out, body.encoding_format, body.model, tokens)

    async def rerank(self, body: RerankRequest, receive: Receive,
                     laps: Laps | None = None) -> dict[str, Any]:
        """The documents by relevance to the query, best first: a pair classifier's
        probability of its positive (last) label, or its regression value; an encoder's
        cosine between the query's and each document's vector (`/v1/embed`'s defaults)."""
        slot = await self.able_slot(body, reranks, "rerank")
        engine = slot.engine
        try:
            if _embeds(engine):
                texts = [body.query, *body.documents]
                out, tokens = await self._embed(
                    EmbedRequest.model_construct(inputs=texts, model=body.model), receive, laps,
                    slot)
                scores = _cosines(out[0], out[1:])
            else:
                out, jobs = await self._run_jobs(
                    "classify", body, receive, laps, "admit_classify", ("classify",),
                    texts=[(body.query, d) for d in body.documents], slot=slot)
                positive = engine.labels[-1]  # type: ignore[attr-defined]
                scores = [r["value"] if "value" in r else r["scores"][positive] for r in out]
                tokens = sum(j.length for j in jobs)
        except InputError as e:
            raise InputError(e.message, _rerank_loc(e.loc)) from None
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.top_n]
        docs = body.documents
        results = [{"index": i, "relevance_score": scores[i], "document": {"text": docs[i]}}
                   if body.return_documents else {"index": i, "relevance_score": scores[i]}
                   for i in order]
        return {"model": body.model or self.router.default.name, "results": results,
                "usage": {"total_tokens": tokens}}

    async def classify(self, body: ClassifyRequest, receive: Receive,
                       laps: Laps | None = None) -> dict[str, Any]:
        slot = await self.slot_for(body, "classify")
        slot.engine.check_pairs(body.count, body.pairs, body.input_ids is not None)
        texts = None if body.pairs is None else list(zip(body.texts, body.pairs))
        out = await self._run("classify", body, receive, laps, "admit_classify",
                              ("classify",), texts=texts, slot=slot)
        return {"results": out}

    async def generate(self, body: GenerateRequest, receive: Receive,
                       laps: Laps | None = None) -> dict[str, Any] | StreamingResponse:
        """Continuations of each prompt; with ``stream`` one prompt's tokens as server-sent
        events (a response the FastAPI route sends)."""
        slot = await self.slot_for(body, "generate")
        limit = self.settings.max_new_tokens
        if body.max_new_tokens > limit:
            raise InputError(f"max_new_tokens = {body.max_new_tokens} is over this server's "
                             f"limit of {limit} (--max-new-tokens)", ("body", "max_new_tokens"))
        texts, passages = None, None
        if body.retrieve is not None:  # questions → prompts with retrieved passages
            if body.input_ids is not None:
                raise InputError("retrieve needs questions as text: send them in 'inputs'",
                                 ("body", "input_ids"))
            texts, passages = await need(self.retrieval).prompts(
                body.texts, body.retrieve.k, body.retrieve.mode, body.max_new_tokens, slot.engine)
        options = (body.max_new_tokens, body.temperature, body.top_k, body.top_p, body.seed)
        if body.stream:
            if body.count != 1:
                raise InputError(f"stream takes one prompt, got {body.count}: send one per "
                                 f"request", ("body", body.field))
            ids = (slot.engine.tokenize(texts or body.texts) if body.input_ids is None
                   else [slot.engine.check_ids(body.id_lists[0], ("body", "input_ids"))])
            prompt, _ = slot.engine.admit_generate(ids[0], input_loc(0, body.many, body.field))
            return self.stream_generation(slot, options, prompt)
        out = await self._run("generate", body, receive, laps, "admit_generate",
                              ("generate", *options), texts=texts, slot=slot)
        if passages is not None:
            out = [{**o, "passages": p} for o, p in zip(out, passages)]
        return {"results": out}

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


async def _first_of(results: asyncio.Future, receive: Receive, timeout: float) -> str:
    """Wait for ``results``, the client disconnecting or ``timeout`` seconds, whichever comes
    first: "results", "disconnected" or "timeout".

    Seeing a disconnect takes a task awaiting ``receive``, and a task per request costs the
    event loop (the server's bottleneck on a GPU) more than the rest of the request's
    hand-off. So a request starts watching only once it has waited `WATCH_AFTER_S`: answers
    that come sooner never pay for it, and the inputs of a client that gives up on a long
    wait are still dropped before they cost compute. ``asyncio.wait`` is not used for the
    same reason: the sets, futures and generator it builds per call."""
    loop = asyncio.get_running_loop()
    woken = loop.create_future()
    watcher: asyncio.Task | None = None

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    def watch() -> None:
        nonlocal watcher, timer
        watcher = loop.create_task(_disconnected(receive))
        watcher.add_done_callback(wake)
        timer = loop.call_later(timeout - WATCH_AFTER_S, wake)

    results.add_done_callback(wake)
    # One timer at a time (a timer costs the loop about as much as the rest of the wait):
    # the watch's, which then sets the timeout's for the time left.
    timer = (loop.call_later(WATCH_AFTER_S, watch) if timeout > WATCH_AFTER_S
             else loop.call_later(timeout, wake))
    try:
        await woken
    finally:
        timer.cancel()
        results.remove_done_callback(wake)
        left = False
        if watcher is not None:
            watcher.remove_done_callback(wake)
            left = watcher.done()
            watcher.cancel()
    return "results" if results.done() else "disconnected" if left else "timeout"


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone (the request body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _embeds(engine: Engine) -> bool:
    return "embed" in engine.tasks


def reranks(engine: Engine) -> bool:
    """Whether ``engine`` can rank documents: an encoder (by cosine), or a pair classifier
    with one relevance number per pair (two labels, or regression)."""
    if _embeds(engine):
        return True
    # pair None: a transformers classifier that takes single texts and pairs alike
    return ("classify" in engine.tasks and getattr(engine, "pair", False) is not False
            and (engine.problem == "regression"  # type: ignore[attr-defined]
                 or len(engine.labels) == 2))  # type: ignore[attr-defined]


def _cosines(query: Any, documents: list[Any]) -> list[float]:
    q = np.asarray(query, dtype=np.float64)
    d = np.asarray(documents, dtype=np.float64)
    norms = np.linalg.norm(d, axis=1) * np.linalg.norm(q)
    return (d @ q / np.maximum(norms, 1e-12)).tolist()


def _rerank_loc(loc: tuple) -> tuple:
    """An embedding rerank's input error placed in the rerank body: input 0 was the query,
    input i the document i - 1."""
    if loc[:2] != ("body", "inputs") or len(loc) < 3:
        return loc
    return ("body", "query") if loc[2] == 0 else ("body", "documents", loc[2] - 1)


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
