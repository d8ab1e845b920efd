"""The seam between the training loop and the layout: one object the loop calls for everything
that depends on how the model is spread over processes.

The loop (`shoestring.train.loop`) holds no ``if distributed`` branch. It asks a `Parallelism`
to build the model (pipeline split → tensor parallel → activation checkpointing → FSDP2/DDP,
torchtitan's order), to take this rank's rows of the global batch, to run forward and backward
over the step's micro-batches (through a pipeline schedule when pp > 1), to clip by the global
gradient norm, to reduce the loss, and to make every rank agree on decisions taken from local
observations (wall clock, a caught signal).

In one process without torchrun every group is ``None`` and each of those calls reduces to the
plain PyTorch one (no collective, no wrapper): the single-device run and every layout go
through the same code. Every layout computes the single-process losses up to floating-point
reduction order (tests/test_dist_parity.py, tolerance in docs/distributed.md):

* the global batch (``batch_size`` rows) is read and masked exactly as one process would;
* it is cut into ``accum`` micro-steps of ``dp × micro`` rows; data-parallel rank r takes rows
  ``[r·micro, (r+1)·micro)`` of each micro-step, so every rank does the same number of
  forward/backward passes and each row weighs the same;
* each micro-step's mean loss is divided by ``accum``, and data parallelism averages across
  ranks, so the gradient is the global batch's mean gradient;
* gradients are synchronised across data-parallel ranks on the last micro-step only (DDP
  ``no_sync``, FSDP2 ``set_requires_gradient_sync``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from shoestring.config import Config
from shoestring.dist.layout import Layout, validate
from shoestring.errors import ShoestringError

# (model parts, layout, meshes or None) → one optimizer per part; the trainer supplies it
OptimizerFactory = Callable[[list[nn.Module], Any, Any], list[torch.optim.Optimizer]]


def world_from_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment (1 process without it)."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def check_layout(cfg: Config, layout: Layout, vocab_size: int, world_size: int,
                 device_type: str) -> None:
    """Every check of the layout against this model and batch (no process group needed)."""
    m, t = cfg.model, cfg.train
    validate(layout, world_size, num_layers=m.num_layers, num_heads=m.num_heads,
             hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
             vocab_size=vocab_size, batch_size=t.batch_size,
             num_kv_heads=getattr(m, "num_kv_heads", None), device_type=device_type,
             micro_batch=t.micro_batch(layout.dp))
    if layout.tp > 1 and m.bias:
        raise ShoestringError(
            "model.bias=true with tp > 1 is not supported: fused q/k/v biases would be stored "
            "in the tp-dependent packed order", where="model.bias",
            fix="use biases with tp=1 (dp/pp/ZeRO work), or model.bias=false (the default)")
    if layout.tp > 1 and m.positions != "rotary":
        raise ShoestringError(
            f"model.positions={m.positions} with tp > 1 is not supported (sequence "
            "parallelism shards the residual stream before absolute positions are added)",
            where="model.positions", fix="use rotary positions (the default) with tp > 1")
    if layout.tp > 1 and m.family.generator:
        raise ShoestringError(
            f"tensor parallelism (tp > 1) is not supported for model.objective={m.objective}: "
            "the generator's width is not split", where="--parallel",
            fix="use dp (and ZeRO) for this objective")
    if layout.pp > 1 and m.family.sparse_head and not m.sparse_prediction:
        raise ShoestringError("pipeline parallelism runs the sparse MLM head only",
                              where="model.sparse_prediction", fix="set it to true (default)")
    if layout.pp > 1 and t.compile is True:
        raise ShoestringError(
            "train.compile with pp > 1 is not supported: the pipeline schedule runs the stage "
            "modules itself", where="train.compile", fix="--set train.compile=false")


_INCARNATIONS = 0


def _fresh_store():  # noqa: ANN202
    """For the 2nd+ process group of one process (several runs in one launch, as the tests
    do): the launcher's store under a new prefix, so no key of the previous group is reused
    (gloo would otherwise dial a peer's stale address)."""
    global _INCARNATIONS
    _INCARNATIONS += 1
    if _INCARNATIONS == 1 or "MASTER_ADDR" not in os.environ:
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    return dist.PrefixStore(f"shoestring-run-{_INCARNATIONS}", store)


def _init_process_group(device_type: str, local_rank: int) -> torch.device:
    """NCCL on CUDA (one GPU per local rank), gloo on CPU."""
    rank, world, _ = world_from_env()
    store = _fresh_store()
    kw = {} if store is None else {"store": store, "rank": rank, "world_size": world}
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, **kw)
        return device
    dist.init_process_group("gloo", **kw)
    return torch.device("cpu")


