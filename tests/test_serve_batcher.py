"""The micro-batcher on its own: batch formation, length grouping, fault isolation, bounds.

The model here is a plain Python function (the batcher is generic over it); the HTTP tests
in test_serve.py run the same batcher with a real model behind a real server.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from shoestring.serve.batcher import Job, MicroBatcher, QueueFull, choose_batch, plan_groups
from shoestring.serve.prometheus import ServeMetrics


def sample(metrics: ServeMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_plan_groups_splits_only_when_padding_costs_more_than_a_call() -> None:
    # Equal lengths: one call.
    assert plan_groups([10] * 8, overhead=64) == [list(range(8))]
    # Two clusters far apart: padding 8 short inputs to 500 costs far more than one more call.
    lengths = [500, 10, 498, 12, 11, 499, 10, 497]
    groups = plan_groups(lengths, overhead=64)
    assert sorted(sorted(lengths[i] for i in g) for g in groups) == [
        [10, 10, 11, 12],
        [497, 498, 499, 500],
    ]
    # A huge per-call overhead keeps everything in one call.
    assert len(plan_groups(lengths, overhead=1e9)) == 1
    # Every index exactly once.
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    # Without padding, only equal lengths share a call.
    assert sorted(map(sorted, plan_groups([3, 5, 3, 5, 4], pad=False))) == [[0, 2], [1, 3], [4]]


def test_choose_batch_keeps_the_oldest_and_its_nearest_lengths() -> None:
    jobs = [Job(("t",), n, i) for i, n in enumerate([50, 10, 11, 49, 51, 12, 48, 13])]
    batch = choose_batch(jobs, 4)
    assert jobs[0] in batch  # the oldest is never passed over
    assert sorted(j.length for j in batch) == [48, 49, 50, 51]
    assert choose_batch(jobs[:3], 4) == jobs[:3]


def test_choose_batch_fills_to_the_padded_token_budget() -> None:
    jobs = [Job(("t",), n, i) for i, n in enumerate([50, 10, 11, 49, 51, 12, 48, 13])]
    # 4 × 51 = 204 padded positions fit 210; a fifth input of 51 or less would not (5 × 51).
    batch = choose_batch(jobs, 100, max_batch_tokens=210)
    assert jobs[0] in batch and sorted(j.length for j in batch) == [48, 49, 50, 51]
    # Short inputs are cheap: all four short ones and the oldest (padded to 50) fit 5 × 50.
    batch = choose_batch([jobs[0], *jobs[1:3], *jobs[5:]], 100, max_batch_tokens=250)
    assert len(batch) == 5
    # A budget of one long input still serves the oldest, alone.
    assert choose_batch(jobs, 100, max_batch_tokens=10) == [jobs[0]]
    # Everything fits: every job, in arrival order.
    assert choose_batch(jobs, 100, max_batch_tokens=8 * 51) == jobs


def test_a_free_engine_starts_at_once_and_a_backlog_is_split_by_tokens() -> None:
    # TEI's loop: no waiting window (max_wait 0), and what piled up while the engine was busy
    # is taken in batches of at most max_batch_tokens padded positions.
    release = threading.Event()
    calls: list[list[str]] = []

    def run(key: tuple, payloads: list[str]) -> list[str]:
        if payloads == ["blocker"]:
            release.wait(10)
        calls.append(list(payloads))
        return payloads

    metrics = ServeMetrics()
    b = MicroBatcher(run, max_batch_tokens=500, metrics=metrics)
    b.start()

    async def main() -> None:
        first = b.submit([Job(("t",), 1, "blocker")])
        while b.in_flight == 0:
            await asyncio.sleep(0.001)
        big = b.submit([Job(("t",), 100, f"x{i}") for i in range(12)])  # one client, 12 inputs
        release.set()
        assert await asyncio.gather(*first, *big) == ["blocker", *(f"x{i}" for i in range(12))]

    try:
        asyncio.run(main())
    finally:
        release.set()
        b.close()
    assert [len(c) for c in calls] == [1, 5, 5, 2]  # 5 × 100 = 500 tokens a call at most
    assert sample(metrics, "shoestring_batch_padded_tokens_sum", task="t") == 1 + 1200
    assert sample(metrics, "shoestring_batch_padded_tokens_bucket", task="t", le="256.0") == 2


def _run_batcher(batcher: MicroBatcher, groups: list[list[Job]]) -> list[list[object]]:
    """Submit each group as one request, concurrently, and collect results or exceptions."""

    async def main() -> list[list[object]]:
        futures = [batcher.submit(g) for g in groups]
        return [await asyncio.gather(*f, return_exceptions=True) for f in futures]

    return asyncio.run(main())


def test_a_bad_input_fails_alone_and_batch_mates_get_answers() -> None:
    calls: list[list[int]] = []

    def run(key: tuple, payloads: list[int]) -> list[int]:
        calls.append(list(payloads))
        if 13 in payloads:
            raise ValueError("13 is unlucky")
        return [p * 2 for p in payloads]

    metrics = ServeMetrics()
    b = MicroBatcher(run, max_batch_size=8, max_wait_s=0.5, metrics=metrics)
    b.start()
    try:
        out = _run_batcher(b, [[Job(("double",), 4, p)] for p in (1, 13, 3, 4)])
    finally:
        b.close()
    assert out[0] == [2] and out[2] == [6] and out[3] == [8]
    assert isinstance(out[1][0], ValueError)
    assert len(calls[0]) == 4  # they did form one batch first
    assert sample(metrics, "shoestring_failed_inputs_total", task="double") == 1


def test_full_queue_raises_at_once_and_admits_all_or_nothing() -> None:
    release = threading.Event()

    def run(key: tuple, payloads: list[int]) -> list[int]:
        release.wait(10)
        return payloads

    b = MicroBatcher(run, max_batch_size=1, max_wait_s=0.0, max_queue=2)
    b.start()

    async def main() -> None:
        first = b.submit([Job(("t",), 1, 0)])  # taken by the worker, which then blocks
        while b.in_flight == 0:
            await asyncio.sleep(0.001)
        queued = b.submit([Job(("t",), 1, 1), Job(("t",), 1, 2)])  # fills the queue
        with pytest.raises(QueueFull):
            b.submit([Job(("t",), 1, 3)])
        assert b.queue_depth == 2  # the refused request took no slot
        release.set()
        assert await asyncio.gather(*first, *queued) == [0, 1, 2]

    try:
        asyncio.run(main())
    finally:
        release.set()
        b.close()


def test_cancelled_jobs_never_run_and_close_drains_the_rest() -> None:
    ran: list[int] = []

    def run(key: tuple, payloads: list[int]) -> list[int]:
        ran.extend(payloads)
        return payloads

    metrics = ServeMetrics()
    b = MicroBatcher(run, max_batch_size=64, max_wait_s=30.0, metrics=metrics)
    b.start()

    async def main() -> list[int]:
        gone, kept = Job(("t",), 1, "gone"), Job(("t",), 1, "kept")
        futures = b.submit([gone, kept])
        assert b.cancel([gone], "disconnected") == 1
        assert b.queue_depth == 1
        # close() must not wait out the 30 s gathering window: it flushes what is queued.
        await asyncio.to_thread(b.close, True, 20.0)
        return await futures[1]

    assert asyncio.run(main()) == "kept"
    assert ran == ["kept"]
    assert sample(metrics, "shoestring_dropped_inputs_total", reason="disconnected") == 1


def test_the_group_holding_the_oldest_job_runs_first() -> None:
    # A long input queued before four short ones lands in the same batch but in its own length
    # group; shortest-first would run it last, behind inputs that arrived after it.
    release = threading.Event()
    calls: list[list[str]] = []

    def run(key: tuple, payloads: list[str]) -> list[str]:
        if payloads == ["blocker"]:
            release.wait(10)
        calls.append(list(payloads))
        return payloads

    b = MicroBatcher(run, max_batch_size=8, max_wait_s=0.0)
    b.start()

    async def main() -> None:
        first = b.submit([Job(("t",), 1, "blocker")])  # holds the worker while the rest queue
        while b.in_flight == 0:
            await asyncio.sleep(0.001)
        long = b.submit([Job(("t",), 500, "long")])
        short = b.submit([Job(("t",), 10, f"short{i}") for i in range(4)])
        release.set()
        await asyncio.gather(*first, *long, *short)

    try:
        asyncio.run(main())
    finally:
        release.set()
        b.close()
    assert calls[0] == ["blocker"]
    assert calls[1] == ["long"]  # split off (padding 4 inputs to 500 costs more than a call)
    assert sorted(calls[2]) == [f"short{i}" for i in range(4)]
