"""Where training runs, at what precision, and how fast that device can go.

MFU needs a peak. Datasheet peaks do not exist for an arbitrary CPU, so the peak is
measured: a short dense matmul burst in the training dtype. "auto" precision picks bf16
autocast only where it measurably beats fp32 (on this kind of CPU with avx512_bf16 it is
~2.7x; on CPUs without bf16 units it is slower than fp32).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from shoestring.datasheets import from_device_name
from shoestring.fsutil import shoestring_home

ASSUMED_MFU = 0.3
"""The fraction of the measured peak a run is assumed to reach before it is measured: what
`plan` buys with a wall-clock budget (unless --mfu or --measure), and how long `train`
expects a FLOP, token or step budget to take (for the compile choice and the long-budget
warning). 0.3 is near the lowest MFU `train` has recorded on this project's machines (27% to
81% of the measured peak in BENCHMARKS.md: the `cram` demo on a 846 GFLOP/s host, the `mini`
preset on a 2-core Xeon); a lower guess errs toward a plan that ends early and a warning that
comes too soon, rather than a plan that overruns its wall clock. `plan --measure` replaces it
with the real trainer's step timed here."""


@dataclass(frozen=True)
class DeviceInfo:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast
    peak_flops: float  # measured dense matmul FLOP/s in that dtype
    name: str
    # The vendor's dense peak for this device and dtype (shoestring.datasheets table), when known.
    datasheet_flops: float | None = None
    datasheet_name: str | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


def measure_matmul_flops(device_type: str, dtype: torch.dtype, seconds: float = 0.4) -> float:
    """Dense square-matmul FLOP/s on this device, best of a short burst (cached per thread count).

    A CPU shared with other work measures low (150 GFLOP/s busy against 440 quiet), and MFU
    against a low peak reads above 100%. So on a CPU the answer is the best of this probe and
    the best ever measured for this CPU model, thread count and dtype on this machine
    (``$SHOESTRING_HOME/peaks.json``, kept up to date by every probe).
    """
    probe = _measure(device_type, dtype, seconds, torch.get_num_threads())
    if device_type != "cpu":
        return probe
    key = f"{_cpu_model()} | {torch.get_num_threads()} threads | {str(dtype).removeprefix('torch.')}"
    return _best_recorded(key, probe)


def peaks_path() -> Path:
    """Where the best measured CPU peaks are kept."""
    return shoestring_home() / "peaks.json"


def _best_recorded(key: str, probe: float) -> float:
    """max(probe, the record for ``key``); a higher probe becomes the record. The file is a
    cache: unreadable or unwritable, it is ignored."""
    from shoestring.fsutil import json_cache

    with json_cache(peaks_path()) as records:
        best = records.get(key)
        best = (float(best) if isinstance(best, (int, float)) and not isinstance(best, bool)
                and math.isfinite(best) and best > 0 else 0.0)
        if probe > best:
            records[key] = probe
    return max(probe, best)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def peak_note(mfu: float, peak_flops: float) -> str | None:
    """Why an MFU above 1 is shown (None when it is not): the measured peak is a floor, not
    the device's ceiling, when the machine was busy while it was measured."""
    if not mfu > 1.0:
        return None
    return (f"MFU above 100%: training ran faster than the peak measured before it "
            f"({peak_flops / 1e9:,.0f} GFLOP/s), which other work on this machine held down; "
            "measure on a quiet machine (shoestring plan --hardware auto) and the best peak is "
            "kept for later runs")


def busy_note(load: float, cores: int) -> str | None:
    """A sentence when the CPU is shared with other work (1-minute load average above its
    cores): a run's throughput is then a fraction of what the machine gives when quiet, and
    the user should know before blaming the tool. None on a quiet machine."""
    if load <= cores:
        return None
    return (f"load average {load:.1f} on {cores} cores: other work shares this CPU, so this "
            "run's tokens/s will be a fraction of a quiet machine's")


