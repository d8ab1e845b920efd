"""Request and response bodies of the HTTP API, as typed pydantic models.

Requests are strict (a number where text belongs is a 422, not silently converted) and
closed (an unknown field is a 422 naming it, so a typo like ``topk`` is not ignored). Numbers
must be finite (JSON's ``NaN``/``Infinity``, which Python's parser accepts, are a 422) and in
range, including ranges the sampler needs (a temperature of 1e-300 overflows the logits).
Every model endpoint takes ``inputs`` (one text, or a list of texts answered in order) or
``input_ids`` (token ids a client tokenized itself: one input's ids, or a list of them), never
both. ``/v1/embed`` can answer each vector as base64 of its little-endian float32 bytes
(``encoding_format: "base64"``, OpenAI's shape) instead of a list of JSON numbers.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic import model_validator
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


def _texts(v: str | list[str], field: str, one: str = "the text") -> str | list[str]:
    """``field``'s text(s) checked: a list not empty, no text blank or with a lone surrogate
    (``one``: what a single text is called in the error)."""
    if isinstance(v, list):
        if not v:
            raise PydanticCustomError("empty_inputs", "{field} is an empty list: send at least "
                                      "one text", {"field": field})
        for i, t in enumerate(v):
            if not t.strip():
                raise PydanticCustomError("empty_text", "{field}[{i}] is empty: every text "
                                          "needs some content", {"field": field, "i": i})
            _encodable(t, f"{field}[{i}]")
    elif not v.strip():
        raise PydanticCustomError("empty_text", "{one} is empty: send some content", {"one": one})
    else:
        _encodable(v, one)
    return v


STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
MIN_TEMPERATURE = 0.01  # below it logits / temperature overflow float32: sampling is greedy
MIN_TOP_P = 1e-6  # the smallest probability mass worth asking for (smaller: use top_k=1)


def _token_ids(value: Any, field: str = "input_ids") -> list[list[int]]:
    """``field`` (token ids) as a list of id lists (one per input), its shape checked here so
    that an error names the place (``input_ids[1][3]``); the ids' range is the engine's
    check, which knows the vocabulary."""
    if not isinstance(value, list) or not value:
        raise PydanticCustomError("token_ids", "{field} must be a non-empty list of token ids "
                                  "(one input) or of such lists (several inputs)",
                                  {"field": field})
    many = isinstance(value[0], list)
    lists = value if many else [value]
    for i, ids in enumerate(lists):
        where = f"{field}[{i}]" if many else field
        if not isinstance(ids, list):
            raise PydanticCustomError("token_ids", "{where} is not a list of token ids",
                                      {"where": where})
        if not ids:
            raise PydanticCustomError("token_ids", "{where} is empty: every input needs at "
                                      "least one token id", {"where": where})
        for j, t in enumerate(ids):
            if type(t) is not int:
                raise PydanticCustomError(
                    "token_ids", "{where}[{j}] is {value}, not a token id (an integer)",
                    {"where": where, "j": j, "value": repr(t)})
    return lists


class _Request(BaseModel):
    model_config = STRICT

    inputs: str | list[str] | None = Field(None, description="one text, or a list of texts")
    input_ids: list[int] | list[list[int]] | None = Field(
        None, description="instead of inputs: token ids as the served tokenizer writes them "
        "(special tokens included), one input's or a list of inputs'")
    model: str | None = Field(None, description="which served model answers: NAME or "
                              "NAME:VERSION|TAG (default: the first)")

    @field_validator("inputs")
    @classmethod
    def _not_empty(cls, v: str | list[str] | None) -> str | list[str] | None:
        return v if v is None else _texts(v, "inputs")

    @field_validator("input_ids", mode="wrap")
    @classmethod
    def _ids_shape(cls, v: Any, handler: Any) -> Any:
        # The type's own (Rust) validation first; only a body it refuses, or an empty list
        # it lets through, is walked in Python, for an error that names the place.
        try:
            out = handler(v)
        except ValidationError:
            _token_ids(v)
            raise
        if out is not None:
            lists = out if out and isinstance(out[0], list) else [out]
            if not out or not all(lists):
                _token_ids(out)  # raises, naming the empty list
        return out

    @model_validator(mode="after")
    def _one_kind_of_input(self) -> _Request:
        if self.inputs is None and self.input_ids is None:
            raise PydanticCustomError("missing", "Field required: send inputs (one text or a "
                                      "list of texts) or input_ids (token ids)")
        if self.inputs is not None and self.input_ids is not None:
            raise PydanticCustomError("input_kinds", "send inputs (texts) or input_ids (token "
                                      "ids), not both")
        return self

    @property
    def many(self) -> bool:
        """Whether the body holds a list of inputs (errors then name ``inputs[i]``)."""
        if self.input_ids is not None:
            return isinstance(self.input_ids[0], list)
        return isinstance(self.inputs, list)

    @property
    def field(self) -> str:
        """The body field the inputs came in."""
        return "inputs" if self.input_ids is None else "input_ids"

    @property
    def count(self) -> int:
        return len(self.id_lists if self.input_ids is not None else self.texts)

    @property
    def texts(self) -> list[str]:
        if self.inputs is None:
            return []
        return list(self.inputs) if isinstance(self.inputs, list) else [self.inputs]

    @property
    def id_lists(self) -> list[list[int]]:
        ids = self.input_ids
        if ids is None:
            return []
        return ids if isinstance(ids[0], list) else [ids]  # type: ignore[list-item,return-value]


class FillMaskRequest(_Request):
    """Predict the token at each ``[MASK]`` in each text."""

    top_k: Annotated[int, Field(ge=1, le=100)] = Field(5, description="candidates per mask")


class EmbedRequest(_Request):
    """One vector per text from the encoder's last hidden states."""

    pooling: Literal["mean", "cls"] | None = Field(
        None, description="mean over tokens, or [CLS]; unset: the model's own (/v1/model "
        "shows it: mean for shoestring's models, a sentence-transformers folder's pooling)")
    normalize: bool | None = Field(
        None, description="scale each vector to unit length; unset: the model's own (true "
        "for shoestring's models)")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="each vector as a list of numbers, or as base64 of its "
        "little-endian float32 bytes (smaller, and exact)")


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


