"""Dynamic micro-batching: many small requests become few model calls, off the event loop.

A model call costs a fixed overhead plus a cost per token position, so one call on 32 inputs
is far cheaper than 32 calls on one; that is the whole throughput gain of a model server
(BentoML's "adaptive batching"). The batcher keeps a bounded queue of *jobs* (one input each)
and one worker thread that repeatedly:

0. tokenizes every job queued as text since its last pass, in one call of the engine's
   tokenizer (a WordPiece word cache for ASCII text, a few microseconds a text; the Rust
   batch call for the rest, which releases the GIL, so the event loop keeps receiving while
   it runs), and admits each (length limits, the task's checks): a job the model cannot take
   fails its request at once (422) and that request's other jobs leave the queue unrun;
1. takes the oldest tokenized job and, by default (``max_wait`` 0, TEI's design), starts at once:
   a free engine never waits, and whatever piled up while the previous batch ran is the
   next batch, so batches grow with load. With ``max_wait`` > 0 it waits that long for
   batch-mates, but only while requests arrive more often than once per ``max_wait``;
2. fills the batch with the jobs nearest the oldest one's length until ``max_batch_tokens``
   padded positions (count × longest) or ``max_batch_size`` jobs (the oldest is always
   served, so nothing starves). A request with many inputs is many jobs, so one larger than
   a batch is split across batches transparently;
3. splits that batch into length groups so short inputs are not padded to the longest
   (`plan_groups`, an exact dynamic program over the distinct lengths, weighing padding
   against a call's fixed cost, which the engine measures), and runs the group holding the
   oldest job first, then the rest by their oldest job;
4. runs each group; if a group's call raises, runs its jobs one by one, so one bad input
   fails only its own request.

The event loop only enqueues and awaits futures (one per request with `submit_request`);
results come back through ``loop.call_soon_threadsafe``, one wake-up per batch. A full
queue raises `QueueFull` at once (the HTTP layer answers 429 + Retry-After): memory stays
bounded under any load. Jobs whose client went away or whose time ran out are removed with
`cancel` before they cost any compute. `close` drains: it stops accepting, lets the worker
finish everything queued (tokenizing included), then joins it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shoestring.inference.laps import StageTimes
from shoestring.serve.prometheus import ServeMetrics

RunFn = Callable[[tuple, list[Any]], list[Any]]
TokenizeFn = Callable[[list[Any]], list[list[int]]]

# A model call's fixed cost (Python dispatch, kernel launches, the tokenizer-side work around
# it) expressed in token positions: a length group is only split off when that saves more
# padded positions than this. Measured on CPU for small encoders it is tens to a few hundred
# positions; the plan is not sensitive to the exact value.
GROUP_OVERHEAD_TOKENS = 64


class QueueFull(Exception):
    """The queue has no room for the request's inputs: shed load now, retry later."""

    def __init__(self, depth: int, capacity: int) -> None:
        super().__init__(f"the request queue is full ({depth} of {capacity} inputs waiting)")
        self.depth, self.capacity = depth, capacity


class BatcherClosed(Exception):
    """The server is shutting down and accepts no new work."""


@dataclass(eq=False, slots=True)
class Job:
    """One input waiting for the model. Jobs with equal ``key`` may share a model call.

    A job queued as ``text`` has no payload yet: the worker tokenizes it and calls
    ``finish(ids, loc, *options)`` for ``(payload, length)``, which raises (an
    ``InputError``) when the model cannot take it."""

    key: tuple  # (task, *options that must be equal inside one call)
    length: int  # token positions: the cost that padding grows (-1: not tokenized yet)
    payload: Any
    future: asyncio.Future | None = None
    loop: asyncio.AbstractEventLoop | None = None
    enqueued: float = 0.0
    cancelled: str | None = None  # why it was dropped (disconnected, timeout), if it was
    done: bool = field(default=False)
    text: Any = None  # what to tokenize: a text, or a (text, pair) tuple
    finish: Callable[..., tuple[Any, int]] | None = None
    loc: tuple = ()
    options: tuple = ()
    group: JobGroup | None = None  # the request this job answers part of (`submit_request`)
    index: int = 0  # its place among the request's results
    prep_s: float = 0.0  # seconds its tokenizing took (not counted as queueing)