def _local(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _unwrap(mod: nn.Module) -> nn.Module:
    """The module inside the DDP wrapper (FSDP2, TP and per-block compile modify in place)."""
    while isinstance(mod, torch.nn.parallel.DistributedDataParallel):
        mod = mod.module
    return mod


@dataclass
class Parallelism:
    """How this process takes part in training (see the module docstring).

    Built by `Parallelism.start`; ``parts`` are the module(s) this rank trains (one per local
    pipeline stage, one without a pipeline), ``optimizers`` one per part.
    """

    layout: Layout
    device: torch.device
    rank: int = 0
    world: int = 1
    meshes: Any = None  # shoestring.dist.mesh.Meshes, or None in one process
    parts: list[nn.Module] = field(default_factory=list)
    stage_ids: list[int] = field(default_factory=lambda: [0])
    fused: dict[str, list[int]] = field(default_factory=dict)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    schedule: Any = None  # a torch.distributed.pipelining schedule when pp > 1
    tied_owners: list[nn.Parameter] = field(default_factory=list)
    tied_copies: list[nn.Parameter] = field(default_factory=list)
    embedding_group: Any = None
    _compiled_loss: Callable | None = None  # one process: model and loss in one graph
    _compiled_blocks: bool = False  # distributed: each block compiled (parallelize)
    _loss_scale: float = 1.0
    _stage_objective: Any = None  # the objective of the step the pipeline schedule runs

    # ------------------------------------------------------------------ setup

    @classmethod
    def start(cls, cfg: Config, layout: Layout | None, vocab_size: int) -> Parallelism:
        """Validate ``layout`` for this model and job, then (only when the job has more than
        one process) create the process group and the device mesh. Validation happens before
        any collective, on every rank, so a bad layout fails the same way everywhere."""
        rank, world, local_rank = world_from_env()
        layout = layout or Layout()
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        check_layout(cfg, layout, vocab_size, world, device_type)
        if world == 1:
            device = torch.device(device_type)
            return cls(layout=layout, device=device)
        from shoestring.dist.mesh import build_mesh

        device = _init_process_group(device_type, local_rank)
        dist.barrier()
        return cls(layout=layout, device=device, rank=rank, world=world,
                   meshes=build_mesh(layout, device_type))

    @property
    def distributed(self) -> bool:
        return self.meshes is not None

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run dir (metrics, summary, final/); every rank writes its
        checkpoint shards."""
        return self.rank == 0

    @property
    def dp(self) -> int:
        return self.layout.dp

    def coord(self, dim: str) -> int:
        return 0 if self.meshes is None else self.meshes.coord(dim)

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------ model

    def apply(self, model: nn.Module, cfg: Config, optimizers: OptimizerFactory,
              compiled: bool = False) -> None:
        """Spread the canonical ``model`` (identical on every rank) over the layout and build
        the optimizers with ``optimizers(parts, layout, meshes)`` (the trainer's): pipeline
        split, then TP → AC → FSDP/DDP on each stage module. ``compiled`` (`train.speed`
        resolves train.compile): in one process the model and the loss are compiled as one
        graph; in a distributed run each transformer block is compiled in place between AC
        and FSDP/DDP (`parallelize.apply_compile`, torchtitan's order); a pipeline stays
        uncompiled (its schedule runs the stage modules itself; `check_layout` refuses an
        explicit train.compile=true with pp > 1)."""
        from shoestring.dist.parallelize import fused_params, parallelize

        family, layout = cfg.model.family, self.layout
        self.fused = fused_params(model)
        if layout.pp > 1:
            from shoestring.dist.pipeline import split_model

            stages = split_model(model, layout, self.coord("pp"), layout.tp, family)
        else:
            stages = [(0, model)]
        tied = getattr(model, "decoder", None) is None and getattr(model, "lm_head", None) is None
        self.parts, self.stage_ids = [], []
        self._compiled_blocks = compiled and self.distributed and layout.pp == 1
        for s, mod in stages:
            mod.to(self.device)
            if self.meshes is not None:
                mod = parallelize(mod, self.meshes, layout, self.fused, family=family,
                                  last=s == layout.num_stages - 1,
                                  compiled=self._compiled_blocks)
            else:
                from shoestring.dist.parallelize import apply_ac

                apply_ac(mod, layout.ac)
            self.parts.append(mod)
            self.stage_ids.append(s)
            if layout.pp > 1 and tied and hasattr(_unwrap(mod), "tok_embeddings"):
                emb = _unwrap(mod).tok_embeddings.weight
                (self.tied_owners if s == 0 else self.tied_copies).append(emb)
        if layout.pp > 1 and tied:
            self.embedding_group = self._embedding_group()
        self.optimizers = optimizers(self.parts, layout, self.meshes)
        if compiled and not self.distributed:
            # The loss in the same graph as the model: the fp32 upcast, log-softmax and its
            # backward fuse instead of materializing (B, T, V) fp32 logits (the decoder's step
            # runs ~1.3x faster than with the model alone compiled; docs/training.md).
            self._compiled_loss = torch.compile(_loss_of)
        if layout.pp > 1:
            from shoestring.dist.pipeline import build_schedule

            self.schedule = build_schedule(
                list(zip(self.stage_ids, self.parts)), layout, self.meshes.pp.get_group(),
                self.device, lambda out, target: (
                    self._stage_objective.stage_loss(out, target) / self._loss_scale))

    def _embedding_group(self):  # noqa: ANN202
        """Process group of the first and last stage rank that share this rank's (dp, tp)
        place; only those two ranks create (and join) it."""
        ranks = sorted(int(r) for r in self.meshes.pp.mesh.flatten())
        first, last = ranks[0], ranks[(self.layout.num_stages - 1) % self.layout.pp]
        if dist.get_rank() not in (first, last):
            return None
        return dist.new_group([first, last], use_local_synchronization=True)

    def modules(self) -> list[nn.Module]:
        """The plain modules (no DDP wrapper): for state dicts and evaluation."""
        return [_unwrap(p) for p in self.parts]

    def train_mode(self, on: bool = True) -> None:
        for p in self.parts:
            p.train(on)

    # ------------------------------------------------------------------ data

    def local_rows(self, batch: tuple[Tensor, ...], accum: int) -> list[tuple[Tensor, ...]]:
        """The global batch (``accum × dp × micro`` rows, prepared as one process would) →
        this rank's ``accum`` micro-batches, on its device."""
        dp, r = self.dp, self.coord("dp")
        out = []
        for i in range(accum):
            rows = batch[0].shape[0] // accum
            micro = rows // dp
            lo = i * rows + r * micro
            out.append(tuple(t[lo:lo + micro].to(self.device, non_blocking=True) for t in batch))
        return out

    # ------------------------------------------------------------------ the step

    def _sync_context(self, last: bool) -> contextlib.AbstractContextManager:
        """Gradients cross data-parallel ranks only on the step's last micro-batch."""
        if self.meshes is None or self.meshes.dp is None or self.schedule is not None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for p in self.parts:
            if hasattr(p, "no_sync"):  # DDP
                if not last:
                    stack.enter_context(p.no_sync())
            elif hasattr(p, "set_requires_gradient_sync"):  # FSDP2
                p.set_requires_gradient_sync(last)
        return stack

    def _compile_context(self) -> contextlib.AbstractContextManager:
        """Under DDP, compiled blocks are traced with Dynamo's DDPOptimizer off. That optimizer
        exists for a graph that holds a whole DDP model: it splits the graph at DDP's bucket
        boundaries so that gradient buckets are ready before the whole backward ends. Here
        DDP wraps the model from outside and each block is its own graph: the block's backward
        hands its gradients to autograd when it returns, DDP's reducer hooks (on gradient
        accumulation, outside any graph) fill and all-reduce buckets while earlier blocks run
        backward. Left on (Dynamo turns it on whenever it compiles inside a DDP forward), it
        cut each block's graph into pieces at DDP's 1 MiB first bucket and 25 MiB buckets:
        less fusion and twice the compile time for a block of 4 MB."""
        if not self._compiled_blocks or not any(hasattr(p, "no_sync") for p in self.parts):
            return contextlib.nullcontext()
        return torch._dynamo.config.patch(optimize_ddp=False)

    def _loss_context(self) -> contextlib.AbstractContextManager:
        if self.meshes is None or self.meshes.tp is None:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def forward_backward(self, objective, micro_batches: list[tuple[Tensor, ...]],  # noqa: ANN001
                         autocast: Callable[[], contextlib.AbstractContextManager],
                         scaler: torch.amp.GradScaler | None = None) -> Tensor:
        """Forward and backward over this rank's micro-batches, gradients accumulated as the
        mean over them; returns this rank's mean loss (0 on pipeline ranks without the last
        stage), as a tensor so the caller decides when to synchronise."""
        accum = len(micro_batches)
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        model = self.parts[0]
        for i, micro in enumerate(micro_batches):
            with (self._sync_context(i == accum - 1), self._loss_context(),
                  self._compile_context(), autocast()):
                if self.schedule is None:
                    loss = (self._compiled_loss(objective, model, micro)
                            if self._compiled_loss is not None
                            else objective.loss(model, micro)) / accum
                    (scaler.scale(loss) if scaler else loss).backward()
                    total += _local(loss).detach().float()
                else:
                    total += self._run_schedule(self.schedule.step, objective, micro,
                                                accum).to(self.device)
        return total

    def _run_schedule(self, run: Callable, objective, batch: tuple[Tensor, ...],  # noqa: ANN001
                      accum: int = 1) -> Tensor:
        """``schedule.step`` or ``schedule.eval`` on one batch (one of ``accum`` micro-batches,
        split again into the layout's pipeline microbatches): the first stage gets the model
        inputs, the last the targets; the loss function divides by both counts, so gradients
        accumulate to the mean (the schedule's own scaling is off). Returns the sum of the
        microbatch losses (0 on ranks without the last stage)."""
        self._loss_scale = float(self.layout.n_microbatches * accum)
        first = 0 in self.stage_ids
        last = self.layout.num_stages - 1 in self.stage_ids
        self._stage_objective = objective  # the schedule's loss function calls it
        args, target = objective.pipeline_io(batch)
        losses: list[Tensor] = []
        run(*(args if first else ()), target=target if last else None,
            losses=losses if last else None)
        if not last:
            return torch.zeros((), dtype=torch.float32)
        return torch.stack([_local(x).detach().float().cpu() for x in losses]).sum()

    def sync_tied_grads(self) -> None:
        """Sum the tied embedding's gradient between the first and last pipeline stage
        (Megatron's embedding group): each holds a copy, both must take the same step."""
        if self.embedding_group is None:
            return
        for p in self.tied_owners + self.tied_copies:
            dist.all_reduce(_local(p.grad), group=self.embedding_group)

    def clip(self, max_norm: float) -> float:
        """Clip by the norm over all parameters of the model — across TP/FSDP shards and
        pipeline stages, the tied copy counted once — and return that norm (the same value
        on every rank, so a non-finite norm is seen everywhere)."""
        from shoestring.dist.parallelize import clip_grad_norm_

        self.sync_tied_grads()
        if self.meshes is None:
            params = [p for part in self.parts for p in part.parameters()]
            return float(torch.nn.utils.clip_grad_norm_(
                params, max_norm if max_norm > 0 else float("inf")))
        pp = self.meshes.pp.get_group() if self.meshes.pp is not None else None
        return clip_grad_norm_(self.parts, self.tied_copies, pp, max_norm)

    def step(self, lr: float, scaler: torch.amp.GradScaler | None = None) -> None:
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
            if scaler is not None:
                scaler.step(opt)
            else:
                opt.step()
        if scaler is not None:
            scaler.update()
        self.zero_grad()

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def unscale(self, scaler: torch.amp.GradScaler | None) -> None:
        if scaler is not None:
            for opt in self.optimizers:
                scaler.unscale_(opt)

    # ------------------------------------------------------------------ agreement

    def reduce_loss(self, loss: Tensor) -> float:
        """The global batch's mean loss, on every rank: summed from the last stage over pp,
        averaged over dp."""
        m = self.meshes
        if m is None:
            return float(loss)
        if m.pp is not None:
            dist.all_reduce(loss, group=m.pp.get_group())
        if m.dp is not None:
            dist.all_reduce(loss, group=m.dp.get_group())
            loss = loss / m.dp.size()
        return float(loss)

    def agree(self, values: list[float]) -> list[float]:
        """The elementwise maximum of ``values`` over all ranks: one small all-reduce turns
        local observations (elapsed wall clock, a caught SIGTERM) into one decision."""
        return self._collective(values, lambda t: dist.all_reduce(t, op=dist.ReduceOp.MAX))

    def gather(self, value: float) -> list[float]:
        """``value`` from every rank, in rank order (a sum of one-hot vectors)."""
        return self._collective([value if r == self.rank else 0.0 for r in range(self.world)],
                                dist.all_reduce)

    def broadcast(self, values: list[float]) -> list[float]:
        """Rank 0's ``values`` on every rank (e.g. its choice of precision)."""
        return self._collective(values, lambda t: dist.broadcast(t, src=0))

    def _collective(self, values: list[float], op: Callable[[Tensor], object]) -> list[float]:
        """``op`` on ``values`` as one float64 tensor on the collective's device (NCCL needs
        CUDA); ``values`` unchanged in one process."""
        if self.meshes is None:
            return values
        device = self.device if self.device.type == "cuda" else torch.device("cpu")
        t = torch.tensor(values, dtype=torch.float64, device=device)
        op(t)
        return [float(x) for x in t.cpu()]

    def barrier(self) -> None:
        if self.meshes is not None:
            dist.barrier()

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def eval_loss(self, objective, batch: tuple[Tensor, ...],  # noqa: ANN001
                  autocast: Callable[[], contextlib.AbstractContextManager],
                  chunk: int = 64) -> float:
        """Mean loss over ``batch`` (every rank runs all of it: the subset is small, and every
        layout scores exactly the same rows). Rows score equally many positions, so the mean
        of chunk means weighted by rows is the mean over positions. Eager, as in one process:
        compiled blocks would compile again for no-grad and the validation chunk's rows, for a
        few small batches."""
        self.train_mode(False)
        n = self.layout.n_microbatches if self.schedule is not None else 1
        chunk = max(n, chunk // n * n)
        size = batch[0].shape[0] // n * n  # a pipeline scores whole microbatches only
        total, rows = torch.zeros((), dtype=torch.float64), 0
        try:
            for start in range(0, size, chunk):
                part = tuple(t[start:min(start + chunk, size)].to(self.device) for t in batch)
                with (self._loss_context(), autocast(),
                      torch.compiler.set_stance("force_eager")):
                    if self.schedule is None:
                        loss = _local(objective.loss(self.modules()[0], part)).float()
                    else:
                        loss = self._run_schedule(self.schedule.eval, objective, part)
                total += loss.double().cpu() * part[0].shape[0]
                rows += part[0].shape[0]
        finally:
            self.train_mode(True)
        if self.meshes is not None and self.meshes.pp is not None:
            dist.all_reduce(total, group=self.meshes.pp.get_group())
        return float(total) / max(rows, 1)

    # ------------------------------------------------------------------ memory

    def measured_memory(self, grad_bytes: int) -> dict[str, int]:
        """Bytes of this rank's parameter shards, gradients and optimizer state after a step,
        the maximum over ranks (what `shoestring.dist.memory` predicts for the busiest rank)."""
        params = _local_bytes(p for part in self.parts for p in part.parameters())
        state = 0
        for opt in self.optimizers:
            inner = getattr(opt, "optim", opt)
            for st in inner.state.values():
                state += _local_bytes(v for v in st.values()
                                      if isinstance(v, Tensor) and v.dim() > 0)
        got = self.agree([float(params), float(grad_bytes), float(state)])
        return {"params": int(got[0]), "grads": int(got[1]), "optimizer": int(got[2])}

    def grad_bytes(self) -> int:
        return _local_bytes(p.grad for part in self.parts for p in part.parameters()
                            if p.grad is not None)


def _loss_of(objective, model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:  # noqa: ANN001
    """What `forward_backward` differentiates; compiled whole in one process."""
    return objective.loss(model, batch)


def _local_bytes(tensors: Iterator[Tensor]) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)
