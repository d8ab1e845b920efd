"""Where a request's time goes, stage by stage, cheap enough to record for every request.

On a GPU the model is fast and the server's own CPU work (parsing, tokenizing, hand-offs,
encoding) bounds the requests per second, so that work is measured per stage, in wall and in
CPU seconds, and exported on ``/metrics``:

* ``shoestring_stage_seconds{task, stage}`` (histogram): wall time an input spent in the stage;
* ``shoestring_stage_cpu_seconds_total{task, stage}`` (counter): CPU seconds the stage's
  thread spent on it (``time.thread_time``), so ``rate()`` of it says how many cores each
  stage keeps busy.

The stages, in a request's order (`STAGES`): ``parse`` (the request entering the app until
its body is read, parsed and validated; on the fast path from the first bytes of its headers),
``submit`` (its inputs made into jobs and queued, the batcher's worker woken), ``tokenize``,
``queue`` (waiting for a batch, its own tokenizing excluded), ``batch`` (the worker's own
work per batch outside tokenize, forward and pooling: choosing and planning it, its metrics,
handing its results to the event loop; its wall time is that CPU time, the waits for work are
not part of it), ``forward`` (padding, the copy to the device and the model call),
``pooling`` (pooling and normalising an embedding, or another task's output step, and the
copy back), ``deliver`` (the event loop settling a batch's results), ``serialize`` (the
answer to bytes), ``send`` (the bytes to the connection, and the request's accounting),
``loop`` (on the fast path: the event loop's CPU since the previous answer that no other
stage recorded: its poll, socket reads, waking on a batch's results, switching tasks).
``parse``, ``serialize``, ``send`` and ``loop`` count requests; the others count inputs (a request of
n texts counts n): a stage run once for a whole batch adds the batch's wall time once per
input in it (each waited that long) and its CPU time once. ``batch`` and ``loop`` are what
their thread spent outside the other stages, so together the stages cover the worker's and
the event loop's CPU (`bench/serve_cpu.py` prints the rest: other threads, the ASGI path).

prometheus-client's own ``Histogram.observe`` costs microseconds and takes a lock per call;
a few stages per request at thousands of requests per second would be a visible share of
the very CPU this measures. `StageTimes` keeps plain counts under one lock and hands
prometheus-client the finished families at scrape time (a custom collector).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

# The ASGI scope key where the outermost layer notes when a request entered the app (its
# ``time.perf_counter()``): the start of its ``parse`` stage.
START = "shoestring.start"
STAGES = ("parse", "submit", "tokenize", "queue", "batch", "forward", "pooling", "deliver",
          "serialize", "send", "loop")
# From 10 µs (parsing one short request) to 10 s (a long queue).
STAGE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Cell:
    __slots__ = ("buckets", "count", "wall", "cpu")

    def __init__(self, n: int) -> None:
        self.buckets = [0] * (n + 1)  # the last is +Inf
        self.count = 0
        self.wall = 0.0
        self.cpu = 0.0


class StageTimes:
    """Wall-time histograms and CPU-time counters per (task, stage); thread-safe.

    Each thread adds to cells of its own (no lock per observation); a scrape adds the
    threads' cells up."""

    def __init__(self, buckets: tuple[float, ...] = STAGE_BUCKETS) -> None:
        self.bounds = buckets
        self._cells: dict[tuple[int, str, str], _Cell] = {}
        self._lock = threading.Lock()  # guards adding cells, not updating them

    def observe(self, task: str, stage: str, wall: float, cpu: float = 0.0, n: int = 1) -> None:
        """``n`` inputs (or requests) spent ``wall`` seconds each in ``stage``, which cost
        ``cpu`` seconds of its thread in all."""
        key = (threading.get_ident(), task, stage)
        cell = self._cells.get(key)
        if cell is None:
            with self._lock:
                cell = self._cells[key] = _Cell(len(self.bounds))
        cell.buckets[bisect_left(self.bounds, wall)] += n
        cell.count += n
        cell.wall += wall * n
        cell.cpu += cpu

    def thread_cpu(self) -> float:
        """CPU seconds this thread has recorded in every stage so far (what a stage covering
        the rest of a thread's work subtracts)."""
        me = threading.get_ident()
        return sum(c.cpu for key, c in list(self._cells.items()) if key[0] == me)

    def _merged(self) -> dict[tuple[str, str], tuple[list[int], int, float, float]]:
        with self._lock:
            cells = list(self._cells.items())
        out: dict[tuple[str, str], tuple[list[int], int, float, float]] = {}
        for (_, task, stage), c in cells:
            buckets, count, wall, cpu = out.get((task, stage), ([0] * len(c.buckets), 0, 0.0,
                                                                0.0))
            out[(task, stage)] = ([a + b for a, b in zip(buckets, c.buckets)], count + c.count,
                                  wall + c.wall, cpu + c.cpu)
        return out

    # --- prometheus-client's collector protocol ----------------------------------------------

    def describe(self) -> list:
        return []  # families are only known at collect time; nothing to check at registration

    def collect(self) -> Iterator:
        cells = self._merged()
        hist = HistogramMetricFamily(
            "shoestring_stage_seconds", "Wall time per input (parse, serialize, send: per "
            "request) in each stage of a request's path, by task and stage.",
            labels=("task", "stage"))
        cpu = CounterMetricFamily(
            "shoestring_stage_cpu_seconds", "CPU seconds of the stage's thread spent in each "
            "stage of the request path, by task and stage.", labels=("task", "stage"))
        for (task, stage), (buckets, count, wall, cpu_s) in sorted(cells.items()):
            cumulative, running = [], 0
            for bound, n in zip((*map(floatToGoString, self.bounds), "+Inf"), buckets):
                running += n
                cumulative.append((bound, running))
            hist.add_metric([task, stage], cumulative, wall)
            cpu.add_metric([task, stage], cpu_s)
        yield hist
        yield cpu


class Laps:
    """Consecutive stages on one thread: each `lap` closes a stage and opens the next.

    ``Laps(times, task)`` starts both clocks now; ``start`` and ``cpu`` backdate them (the
    request's arrival in an outer layer, and the thread time when this thread began on it).
    """

    __slots__ = ("times", "task", "wall", "cpu")

    def __init__(self, times: StageTimes, task: str, start: float | None = None,
                 cpu: float | None = None) -> None:
        self.times, self.task = times, task
        self.cpu = time.thread_time() if cpu is None else cpu
        self.wall = time.perf_counter() if start is None else start

    def lap(self, stage: str, n: int = 1) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        self.times.observe(self.task, stage, wall - self.wall, cpu - self.cpu, n)
        self.wall, self.cpu = wall, cpu

    def skip(self) -> None:
        """Restart the clock without recording (time spent awaiting other work)."""
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def resume(self) -> None:
        """This thread is back on the request after doing other work: the CPU clock restarts,
        the wall clock runs on (the wait is part of the next stage's wall time)."""
        self.cpu = time.thread_time()
