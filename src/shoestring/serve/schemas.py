"""Request and response bodies of the HTTP API, as typed pydantic models.

Requests are strict (a number where text belongs is a 422, not silently converted) and
closed (an unknown field is a 422 naming it, so a typo like ``topk`` is not ignored). Numbers
must be finite (JSON's ``NaN``/``Infinity``, which Python's parser accepts, are a 422) and in
range, including ranges the sampler needs (a temperature of 1e-300 overflows the logits).
Every model endpoint takes ``inputs``: one text, or a list of texts answered in order.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError


def _encodable(text: str, where: str) -> None:
    """JSON may carry lone surrogates (``"\\ud800"``), which are not text: refuse them here
    (422), before the tokenizer fails on them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError(
            "invalid_unicode",
            "{where} has a lone surrogate (U+{code}) at character {pos}: send valid Unicode text",
            {"where": where, "code": f"{ord(text[e.start]):04X}", "pos": e.start}) from None


STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
MIN_TEMPERATURE = 0.01  # below it logits / temperature overflow float32: sampling is greedy
MIN_TOP_P = 1e-6  # the smallest probability mass worth asking for (smaller: use top_k=1)


class _Request(BaseModel):
    model_config = STRICT

    inputs: str | list[str] = Field(description="one text, or a list of texts")
    model: str | None = Field(None, description="which served model answers: NAME or "
                              "NAME:VERSION|TAG (default: the first)")

    @field_validator("inputs")
    @classmethod
    def _not_empty(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list):
            if not v:
                raise PydanticCustomError("empty_inputs",
                                          "inputs is an empty list: send at least one text")
            for i, t in enumerate(v):
                if not t.strip():
                    raise PydanticCustomError("empty_text", "inputs[{i}] is empty: every text "
                                              "needs some content", {"i": i})
                _encodable(t, f"inputs[{i}]")
        elif not v.strip():
            raise PydanticCustomError("empty_text", "the text is empty: send some content")
        else:
            _encodable(v, "the text")
        return v

    @property
    def many(self) -> bool:
        return isinstance(self.inputs, list)

    @property
    def texts(self) -> list[str]:
        return list(self.inputs) if isinstance(self.inputs, list) else [self.inputs]


class FillMaskRequest(_Request):
    """Predict the token at each ``[MASK]`` in each text."""

    top_k: Annotated[int, Field(ge=1, le=100)] = Field(5, description="candidates per mask")


class EmbedRequest(_Request):
    """One vector per text from the encoder's last hidden states."""

    pooling: Literal["mean", "cls"] = Field("mean", description="mean over tokens, or [CLS]")
    normalize: bool = Field(True, description="scale each vector to unit length")


class ClassifyRequest(_Request):
    """Labels (or a value, for regression) from a fine-tuned classifier."""

    pairs: list[str] | None = Field(
        None, description="second texts, one per input, for pair tasks (e.g. paraphrase)")

    @field_validator("pairs")
    @classmethod
    def _pairs_encodable(cls, v: list[str] | None) -> list[str] | None:
        for i, t in enumerate(v or []):
            _encodable(t, f"pairs[{i}]")
        return v


class RetrieveOption(BaseModel):
    """Generate with retrieval: each input is a question; passages go before it."""

    model_config = STRICT

    k: Annotated[int, Field(ge=1, le=50)] = Field(5, description="passages to retrieve")
    mode: Literal["bm25", "dense", "hybrid"] = Field("hybrid", description="retrieval mode")


class GenerateRequest(_Request):
    """Continue each prompt with a decoder."""

    max_new_tokens: Annotated[int, Field(ge=1)] = Field(32, description="tokens to add at most")
    temperature: Annotated[float, Field(ge=0.0, le=10.0)] = Field(
        1.0, description=f"0 = greedy; else {MIN_TEMPERATURE}–10, higher = more random")
    top_k: Annotated[int, Field(ge=1)] | None = Field(None,
                                                      description="sample from the k likeliest")
    top_p: Annotated[float, Field(ge=MIN_TOP_P, le=1.0)] | None = Field(
        None, description="sample from the smallest set with this much probability")
    seed: Annotated[int, Field(ge=0, lt=1 << 63)] | None = Field(
        None, description="make sampling repeatable (such a request runs in its own batch)")
    retrieve: RetrieveOption | None = Field(
        None, description="retrieve passages from the server's --index for each input "
        "(docs/retrieval.md); each result then lists the passages used")
    stream: bool = Field(
        False, description="send tokens as server-sent events as they are made (one prompt)")

    @field_validator("temperature")
    @classmethod
    def _samplable(cls, v: float) -> float:
        if 0.0 < v < MIN_TEMPERATURE:
            raise PydanticCustomError(
                "temperature_too_small", "temperature {v} is too small to sample with (the logits "
                "overflow): send 0 for greedy decoding, or at least {least}",
                {"v": v, "least": MIN_TEMPERATURE})
        return v


# --- responses --------------------------------------------------------------------------------


class Candidate(BaseModel):
    token: str
    id: int
    score: float


class MaskPrediction(BaseModel):
    position: int = Field(description="token index of the mask in the tokenized input")
    candidates: list[Candidate]


class FillMaskResponse(BaseModel):
    results: list[list[MaskPrediction]] = Field(description="per input, per mask")


class EmbedResponse(BaseModel):
    embeddings: list[list[float]]
    dimensions: int


class Classification(BaseModel):
    label: str | None = None
    score: float | None = None
    scores: dict[str, float] | None = None
    value: float | None = None


class ClassifyResponse(BaseModel):
    results: list[Classification]


class Generation(BaseModel):
    text: str
    tokens: int
    finish_reason: Literal["stop", "length"]


class GenerateResponse(BaseModel):
    results: list[Generation]
