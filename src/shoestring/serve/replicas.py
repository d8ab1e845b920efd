"""Whether ``--workers N`` replicas fit the machine: one replica's memory, measured, against
what is free, before the other replicas start.

Every replica is a whole engine process: its own copy of the weights, its own activations
and, on a GPU, its own CUDA context on the same device (processes share a GPU by time
slices; nothing is shared between them). So N replicas need about N times what one needs.
The first replica measures that after loading its models: it runs one batch of the largest
size the settings allow (``--max-batch-tokens`` padded positions of ``--max-length``
inputs), then reads its peak: the CUDA caching allocator's peak reservation plus an
allowance for the CUDA context (`CUDA_CONTEXT_BYTES`, which the allocator does not see), or
on a CPU its peak resident memory (``VmHWM``; it counts the shared libraries too, so it errs
high). The parent checks that the other N - 1 fit in what is free then (device memory, or
``MemAvailable``), keeping `HEADROOM` spare, and otherwise stops with an error that says how
many fit.

While they load, every replica that already serves answers ``/readyz`` 503 (`Loaded`): a
load balancer sends nothing to a server whose other replicas are still loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shoestring.errors import ShoestringError

# What a CUDA context takes on the device beside the allocator's memory (an allowance, not
# a measurement: ~0.5 GiB with recent CUDA on an H100; the check errs on the side of room).
CUDA_CONTEXT_BYTES = 768 << 20
HEADROOM = 0.9  # use at most this share of the free memory


@dataclass(frozen=True)
class Footprint:
    """One replica's memory at its largest batch and what was free beside it."""

    device: str  # "cuda:0", "cpu", ...
    per_replica: int  # bytes
    available: int  # bytes free for more replicas when it was measured

    def describe(self) -> str:
        return (f"{_gib(self.per_replica)} of {_memory(self.device)} each, "
                f"{_gib(self.available)} free beside the first")


def measure(engines: list[Any], max_batch_tokens: int,
            max_length: int | None = None) -> Footprint:
    """This process's footprint with ``engines`` loaded, after their largest batch (inputs of
    ``max_length`` tokens; None: each engine's own ``--max-length``)."""
    import torch

    for engine in engines:
        engine.probe_memory(max_batch_tokens, max_length or engine.max_length)
    device = engines[0].device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, _ = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_reserved(device) + CUDA_CONTEXT_BYTES
        return Footprint(str(device), int(peak), int(free))
    return Footprint(str(device), _proc_kib("/proc/self/status", "VmHWM") << 10,
                     _proc_kib("/proc/meminfo", "MemAvailable") << 10)


class Loaded:
    """How many of a server's N replicas have loaded their models: one counter in shared
    memory, made by the parent before the replicas start, raised by each replica once it has
    loaded and read by every replica's ``/readyz`` (503 until all N have)."""

    def __init__(self, context: Any, total: int) -> None:
        self.total = total
        self._count = context.Value("i", 0)  # passed to each replica as it is spawned

    def add(self) -> None:
        """This replica has loaded its models."""
        with self._count.get_lock():
            self._count.value += 1

    @property
    def count(self) -> int:
        return int(self._count.value)

    def waiting(self) -> str | None:
        """Why the server is not ready yet ("1 of 2 workers loaded"); None once all are."""
        count = self.count
        return None if count >= self.total else f"{count} of {self.total} workers loaded"


def check_fit(workers: int, footprint: Footprint, flag: str = "--workers") -> None:
    """Raise (exit 2) when ``workers`` replicas do not fit: the first is measured and
    running, so ``workers - 1`` more must fit in what was free beside it."""
    if footprint.available <= 0:  # the OS did not say (no /proc): nothing to check against
        return
    room = int(footprint.available * HEADROOM)
    more = room // max(footprint.per_replica, 1)
    if workers - 1 <= more:
        return
    raise ShoestringError(
        f"{workers} replicas do not fit: each needs about {_gib(footprint.per_replica)} of "
        f"{_memory(footprint.device)} at its largest batch, and {_gib(footprint.available)} "
        f"is free beside the first (room for {more} more at {HEADROOM:.0%} of it)", where=flag,
        fix=f"use --workers {more + 1} or fewer, or lower --max-batch-tokens (a replica's "
        "largest batch)")


def _proc_kib(path: str, field: str) -> int:
    """A ``kB`` field of a /proc file (0 where it is missing)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _memory(device: str) -> str:
    return "RAM" if device == "cpu" else f"{device} memory"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
