"""Backward-compatible import path: device detection lives in ``shoestring.device`` (every
stage uses it, not only training)."""

from shoestring.device import (  # noqa: F401
    DeviceInfo,
    measure_matmul_flops,
    precision_name,
    select_device,
)

__all__ = ["DeviceInfo", "measure_matmul_flops", "precision_name", "select_device"]