class JobGroup:
    """One request's jobs and the single future its handler awaits: their results in order
    (an exception in place of a failed input's result), or the first admission error."""

    __slots__ = ("future", "results", "remaining")

    def __init__(self, future: asyncio.Future, count: int) -> None:
        # Not the jobs themselves: each job points here, and a pointer back would make every
        # request a reference cycle, left for the garbage collector to find.
        self.future = future
        self.results: list[Any] = [None] * count
        self.remaining = count

    def settle(self, index: int, result: Any) -> None:
        """One job's result (on the event loop); the future is set with the last one."""
        if self.future.done():
            return
        self.results[index] = result
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.results)


def padded_tokens(lengths: Sequence[int], pad: bool = True) -> int:
    """Token positions a call on inputs of ``lengths`` computes: padded to the longest."""
    return len(lengths) * max(lengths, default=0) if pad else sum(lengths)


def choose_batch(
    candidates: Sequence[Job], max_batch_size: int, max_batch_tokens: int | None = None
) -> list[Job]:
    """The oldest job (``candidates[0]``) and those nearest its length, within both budgets.

    TEI's rule, with length grouping: a batch holds at most ``max_batch_size`` jobs and at
    most ``max_batch_tokens`` padded token positions (count × longest). Jobs are considered
    by how close their length is to the oldest's (ties: arrival order), and each is taken if
    the batch still fits with it, so the job that has waited longest is always served and
    its batch-mates cost it the least padding. The oldest job alone is taken even when it is
    over the token budget (the settings keep ``--max-length`` within it).
    """
    if not candidates:
        return []
    budget = max_batch_tokens if max_batch_tokens is not None else float("inf")
    oldest = candidates[0]
    lengths = [j.length for j in candidates]
    if len(candidates) <= max_batch_size and padded_tokens(lengths) <= budget:
        return list(candidates)
    by_distance = sorted(candidates[1:], key=lambda j: abs(j.length - oldest.length))
    batch, longest = [oldest], oldest.length
    for job in by_distance:
        if len(batch) >= max_batch_size:
            break
        wider = max(longest, job.length)
        if (len(batch) + 1) * wider <= budget:
            batch.append(job)
            longest = wider
    return batch