# --- other protocols' requests: OpenAI's embeddings, the rerank shape of Jina and Cohere ------


class EmbeddingsRequest(BaseModel):
    """OpenAI's ``POST /v1/embeddings``: the served model's pooled, normalized vectors (those
    `/v1/embed` answers with its defaults), with a token count. Unknown fields are refused
    (a 400 naming them), as OpenAI does."""

    model_config = STRICT

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="one text, a list of texts, one input's token ids, or a list of them "
        "(ids as the served tokenizer writes them, special tokens included)")
    model: str = Field(description="a served model's name, as GET /v1/models lists it")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="numbers, or base64 of little-endian float32 bytes")
    dimensions: Annotated[int, Field(ge=1)] | None = Field(
        None, description="the model's full width only: these models were not trained to "
        "shorten their vectors")
    user: str | None = Field(None, description="accepted and ignored")

    @field_validator("input", mode="wrap")
    @classmethod
    def _input_shape(cls, v: Any, handler: Any) -> Any:
        try:
            out = handler(v)
        except ValidationError:
            # One error saying what input may be, naming the place, not one per shape tried.
            if isinstance(v, list) and v and isinstance(v[0], str):
                i = next(i for i, t in enumerate(v) if not isinstance(t, str))
                raise PydanticCustomError(
                    "input_shape", "input[{i}] is {value}: a list of texts holds only texts",
                    {"i": i, "value": repr(v[i])}) from None
            if isinstance(v, list) and v:
                _token_ids(v, "input")
            raise PydanticCustomError(
                "input_shape", "input must be a text, a list of texts, a list of token ids "
                "or a list of token-id lists") from None
        if isinstance(out, str) or not out or isinstance(out[0], str):
            return _texts(out, "input", "input")
        if isinstance(out[0], list) and not all(out):
            _token_ids(out, "input")  # raises, naming the empty list
        return out

    def embed_request(self) -> EmbedRequest:
        """The same input as a `/v1/embed` body with that route's defaults (pooling,
        normalization), so both routes compute the same vectors."""
        v = self.input
        ids = isinstance(v, list) and not isinstance(v[0], str)
        return EmbedRequest.model_construct(inputs=None if ids else v,
                                            input_ids=v if ids else None, model=self.model)


class RerankDocument(BaseModel):
    """A document as Cohere's v1 API takes one: its ``text`` (other fields are ignored)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    text: str


class RerankRequest(BaseModel):
    """Documents ranked by relevance to a query, in the shape Jina's and Cohere's rerank APIs
    share: by a pair classifier's positive probability, or an encoder's cosine."""

    model_config = STRICT

    query: str = Field(description="the text the documents are ranked against")
    documents: list[str | RerankDocument] = Field(
        description="texts, or objects with a 'text' field (Cohere's v1 shape)")
    top_n: Annotated[int, Field(ge=1)] | None = Field(
        None, description="answer the best n only (default: all)")
    return_documents: bool = Field(False, description="include each document's text")
    model: str | None = Field(None, description="which served model ranks: NAME or "
                              "NAME:VERSION|TAG (default: the first)")

    @field_validator("query")
    @classmethod
    def _query_text(cls, v: str) -> str:
        return _texts(v, "query", "query")  # type: ignore[return-value]

    @field_validator("documents")
    @classmethod
    def _document_texts(cls, v: list[str | RerankDocument]) -> list[str]:
        return _texts([d if isinstance(d, str) else d.text for d in v],  # type: ignore[return-value]
                      "documents")

    # What the request path reads of a body (`handlers.Api`): documents are its inputs.
    input_ids: ClassVar[None] = None
    many: ClassVar[bool] = True
    field: ClassVar[str] = "documents"

    @property
    def texts(self) -> list[str]:
        return self.documents  # type: ignore[return-value]

    @property
    def count(self) -> int:
        return len(self.documents)


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
    embeddings: list[list[float]] | list[str] = Field(
        description="one vector per input: numbers, or base64 strings with encoding_format "
        "base64 (decode: numpy.frombuffer(base64.b64decode(s), '<f4'))")
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


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int = Field(description="token positions the model read, special tokens "
                               "included")
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class RerankDocumentText(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int = Field(description="the document's place in the request")
    relevance_score: float
    document: RerankDocumentText | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    model: str
    results: list[RerankResult] = Field(description="best first")
    usage: RerankUsage
