"""The device mesh: ranks arranged as (pp, dp_replicate, dp_shard, tp), tp innermost.

Megatron-LM and torchtitan order the mesh the same way: tensor-parallel groups are contiguous
ranks (the GPUs of one node, joined by NVLink, where TP's per-layer all-reduces belong), data
parallel comes next, and pipeline stages are outermost (one point-to-point activation send per
microbatch is what crosses the slowest links). With ``R = pp·dp·tp`` ranks the coordinate of
rank r is simply its row-major index into that shape.

`dry_run` builds the same `DeviceMesh` for a cluster-sized job inside one process, with
PyTorch's fake process group (no communication, no GPU), and reports the groups one rank
would join — e.g. MT-NLG's 4,480 GPUs as TP 8 × DP 16 × PP 35.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from shoestring.dist.layout import Layout

DIM_ORDER = ("pp", "dp_replicate", "dp_shard", "tp")


def mesh_dims(layout: Layout) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Names and sizes of the mesh dimensions, outermost first; size-1 dims are left out
    except the one FSDP needs to tell replication from sharding (HSDP with shard=1)."""
    sizes = {"pp": layout.pp, "dp_replicate": layout.dp_replicate,
             "dp_shard": layout.dp_shard, "tp": layout.tp}
    keep = {k for k, v in sizes.items() if v > 1}
    if layout.fsdp and layout.dp_replicate > 1:
        keep.add("dp_shard")  # fully_shard on a (replicate, shard) mesh = HSDP
    names = tuple(k for k in DIM_ORDER if k in keep) or ("dp_replicate",)
    return names, tuple(sizes[k] for k in names)


def rank_coords(layout: Layout, rank: int) -> dict[str, int]:
    """The (pp, dp_replicate, dp_shard, tp) coordinate of ``rank`` (pure arithmetic)."""
    coords = {}
    for name in reversed(DIM_ORDER):
        size = getattr(layout, name)
        coords[name] = rank % size
        rank //= size
    coords["dp"] = coords["dp_replicate"] * layout.dp_shard + coords["dp_shard"]
    return {k: coords[k] for k in (*DIM_ORDER, "dp")}


@dataclass
class Meshes:
    """The world mesh and the sub-meshes each strategy needs (None where a degree is 1)."""

    world: DeviceMesh
    layout: Layout
    pp: DeviceMesh | None
    dp: DeviceMesh | None  # all data-parallel ranks, flattened (data slicing, loss averaging)
    fsdp: DeviceMesh | None  # 1-D shard mesh, or 2-D (replicate, shard) for HSDP
    tp: DeviceMesh | None

    def coord(self, dim: str) -> int:
        mesh = getattr(self, dim)
        return 0 if mesh is None else mesh.get_local_rank()


def build_mesh(layout: Layout, device_type: str) -> Meshes:
    """`init_device_mesh` for ``layout`` (the process group must already exist)."""
    names, sizes = mesh_dims(layout)
    world = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    sub = lambda n: world[n] if n in names and getattr(layout, n) > 1 else None  # noqa: E731
    dp_names = tuple(n for n in ("dp_replicate", "dp_shard") if n in names)
    if len(dp_names) == 2:
        dp = world[dp_names]._flatten("dp")
        fsdp = world[dp_names]
    elif len(dp_names) == 1 and layout.dp > 1:
        dp = fsdp = world[dp_names[0]]
    else:
        dp = fsdp = None
    return Meshes(world=world, layout=layout, pp=sub("pp"), dp=dp, fsdp=fsdp, tp=sub("tp"))


def dry_run(layout: Layout, rank: int = 0, device_type: str = "cpu") -> dict:
    """Build ``layout``'s mesh as rank ``rank`` of a fake process group; return its groups.

    Uses torch's fake backend (every collective is a no-op), so a 4,480-rank mesh is built by
    one process in seconds; the tests check the result against the rank arithmetic of
    `rank_coords`. The default process group is destroyed again before returning.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    if dist.is_initialized():
        raise RuntimeError("dry_run needs a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    try:
        meshes = build_mesh(layout, device_type)
        groups = {}
        for dim in ("tp", "pp", "dp"):
            mesh = getattr(meshes, dim)
            groups[dim] = [rank] if mesh is None else sorted(int(r) for r in mesh.mesh.flatten())
        names, sizes = mesh_dims(layout)
        return {
            "rank": rank,
            "world_size": layout.world_size,
            "mesh_dims": dict(zip(names, sizes)),
            "coords": rank_coords(layout, rank),
            "groups": groups,
        }
    finally:
        dist.destroy_process_group()


def format_dry_run(layout: Layout, reports: list[dict], gpus_per_node: int = 8) -> str:
    """Human-readable table of a dry run: mesh shape and each sampled rank's groups."""
    names, sizes = mesh_dims(layout)
    shape = " × ".join(f"{n} {s}" for n, s in zip(names, sizes) if s > 1)
    lines = [
        f"{layout.world_size} ranks = {shape}  (tp innermost; "
        f"{layout.world_size // gpus_per_node} nodes of {gpus_per_node})",
        f"{'rank':>6} {'node':>5} {'pp':>4} {'dp':>4} {'tp':>3}  tp group / pp group / dp group",
    ]

    def span(g: list[int]) -> str:
        if len(g) <= 4:
            return ",".join(map(str, g))
        step = g[1] - g[0]
        return f"{g[0]},{g[1]},…,{g[-1]} (step {step}, {len(g)})"

    for r in reports:
        c = r["coords"]
        lines.append(
            f"{r['rank']:>6} {r['rank'] // gpus_per_node:>5} {c['pp']:>4} {c['dp']:>4} "
            f"{c['tp']:>3}  {span(r['groups']['tp'])} / {span(r['groups']['pp'])} / "
            f"{span(r['groups']['dp'])}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python -m shoestring.dist.mesh dp=16,tp=8,pp=35 [rank ...]``: print a dry run."""
    import sys

    from shoestring.dist.layout import make_layout

    args = sys.argv[1:] if argv is None else argv
    layout = make_layout(args[0] if args else "dp=16,tp=8,pp=35")
    ranks = [int(a) for a in args[1:]] or [0, 1, layout.world_size // 2, layout.world_size - 1]
    reports = [dry_run(layout, r) for r in ranks]
    print(format_dry_run(layout, reports))


if __name__ == "__main__":
    main()
