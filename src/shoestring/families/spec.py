"""What a model family *is*, as constants: the bottom of the house.

A ``FamilySpec`` names a family (masked LM, causal LM, contrastive retriever) and everything
about it that is data — its architecture tag, special tokens, tokenizer and recipe defaults,
presets, shapes. It holds no behaviour that needs torch or a stage: each floor that owns a
behaviour registers it by family name in its own module (model builders in ``model/``, the
training objectives in ``train/objectives.py``, HF adapters in ``export/``, serving engines in
``inference/engine.py``, held-out evaluators in ``eval/held_out.py``). So ``config``, ``data`` and
``plan`` read a spec without importing torch, and nothing here imports upward
(docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The training mask rate of the default recipe (``train.mask_rate``), and what FLOP and memory
# estimates assume when they are not given a run's rate. 0.40 beat 0.25 and 0.15 at equal wall
# clock, in held-out loss and in SST-2 after fine-tuning (docs/recipe.md, "Ablations");
# evaluation masks at a fixed 0.25 (``eval.mask_rate``).
DEFAULT_MASK_RATE = 0.40

# Special tokens. Whatever the tokenizer kind, a family's take the first ids, in this order.
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
MLM_SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
NUM_SPECIAL = len(MLM_SPECIAL_TOKENS)  # MLM ids below this are special
EOT, CLM_PAD, CLM_UNK = "<|endoftext|>", "<|pad|>", "<|unk|>"
CLM_SPECIAL_TOKENS = (EOT, CLM_PAD)
NEEDS_UNK = frozenset({"wordpiece", "unigram"})  # tokenizer kinds with an unknown token

# name → (hidden, layers, heads, kv_heads or None, intermediate, what it is)
Preset = tuple[int, int, int, "int | None", int, str]


def num_masked(seq_len: int, rate: float) -> int:
    """Masked positions per packed sequence ([CLS] and the final [SEP] are never masked)."""
    return max(1, round(rate * (seq_len - 2)))


@dataclass(frozen=True)
class FamilySpec:
    """One model family's constants. Behaviour lives with the floor that owns it, keyed by
    ``name`` (see the module docstring)."""

    name: str  # the objective key: model.objective, data manifest "objective"
    architecture: str  # run dir final/config.json "architecture"
    hf_model_type: str  # Hugging Face config.json "model_type" of the export
    hf_auto_class: str  # the transformers Auto class that loads the export
    description: str  # what it is, for help texts and errors
    default_preset: str  # the smallest preset, named in error hints
    causal: bool  # attention sees only earlier positions
    sparse_head: bool  # the vocabulary head can run at selected positions only
    head_transform: bool  # a dense + norm layer before the vocabulary projection
    head_method: str  # the model's method that maps hidden states to logits
    grouped_query: bool  # num_kv_heads < num_heads is allowed
    # data: tokenizer and packing
    tokenizer_kind: str  # default tokenizer model (data.tokenizer=auto)
    lowercase: bool  # default of data.lowercase
    row_frame: int  # special tokens framing every packed row ([CLS] … [SEP] = 2)
    specials: tuple[str, ...]  # special tokens in id order, before any unknown token
    unk_token: str  # the unknown-token string of the family's tokenizers
    separator_token: str  # the token that ends each document in the packed stream
    mask_token: str | None  # the token that replaces masked inputs (None: no masking)
    # sequence length by model size when no data dir fixes it: (params below, seq_len)…, last
    seq_lens: tuple[tuple[float, int], ...]
    # model recipe: the ModelConfig fields a user leaves unset take these values
    recipe: dict[str, Any]
    # planner defaults when no preset is at hand: layers per hidden unit, FFN / hidden
    shape: tuple[float, float]
    # named sizes, smallest first; `shoestring presets` lists them, model.preset picks one
    presets: dict[str, Preset] = field(default_factory=dict)
    base: str = ""  # family whose data dirs and weights this one uses ("" = itself)
    vocab_head: bool = True  # training runs the vocabulary head (FLOPs count it)
    pipeline: bool = True  # can train pipeline-parallel (pp > 1)
    generator: bool = False  # trains a generator beside the model (RTD; FLOPs count both)
    # training recipe: the TrainConfig fields a user leaves unset take these values
    train_recipe: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.base:
            object.__setattr__(self, "base", self.name)

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        """The special tokens, in id order, of a ``tokenizer_kind`` tokenizer: the unknown
        token is one of them only where it is not among the family's specials already and
        the kind needs one."""
        extra = ([self.unk_token] if self.unk_token not in self.specials
                 and tokenizer_kind in NEEDS_UNK else [])
        return list(self.specials) + extra

    def mask_id(self, special_ids: dict[str, int]) -> int:
        """The id that replaces masked tokens (families without masking ignore it)."""
        return special_ids.get(self.mask_token, 4) if self.mask_token else 4

    def default_seq_len(self, params: float) -> int:
        """Sequence length by model size when no data dir fixes it."""
        for below, seq_len in self.seq_lens[:-1]:
            if params < below:
                return seq_len
        return self.seq_lens[-1][1]

    def head_matmul_params(self, hidden: int, vocab: int) -> int:
        """Weights of the head's matmuls per scored position (for FLOPs): the vocabulary
        projection, after a hidden × hidden transform when the family has one."""
        if not self.vocab_head:
            return 0
        return hidden * vocab + (hidden * hidden if self.head_transform else 0)

    def head_fraction(self, sparse: bool, seq_len: int, mask_rate: float) -> float:
        """Fraction of positions at which the vocabulary head runs."""
        if not self.vocab_head:
            return 0.0
        if self.sparse_head and sparse:
            return num_masked(seq_len, mask_rate) / seq_len
        return 1.0

    def model_head_fraction(self, cfg: Any, seq_len: int, mask_rate: float) -> float:
        """``head_fraction`` for a model config (its ``sparse_prediction``)."""
        return self.head_fraction(cfg.sparse_prediction, seq_len, mask_rate)

    def __repr__(self) -> str:
        return f"<family {self.name}: {self.description}>"
