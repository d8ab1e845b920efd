"""The contrastive family: the masked-LM encoder trained as a retriever.

Inverse-cloze task (Lee, Chang & Toutanova, "Latent Retrieval for Weakly Supervised Open
Domain QA", 2019) on the user's own packed rows, no labels needed: the query is a contiguous
span of a row (``QUERY_FRACTION`` of its tokens, a sentence or two at 128), the positive is the
rest of the row — the span removed, so word overlap alone cannot match them — and every other
row's positive in the (micro-)batch is a negative. Loss: cross-entropy over the query-by-
positive cosine similarities divided by ``TEMPERATURE`` (InfoNCE with in-batch negatives, as in
DPR). Embeddings are the mean-pooled, L2-normalized last hidden states: the pooling of
``serve``'s ``/v1/embed`` and of the dense index, so what is trained is what is searched.

Spans are token spans, not sentences: packed rows keep no sentence boundaries. The model,
data (mlm-prepped data dirs), weights (``--init-from`` an mlm run) and serving engine are the
masked-LM family's, which this class extends; a run records architecture
``shoestring-contrastive`` so that `index` and `serve` know it was tuned for retrieval.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoestring.errors import ShoestringError
from shoestring.families.base import Batch, Objective
from shoestring.families.mlm import MaskedLMFamily

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from torch import nn

    from shoestring.config import EvalConfig, ModelConfig

QUERY_FRACTION = 0.25
TEMPERATURE = 0.05


class ContrastiveFamily(MaskedLMFamily):
    name = "contrastive"
    architecture = "shoestring-contrastive"
    description = "encoder tuned for retrieval (in-batch negatives on inverse-cloze pairs)"
    base = "mlm"  # trains on mlm data dirs, starts from (and builds) mlm weights
    presets: dict = {}  # sizes are the mlm presets': --set model.preset=tiny

    def build(self, cfg: ModelConfig, vocab_size: int) -> nn.Module:
        from shoestring.model.encoder import MaskedLM

        model = MaskedLM(cfg.model_copy(update={"objective": MaskedLMFamily.name}), vocab_size)
        # The MLM head is kept (the run still fills masks) but frozen: no loss reaches it, and
        # data-parallel gradient sync expects every trainable parameter to get a gradient.
        for part in (model.head_dense, model.head_norm, model.decoder, model.decoder_bias):
            if part is not None:
                part.requires_grad_(False)
        return model

    def head_matmul_params(self, hidden: int, vocab: int) -> int:
        return 0  # no vocabulary head runs

    def head_fraction(self, sparse: bool, seq_len: int, mask_rate: float) -> float:
        return 0.0

    def make_batch(self, obj: Objective, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        return inverse_cloze_pairs(ids, gen)

    def loss(self, obj: Objective, model: nn.Module, batch: Batch) -> torch.Tensor:
        return in_batch_loss(model, batch, "mean")

    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: EvalConfig,
                         mask_id: int, vocab_size: int) -> Batch:
        import torch

        return inverse_cloze_pairs(ids, torch.Generator().manual_seed(cfg.seed + first_index))

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        return in_batch_loss(model, batch, "sum"), batch[0].shape[0]

    def pipeline_io(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        raise ShoestringError("contrastive training does not run pipeline-parallel (pp > 1)",
                              where="--parallel", fix="use dp (and ZeRO) for this objective")

    def stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise ShoestringError("contrastive training does not run pipeline-parallel (pp > 1)",
                              where="--parallel", fix="use dp (and ZeRO) for this objective")

    def export_hf(self, run_dir: Path, out: Path, model: nn.Module, meta: dict[str, Any],
                  *, overwrite: bool) -> Path:
        raise ShoestringError(
            "exporting a contrastive run to Hugging Face is not supported yet",
            where=str(run_dir), fix="serve or index with the run dir itself")

    def held_out_loss(self, run_dir: Path, max_sequences: int, seq_len: int,
                      console: Console | None = None) -> float:
        raise ShoestringError("planner sweeps compare pretraining losses; a contrastive run "
                              "has none", where=str(run_dir),
                              fix="sweep with model.objective=mlm or clm")


def inverse_cloze_pairs(ids: torch.Tensor, gen: torch.Generator) -> Batch:
    """Rows [CLS] t1 … tn [SEP] → (queries [CLS] span [SEP], positives: the row without the
    span). One span per row, at a uniformly random start; every row gives one pair, all of
    the same shapes (no padding)."""
    import torch

    B, T = ids.shape
    span = max(1, round((T - 2) * QUERY_FRACTION))
    if T - 2 <= span:
        raise ShoestringError(f"rows of {T} tokens are too short for inverse-cloze pairs",
                              where="data.seq_len", fix="prep with data.seq_len of 16 or more")
    start = torch.randint(1, T - 1 - span + 1, (B,), generator=gen)
    cols = start[:, None] + torch.arange(span)[None, :]
    query = torch.cat([ids[:, :1], ids.gather(1, cols), ids[:, -1:]], dim=1)
    pos = torch.arange(T)[None, :]
    keep = (pos < start[:, None]) | (pos >= start[:, None] + span)
    positive = ids[keep].view(B, T - span)
    return (query, positive)


def pooled(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean-pooled, L2-normalized last hidden states (the engine's ``embed`` pooling)."""
    import torch.nn.functional as F

    return F.normalize(model.encode(ids).float().mean(1), dim=-1)


def in_batch_loss(model: nn.Module, batch: Batch, reduction: str) -> torch.Tensor:
    """InfoNCE: query i should be nearest positive i among all positives of the batch."""
    import torch
    import torch.nn.functional as F

    query, positive = batch
    scores = pooled(model, query) @ pooled(model, positive).T / TEMPERATURE
    return F.cross_entropy(scores, torch.arange(len(query), device=scores.device),
                           reduction=reduction)
