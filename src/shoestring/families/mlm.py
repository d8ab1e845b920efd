"""The masked-LM family: a BERT-style encoder (Cramming/ModernBERT recipe), WordPiece
tokens framed as [CLS] … [SEP], 80/10/10 masking with the sparse head, ModernBERT export."""

from __future__ import annotations

from shoestring.families.spec import CLS, MASK, MLM_SPECIAL_TOKENS, SEP, UNK, FamilySpec

MLM = FamilySpec(
    name="mlm",
    architecture="shoestring-mlm",
    hf_model_type="modernbert",
    hf_auto_class="AutoModelForMaskedLM",
    description="BERT-style encoder (masked LM)",
    default_preset="tiny",
    causal=False,
    sparse_head=True,
    head_transform=True,
    head_method="head",
    grouped_query=False,
    tokenizer_kind="wordpiece",
    lowercase=True,
    row_frame=2,  # [CLS] … [SEP]
    specials=MLM_SPECIAL_TOKENS,
    unk_token=UNK,
    separator_token=SEP,
    mask_token=MASK,
    seq_lens=((1e8, 128), (float("inf"), 512)),  # Cramming's 128 for small encoders
    recipe={"norm": "layernorm", "norm_position": "pre", "bias": False, "ffn": "geglu",
            "positions": "rotary", "tie_embeddings": True, "embedding_norm": True},
    shape=(64.0, 3.0),
    # GLU inner width 2·hidden, Cramming's proportion (model/presets.py)
    presets={
        "tiny": (256, 4, 4, None, 512, "CPU minutes (the demo)"),
        "mini": (512, 4, 8, None, 1024, "CPU hour / small GPU"),
        "small": (512, 8, 8, None, 1024, "BERT-medium size"),
        "base": (768, 12, 12, None, 1536, "BERT-base size (Cramming's 24h-GPU model)"),
        "large": (1024, 24, 16, None, 2048, "BERT-large size"),
    },
)
assert CLS in MLM.specials  # rows are framed by [CLS] … [SEP]
