"""Answers to bytes: JSON through orjson, embeddings without Python float lists.

``json.dumps`` of Python float lists (each number made a Python float first, then printed
in Python) was a large share of the old server's CPU per ``/v1/embed`` request; orjson
writes a float32 NumPy row in C (the ``serialize`` stage: 0.007 ms per request in
bench/serve_cpu.py). So the engine hands embeddings over as float32 NumPy rows and this
module writes them: as JSON numbers (each the shortest decimal that reads back as the
same float32, as TEI writes them), or, with ``encoding_format: "base64"`` (OpenAI's
shape), as base64 of the row's little-endian float32 bytes, which decodes bit-exactly to the
same numbers and is about a third of the size.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def dumps(content: Any) -> bytes:
    """``content`` as compact UTF-8 JSON; NumPy arrays as lists of numbers, NaN as null."""
    return orjson.dumps(content, option=_OPTIONS)


def _base64(row: Any) -> str:
    return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()


def embeddings_answer(rows: Sequence[Any], encoding_format: str = "float") -> dict[str, Any]:
    """The ``/v1/embed`` answer for ``rows`` (float32 vectors), in the asked encoding."""
    dims = len(rows[0]) if len(rows) else 0
    if encoding_format == "base64":
        return {"embeddings": [_base64(r) for r in rows], "dimensions": dims}
    return {"embeddings": rows, "dimensions": dims}


def openai_embeddings_answer(rows: Sequence[Any], encoding_format: str, model: str,
                             tokens: int) -> dict[str, Any]:
    """OpenAI's embeddings answer for ``rows``; ``tokens``: the positions the model read."""
    b64 = encoding_format == "base64"
    return {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": _base64(r) if b64 else r}
                     for i, r in enumerate(rows)],
            "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


class FastJSON(Response):
    """A FastAPI/Starlette response written by `dumps`."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)
