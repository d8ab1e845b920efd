"""Retrieval on the HTTP API: ``POST /v1/search`` and ``/v1/generate``'s ``retrieve`` option.

Started with ``shoestring serve RUN --index INDEX_DIR`` (docs/retrieval.md). The index (and
its encoder, for dense and hybrid search) is loaded once beside the served model; searches run
on a worker thread, one at a time (they are milliseconds; the encoder is small), never on the
event loop. With ``retrieve: {k, mode}`` each prompt of a generate request is treated as a
question: its passages are retrieved and put before it within the decoder's context (the
policy of ``shoestring.retrieval.prompt``), and each result carries the passages it used.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from shoestring.errors import ShoestringError
from shoestring.inference.engine import Engine, InputError


class SearchRequest(BaseModel):
    """Find the passages of the server's index that best match ``query``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    query: Annotated[str, Field(min_length=1, pattern=r"\S",
                                description="what to look for (not blank)")]
    k: Annotated[int, Field(ge=1, le=100)] = Field(5, description="passages to return")
    mode: Literal["bm25", "dense", "hybrid"] = Field("hybrid", description="retrieval mode")


class Retrieval:
    """The server's index, searched one request at a time on a worker thread."""

    def __init__(self, index_dir: str) -> None:
        from shoestring.retrieval.index import RetrievalIndex

        self.index = RetrievalIndex(index_dir)
        if self.index.has_dense:
            self.index.embedder()  # load (and check) the encoder now, not on the first query
        self._lock = threading.Lock()

    def _locked(self, fn: Any, *args: Any) -> Any:
        with self._lock:
            return fn(*args)

    async def search(self, query: str, k: int, mode: str, loc: tuple) -> list:
        try:
            return await asyncio.to_thread(self._locked, self.index.search, query, k, mode)
        except ShoestringError as e:
            raise InputError(e.message, loc) from None

    async def prompts(self, questions: list[str], k: int, mode: str, max_new_tokens: int,
                      engine: Engine) -> tuple[list[str], list[list[dict]]]:
        """Each question → (its prompt with retrieved passages, the passages used), sized
        for ``engine``: the decoder the request was routed to."""
        from shoestring.retrieval.ask import decoder_context
        from shoestring.retrieval.prompt import build_prompt

        texts, used = [], []
        for i, q in enumerate(questions):
            loc = ("body", "inputs", i) if len(questions) > 1 else ("body", "inputs")
            hits = await self.search(q, k, mode, ("body", "retrieve"))
            try:
                prompt = build_prompt(q, hits, engine.tokenizer, decoder_context(engine),
                                      max_new_tokens)
            except ShoestringError as e:
                raise InputError(e.message, loc) from None
            texts.append(prompt.text)
            used.append([{**h.to_dict(), "truncated": prompt.truncated and h is prompt.used[-1]}
                         for h in prompt.used])
        return texts, used


def attach_retrieval(app: FastAPI, index_dir: str | None, authorized: Any) -> Retrieval | None:
    """Add ``/v1/search`` to ``app``; the loaded index (None without one) for generate."""
    retrieval = Retrieval(index_dir) if index_dir else None

    @app.post("/v1/search", dependencies=[Depends(authorized)])
    async def search(body: SearchRequest) -> Any:
        """The k best passages of the server's index for the query, with their sources."""
        hits = await need(retrieval).search(body.query, body.k, body.mode, ("body", "mode"))
        return {"results": [h.to_dict() for h in hits]}

    return retrieval


def need(retrieval: Retrieval | None) -> Retrieval:
    if retrieval is None:
        raise HTTPException(404, "this server has no index: start it with "
                            "shoestring serve RUN --index INDEX_DIR (docs/retrieval.md)")
    return retrieval
