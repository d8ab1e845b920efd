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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse

from shoestring.serve.answers import ClientGone, Timeout
from shoestring.serve.batcher import Job
from shoestring.serve.encoding import embeddings_answer
from shoestring.inference.engine import InputError, input_loc
from shoestring.serve.metrics import ServeMetrics
from shoestring.serve.retrieval_routes import need
from shoestring.serve.routing import ModelRouter, Slot
from shoestring.serve.schemas import ClassifyRequest, EmbedRequest, FillMaskRequest
from shoestring.serve.schemas import GenerateRequest
from shoestring.serve.security import MISSING_KEY, ApiKey, Receive, Refused
from shoestring.serve.settings import ServeSettings
from shoestring.inference.stages import Laps
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

    async def slot_for(self, body: Any, task: str) -> Slot:
        """The model ``body.model`` names, once the input count is within the limit (413) and
        that model can do ``task`` (404)."""
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
        if task not in engine.tasks:
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
        return [Job(key, -1, None, text=t, finish=admit, loc=input_loc(i, many),
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
        slot = slot or await self.slot_for(body, task)
        if laps is not None:
            laps.resume()  # the loop may have run other requests since this one's last lap
        jobs = self.jobs(slot, key, body, getattr(slot.engine, admit_name), options, texts)
        if laps is not None and body.input_ids is not None:
            laps.lap("tokenize", len(jobs))  # token ids admitted on the event loop
        out = await self.infer(receive, jobs, body.many, slot, body.field, laps)
        if laps is not None:
            laps.skip()  # waiting: the other stages are timed where they run
        return out

    # --- the endpoints: a validated body in, the answer's content out ----------------------

    async def fill_mask(self, body: FillMaskRequest, receive: Receive,
                        laps: Laps | None = None) -> dict[str, Any]:
        out = await self._run("fill-mask", body, receive, laps, "admit_fill_mask",
                              ("fill-mask",), (body.top_k,))
        return {"results": out}

    async def embed(self, body: EmbedRequest, receive: Receive,
                    laps: Laps | None = None) -> dict[str, Any]:
        out = await self._run("embed", body, receive, laps, "admit_embed", ("embed",),
                              (body.pooling, body.normalize))
        return embeddings_answer(out, body.encoding_format)

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


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
