"""``--hardware``: a row of the datasheet table (shoestring/datasheets.py) or ``auto``, the
measured peak of this device."""

from __future__ import annotations

import os

from shoestring.datasheets import Hardware, normalize_name, lookup


def measure_this_device(precision: str = "auto") -> Hardware:
    """``auto``: this machine's measured dense matmul peak (CPU included), per dtype.

    The measurement is `shoestring.device.measure_matmul_flops`, the same one `train`
    uses for MFU, so a plan's MFU and a run's MFU are quoted against the same peak.
    """
    import torch

    from shoestring.device import measure_matmul_flops, select_device

    dev = select_device(precision, measure_peak=False)
    kind = dev.device.type
    fp32 = measure_matmul_flops(kind, torch.float32)
    bf16 = measure_matmul_flops(kind, torch.bfloat16) if dev.dtype == torch.bfloat16 else None
    fp16 = None
    if kind == "cuda":
        fp16 = measure_matmul_flops(kind, torch.float16)
        memory_gb = torch.cuda.get_device_properties(dev.device).total_memory / 2**30
    else:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return Hardware(
        name="auto",
        description=f"this machine: {dev.name}, measured",
        bf16=bf16,
        fp16=fp16,
        fp32=fp32,
        memory_gb=round(memory_gb, 1),
        source="measured by shoestring.device.measure_matmul_flops (dense square matmul)",
        measured=True,
    )


def get_hardware(name: str, precision: str = "auto") -> Hardware:
    """``auto`` (measured here) or a table row."""
    if normalize_name(name) == "auto":
        return measure_this_device(precision)
    return lookup(name)
