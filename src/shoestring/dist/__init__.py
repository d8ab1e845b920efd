"""Scale-out on PyTorch's own distributed stack: data, tensor and pipeline parallelism + ZeRO.

Layout parsing and validation (`layout`), the device mesh (`mesh`), the strategies applied to a
plain model (`parallelize`, `pipeline`), the `Parallelism` object the one trainer drives
(`parallelism`) and the one per-rank memory model (`memory`, which `train` and `plan` both
use). Nothing here imports `train/`: the trainer hands in what it owns (the optimizer
factory, the objective). Importing `shoestring.dist.layout` or `shoestring.dist.memory` does
not initialise any process group.
"""
