"""Retrieve → prompt → generate: `shoestring ask` and serve's ``retrieve`` option."""

from __future__ import annotations

from typing import Any

from shoestring.errors import ShoestringError
from shoestring.retrieval.index import RetrievalIndex
from shoestring.retrieval.prompt import build_prompt
from shoestring.units import with_article


def decoder_context(engine: Any) -> int:
    """The decoder's context length: the sequence length it was trained at
    (`inference.engine.trained_context`, the server's --max-length default too)."""
    return int(engine.context or engine.meta["seq_len"])


def check_decoder(engine: Any, where: str) -> None:
    if "generate" not in engine.tasks:
        raise ShoestringError(
            f"this model is {with_article(engine.kind)}, which does not generate text", where=where,
            fix="give a decoder run (model.objective=clm) to answer questions")


def ask(engine: Any, index: RetrievalIndex, question: str, *, k: int = 5, mode: str = "hybrid",
        max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
        seed: int | None = 0) -> dict[str, Any]:
    """The decoder's answer to ``question`` with retrieved passages in its context; greedy at
    temperature 0, else sampled (``top_k``: from the k likeliest tokens) as serve samples."""
    context = decoder_context(engine)
    hits = index.search(question, k, mode, where="question")
    prompt = build_prompt(question, hits, engine.tokenizer, context, max_new_tokens)
    # One completion by the decoder engine: the same call serve's batcher makes.
    key = ("generate", max_new_tokens, temperature, top_k, None, seed)
    out = engine.run(key, engine.prepare_generate([prompt.text], many=False))[0]
    return {"answer": out["text"].strip(), "finish_reason": out["finish_reason"],
            "prompt_tokens": prompt.tokens, "context": context,
            "truncated": prompt.truncated, "passages": [h.to_dict() for h in prompt.used]}
