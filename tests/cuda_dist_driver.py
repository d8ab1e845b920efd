"""World size 1 on NCCL, for tests/test_cuda.py (run under torchrun with one process).

shoestring's own DDP and FSDP2 wrapping (`shoestring.dist.parallelize.parallelize`, what the
trainer applies at world size > 1) on a one-rank NCCL process group and mesh, trained a few
steps beside the plain model: the losses must agree. The trainer itself builds no process
group at world size 1 (`Parallelism.start` trains one process without one), so this driver
builds the group and the mesh that a larger job would have.

argv[1]: the prepared data dir; argv[2]: a JSON list of ``--set`` overrides. Prints one JSON
line: {"device", "backend", "fp32": {wrap: losses}, "bf16": {wrap: losses}}. Without CUDA it
runs the same on CPU with gloo (how the driver itself is checked on a CPU machine).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from shoestring.config import load_config
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader
from shoestring.dist.layout import make_layout
from shoestring.dist.mesh import Meshes
from shoestring.dist.parallelize import fused_params, parallelize
from shoestring.model import build_model
from shoestring.train.objectives import objective_for
from shoestring.train.optim import build_optimizer

STEPS = 4
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def losses(data_dir: str, sets: list[str], wrap: str, dtype: torch.dtype) -> list[float]:
    """``STEPS`` training steps of the model wrapped as ``wrap`` (plain, ddp, fsdp2)."""
    cfg = load_config(None, sets)
    data = DataDir(data_dir)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.vocab_size).to(DEVICE)
    run = model
    if wrap != "plain":
        layout = make_layout("dp=1", zero=3 if wrap == "fsdp2" else 0)
        mesh = init_device_mesh(DEVICE, (1,), mesh_dim_names=("dp",))
        meshes = Meshes(world=mesh, layout=layout, pp=None, dp=mesh, fsdp=mesh, tp=None)
        run = parallelize(model, meshes, layout, fused_params(model), family=cfg.model.family)
        assert (type(run).__name__ == "DistributedDataParallel") == (wrap == "ddp"), type(run)
    opt = build_optimizer(model, cfg.train)  # DDP: the same parameters; FSDP2: in place
    obj = objective_for(cfg.model.family, data.seq_len, data.vocab_size, data.special_ids,
                        cfg.train.mask_rate, cfg.model.sparse_prediction)
    loader = BatchLoader(data.split("train", verify=False), cfg.train.batch_size,
                         cfg.train.seed, prefetch=0)
    gen = torch.Generator().manual_seed(cfg.train.seed)
    out = []
    for _ in range(STEPS):
        batch = tuple(t.to(DEVICE) for t in obj.make_batch(next(loader), gen))
        with torch.autocast(DEVICE, dtype=dtype, enabled=dtype != torch.float32):
            loss = obj.loss(run, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(float(loss.detach()))
    loader.close()
    return out


def main() -> None:
    data_dir, sets = sys.argv[1], json.loads(sys.argv[2])
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
        name = torch.cuda.get_device_name(0)
    else:
        dist.init_process_group("gloo")
        name = "cpu"
    try:
        result = {"device": name, "backend": dist.get_backend(),
                  "world_size": dist.get_world_size()}
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            result[name] = {w: losses(data_dir, sets, w, dtype)
                            for w in ("plain", "ddp", "fsdp2")}
    finally:
        dist.destroy_process_group()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
