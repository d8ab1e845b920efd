"""Each parallelism is one function applied to a plain model (torchtitan's shape).

Order matters and is the same everywhere: tensor parallel (DTensor) first, then activation
checkpointing, then data parallel (FSDP2 ``fully_shard`` for ZeRO 2/3 and HSDP, DDP for ZeRO
0/1). Pipeline splitting (`shoestring.dist.pipeline`) happens before all of them, so each stage
module is parallelized like a whole model.

Fused projections. The models keep q/k/v in one ``Wqkv`` matrix and the GLU's input and gate
in one ``Wi`` (ModernBERT's layout, which keeps the Hugging Face export lossless). A plain
column split of a fused matrix would give rank 0 all of q and half of k; tensor parallelism
needs every rank to hold *its heads* of q, k and v. `PackedColwiseParallel` therefore
reorders the rows so that rank r's contiguous block is [q_r; k_r; v_r] before sharding — the
model's own ``.view(..., 3, heads, head_dim)`` then sees exactly its heads. Because that packed
order depends on ``tp``, checkpoints never store it: `shoestring.train.checkpoint` saves each
fused matrix as its parts (``...Wqkv.weight.part0`` = q, ...), which are plain row blocks in
every layout; under FSDP those matrices are sharded along their input dimension
(``Shard(1)``) so the split stays a local view. Export concatenates the parts back.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from shoestring.families import FamilySpec
from shoestring.dist.layout import Layout
from shoestring.dist.mesh import Meshes
from shoestring.errors import ShoestringError

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "module.", "_orig_mod.",
                     "_fsdp_wrapped_module.")


def clean_fqn(name: str) -> str:
    """A parameter name without the wrapper prefixes DDP/AC/compile insert."""
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


# --------------------------------------------------------------------------- structure


def fused_params(model: nn.Module) -> dict[str, list[int]]:
    """Canonical names of fused projection parameters → row sizes of their parts.

    ``attn.Wqkv``: [q, k, v] (k and v narrower under grouped-query attention); a gated
    feed-forward's ``mlp.Wi``: [input, gate]. A plain GELU ``Wi`` is not fused.
    """
    out: dict[str, list[int]] = {}
    for name, mod in model.named_modules():
        name = clean_fqn(name)
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        if name.endswith("attn.Wqkv") and isinstance(mod, nn.Linear):
            attn = model.get_submodule(parent)
            hd = attn.head_dim
            sizes = [attn.num_heads * hd, attn.kv_heads * hd, attn.kv_heads * hd]
        elif name.endswith("mlp.Wi") and getattr(model.get_submodule(parent), "gated", False):
            sizes = [mod.out_features // 2] * 2
        else:
            continue
        for pname, _ in mod.named_parameters(recurse=False):
            out[f"{name}.{pname}"] = sizes
    return out


def block_names(model: nn.Module) -> list[str]:
    """Names of the transformer blocks (``layers.<i>``) of a model or a pipeline stage, or of
    each of its parts' (``generator.layers.<i>``, ``discriminator.layers.<i>``: model/detector.py)."""
    layers = getattr(model, "layers", None)
    if layers is None:
        names = [f"{name}.{block}" for name, child in model.named_children()
                 if isinstance(getattr(child, "layers", None), (nn.ModuleList, nn.ModuleDict))
                 for block in block_names(child)]
        if not names:
            raise ShoestringError(
                f"{type(model).__name__} has no .layers; shoestring.dist does not know how to "
                "parallelize it", where="parallelize")
        return names
    keys = layers.keys() if isinstance(layers, nn.ModuleDict) else range(len(layers))
    return [f"layers.{k}" for k in keys]


# --------------------------------------------------------------------------- tensor parallel


def pack_rows(weight: Tensor, sizes: list[int], n: int) -> Tensor:
    """Reorder fused rows [c0; c1; ...] so that block r of n is [c0_r; c1_r; ...]."""
    pieces = [c.chunk(n, dim=0) for c in weight.split(sizes, dim=0)]
    return torch.cat([pieces[i][r] for r in range(n) for i in range(len(sizes))], dim=0)


