"""The causal-LM family: a Llama-style decoder, byte-level BPE with <|endoftext|> between
documents, next-token loss over whole rows, Llama export, text generation when served."""

from __future__ import annotations

from shoestring.families.spec import CLM_SPECIAL_TOKENS, CLM_UNK, EOT, FamilySpec

CLM = FamilySpec(
    name="clm",
    architecture="shoestring-clm",
    hf_model_type="llama",
    hf_auto_class="AutoModelForCausalLM",
    description="GPT/Llama-style decoder (causal LM)",
    default_preset="clm-tiny",
    causal=True,
    sparse_head=False,
    head_transform=False,
    head_method="logits",
    grouped_query=True,
    tokenizer_kind="bpe",
    lowercase=False,
    row_frame=0,
    specials=CLM_SPECIAL_TOKENS,  # + <|unk|> for the kinds that need one
    unk_token=CLM_UNK,
    separator_token=EOT,
    mask_token=None,
    seq_lens=((1e7, 256), (1e9, 1024), (float("inf"), 2048)),
    recipe={"norm": "rmsnorm", "norm_position": "pre", "bias": False, "ffn": "swiglu",
            "positions": "rotary", "tie_embeddings": True, "embedding_norm": False},
    shape=(64.0, 8 / 3),
    # Llama's 8/3·hidden rounded up to a multiple of 64 (model/presets.py)
    presets={
        "clm-tiny": (256, 4, 4, None, 704, "CPU minutes"),
        "clm-mini": (512, 8, 8, None, 1408, "CPU hour / small GPU"),
        "gpt2-small": (768, 12, 12, None, 2048, "GPT-2 small size (124M with its vocab)"),
        "gpt2-medium": (1024, 24, 16, None, 2752, "GPT-2 medium size"),
        "gpt2-large": (1280, 36, 20, None, 3456, "GPT-2 large size"),
        "llama-1b": (2048, 16, 32, 8, 8192, "Llama-3.2-1B shape (grouped-query attention)"),
    },
)
