"""Pipeline parallelism with `torch.distributed.pipelining`: stages and schedules.

A model is cut into ``pp × stages_per_rank`` stages of equal block counts. Stage modules keep
the canonical parameter names (``layers`` is a ModuleDict keyed by the original block index,
as torchtitan does), so checkpoints are the same whatever the cut. The first stage owns the
embedding; the last stage owns the head and, since the output projection is tied to the
embedding, a copy of it whose gradient is summed with the first stage's every step (Megatron's
embedding group; see `parallelize.sync_tied_grads`).

The MLM head is sparse (logits only at the masked positions), so the masked positions travel
through the pipeline next to the activations, as a float tensor: the stage-to-stage transport
of `torch.distributed.pipelining` on gloo garbles integer tensors (seen with torch 2.13), and
positions below 2^24 are exact in float32.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from shoestring.families import FamilySpec
from shoestring.dist.layout import Layout


def stage_layers(num_layers: int, num_stages: int, stage: int) -> list[int]:
    per = num_layers // num_stages
    return list(range(stage * per, (stage + 1) * per))


def stages_of_rank(layout: Layout, pp_rank: int) -> list[int]:
    """Stage indices this pipeline rank runs: one, or ``stages_per_rank`` interleaved
    (stage s lives on rank s mod pp: the looped placement of the interleaved 1F1B schedule)."""
    return [pp_rank + i * layout.pp for i in range(layout.stages_per_rank)]


class TrunkStage(nn.Module):
    """A contiguous slice of blocks of a `MaskedLM` or `CausalLM` (the shared `Trunk`).

    The first stage embeds, the last applies the final norm and the model's own head
    (``MaskedLM.head`` / ``CausalLM.logits``, called on this module, which holds the same
    attribute names). Parameter names equal the whole model's.
    """

    def __init__(self, model: nn.Module, layer_ids: list[int], first: bool, last: bool,
                 family: FamilySpec, tp: int = 1) -> None:
        super().__init__()
        self.first, self.last, self.tp = first, last, tp
        self.rotary = model.rotary
        self.causal = family.causal
        self._head = getattr(type(model), family.head_method)
        if first:
            self.tok_embeddings = model.tok_embeddings
            self.added_positions = model.added_positions
            self.emb_norm = model.emb_norm
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layer_ids})
        if last:
            tied = (getattr(model, "decoder", None) is None
                    and getattr(model, "lm_head", None) is None)
            if tied and not first:  # the tied output projection's copy (grads summed each step)
                self.tok_embeddings = copy.deepcopy(model.tok_embeddings)
            self.final_norm = model.final_norm
            for name in ("head_dense", "head_norm", "decoder", "decoder_bias", "lm_head"):
                if hasattr(model, name):
                    setattr(self, name, getattr(model, name))

    def forward(self, x: Tensor, positions: Tensor | None = None
                ) -> Tensor | tuple[Tensor, Tensor]:
        if self.first:
            seq_len = x.shape[1]
            x = self.tok_embeddings(x)
            if self.added_positions is not None:
                x = x + self.added_positions(torch.arange(seq_len, device=x.device))
            if self.emb_norm is not None:
                x = self.emb_norm(x)
            if positions is not None:
                positions = positions.to(torch.float32)
        else:  # under sequence parallelism the residual stream arrives sequence-sharded
            seq_len = x.shape[1] * self.tp
        rope = self.rotary(seq_len, x.device) if self.rotary is not None else None
        for layer in self.layers.values():
            x = layer(x, rope, None, self.causal, None)
        if not self.last:
            return x if positions is None else (x, positions)
        hidden = self.final_norm(x) if self.final_norm is not None else x
        if positions is not None:
            # clamp: shape inference runs stages on uninitialised buffers; real positions < T
            pos = positions.long().clamp(0, hidden.shape[1] - 1)
            hidden = torch.gather(hidden, 1, pos.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        return self._head(self, hidden)


def split_model(model: nn.Module, layout: Layout, pp_rank: int, tp: int, family: FamilySpec
                ) -> list[tuple[int, nn.Module]]:
    """(stage index, stage module) for each stage this pipeline rank runs."""
    n = layout.num_stages
    L = len(model.layers)
    return [
        (s, TrunkStage(model, stage_layers(L, n, s), first=s == 0, last=s == n - 1, family=family,
                       tp=tp))
        for s in stages_of_rank(layout, pp_rank)
    ]


def build_schedule(stage_modules: list[tuple[int, nn.Module]], layout: Layout, pp_group,
                   device: torch.device, loss_fn):  # noqa: ANN001, ANN201
    """`PipelineStage`s over the (already parallelized) stage modules and the schedule.

    The schedule's own gradient scaling (÷ microbatches after each step) is off: it would
    divide gradients accumulated over several steps again; ``loss_fn`` divides instead
    (`shoestring.dist.parallelism`)."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    stages = [PipelineStage(mod, s, layout.num_stages, device, group=pp_group)
              for s, mod in stage_modules]
    m = layout.n_microbatches
    if layout.pp_schedule == "interleaved":
        return ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn,
                                       scale_grads=False)
    cls = ScheduleGPipe if layout.pp_schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
