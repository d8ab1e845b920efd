"""The masked-LM family: a BERT-style encoder (Cramming/ModernBERT recipe), WordPiece
tokens framed as [CLS] … [SEP], 80/10/10 masking with the sparse head, ModernBERT export."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoestring.families.base import Batch, Family, Objective

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from torch import nn

    from shoestring.config import EvalConfig, ModelConfig
    from shoestring.serve.engine import Engine


class MaskedLMFamily(Family):
    name = "mlm"
    architecture = "shoestring-mlm"
    hf_model_type = "modernbert"
    hf_auto_class = "AutoModelForMaskedLM"
    description = "BERT-style encoder (masked LM)"
    default_preset = "tiny"
    causal = False
    sparse_head = True
    head_transform = True
    head_method = "head"
    grouped_query = False
    tokenizer_kind = "wordpiece"
    lowercase = True
    row_frame = 2
    recipe = {"norm": "layernorm", "norm_position": "pre", "bias": False, "ffn": "geglu",
              "positions": "rotary", "tie_embeddings": True, "embedding_norm": True}
    shape = (64.0, 3.0)
    # GLU inner width 2·hidden, Cramming's proportion (model/presets.py)
    presets = {
        "tiny": (256, 4, 4, None, 512, "CPU minutes (the demo)"),
        "mini": (512, 4, 8, None, 1024, "CPU hour / small GPU"),
        "small": (512, 8, 8, None, 1024, "BERT-medium size"),
        "base": (768, 12, 12, None, 1536, "BERT-base size (Cramming's 24h-GPU model)"),
        "large": (1024, 24, 16, None, 2048, "BERT-large size"),
    }

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        from shoestring.data.tokenizer import SPECIAL_TOKENS

        return list(SPECIAL_TOKENS)

    @property
    def unk_token(self) -> str:
        from shoestring.data.tokenizer import UNK

        return UNK

    @property
    def separator_token(self) -> str:
        from shoestring.data.tokenizer import SEP

        return SEP

    def default_seq_len(self, params: float) -> int:
        return 128 if params < 1e8 else 512  # Cramming's 128 for small encoders

    def build(self, cfg: ModelConfig, vocab_size: int) -> nn.Module:
        from shoestring.model.encoder import MaskedLM

        return MaskedLM(cfg, vocab_size)

    def head_fraction(self, sparse: bool, seq_len: int, mask_rate: float) -> float:
        from shoestring.data.masking import num_masked

        return num_masked(seq_len, mask_rate) / seq_len if sparse else 1.0

    def mask_id(self, special_ids: dict[str, int]) -> int:
        from shoestring.data.tokenizer import MASK

        return special_ids.get(MASK, 4)

    def make_batch(self, obj: Objective, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        from shoestring.data.masking import mask_tokens
        from shoestring.data.tokenizer import NUM_SPECIAL

        b = mask_tokens(ids, obj.mask_rate, NUM_SPECIAL, obj.mask_id, obj.vocab_size, gen)
        return (b.inputs, b.positions, b.targets)

    def loss(self, obj: Objective, model: nn.Module, batch: Batch) -> torch.Tensor:
        from shoestring.families.losses import masked_lm_loss

        inputs, positions, targets = batch
        if obj.sparse:
            return masked_lm_loss(model(inputs, positions), targets)
        return masked_lm_loss(model(inputs), targets, positions)

    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: EvalConfig,
                         mask_id: int, vocab_size: int) -> Batch:
        from shoestring.data.masking import fixed_masks
        from shoestring.data.tokenizer import NUM_SPECIAL

        b = fixed_masks(ids, first_index, cfg.mask_rate, cfg.seed, NUM_SPECIAL, mask_id,
                        vocab_size)
        return (b.inputs, b.positions, b.targets)

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        from shoestring.families.losses import masked_lm_loss

        inputs, positions, targets = batch
        return masked_lm_loss(model(inputs, positions), targets, reduction="sum"), targets.numel()

    def pipeline_io(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        import torch

        inputs, positions, targets = batch
        return (inputs, positions.to(torch.float32)), targets

    def stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from shoestring.families.losses import masked_lm_loss

        return masked_lm_loss(output, target)

    def export_hf(self, run_dir: Path, out: Path, model: nn.Module, meta: dict[str, Any],
                  *, overwrite: bool) -> Path:
        from shoestring.model.hf import export_encoder

        return export_encoder(run_dir, out, overwrite=overwrite)

    def import_hf(self, hf_dir: Path, hf_config: dict[str, Any]) -> tuple[nn.Module, dict]:
        from shoestring.model.hf import import_encoder

        return import_encoder(hf_dir)

    def engine(self, model: nn.Module, tokenizer: Any, meta: dict[str, Any], path: Path,
               **kw: Any) -> Engine:
        from shoestring.serve.engine import EncoderEngine

        return EncoderEngine(model, tokenizer, meta, path, **kw)

    def held_out_loss(self, run_dir: Path, max_sequences: int, seq_len: int,
                      console: Console | None = None) -> float:
        from shoestring.eval.mlm import evaluate_run

        result = evaluate_run(run_dir, overrides=[f"eval.max_sequences={max_sequences}"],
                              console=console)
        return float(result["mlm_loss"])