class PackedColwiseParallel(ColwiseParallel):
    """ColwiseParallel for a fused projection: each rank gets its slice of *every* part."""

    def __init__(self, sizes: list[int], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.sizes = sizes

    def _partition_linear_fn(self, name, module, device_mesh):  # noqa: ANN001
        n = device_mesh.size()
        for pname, param in list(module.named_parameters(recurse=False)):
            packed = pack_rows(param.data, self.sizes, n)
            dist_param = nn.Parameter(
                distribute_tensor(packed, device_mesh, [Shard(0)], src_data_rank=None),
                requires_grad=param.requires_grad,
            )
            module.register_parameter(pname, dist_param)


class ReplicateParallel(ParallelStyle):
    """Parameters replicated as DTensors over the TP group; plain tensor inputs become
    Replicate DTensors (torchtitan's NoParallel): keeps the small head layers on the mesh so
    the tied, vocabulary-sharded output projection can consume their output."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:  # noqa: ANN001
        def input_fn(mod, inputs, mesh):  # noqa: ANN001
            return tuple(
                DTensor.from_local(t, mesh, [Replicate()], run_check=False)
                if isinstance(t, Tensor) and not isinstance(t, DTensor) else t
                for t in inputs
            )

        return distribute_module(module, device_mesh, None, input_fn, None)


def _gather_hook(local: bool):  # noqa: ANN202
    """Forward hook on the trunk's last module: sequence-sharded residual stream → the full
    sequence (a plain tensor for the MLM gather, a Replicate DTensor for the CLM logits)."""

    def hook(module: nn.Module, inputs: tuple, output: Tensor) -> Tensor:
        if not isinstance(output, DTensor):
            mesh = module._shoestring_tp_mesh
            output = DTensor.from_local(output, mesh, [Shard(1)], run_check=False)
        full = output.redistribute(placements=[Replicate()])
        return full.to_local() if local else full

    return hook


def apply_tp(model: nn.Module, tp_mesh, fused: dict[str, list[int]], *,  # noqa: ANN001
             family: FamilySpec, last: bool = True) -> None:
    """Megatron-style tensor + sequence parallelism with DTensor, for the shared trunk
    (`shoestring.model.layers`) of the encoder and the decoder.

    Column-parallel fused q/k/v and GLU input projections, row-parallel output projections,
    norms and residual stream sharded along the sequence (SequenceParallel), the vocabulary
    sharded across the group for the (tied or untied) output projection: logits stay
    vocabulary-sharded and the loss runs under ``loss_parallel``. ``last``: this module
    computes the head (the whole model, or the last pipeline stage).
    """
    n = tp_mesh.size()
    plan: dict[str, ParallelStyle] = {}
    has = lambda name: _has(model, name)  # noqa: E731
    if has("tok_embeddings"):
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                 output_layouts=Shard(1))
    if has("emb_norm"):
        plan["emb_norm"] = SequenceParallel(use_local_output=True)
    blocks = block_names(model)
    for b in blocks:
        block = model.get_submodule(b)
        attn = block.attn
        if not isinstance(block.attn_norm, nn.Identity):
            plan[f"{b}.attn_norm"] = SequenceParallel(use_local_output=True)
        plan[f"{b}.attn"] = PrepareModuleInput(
            input_layouts=(Shard(1), None, None, None, None),
            desired_input_layouts=(Replicate(), None, None, None, None),
        )
        plan[f"{b}.attn.Wqkv"] = PackedColwiseParallel(fused[f"{b}.attn.Wqkv.weight"])
        plan[f"{b}.attn.Wo"] = RowwiseParallel(output_layouts=Shard(1))
        plan[f"{b}.mlp_norm"] = SequenceParallel(use_local_output=True)
        plan[f"{b}.mlp"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        )
        wi = f"{b}.mlp.Wi.weight"
        plan[f"{b}.mlp.Wi"] = (PackedColwiseParallel(fused[wi]) if wi in fused
                               else ColwiseParallel())
        plan[f"{b}.mlp.Wo"] = RowwiseParallel(output_layouts=Shard(1))
        attn.num_heads //= n
        attn.kv_heads //= n
    gather_at = None
    if last:
        if has("final_norm"):
            plan["final_norm"] = SequenceParallel(use_local_output=False)
            gather_at = "final_norm"
        elif blocks:
            gather_at = blocks[-1]
        for name in ("head_dense", "head_norm"):
            if has(name):
                plan[name] = ReplicateParallel()
        for name in ("decoder", "lm_head"):  # untied output projections: vocabulary-sharded
            if has(name):
                plan[name] = ColwiseParallel()
    parallelize_module(model, tp_mesh, plan)
    if gather_at is not None:
        target = model.get_submodule(gather_at)
        target._shoestring_tp_mesh = tp_mesh
        # a head at selected positions gathers them from a plain tensor; a dense vocabulary
        # head keeps the Replicate DTensor that loss_parallel needs
        target.register_forward_hook(_gather_hook(local=family.sparse_head))


def _has(model: nn.Module, name: str) -> bool:
    try:
        return model.get_submodule(name) is not None
    except AttributeError:
        return False


# --------------------------------------------------------------------------- activation ckpt


def _selective_policy():  # noqa: ANN202
    """Save the outputs of matmuls and attention (expensive to redo); recompute the rest
    (norms, GELU, rotary, residual adds: cheap FLOPs, most of the activation bytes)."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.linear.default,
            aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default}

    def policy(ctx, op, *args, **kwargs):  # noqa: ANN001, ANN202
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_ac(model: nn.Module, mode: str) -> None:
    """Wrap each block in activation checkpointing: ``full`` recomputes the whole block in
    backward; ``selective`` keeps matmul/attention outputs and recomputes the cheap ops."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    kwargs: dict = {"preserve_rng_state": False}
    if mode == "selective":
        kwargs["context_fn"] = functools.partial(
            create_selective_checkpoint_contexts, _selective_policy()
        )
    for name in block_names(model):
        parent, _, key = name.rpartition(".")
        layers = model.get_submodule(parent)
        index = key if isinstance(layers, nn.ModuleDict) else int(key)
        layers[index] = checkpoint_wrapper(layers[index], **kwargs)


# --------------------------------------------------------------------------- compile


def apply_compile(model: nn.Module) -> None:
    """``torch.compile`` each transformer block in place (torchtitan's ``apply_compile``),
    after TP and activation checkpointing and before FSDP/DDP wrap the model.

    In place (``nn.Module.compile``): parameter names, `block_names` and state dicts are the
    uncompiled model's. Dynamo traces the block's ``forward``, not the hooks around it, so the
    hooks FSDP2 puts on each block (all-gather before, reshard after) run eagerly between the
    graphs. The blocks share one code object and, with nn modules inlined, one set of
    guards: inductor compiles the block once (twice where block 0 differs: no attention norm
    after a normalized embedding), whatever the depth. The embeddings, the head and the loss
    stay eager (one process compiles them with the model, `Parallelism.apply`)."""
    for b in block_names(model):
        model.get_submodule(b).compile()


# --------------------------------------------------------------------------- data parallel


def apply_fsdp(model: nn.Module, meshes: Meshes, layout: Layout, fused: Iterable[str],
               reshard_after_forward: bool) -> None:
    """FSDP2: one ``fully_shard`` unit per block plus the root (ZeRO-2: no reshard after
    forward; ZeRO-3: reshard; HSDP when the mesh is 2-D)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    fused_ids = {id(p) for name, p in model.named_parameters() if clean_fqn(name) in fused}

    def placement(p: nn.Parameter):  # noqa: ANN202
        return Shard(1) if id(p) in fused_ids and p.dim() == 2 else Shard(0)

    offload = CPUOffloadPolicy() if layout.offload else OffloadPolicy()
    kw = dict(mesh=meshes.fsdp, offload_policy=offload, shard_placement_fn=placement)
    for b in block_names(model):
        fully_shard(model.get_submodule(b), reshard_after_forward=reshard_after_forward, **kw)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kw)


