"""Prometheus metrics in the text exposition format (version 0.0.4), with no dependency.

A server needs four kinds of numbers, all cheap to keep: counters (requests by endpoint and
status), histograms (latency, batch size), and gauges read at scrape time (queue depth). The
format is small and stable, so this module writes it directly instead of pulling in a client
library; every update takes one lock, because the batcher's worker thread and the event loop
both record.
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Callable, Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    pairs = [*labels, *([extra] if extra else [])]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


class _Metric(abc.ABC):
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        self.name, self.help, self.labelnames = name, help, tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> Labels:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple((k, str(labels[k])) for k in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    @abc.abstractmethod
    def samples(self) -> list[str]:
        """The metric's sample lines in Prometheus text format."""


class Counter(_Metric):
    """A count that only goes up (per label set)."""

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(k)} {_num(v)}" for k, v in items]


class Gauge(_Metric):
    """A value read from a function at scrape time (so it is never stale)."""

    kind = "gauge"

    def __init__(self, name: str, help: str, read: Callable[[], float]) -> None:
        super().__init__(name, help)
        self._read = read

    def samples(self) -> list[str]:
        return [f"{self.name} {_num(self._read())}"]


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, buckets: Iterable[float], labelnames: Sequence[str] = ()
    ) -> None:
        super().__init__(name, help, labelnames)
        self.buckets = tuple(sorted(buckets))
        self._data: dict[Labels, list[float]] = {}  # per-bucket counts (+Inf last), sum, count

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            data = self._data.setdefault(key, [0.0] * (len(self.buckets) + 3))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    data[i] += 1
                    break
            else:
                data[len(self.buckets)] += 1
            data[-2] += value
            data[-1] += 1

    def count(self, **labels: str) -> float:
        with self._lock:
            data = self._data.get(self._key(labels))
            return data[-1] if data else 0.0

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._data.items())
        lines = []
        for key, data in items:
            cumulative = 0.0
            for bound, n in zip((*self.buckets, math.inf), data):
                cumulative += n
                lines.append(
                    f"{self.name}_bucket{_labels(key, ('le', _num(bound)))} {_num(cumulative)}"
                )
            lines.append(f"{self.name}_sum{_labels(key)} {_num(data[-2])}")
            lines.append(f"{self.name}_count{_labels(key)} {_num(data[-1])}")
        return lines


class Registry:
    """The metrics of one server; ``render()`` is the body of ``GET /metrics``."""

    def __init__(self) -> None:
        self._metrics: list[_Metric] = []

    def add(self, metric: _Metric) -> _Metric:
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for m in self._metrics:
            lines += m.header() + m.samples()
        return "\n".join(lines) + "\n"


class ServeMetrics:
    """Every number the server reports, named ``shoestring_*``."""

    def __init__(self) -> None:
        self.registry = Registry()
        add = self.registry.add
        self.requests: Counter = add(
            Counter(  # type: ignore[assignment]
                "shoestring_requests_total",
                "HTTP requests answered, by endpoint and status code.",
                ("endpoint", "status"),
            )
        )
        self.latency: Histogram = add(
            Histogram(  # type: ignore[assignment]
                "shoestring_request_duration_seconds",
                "Time from request to response, by endpoint.",
                LATENCY_BUCKETS,
                ("endpoint",),
            )
        )
        self.batch_size: Histogram = add(
            Histogram(  # type: ignore[assignment]
                "shoestring_batch_size", "Inputs per model call, by task.", BATCH_BUCKETS, ("task",)
            )
        )
        self.batch_seconds: Histogram = add(
            Histogram(  # type: ignore[assignment]
                "shoestring_batch_duration_seconds",
                "Model time per batch, by task.",
                LATENCY_BUCKETS,
                ("task",),
            )
        )
        self.tokens: Counter = add(
            Counter(  # type: ignore[assignment]
                "shoestring_batch_tokens_total",
                "Token positions computed, by task and kind (real or padding).",
                ("task", "kind"),
            )
        )
        self.dropped: Counter = add(
            Counter(  # type: ignore[assignment]
                "shoestring_dropped_inputs_total",
                "Queued inputs dropped before inference, by reason "
                "(disconnected, timeout, cancelled).",
                ("reason",),
            )
        )
        self.failed: Counter = add(
            Counter(  # type: ignore[assignment]
                "shoestring_failed_inputs_total",
                "Inputs whose inference raised (their batch-mates were retried alone).",
                ("task",),
            )
        )

    def add_gauge(self, name: str, help: str, read: Callable[[], float]) -> None:
        self.registry.add(Gauge(name, help, read))

    def render(self) -> str:
        return self.registry.render()
