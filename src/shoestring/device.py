"""Where training runs, at what precision, and how fast that device can go.

MFU needs a peak. Datasheet peaks do not exist for an arbitrary CPU, so the peak is
measured: a short dense matmul burst in the training dtype. "auto" precision picks bf16
autocast only where it measurably beats fp32 (on this kind of CPU with avx512_bf16 it is
~2.7x; on CPUs without bf16 units it is slower than fp32).
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceInfo:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast
    peak_flops: float  # measured dense matmul FLOP/s in that dtype
    name: str
    # The vendor's dense peak for this device and dtype (plan.hardware table), when known.
    datasheet_flops: float | None = None
    datasheet_name: str | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


def measure_matmul_flops(device_type: str, dtype: torch.dtype, seconds: float = 0.4) -> float:
    """Dense square-matmul FLOP/s on this device, best of a short burst (cached per thread count)."""
    return _measure(device_type, dtype, seconds, torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _measure(device_type: str, dtype: torch.dtype, seconds: float, threads: int) -> float:
    device = torch.device(device_type)
    n = 4096 if device_type == "cuda" else 1024
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        sync()
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t))
    return best


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
    from shoestring.plan.hardware import from_device_name

    hw = from_device_name(device_name)
    if hw is None:
        return None, None
    flops = getattr(hw, precision_name(dtype))
    return (flops, hw.name) if flops else (None, None)