def apply_ddp(model: nn.Module, meshes: Meshes) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, process_group=meshes.dp.get_group())


def parallelize(part: nn.Module, meshes: Meshes, layout: Layout, fused: dict[str, list[int]],
                *, family: FamilySpec, last: bool = True, compiled: bool = False) -> nn.Module:
    """TP → AC → compile each block (``compiled``) → FSDP/DDP on one model (or pipeline
    stage) module. Returns the module to run."""
    if meshes.tp is not None:
        apply_tp(part, meshes.tp, fused, family=family, last=last)
    apply_ac(part, layout.ac)
    if compiled:
        apply_compile(part)
    if layout.fsdp:
        apply_fsdp(part, meshes, layout, fused, reshard_after_forward=layout.zero == 3)
    elif meshes.dp is not None:
        part = apply_ddp(part, meshes)
    return part


# --------------------------------------------------------------------------- gradients


def _norm_sq(grads: list[Tensor]) -> Tensor:
    """Global squared L2 norm of a list of (possibly DTensor) gradients."""
    total = torch.zeros((), dtype=torch.float32)
    by_spec: dict[tuple, list[Tensor]] = {}
    for g in grads:
        key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else None
        by_spec.setdefault(key, []).append(g)  # type: ignore[arg-type]
    for key, gs in by_spec.items():
        n = torch.nn.utils.get_total_norm(gs, 2.0, foreach=False)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        total = total + n.float().cpu() ** 2
    return total


def clip_grad_norm_(parts: list[nn.Module], tied_copies: list[nn.Parameter],
                    pp_group: Any, max_norm: float) -> float:
    """Clip by the norm over *all* parameters of ``parts``, across TP/FSDP shards (DTensor
    norms) and pipeline stages (a sum over ``pp_group``, None without pipelining), counting the
    tied copy once."""
    import torch.distributed as dist

    copies = {id(p) for p in tied_copies}
    params = [p for part in parts for p in part.parameters() if p.grad is not None]
    counted = [p.grad for p in params if id(p) not in copies]
    sq = _norm_sq(counted)
    if pp_group is not None:
        dev = params[0].grad.device if params else torch.device("cpu")
        sq = sq.to(dev)
        dist.all_reduce(sq, group=pp_group)
        sq = sq.cpu()
    norm = float(sq.sqrt())
    if max_norm > 0 and params:
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for p in params:
                p.grad.mul_(coef)
    return norm
