"""Scale-out on PyTorch's own distributed stack: data, tensor and pipeline parallelism + ZeRO.

Layout parsing and validation (`layout`), the device mesh (`mesh`), the strategies applied to a
plain model (`parallelize`, `pipeline`), distributed checkpoints (`checkpoint`), the per-rank
memory model (`memory`) and a torchrun-launched trainer (`trainer`). Nothing here is imported
by the single-device path; importing `shoestring.dist.layout` or `shoestring.dist.memory` does
not initialise any process group.
"""