def plan_groups(
    lengths: Sequence[int], overhead: float = GROUP_OVERHEAD_TOKENS, pad: bool = True
) -> list[list[int]]:
    """Split a batch into model calls that minimise padded positions plus per-call overhead.

    Returns lists of indices into ``lengths``. With ``pad`` each call pads its inputs to its
    longest one, costing ``n · max_len + overhead``; sorted by length, the best split is
    contiguous, so an O(u²) dynamic program over the u distinct lengths finds the exact
    optimum.
    Without ``pad`` (a model that cannot mask padding) each call holds equal lengths only.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if not order:
        return []
    if not pad:
        groups: list[list[int]] = []
        for i in order:
            if groups and lengths[groups[-1][0]] == lengths[i]:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups
    # Only boundaries between different lengths can be cuts: splitting inputs of one length
    # saves no padding and costs a call. So the program runs over the distinct lengths.
    sorted_len = [lengths[i] for i in order]
    ends = [k + 1 for k in range(len(order)) if k + 1 == len(order)
            or sorted_len[k + 1] != sorted_len[k]]  # end (exclusive) of each run of one length
    u = len(ends)
    best = [0.0] + [float("inf")] * u
    cut = [0] * (u + 1)
    for j in range(1, u + 1):
        width, end = sorted_len[ends[j - 1] - 1], ends[j - 1]
        for i in range(j):
            cost = best[i] + (end - (ends[i - 1] if i else 0)) * width + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], u
    while j > 0:
        i = cut[j]
        bounds.append((ends[i - 1] if i else 0, ends[j - 1]))
        j = i
    return [order[a:b] for a, b in reversed(bounds)]


class MicroBatcher:
    """A bounded queue of jobs and the worker thread that batches them through ``run``.

    ``run(key, payloads)`` is called on the worker thread and returns one result per payload;
    a result that is an ``Exception`` instance fails only that job. ``pad=False`` groups only
    equal lengths (for models that cannot mask padding).
    """

    def __init__(self, run: RunFn, *, max_batch_size: int = 1024,
                 max_batch_tokens: int | None = None, max_wait_s: float = 0.0,
                 max_queue: int = 1024, pad: bool | Callable[[tuple], bool] = True,
                 metrics: ServeMetrics | None = None,
                 group_overhead_tokens: float = GROUP_OVERHEAD_TOKENS,
                 tokenize: TokenizeFn | None = None) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_s < 0:
            raise ValueError("max_batch_size and max_queue must be ≥ 1, max_wait_s ≥ 0")
        self._run = run
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self._pad = pad if callable(pad) else (lambda key, _p=pad: _p)
        self.metrics = metrics
        self.group_overhead_tokens = group_overhead_tokens
        self._tokenize = tokenize
        self._pending: list[Job] = []  # tokenized, arrival order
        self._raw: list[Job] = []  # queued as text, not tokenized yet, arrival order
        self._preparing = 0  # jobs being tokenized (off the lock)
        self._cv = threading.Condition()
        self._closing = False
        # Mean time between requests (exponential moving average), starting as "busy".
        self._gap = 0.0
        self._last_arrival: float | None = None
        self._in_flight = 0
        self._thread: threading.Thread | None = None
        self._running = False  # the worker is alive (a flag: a request checks it)
        self._wake_due = False  # a wake-up of the worker is scheduled on the event loop
        self._outbox: list[tuple[list[Job], list[Any]]] = []  # results not yet handed back

    # --- event-loop side -------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._pending) + len(self._raw) + self._preparing

    @property
    def in_flight(self) -> int:
        """Jobs taken by the worker and not finished yet."""
        return self._in_flight

    @property
    def alive(self) -> bool:
        """The worker thread is running (it clears this as it exits, however it exits)."""
        return self._running

    @property
    def accepting(self) -> bool:
        return self._running and not self._closing

    def start(self) -> None:
        if self._thread is None:
            self._running = True
            self._thread = threading.Thread(target=self._worker, name="shoestring-batcher",
                                            daemon=True)
            self._thread.start()

    def submit(self, jobs: Sequence[Job]) -> list[asyncio.Future]:
        """Queue ``jobs`` (all or none) and return their futures; call from the event loop.

        Raises `QueueFull` when they do not all fit and `BatcherClosed` after `close`.
        """
        loop = asyncio.get_running_loop()
        for job in jobs:
            job.future, job.loop = loop.create_future(), loop
        self._enqueue(jobs, loop)
        return [job.future for job in jobs]  # type: ignore[misc]

    def submit_request(self, jobs: Sequence[Job]) -> asyncio.Future:
        """Queue one request's ``jobs`` (all or none) behind one future: the list of their
        results in order, an exception instance in place of a failed input's result; or the
        exception that refused one of them before it ran (then none of them run)."""
        loop = asyncio.get_running_loop()
        request = JobGroup(loop.create_future(), len(jobs))
        for i, job in enumerate(jobs):
            job.group, job.index, job.loop = request, i, loop
        self._enqueue(jobs, loop)
        return request.future

    def _enqueue(self, jobs: Sequence[Job], loop: asyncio.AbstractEventLoop) -> None:
        now = time.monotonic()
        with self._cv:
            if not self.accepting:
                raise BatcherClosed("the server is shutting down")
            depth = self.queue_depth
            if depth + len(jobs) > self.max_queue:
                raise QueueFull(depth, self.max_queue)
            was_empty = depth == 0
            if self._last_arrival is not None:
                # Capped, so one idle spell does not make the server slow to see a burst.
                gap = min(now - self._last_arrival, 2 * self.max_wait_s)
                self._gap = 0.8 * self._gap + 0.2 * gap
            self._last_arrival = now
            for job in jobs:
                job.enqueued = now
                (self._pending if job.text is None else self._raw).append(job)
            # Wake the worker only when it has something new to decide: the first job starts
            # a gathering window, a full batch ends it. In between it sleeps until the window
            # closes; waking it on every arrival would only trade the GIL back and forth with
            # the event loop, which is busy receiving the very requests it is waiting for.
            #
            # The wake-up itself waits for the end of the event loop's current pass: woken at
            # once, the worker would only wait for the GIL, which the loop holds until it
            # has read the other connections' requests and goes back to its poll (each such
            # wait a thread switch: CPU on both sides), and those requests join its batch.
            if ((was_empty or (self.max_wait_s > 0 and len(self._pending) >= self.max_batch_size))
                    and not self._wake_due):
                self._wake_due = True
                loop.call_soon(self._wake)

    def _wake(self) -> None:
        with self._cv:
            self._wake_due = False
            self._cv.notify()

    def cancel(self, jobs: Sequence[Job], reason: str) -> int:
        """Drop ``jobs`` that have not run yet (client gone, time up); returns how many."""
        dropped = 0
        with self._cv:
            for job in jobs:
                if job.done or job.cancelled:
                    continue
                job.cancelled = reason
                try:
                    (self._pending if job.text is None or job.length >= 0
                     else self._raw).remove(job)
                    dropped += 1
                except ValueError:
                    pass  # taken by the worker: it skips cancelled jobs before running them
            self._cv.notify()
        if dropped and self.metrics:
            self.metrics.dropped.labels(reason=reason).inc(dropped)
        return dropped

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting; with ``drain`` finish every queued job first, else fail them."""
        with self._cv:
            self._closing = True
            if not drain:
                why = "the server shut down before this input ran"
                queued = self._raw + self._pending
                _deliver(queued, [BatcherClosed(why) for _ in queued])
                self._pending.clear()
                self._raw.clear()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- worker side -------------------------------------------------------------------------

    def _next_batch(self) -> list[Job] | None:
        """Block until a batch is due; None once closing with nothing left."""
        with self._cv:
            while True:
                if self._raw:
                    # Once per decision, so a steady stream of new texts cannot starve the
                    # jobs already tokenized: later arrivals wait for the next pass.
                    self._prepare_raw()
                if not self._pending:
                    if self._raw:
                        continue
                    if self._closing:
                        return None
                    self._cv.wait()
                    continue
                oldest = self._pending[0]
                same = [j for j in self._pending if j.key == oldest.key]
                batch = choose_batch(same, self.max_batch_size, self.max_batch_tokens)
                wait = oldest.enqueued + self.max_wait_s - time.monotonic()
                # Wait for batch-mates only while requests arrive often enough to bring some
                # in time (on average, or right now: mates are already queued); at low load
                # (one client, say) waiting would add latency for nothing.
                busy = self._gap < self.max_wait_s or len(same) > 1
                # With --max-wait-ms 0 (the default, TEI's way) a free engine never waits:
                # whatever piled up while it was busy is the next batch.
                full = len(batch) < len(same) or len(same) >= self.max_batch_size
                if not full and wait > 0 and busy and not self._closing:
                    self._cv.wait(wait)
                    continue
                taken = set(map(id, batch))
                self._pending = [j for j in self._pending if id(j) not in taken]
                self._in_flight += len(batch)
                return batch

    def _prepare_raw(self) -> None:
        """Tokenize and admit every job queued as text (called holding the lock, which is
        released while the tokenizer runs). Admitted jobs join the tokenized queue in arrival
        order; a job the model cannot take fails its request, whose other jobs are dropped."""
        raw, self._raw = self._raw, []
        self._preparing = len(raw)
        wall, cpu = time.perf_counter(), time.thread_time()
        self._cv.release()
        try:
            tokenized = _tokenize_jobs(self._tokenize, raw)
        finally:
            self._cv.acquire()
            self._preparing = 0
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        admitted, failed = [], []
        for job, outcome in zip(raw, tokenized):
            if job.cancelled:  # its client went away while it was being tokenized
                if self.metrics:
                    self.metrics.dropped.labels(reason=job.cancelled).inc()
            elif isinstance(outcome, BaseException):
                failed.append((job, outcome))
            else:
                job.payload, job.length = outcome
                job.prep_s = wall
                admitted.append(job)
        if failed:
            refused = {id(j.group) for j, _ in failed if j.group is not None}
            admitted = [j for j in admitted if id(j.group) not in refused or j.group is None]
            self._fail_requests(failed, refused)
        if admitted:
            if self._pending and self._pending[-1].enqueued > admitted[0].enqueued:
                self._pending = sorted(self._pending + admitted, key=lambda j: j.enqueued)
            else:
                self._pending += admitted
        if self.metrics and raw:
            tasks = Counter(str(j.key[0]) for j in raw)
            for task, n in tasks.items():
                self.metrics.stages.observe(task, "tokenize", wall, cpu * n / len(raw), n)

    def _fail_requests(self, failed: list[tuple[Job, BaseException]], refused: set[int]) -> None:
        """Deliver admission errors; the refused requests' other queued jobs leave the queue
        (their answer is already the error)."""
        for job in self._pending:
            if job.group is not None and id(job.group) in refused:
                job.cancelled = "refused"
        self._pending = [j for j in self._pending if j.cancelled != "refused"]
        _deliver([j for j, _ in failed], [e for _, e in failed])

    def _worker(self) -> None:
        stages = self.metrics.stages if self.metrics else None
        try:
            cpu = time.thread_time()
            booked = stages.thread_cpu() if stages else 0.0
            while (batch := self._next_batch()) is not None:
                self._run_batch(batch)
                if stages is not None:
                    # The worker's CPU since the last batch that no other stage recorded:
                    # choosing and planning this batch, its metrics, the hand-off back.
                    now, recorded = time.thread_time(), stages.thread_cpu()
                    own = max(0.0, (now - cpu) - (recorded - booked))
                    stages.observe(str(batch[0].key[0]), "batch", own, own, len(batch))
                    cpu, booked = now, recorded + own
                # Last, just before the worker looks for more work (and sleeps if there is
                # none): the event loop this wakes then finds the GIL free instead of waiting
                # for the worker's bookkeeping (a thread switch each way per batch).
                self._hand_back()
        finally:
            self._running = False

    def _run_batch(self, batch: list[Job]) -> None:
        key = batch[0].key
        lengths = [j.length for j in batch]
        groups = plan_groups(lengths, self.group_overhead_tokens, self._pad(key))
        # Oldest first: shortest-first would leave a long input that has already waited
        # behind every short group of each batch, which is what stretches the tail.
        groups.sort(key=lambda g: min(batch[i].enqueued for i in g))
        try:
            for group in groups:
                self._hand_back()  # the previous group's results: not held behind this one
                self._run_group(key, [batch[i] for i in group])
        finally:
            with self._cv:
                self._in_flight -= len(batch)

    def _run_group(self, key: tuple, jobs: list[Job]) -> None:
        live = [j for j in jobs if not j.cancelled]
        if self.metrics:
            for j in jobs:
                if j.cancelled:
                    self.metrics.dropped.labels(reason=j.cancelled).inc()
        if not live:
            return
        if self.metrics:
            now = time.monotonic()
            task = str(key[0])
            for j in live:
                self.metrics.stages.observe(task, "queue", max(0.0, now - j.enqueued - j.prep_s))
        results = self._call(key, live)
        if isinstance(results, BaseException) and len(live) > 1:
            # Find the culprit: each input alone, so its batch-mates still get answers.
            results = [self._call(key, [j]) for j in live]
            results = [r if isinstance(r, BaseException) else r[0] for r in results]
        elif isinstance(results, BaseException):
            results = [results]
        if self.metrics:
            failed = sum(isinstance(r, BaseException) for r in results)
            if failed:
                self.metrics.failed.labels(task=str(key[0])).inc(failed)
        for job in live:
            job.done = True
        self._outbox.append((live, results))

    def _hand_back(self) -> None:
        """Results of the groups run since the last call, to their event loops."""
        if self._outbox:
            stages = self.metrics.stages if self.metrics else None
            outbox, self._outbox = self._outbox, []
            _deliver([j for jobs, _ in outbox for j in jobs],
                     [r for _, results in outbox for r in results], stages)

    def _call(self, key: tuple, jobs: list[Job]) -> list[Any] | BaseException:
        t = time.perf_counter()
        try:
            results = self._run(key, [j.payload for j in jobs])
            if len(results) != len(jobs):
                raise RuntimeError(f"the engine returned {len(results)} results for {len(jobs)} "
                                   "inputs")
        except Exception as e:  # noqa: BLE001 - reported to the requests, never kills the worker
            return e
        if self.metrics:
            lengths = [j.length for j in jobs]
            self.metrics.observe_batch(str(key[0]), time.perf_counter() - t, lengths,
                                       padded_tokens(lengths, self._pad(key)))
        return results


