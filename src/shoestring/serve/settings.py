"""The server's settings, validated up front: every limit that bounds memory and latency.

Each field is one `shoestring serve` flag (``max_batch_size`` ↔ ``--max-batch-size``); a bad
value is reported with the flag's name before any model is loaded.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic import model_validator

from shoestring.errors import ShoestringError

MIN_API_KEY_CHARS = 16


class ServeSettings(BaseModel):
    """How `shoestring serve` listens, batches, and protects itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="address to listen on (loopback by default)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 = any free port)")
    max_batch_tokens: int = Field(
        16384, ge=1, description="padded token positions (count × longest) per model call at most"
    )
    max_batch_size: int | None = Field(
        None, ge=1, le=65536, description="inputs per model call at most (default: tokens decide)"
    )
    max_wait_ms: float = Field(
        0.0, ge=0.0, le=10_000.0,
        description="how long the oldest input waits for batch-mates (0: start when free)")
    max_queue: int = Field(4096, ge=1, description="queued inputs before answering 429")
    max_concurrent_requests: int = Field(
        512, ge=1, description="requests being handled at once before answering 429"
    )
    max_length: int | None = Field(
        None, ge=4, description="tokens per input, special tokens included (default: the "
        "context the model was trained on; more than that is refused)")
    truncate: bool = Field(
        False, description="cut over-long inputs to max_length instead of answering 422"
    )
    max_client_batch: int = Field(
        1024, ge=1, description="texts in one request at most (split into batches; 413 above)"
    )
    max_body_bytes: int = Field(1 << 20, ge=256, description="request body size limit (413)")
    request_timeout_s: float = Field(
        30.0, gt=0.0, description="a request still unanswered after this gets 504"
    )
    body_timeout_s: float = Field(
        15.0, gt=0.0, le=3600.0, description="a request body not fully arrived this long after "
        "its headers gets 408 and the connection is closed (slow or stalled clients)")
    idle_timeout_s: float = Field(
        30.0, gt=0.0, le=3600.0, description="a connection is closed when it has not sent a "
        "whole request head this long after it opened or after its last answer, or has not "
        "read an answer for this long (idle, trickling and unread connections)")
    max_connections: int = Field(
        4096, ge=16, le=1_000_000, description="open connections at most: a new one beyond it "
        "closes the longest-idle connection, or is answered 503 when none is idle")
    max_header_bytes: int = Field(
        16384, ge=1024, le=1 << 20, description="a request's line and headers at most (431 "
        "and the connection closed above it)")
    shutdown_timeout_s: float = Field(
        30.0, ge=0.0, description="on shutdown, wait this long for in-flight requests"
    )
    max_new_tokens: int = Field(256, ge=1,
                                description="generation: the most tokens one request may ask")
    api_key: SecretStr | None = Field(
        None, description="require this key (Authorization: Bearer … or X-API-Key) on /v1 and "
        "/metrics")
    threads: int | None = Field(
        None, ge=1, description="torch threads for inference (default: torch's, one per core)"
    )
    index: str | None = Field(
        None, description="index dir for /v1/search and generate's retrieve option (docs/retrieval.md)"
    )
    workers: int = Field(1, ge=1, le=64, description="engine processes behind the one port")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "fp32", description="inference precision: fp32, bf16 autocast, or auto (bf16 where it is "
        "faster)")
    backend: Literal["auto", "torch", "onnx", "onnx-int8"] = Field(
        "auto", description="forward-pass runtime of encoders and classifiers: PyTorch, ONNX "
        "Runtime fp32 or int8, or auto (the fastest here that passes the accuracy gate; "
        "inference/backends.py)")

    @field_validator("api_key")
    @classmethod
    def _long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < MIN_API_KEY_CHARS:
            raise ValueError(
                f"the API key must be at least {MIN_API_KEY_CHARS} characters; generate one with "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ServeSettings:
        if self.max_length is not None and self.max_batch_tokens < self.max_length:
            raise ValueError(
                f"--max-batch-tokens ({self.max_batch_tokens}) must be at least --max-length "
                f"({self.max_length}): one input of the longest length must fit a batch"
            )
        if self.max_queue < self.max_client_batch:
            raise ValueError(
                f"--max-queue ({self.max_queue}) must be at least --max-client-batch "
                f"({self.max_client_batch}): the largest request must fit the queue"
            )
        return self

    @property
    def loopback(self) -> bool:
        """Whether only this machine can connect."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def make_settings(**values: object) -> ServeSettings:
    """`ServeSettings` from CLI values; a bad one is a ShoestringError naming its flag."""
    try:
        return ServeSettings(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        if not first["loc"]:  # a rule across fields: the message names their flags
            msg = str(first["msg"]).removeprefix("Value error, ")
            flag, _, rest = msg.partition(" ")
            raise ShoestringError(rest, where=flag) from None
        name = str(first["loc"][0])
        value = "***" if name == "api_key" else first.get("input")
        raise ShoestringError(f"{value!r} is not allowed: {first['msg']}",
                              where=_flag(name)) from None


def _flag(name: str) -> str:
    return "--" + name.removesuffix("_s").replace("_", "-")
