"""Accelerator datasheets: the dense peak and memory of each known device, with its source.

On floor 1 beside ``device`` (which quotes MFU against the datasheet peak too) so both the
trainer and the planner read one table; the measured peak (``auto``) is in plan/hardware.py.

Every row is the *dense* (no 2:4 sparsity) tensor-core peak from the vendor's datasheet or
architecture whitepaper, with its source. Datasheets often print the sparse figure, which is
twice the dense one; the table halves those. GeForce cards run fp16/bf16 matmuls with fp32
accumulation (what mixed-precision training uses) at half their fp16-accumulate rate; the
table gives the fp32-accumulate figure. ``fp32`` is the plain (non-TF32) rate, because PyTorch
does not use TF32 for fp32 matmuls unless told to. MFU is quoted against these peaks, so
planning with the wrong one is off by the same factor: when in doubt, use ``auto`` on the
machine itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shoestring.errors import ShoestringError

T = 1e12


@dataclass(frozen=True)
class Hardware:
    """One accelerator: dense peaks in FLOP/s per dtype (None: no fast path), memory per device."""

    name: str
    description: str
    bf16: float | None
    fp16: float | None
    fp32: float
    memory_gb: float
    source: str
    aliases: tuple[str, ...] = field(default=())
    measured: bool = False

    def peak(self, dtype: str = "auto") -> tuple[float, str]:
        """(FLOP/s, dtype) for training in ``dtype``; "auto" = bf16, else fp16, else fp32."""
        if dtype == "auto":
            for name in ("bf16", "fp16", "fp32"):
                value = getattr(self, name)
                if value:
                    return value, name
        if dtype not in ("bf16", "fp16", "fp32"):
            raise ShoestringError(
                f"unknown dtype {dtype!r}", where="--dtype", fix="use auto, bf16, fp16 or fp32"
            )
        value = getattr(self, dtype)
        if not value:
            raise ShoestringError(
                f"{self.name} has no fast {dtype} matmul",
                where="--dtype",
                fix="use fp16 or fp32 on this device (or auto)",
            )
        return value, dtype


_NV_AMPERE_GA102 = (
    "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
)
_NV_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_NV_A100 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_NV_H100 = "https://www.nvidia.com/en-us/data-center/h100/"

HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in [
        Hardware("p100", "NVIDIA Tesla P100 (SXM2, 16 GB)", None, 21.2 * T, 10.6 * T, 16,
                 "https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-datasheet.pdf"),
        Hardware("v100", "NVIDIA V100 (SXM2, 32 GB)", None, 125 * T, 15.7 * T, 32,
                 "https://images.nvidia.com/content/technologies/volta/pdf/"
                 "volta-v100-datasheet-update-us-1165301-r5.pdf", ("v100-32gb", "v100-sxm2")),
        Hardware("v100-16gb", "NVIDIA V100 (SXM2, 16 GB)", None, 125 * T, 15.7 * T, 16,
                 "https://images.nvidia.com/content/technologies/volta/pdf/"
                 "volta-v100-datasheet-update-us-1165301-r5.pdf"),
        Hardware("t4", "NVIDIA T4 (16 GB)", None, 65 * T, 8.1 * T, 16,
                 "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
                 "t4-tensor-core-datasheet-951643.pdf"),
        Hardware("rtx2080ti", "NVIDIA GeForce RTX 2080 Ti (11 GB; fp16 with fp32 accumulate)",
                 None, 53.8 * T, 13.4 * T, 11,
                 "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/"
                 "technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf",
                 ("2080ti", "rtx-2080-ti")),
        Hardware("rtx3090", "NVIDIA GeForce RTX 3090 (24 GB; fp32 accumulate)", 71 * T, 71 * T,
                 35.6 * T, 24, _NV_AMPERE_GA102, ("3090", "rtx-3090")),
        Hardware("rtx4090", "NVIDIA GeForce RTX 4090 (24 GB; fp32 accumulate)", 165.2 * T,
                 165.2 * T, 82.6 * T, 24, _NV_ADA, ("4090", "rtx-4090")),
        Hardware("a10", "NVIDIA A10 (24 GB)", 125 * T, 125 * T, 31.2 * T, 24,
                 "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
        Hardware("a6000", "NVIDIA RTX A6000 (48 GB)", 154.8 * T, 154.8 * T, 38.7 * T, 48,
                 _NV_AMPERE_GA102, ("rtx-a6000",)),
        Hardware("a100-40gb", "NVIDIA A100 (SXM4/PCIe, 40 GB)", 312 * T, 312 * T, 19.5 * T, 40,
                 _NV_A100, ("a100-40",)),
        Hardware("a100", "NVIDIA A100 (SXM4/PCIe, 80 GB)", 312 * T, 312 * T, 19.5 * T, 80,
                 _NV_A100, ("a100-80gb", "a100-80")),
        Hardware("l4", "NVIDIA L4 (24 GB)", 121 * T, 121 * T, 30.3 * T, 24,
                 "https://www.nvidia.com/en-us/data-center/l4/"),
        Hardware("l40s", "NVIDIA L40S (48 GB)", 362.05 * T, 362.05 * T, 91.6 * T, 48,
                 "https://www.nvidia.com/en-us/data-center/l40s/"),
        Hardware("h100", "NVIDIA H100 SXM5 (80 GB)", 989.4 * T, 989.4 * T, 66.9 * T, 80, _NV_H100,
                 ("h100-sxm", "h100-sxm5")),
        Hardware("h100-pcie", "NVIDIA H100 PCIe (80 GB)", 756.5 * T, 756.5 * T, 51.2 * T, 80,
                 _NV_H100),
        Hardware("h200", "NVIDIA H200 SXM (141 GB)", 989.4 * T, 989.4 * T, 66.9 * T, 141,
                 "https://www.nvidia.com/en-us/data-center/h200/"),
        Hardware("b200", "NVIDIA B200 (HGX, 180 GB)", 2250 * T, 2250 * T, 75 * T, 180,
                 "https://www.nvidia.com/en-us/data-center/hgx/"),
        Hardware("mi250x", "AMD Instinct MI250X (128 GB; one OAM = 2 GCDs)", 383 * T, 383 * T,
                 47.9 * T, 128,
                 "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html"),
        Hardware("mi300x", "AMD Instinct MI300X (192 GB)", 1307.4 * T, 1307.4 * T, 163.4 * T, 192,
                 "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"),
    ]
}


def normalize_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "")


def lookup(name: str) -> Hardware:
    """A table row by name or alias (case-insensitive); unknown names → a clear error."""
    key = normalize_name(name)
    for hw in HARDWARE.values():
        if key == hw.name or key in hw.aliases or key.replace("-", "") == hw.name.replace("-", ""):
            return hw
    raise ShoestringError(
        f"unknown hardware {name!r}",
        where="--hardware",
        fix=f"use auto (measure this machine) or one of: {', '.join(HARDWARE)}",
    )


# What `torch.cuda.get_device_name` reports, matched in order (most specific first), e.g.
# "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-16GB", "AMD Instinct MI300X".
_DEVICE_NAME_PATTERNS: list[tuple[str, str | None]] = [
    (r"h100.*nvl", None), (r"a10g", None),  # variants the table has no row for
    (r"h100.*pcie", "h100-pcie"), (r"h100", "h100"), (r"h200", "h200"), (r"b200", "b200"),
    (r"a100.*40g", "a100-40gb"), (r"a100", "a100"), (r"l40s", "l40s"), (r"\bl4\b", "l4"),
    (r"rtx a6000", "a6000"), (r"\ba10\b", "a10"), (r"rtx 4090", "rtx4090"),
    (r"rtx 3090", "rtx3090"), (r"rtx 2080 ti", "rtx2080ti"), (r"v100.*16g", "v100-16gb"),
    (r"v100", "v100"), (r"\bt4\b", "t4"), (r"p100", "p100"), (r"mi300x", "mi300x"),
    (r"mi250x", "mi250x"),
]


def from_device_name(device_name: str) -> Hardware | None:
    """The table row for a CUDA/ROCm device name as torch reports it, or None when unknown.

    Used for MFU against the datasheet peak beside the measured one; unknown devices (and
    every CPU) simply have no datasheet figure.
    """
    import re

    name = device_name.lower()
    for pattern, key in _DEVICE_NAME_PATTERNS:
        if re.search(pattern, name):
            return HARDWARE[key] if key else None
    return None