def _tokenize_jobs(tokenize: TokenizeFn | None,
                   jobs: list[Job]) -> list[tuple[Any, int] | BaseException]:
    """Each job's (payload, length) from one tokenizer call, or the exception refusing it."""
    if tokenize is None:
        raise RuntimeError("jobs were queued as text, but this batcher has no tokenizer")
    out: list[tuple[Any, int] | BaseException] = []
    try:
        ids = tokenize([j.text for j in jobs])
    except Exception:  # noqa: BLE001 - a bad text fails its own request, not the batch
        ids = []
        for j in jobs:
            try:
                ids.append(tokenize([j.text])[0])
            except Exception as one:  # noqa: BLE001
                ids.append(one)
    for job, tokens in zip(jobs, ids):
        if isinstance(tokens, BaseException):
            out.append(tokens)
            continue
        try:
            out.append(job.finish(tokens, job.loc, *job.options))  # type: ignore[misc]
        except Exception as e:  # noqa: BLE001 - InputError: the request's 422
            out.append(e)
    return out


def _deliver_batch(pairs: list[tuple[Job, Any]], stages: StageTimes | None = None) -> None:
    """Settle each job's future or request with its result (on its event loop); one already
    done is left. With ``stages``, its CPU is the ``deliver`` stage."""
    if stages is not None:
        wall, cpu = time.perf_counter(), time.thread_time()
        _settle(pairs)
        stages.observe(str(pairs[0][0].key[0]), "deliver", time.perf_counter() - wall,
                       time.thread_time() - cpu, len(pairs))
    else:
        _settle(pairs)


def _settle(pairs: list[tuple[Job, Any]]) -> None:
    for job, result in pairs:
        group = job.group
        if group is not None:
            if isinstance(result, BaseException) and job.length < 0:
                # Refused at admission: the request's answer is this error, at once.
                if not group.future.done():
                    group.future.set_exception(result)
                continue
            group.settle(job.index, result)
            continue
        future = job.future
        if future is None or future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


def _deliver(jobs: Sequence[Job], results: Sequence[Any],
             stages: StageTimes | None = None) -> None:
    """Hand results to their event loops: one wake-up per loop, not one per job."""
    by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list]] = {}
    for job, result in zip(jobs, results):
        if job.loop is None:
            continue
        by_loop.setdefault(id(job.loop), (job.loop, []))[1].append((job, result))
    for loop, pairs in by_loop.values():
        try:
            loop.call_soon_threadsafe(_deliver_batch, pairs, stages)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


__all__ = ["BatcherClosed", "Job", "MicroBatcher", "JobGroup", "QueueFull", "choose_batch",
           "padded_tokens", "plan_groups"]
