"""The training objectives: this floor's part of a model family.

An ``Objective`` is a family's loss bound to one run's shapes and tokenizer: it turns token
rows into a batch (masks, inverse-cloze pairs, or the rows themselves), computes the training
loss, the validation batch and summed loss, and the pipeline-parallel inputs and last-stage
loss. ``OBJECTIVES`` registers one class per family name (families/spec.py holds the
constants); ``objective_for`` builds the right one. The trainer, the planner's measurements,
the distributed parity tests and the privacy audit all use these, so a loss is written once.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from shoestring.data.masking import fixed_masks, fixed_uniforms, inverse_cloze_pairs, mask_tokens
from shoestring.errors import ShoestringError
from shoestring.families import CLM, CONTRASTIVE, MLM, RTD, FamilySpec
from shoestring.families.rtd import DISC_WEIGHT
from shoestring.families.spec import DEFAULT_MASK_RATE, NUM_SPECIAL
from shoestring.model.losses import (causal_lm_loss, in_batch_loss, masked_lm_loss,
                                     replaced_token_loss)

Batch = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Objective(abc.ABC):
    """A family's training objective bound to one run's shapes: what the trainer calls.

    ``spec`` is the family's. Subclasses implement the batch and loss methods."""

    spec: ClassVar[FamilySpec]
    seq_len: int
    vocab_size: int
    mask_rate: float = DEFAULT_MASK_RATE
    mask_id: int = 4
    sparse: bool = True

    @property
    def head_fraction(self) -> float:
        """Fraction of positions the vocabulary head computes (for FLOPs)."""
        return self.spec.head_fraction(self.sparse, self.seq_len, self.mask_rate)

    @abc.abstractmethod
    def make_batch(self, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        """Token rows → what ``loss`` consumes. The whole step's batch is prepared at once
        (then split into micro-batches), so gradient accumulation draws the same masks as
        one big batch."""

    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean training loss of ``model`` on ``batch`` (logits in fp32)."""

    @abc.abstractmethod
    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: Any) -> Batch:
        """A deterministic batch for validation (``cfg``: the EvalConfig's ``mask_rate`` and
        ``seed``): the same for every run on the same rows."""

    @abc.abstractmethod
    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        """(summed loss, scored positions) of ``batch``, for validation averages."""

    def pipeline_io(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        """(first-stage inputs, last-stage target) of a pipeline-parallel step."""
        raise self._no_pipeline()

    def stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss on the last pipeline stage's output."""
        raise self._no_pipeline()

    def _no_pipeline(self) -> ShoestringError:
        return ShoestringError(f"{self.spec.description} does not train pipeline-parallel "
                               "(pp > 1)", where="--parallel",
                               fix="use dp (and ZeRO) for this objective")


class MaskedLMObjective(Objective):
    """80/10/10 masking; the sparse head scores the masked positions only."""

    spec = MLM

    def make_batch(self, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        b = mask_tokens(ids, self.mask_rate, NUM_SPECIAL, self.mask_id, self.vocab_size, gen)
        return (b.inputs, b.positions, b.targets)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, positions, targets = batch
        if self.sparse:
            return masked_lm_loss(model(inputs, positions), targets)
        return masked_lm_loss(model(inputs), targets, positions)

    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: Any) -> Batch:
        b = fixed_masks(ids, first_index, cfg.mask_rate, cfg.seed, NUM_SPECIAL, self.mask_id,
                        self.vocab_size)
        return (b.inputs, b.positions, b.targets)

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        inputs, positions, targets = batch
        return masked_lm_loss(model(inputs, positions), targets, reduction="sum"), targets.numel()

    def pipeline_io(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        inputs, positions, targets = batch
        return (inputs, positions.to(torch.float32)), targets

    def stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return masked_lm_loss(output, target)


class CausalLMObjective(Objective):
    """Next-token loss over whole rows."""

    spec = CLM

    def make_batch(self, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        return (ids,)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        (ids,) = batch
        # The whole row goes in (the last position's logits are unused) so the compute is
        # exactly the FLOP formula's at seq_len.
        return causal_lm_loss(model(ids), ids)

    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: Any) -> Batch:
        return (ids,)

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        (ids,) = batch
        return causal_lm_loss(model(ids), ids, reduction="sum"), ids[:, 1:].numel()

    def pipeline_io(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        (ids,) = batch
        return (ids,), ids

    def stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return causal_lm_loss(output, target)


class ContrastiveObjective(Objective):
    """InfoNCE on inverse-cloze pairs with in-batch negatives (families/contrastive.py)."""

    spec = CONTRASTIVE

    def make_batch(self, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        return inverse_cloze_pairs(ids, gen)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return in_batch_loss(model, batch, "mean")

    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: Any) -> Batch:
        return inverse_cloze_pairs(ids, torch.Generator().manual_seed(cfg.seed + first_index))

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        return in_batch_loss(model, batch, "sum"), batch[0].shape[0]


@dataclass(frozen=True)
class ReplacedTokenObjective(MaskedLMObjective):
    """Replaced-token detection (model/detector.py): MLM's masks plus one uniform per masked
    position for the generator's sampling, drawn with them; the loss is the generator's MLM
    loss plus ``disc_weight`` × the discriminator's (model/losses.py)."""

    spec = RTD
    disc_weight: float = DISC_WEIGHT

    def make_batch(self, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        inputs, positions, targets = super().make_batch(ids, gen)
        return (inputs, positions, targets, torch.rand(positions.shape, generator=gen))

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self.parts(model, batch)[0]

    def parts(self, model: nn.Module, batch: Batch, reduction: str = "mean"
              ) -> tuple[torch.Tensor, ...]:
        """(total, generator MLM loss, discriminator loss, the model's outputs...)."""
        _, _, targets, _ = batch
        gen_logits, disc_logits, replaced = model(*batch)
        return (*replaced_token_loss(gen_logits, targets, disc_logits, replaced,
                                     self.disc_weight, reduction),
                gen_logits, disc_logits, replaced)

    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: Any) -> Batch:
        inputs, positions, targets = super().validation_batch(ids, first_index, cfg)
        return (inputs, positions, targets, fixed_uniforms(positions, first_index, cfg.seed))

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        # The mean total of the rows, weighted by their number: averaging these over batches
        # gives the training loss's quantity on held-out rows.
        rows = batch[0].shape[0]
        return self.parts(model, batch)[0] * rows, rows

    def pipeline_io(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        raise self._no_pipeline()

    def stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise self._no_pipeline()


OBJECTIVES: dict[str, type[Objective]] = {
    o.spec.name: o for o in (MaskedLMObjective, CausalLMObjective, ContrastiveObjective,
                             ReplacedTokenObjective)}


def objective_for(family: FamilySpec, seq_len: int, vocab_size: int,
                  special_ids: dict[str, int], mask_rate: float = DEFAULT_MASK_RATE,
                  sparse: bool = True, model: Any = None) -> Objective:
    """The training objective of ``family`` for one run's shapes and tokenizer; ``model``
    (the run's ModelConfig) supplies a generator family's loss weight."""
    args = (seq_len, vocab_size, mask_rate, family.mask_id(special_ids), sparse)
    if family.generator:
        return ReplacedTokenObjective(*args, model.rtd_weight if model is not None else DISC_WEIGHT)
    return OBJECTIVES[family.name](*args)
