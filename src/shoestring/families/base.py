"""What a model family is: the one place that knows how a masked LM differs from a causal LM.

A family spec is a small class with a few constants and methods that point at the existing
code (the model classes, the HF converters, the serving engine, the evaluators). Everything
outside ``shoestring.families`` asks the spec (``families.get(cfg.model.objective)``) instead
of comparing objective strings, so a new family is a new module here and one registry line.

This module imports neither torch nor a stage at import time: ``config``, ``data`` and
``plan`` consult the specs without paying for torch (the methods import what they use).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from torch import nn

    from shoestring.config import EvalConfig, ModelConfig
    from shoestring.serve.engine import Engine

Batch = tuple["torch.Tensor", ...]
# The training mask rate of the default recipe (``train.mask_rate``), and what FLOP and memory
# estimates assume when they are not given a run's rate. 0.40 beat 0.25 and 0.15 at equal wall
# clock, in held-out loss and in SST-2 after fine-tuning (docs/recipe.md, "Ablations"); evaluation masks at a fixed 0.25 (``eval.mask_rate``).
DEFAULT_MASK_RATE = 0.40
Preset = tuple[int, int, int, "int | None", int, str]


@dataclass(frozen=True)
class Objective:
    """A family's training objective bound to one run's shapes: what the trainer calls.

    ``kind`` is the family name (kept as a field so older call sites that read it still work).
    """

    kind: str
    seq_len: int
    vocab_size: int
    mask_rate: float = DEFAULT_MASK_RATE
    mask_id: int = 4
    sparse: bool = True

    @property
    def family(self) -> Family:
        from shoestring.families import get

        return get(self.kind)

    @property
    def head_fraction(self) -> float:
        """Fraction of positions the vocabulary head computes (for FLOPs)."""
        return self.family.head_fraction(self.sparse, self.seq_len, self.mask_rate)

    def make_batch(self, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        """Token rows → what ``loss`` consumes. The whole step's batch is prepared at once
        (then split into micro-batches), so gradient accumulation draws the same masks as
        one big batch."""
        return self.family.make_batch(self, ids, gen)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy over the scored positions (logits in fp32)."""
        return self.family.loss(self, model, batch)