def load_cost(cpu_load: dict | None) -> str | None:
    """What a shared CPU cost a run (``summary.json``'s ``cpu_load``), for its results: the
    load above the cores while it trained and, roughly, the share of a quiet machine's steps
    it got (cores / load). None on a quiet machine or a GPU."""
    if not cpu_load:
        return None
    load = max(cpu_load["start"], cpu_load["end"])
    if cpu_load["cores"] / max(load, 1e-9) > 0.9:  # the run's own threads count in the load
        return None
    return (f"load average {cpu_load['start']:.1f} → {cpu_load['end']:.1f} on "
            f"{cpu_load['cores']} cores while training: other work shared this CPU, so the run "
            f"got roughly {cpu_load['cores'] / load:.0%} of a quiet machine's steps (its "
            "results, not only its speed, are those of a smaller run)")


@functools.lru_cache(maxsize=None)
def _measure(device_type: str, dtype: torch.dtype, seconds: float, threads: int) -> float:
    a, b = probe_operands(device_type, dtype, seconds)
    n = a.shape[0]
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        sync()
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t))
    return best


def probe_operands(device_type: str, dtype: torch.dtype,
                   seconds: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Two warmed-up square operands for the peak probe: 4096 on a GPU; on a CPU the largest
    of 256, 512 and 1024 whose product takes under a quarter of ``seconds``.

    A CPU without bf16 units (AVX2 only) multiplies bf16 ~100x slower than fp32 (0.6 GFLOP/s
    against 64 at 1024 on the 2-core host of 2026-11-29: 3.6 s a product), and "auto"
    precision probes bf16 on every `train`; at a fixed 1024 that probe cost 25 s a run. Growing
    the size only while a product stays short bounds it near ``seconds`` on any CPU, and a CPU
    with bf16 units still reaches 1024, where the dense peak is measured.
    """
    device = torch.device(device_type)

    def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
            return (torch.randn(n, n, device=device, dtype=dtype),
                    torch.randn(n, n, device=device, dtype=dtype))

    if device_type == "cuda":
        a, b = operands(4096)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        return a, b
    a, b = operands(256)
    a @ b  # the first product starts the thread pool
    while a.shape[0] < 1024:
        bigger = operands(2 * a.shape[0])
        t = time.perf_counter()
        bigger[0] @ bigger[1]
        if time.perf_counter() - t > seconds / 4:
            break
        a, b = bigger
    return a, b


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def select_device(precision: str = "auto", measure_peak: bool = True) -> DeviceInfo:
    """CUDA when present, else CPU; autocast per ``precision`` ("auto", "bf16", "fp16", "fp32").

    ``measure_peak=False`` skips the peak measurement (``peak_flops`` is then 0) where only the
    dtype matters; "auto" on a CPU still measures both dtypes to choose.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if precision == "fp16":
        if device.type != "cuda":
            from shoestring.errors import ShoestringError

            raise ShoestringError(
                "fp16 autocast with loss scaling is for CUDA GPUs without bf16; this is a CPU",
                where="train.precision", fix="use bf16 (fast on CPUs with bf16 units) or fp32")
        dtype = torch.float16
    elif precision == "fp32":
        dtype = torch.float32
    elif precision == "bf16":
        dtype = torch.bfloat16
    elif device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    else:
        fp32 = measure_matmul_flops("cpu", torch.float32)
        bf16 = measure_matmul_flops("cpu", torch.bfloat16)
        dtype = torch.bfloat16 if bf16 > 1.3 * fp32 else torch.float32
    peak = measure_matmul_flops(device.type, dtype) if measure_peak else 0.0
    name = _device_name(device)
    return DeviceInfo(device, dtype, peak, name, *_datasheet(name, dtype))


def precision_name(dtype: torch.dtype) -> str:
    """The ``train.precision`` value that selects ``dtype`` (bf16, fp16 or fp32)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def _datasheet(device_name: str, dtype: torch.dtype) -> tuple[float | None, str | None]:
    """(dense peak FLOP/s, table name) from the datasheet table for a known GPU, else Nones."""
    hw = from_device_name(device_name)
    if hw is None:
        return None, None
    flops = getattr(hw, precision_name(dtype))
    return (flops, hw.name) if flops else (None, None)
