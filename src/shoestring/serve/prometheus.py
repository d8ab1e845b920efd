"""Prometheus metrics for one server process, kept with ``prometheus-client``.

Each `ServeMetrics` owns its own ``CollectorRegistry`` (not the library's global one), so
several servers in one process (tests, benchmarks) never share or clash on series. Gauges are
read at scrape time (``set_function``), so they are never stale. ``tokens_per_second`` is the
real (unpadded) tokens computed over the last `RATE_WINDOW_S` seconds, the number an
operator watches to see the engine's throughput without a Prometheus ``rate()`` query.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from shoestring.inference.laps import StageTimes

# No ``*_created`` series: they double the output and nothing here reads them.
prometheus_client.disable_created_metrics()

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
RATE_WINDOW_S = 10.0


class TokenRate:
    """Tokens per second over a sliding window (thread-safe: the worker adds, a scrape reads)."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, tokens: int, now: float | None = None) -> None:
        with self._lock:
            self._events.append((time.monotonic() if now is None else now, tokens))

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._events and self._events[0][0] < now - self.window_s:
                self._events.popleft()
            return sum(n for _, n in self._events) / self.window_s


class ServeMetrics:
    """Every number the server reports, named ``shoestring_*``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.requests = Counter("shoestring_requests_total",
                                "HTTP requests answered, by endpoint and status code.",
                                ("endpoint", "status"), registry=reg)
        self.latency = Histogram("shoestring_request_duration_seconds",
                                 "Time from request to response, by endpoint.", ("endpoint",),
                                 buckets=LATENCY_BUCKETS, registry=reg)
        self.batch_size = Histogram("shoestring_batch_size", "Inputs per model call, by task.",
                                    ("task",), buckets=BATCH_BUCKETS, registry=reg)
        self.batch_seconds = Histogram("shoestring_batch_duration_seconds",
                                       "Model time per batch, by task.", ("task",),
                                       buckets=LATENCY_BUCKETS, registry=reg)
        self.batch_tokens = Histogram(
            "shoestring_batch_padded_tokens",
            "Padded token positions per model call (what --max-batch-tokens bounds), by task.",
            ("task",), buckets=BATCH_TOKEN_BUCKETS, registry=reg)
        self.tokens = Counter("shoestring_batch_tokens_total",
                              "Token positions computed, by task and kind (real or padding).",
                              ("task", "kind"), registry=reg)
        self.dropped = Counter(
            "shoestring_dropped_inputs_total",
            "Queued inputs dropped before inference, by reason (disconnected, timeout, cancelled).",
            ("reason",), registry=reg)
        self.failed = Counter(
            "shoestring_failed_inputs_total",
            "Inputs whose inference raised (their batch-mates were retried alone).",
            ("task",), registry=reg)
        self.refused = Counter(
            "shoestring_refused_requests_total",
            "Requests refused for a limit, by the limit (max_concurrent_requests, max_queue, "
            "max_client_batch).", ("limit",), registry=reg)
        self.closed = Counter(
            "shoestring_closed_connections_total",
            "Connections the server closed itself, by reason (idle, head_timeout, unread, "
            "evicted, refused, header_too_large, bad_request).", ("reason",), registry=reg)
        self.streams = Counter("shoestring_streams_total",
                               "Streamed generations ended, by finish reason (stop, length, "
                               "cancelled: the client went away).", ("finish_reason",),
                               registry=reg)
        self.streamed_tokens = Counter("shoestring_streamed_tokens_total",
                                       "Tokens generated for streams.", registry=reg)
        self.stages = StageTimes()  # shoestring_stage_seconds, shoestring_stage_cpu_seconds_total
        reg.register(self.stages)
        self.rate = TokenRate()
        self._by_task: dict[str, tuple] = {}
        self.add_gauge("shoestring_tokens_per_second",
                       f"Real tokens computed per second over the last {RATE_WINDOW_S:g} s.",
                       self.rate.rate)

    def observe_batch(self, task: str, seconds: float, lengths: list[int], padded: int) -> None:
        """One model call: its size, time, padded tokens and real tokens."""
        real = sum(lengths)
        size, duration, tokens, real_n, padding = self._batch_series(task)
        size.observe(len(lengths))
        duration.observe(seconds)
        tokens.observe(padded)
        real_n.inc(real)
        padding.inc(padded - real)
        self.rate.add(real)

    def _batch_series(self, task: str) -> tuple:
        """``observe_batch``'s five series for ``task`` (``labels()`` costs microseconds a
        call: each is looked up once)."""
        series = self._by_task.get(task)
        if series is None:
            series = self._by_task[task] = (
                self.batch_size.labels(task=task), self.batch_seconds.labels(task=task),
                self.batch_tokens.labels(task=task), self.tokens.labels(task=task, kind="real"),
                self.tokens.labels(task=task, kind="padding"))
        return series

    def add_gauge(self, name: str, help: str, read: Callable[[], float]) -> None:
        Gauge(name, help, registry=self.registry).set_function(read)

    def render(self) -> bytes:
        return generate_latest(self.registry)
