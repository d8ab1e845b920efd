"""The causal-LM family: a Llama-style decoder, byte-level BPE with <|endoftext|> between
documents, next-token loss over whole rows, Llama export, text generation when served."""

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


class CausalLMFamily(Family):
    name = "clm"
    architecture = "shoestring-clm"
    hf_model_type = "llama"
    hf_auto_class = "AutoModelForCausalLM"
    description = "GPT/Llama-style decoder (causal LM)"
    default_preset = "clm-tiny"
    causal = True
    sparse_head = False
    head_transform = False
    head_method = "logits"
    grouped_query = True
    tokenizer_kind = "bpe"
    lowercase = False
    row_frame = 0
    recipe = {"norm": "rmsnorm", "norm_position": "pre", "bias": False, "ffn": "swiglu",
              "positions": "rotary", "tie_embeddings": True, "embedding_norm": False}
    shape = (64.0, 8 / 3)
    # Llama's 8/3·hidden rounded up to a multiple of 64 (model/presets.py)
    presets = {
        "clm-tiny": (256, 4, 4, None, 704, "CPU minutes"),
        "clm-mini": (512, 8, 8, None, 1408, "CPU hour / small GPU"),
        "gpt2-small": (768, 12, 12, None, 2048, "GPT-2 small size (124M with its vocab)"),
        "gpt2-medium": (1024, 24, 16, None, 2752, "GPT-2 medium size"),
        "gpt2-large": (1280, 36, 20, None, 3456, "GPT-2 large size"),
        "llama-1b": (2048, 16, 32, 8, 8192, "Llama-3.2-1B shape (grouped-query attention)"),
    }

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        from shoestring.data.tokenizer import CLM_SPECIAL_TOKENS, CLM_UNK, NEEDS_UNK

        return CLM_SPECIAL_TOKENS + ([CLM_UNK] if tokenizer_kind in NEEDS_UNK else [])

    @property
    def unk_token(self) -> str:
        from shoestring.data.tokenizer import CLM_UNK

        return CLM_UNK

    @property
    def separator_token(self) -> str:
        from shoestring.data.tokenizer import EOT

        return EOT

    def default_seq_len(self, params: float) -> int:
        if params < 1e7:
            return 256
        return 1024 if params < 1e9 else 2048

    def build(self, cfg: ModelConfig, vocab_size: int) -> nn.Module:
        from shoestring.model.decoder import CausalLM

        return CausalLM(cfg, vocab_size)

    def make_batch(self, obj: Objective, ids: torch.Tensor, gen: torch.Generator) -> Batch:
        return (ids,)

    def loss(self, obj: Objective, model: nn.Module, batch: Batch) -> torch.Tensor:
        from shoestring.families.losses import causal_lm_loss

        (ids,) = batch
        # The whole row goes in (the last position's logits are unused) so the compute is
        # exactly the FLOP formula's at seq_len.
        return causal_lm_loss(model(ids), ids)

    def validation_batch(self, ids: torch.Tensor, first_index: int, cfg: EvalConfig,
                         mask_id: int, vocab_size: int) -> Batch:
        return (ids,)

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        from shoestring.families.losses import causal_lm_loss

        (ids,) = batch
        return causal_lm_loss(model(ids), ids, reduction="sum"), ids[:, 1:].numel()

    def pipeline_io(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        (ids,) = batch
        return (ids,), ids

    def stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from shoestring.families.losses import causal_lm_loss

        return causal_lm_loss(output, target)

    def export_hf(self, run_dir: Path, out: Path, model: nn.Module, meta: dict[str, Any],
                  *, overwrite: bool) -> Path:
        from shoestring.model.hf_llama import export_decoder

        return export_decoder(run_dir, out, model, meta, overwrite=overwrite)

    def import_hf(self, hf_dir: Path, hf_config: dict[str, Any]) -> tuple[nn.Module, dict]:
        from shoestring.model.hf_llama import import_decoder

        return import_decoder(hf_dir, hf_config)

    def engine(self, model: nn.Module, tokenizer: Any, meta: dict[str, Any], path: Path,
               **kw: Any) -> Engine:
        from shoestring.serve.engine import DecoderEngine

        return DecoderEngine(model, tokenizer, meta, path, **kw)

    def held_out_loss(self, run_dir: Path, max_sequences: int, seq_len: int,
                      console: Console | None = None) -> float:
        from shoestring.eval.decoder import evaluate_decoder

        result = evaluate_decoder(run_dir, samples=0, max_tokens=max_sequences * seq_len,
                                  console=console)
        return float(result["perplexity"]["loss"])