class Family(abc.ABC):
    """One model family. Subclasses set the constants and implement the methods."""

    name: ClassVar[str]  # the objective key: model.objective, data manifest "objective"
    architecture: ClassVar[str]  # run dir final/config.json "architecture"
    hf_model_type: ClassVar[str]  # Hugging Face config.json "model_type" of the export
    hf_auto_class: ClassVar[str]  # the transformers Auto class that loads the export
    description: ClassVar[str]  # what it is, for help texts and errors
    default_preset: ClassVar[str]  # the smallest preset, named in error hints
    causal: ClassVar[bool]  # attention sees only earlier positions
    sparse_head: ClassVar[bool]  # the vocabulary head can run at selected positions only
    head_transform: ClassVar[bool]  # a dense + norm layer before the vocabulary projection
    head_method: ClassVar[str]  # the model's method that maps hidden states to logits
    grouped_query: ClassVar[bool]  # num_kv_heads < num_heads is allowed
    # data: tokenizer and packing
    tokenizer_kind: ClassVar[str]  # default tokenizer model (data.tokenizer=auto)
    lowercase: ClassVar[bool]  # default of data.lowercase
    row_frame: ClassVar[int]  # special tokens framing every packed row ([CLS] … [SEP] = 2)
    # model recipe: the ModelConfig fields a user leaves unset take these values
    recipe: ClassVar[dict[str, Any]]
    # planner defaults when no preset is at hand: layers per hidden unit, FFN / hidden
    shape: ClassVar[tuple[float, float]]
    # named sizes, smallest first: name → (hidden, layers, heads, kv_heads or None,
    # intermediate, what it is); `shoestring presets` lists them, model.preset picks one
    presets: ClassVar[dict[str, Preset]]

    @property
    def base(self) -> str:
        """The family whose data dirs this one trains on and whose weights it starts from
        (itself; the contrastive family's is mlm)."""
        return self.name

    # --- data ------------------------------------------------------------------------
    @abc.abstractmethod
    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        """The special tokens, in id order, of a ``tokenizer_kind`` tokenizer."""

    @property
    @abc.abstractmethod
    def unk_token(self) -> str:
        """The unknown-token string of the family's tokenizers."""

    @property
    @abc.abstractmethod
    def separator_token(self) -> str:
        """The token that ends each document in the packed stream."""

    @abc.abstractmethod
    def default_seq_len(self, params: float) -> int:
        """Sequence length by model size when no data dir fixes it."""

    # --- model -----------------------------------------------------------------------
    @abc.abstractmethod
    def build(self, cfg: ModelConfig, vocab_size: int) -> nn.Module:
        """The model, freshly initialized from the global torch seed."""

    def head_matmul_params(self, hidden: int, vocab: int) -> int:
        """Weights of the head's matmuls per scored position (for FLOPs): the vocabulary
        projection, after a hidden × hidden transform when the family has one."""
        return hidden * vocab + (hidden * hidden if self.head_transform else 0)

    def head_fraction(self, sparse: bool, seq_len: int, mask_rate: float) -> float:
        """Fraction of positions at which the vocabulary head runs."""
        return 1.0

    def model_head_fraction(self, cfg: ModelConfig, seq_len: int, mask_rate: float) -> float:
        """``head_fraction`` for a model config (its ``sparse_prediction``)."""
        return self.head_fraction(cfg.sparse_prediction, seq_len, mask_rate)

    # --- objective -------------------------------------------------------------------
    def objective(self, seq_len: int, vocab_size: int, special_ids: dict[str, int],
                  mask_rate: float, sparse: bool) -> Objective:
        """The training objective for one run's shapes and tokenizer."""
        return Objective(self.name, seq_len, vocab_size, mask_rate, self.mask_id(special_ids),
                         sparse)

    def mask_id(self, special_ids: dict[str, int]) -> int:
        """The id that replaces masked tokens (families without masking ignore it)."""
        return 4

    @abc.abstractmethod
    def make_batch(self, obj: Objective, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        """Token rows → the tensors ``loss`` consumes."""

    @abc.abstractmethod
    def loss(self, obj: Objective, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean training loss of ``model`` on ``batch``."""

    @abc.abstractmethod
    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: EvalConfig,
                         mask_id: int, vocab_size: int) -> Batch:
        """A deterministic batch for validation: the same for every run on the same rows."""

    @abc.abstractmethod
    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        """(summed loss, scored positions) of ``batch``, for validation averages."""

    @abc.abstractmethod
    def pipeline_io(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        """(first-stage inputs, last-stage target) of a pipeline-parallel step."""

    @abc.abstractmethod
    def stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss on the last pipeline stage's output."""

    # --- artifacts, serving and evaluation ------------------------------------------
    @abc.abstractmethod
    def export_hf(self, run_dir: Path, out: Path, model: nn.Module, meta: dict[str, Any],
                  *, overwrite: bool) -> Path:
        """Write the run's model as a Hugging Face folder (complete or absent)."""

    @abc.abstractmethod
    def import_hf(self, hf_dir: Path, hf_config: dict[str, Any]) -> tuple[nn.Module, dict]:
        """A Hugging Face folder of ``hf_model_type`` as our model plus a run meta."""

    @abc.abstractmethod
    def engine(self, model: nn.Module, tokenizer: Any, meta: dict[str, Any], path: Path,
               **kw: Any) -> Engine:
        """The serving engine for this family's model."""

    @abc.abstractmethod
    def held_out_loss(self, run_dir: Path, max_sequences: int, seq_len: int,
                      console: Console | None = None) -> float:
        """The family's evaluator on a finished run: its held-out loss (at most
        ``max_sequences`` validation rows of ``seq_len``), as the planner's sweeps compare."""

    def __repr__(self) -> str:
        return f"<family {self.name}: {self.description}>"
