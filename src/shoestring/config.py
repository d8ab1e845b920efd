"""Typed configuration for every stage, as data.

One root object (`Config`) with a section per stage. It comes from defaults, then an optional
YAML file, then ``--set section.key=value`` overrides, and is validated up front so a wrong
key or value is reported with its full dotted name and the allowed values before any work.
Every recipe choice is a named field with the published default (the Cramming style), so an
ablation is one ``--set``.
"""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from shoestring import families
from shoestring.errors import ShoestringError
from shoestring.families.rtd import DISC_WEIGHT
from shoestring.fsutil import read_yaml, unique_paths
from shoestring.units import BudgetSpec, parse_budget, parse_interval


def _parsed(parse: Any) -> Any:
    """A field that holds the parsed value of its text (``parse``: text → `BudgetSpec`),
    validated here, at the border, and written back as the text the user gave."""

    def validate(value: Any) -> BudgetSpec | None:
        if value is None or isinstance(value, BudgetSpec):
            return value
        if not isinstance(value, str):
            raise ValueError("Input should be a valid string")
        try:
            return parse(value)
        except ShoestringError as e:
            raise ValueError(f"{e.what}; {e.fix}") from None

    return Annotated[BudgetSpec | None, PlainValidator(validate),
                     PlainSerializer(lambda v: None if v is None else v.text),
                     WithJsonSchema({"type": ["string", "null"]})]


_BudgetField = _parsed(parse_budget)  # train.budget: the one budget grammar (units.parse_budget)
_IntervalField = _parsed(parse_interval)  # train.checkpoint_every: 10%, 30m or 500steps


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# The tokenizers prep trains (data.tokenizer; auto picks the family's).
TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram")

# The tokenizer trains on at most this much text (characters), a uniform sample of the
# training documents beyond it: its memory and time then stop growing with the corpus.
TOKENIZER_SAMPLE_CHARS = 1 << 28


class MixtureSource(_Section):
    """One source of a data mixture: which documents are its, and how much of training it is
    (see docs/data.md, "Mixtures")."""

    weight: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="share of the training tokens (relative: "
        "the weights are normalized to sum to 1)"
    )
    epochs: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="passes over this source's training "
        "tokens relative to the others' (instead of weight; exact at a budget of the sum of epochs × tokens)"
    )
    value: str | None = Field(
        None, min_length=1, description="the value of the mixture's field that selects this "
        "source's documents (default: the source's name)"
    )
    files: list[str] | None = Field(
        None, min_length=1, description="inputs (files, folders, globs) whose documents are "
        "this source, instead of a field value"
    )

    @model_validator(mode="before")
    @classmethod
    def _number_is_weight(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"weight": value}  # `wikipedia: 0.6`
        return value

    @model_validator(mode="after")
    def _one_amount(self) -> MixtureSource:
        if (self.weight is None) == (self.epochs is None):
            raise ValueError("give exactly one of weight or epochs")
        if self.value is not None and self.files is not None:
            raise ValueError("give value (a field value) or files, not both")
        return self


class MixtureConfig(_Section):
    """A designed data mixture: named sources, each a share of the training tokens."""

    field: str = Field(
        "source", min_length=1, description="JSON-lines field whose value names a "
        "document's source (for sources without files)"
    )
    sources: dict[str, MixtureSource] = Field(
        ..., min_length=1, description="source name → weight (or {weight|epochs, value|files})"
    )

    @field_validator("sources")
    @classmethod
    def _names(cls, value: dict[str, MixtureSource]) -> dict[str, MixtureSource]:
        for name in value:
            if not name.strip() or any(c in name for c in ",="):
                raise ValueError(f"source name {name!r} must be non-empty, without ',' or '='")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> MixtureConfig:
        by_weight = [n for n, s in self.sources.items() if s.weight is not None]
        by_epochs = [n for n, s in self.sources.items() if s.epochs is not None]
        if by_weight and by_epochs:
            raise ValueError(
                f"sources {', '.join(by_weight)} give a weight and {', '.join(by_epochs)} give "
                "epochs: give every source a weight, or every source epochs")
        return self

    @model_validator(mode="after")
    def _distinct(self) -> MixtureConfig:
        """Two sources that take the same documents: the later one would get none, found
        only after reading the whole corpus."""
        takers: dict[str, str] = {}
        for name, s in self.sources.items():
            for what in ([f"file {f}" for f in s.files] if s.files
                         else [f"{self.field}={s.value or name!r}"]):
                if what in takers:
                    raise ValueError(f"sources {takers[what]} and {name} both take the "
                                     f"documents of {what}: a document belongs to one source")
                takers[what] = name
        return self


class DataConfig(_Section):
    """How `prep` turns raw text into packed token shards (see docs/data.md)."""

    text_field: str = Field(
        "text", description="field/column holding a document's text (.jsonl, .parquet, .csv, hf:)"
    )
    split_on: Literal["blank", "lines", "none"] = Field(
        "blank", description=".txt files: a document per block between blank lines (blank), "
        "per line (lines: WikiText, line-per-document dumps), or per file (none)"
    )
    on_error: Literal["raise", "skip"] = Field(
        "raise", description="bad records/files: stop with an error, or skip and count them"
    )
    min_chars: int = Field(16, ge=1, description="drop documents shorter than this after cleaning")
    max_document_chars: int = Field(
        1_000_000, ge=1000, description="cut longer documents into pieces of at most this many "
        "characters (at paragraph, line or word breaks), so memory does not depend on the "
        "longest document; .txt files are read in bounded chunks (docs/data.md)"
    )
    objective: Literal["mlm", "clm"] = Field(
        "mlm", description="mlm: [CLS] … [SEP] rows for encoders; clm: <|endoftext|>-joined stream"
    )
    tokenizer: str = Field(
        "auto",
        description="auto (WordPiece for mlm, byte-level BPE for clm), wordpiece, bpe, unigram, "
        "or the path of an existing tokenizer.json",
    )
    vocab_size: int = Field(8192, ge=128, le=1 << 20, description="vocabulary size when training")
    lowercase: bool | None = Field(
        None, description="lowercase (and strip accents for WordPiece); default: yes for mlm, no for clm"
    )
    seq_len: int = Field(128, ge=8, le=65536, description="tokens per packed sequence")
    val_fraction: float = Field(
        0.05, gt=0.0, lt=0.5, description="fraction held out: of the documents (by content "
        "hash), or of the text at the end when there are too few documents (docs/data.md)"
    )
    shard_tokens: int = Field(1 << 24, ge=1024, description="max tokens per shard file")
    order: Literal["none", "sort"] = Field(
        "none",
        description="train sequence order: none (stream order, loader shuffles) or sort "
        "(Cramming: ascending mean unigram log-probability, read in that order)",
    )
    workers: int = Field(1, ge=1, le=256, description="processes for cleaning and tokenizing")
    mixture: MixtureConfig | None = Field(
        None, description="a designed mixture of sources, each a share of the training "
        "tokens that the loader samples (docs/data.md, Mixtures); prep --mix sets it"
    )
    tokenizer_sample_chars: int = Field(
        TOKENIZER_SAMPLE_CHARS, ge=1, description="a trained tokenizer learns from at most this "
        "many characters: all training documents when they fit, else a uniform sample (by "
        "content hash) of about this size; the manifest records it (tokenizer.sample)"
    )

    @field_validator("split_on", mode="before")
    @classmethod
    def _old_split_names(cls, value: Any) -> Any:
        return {"file": "none", "blank-lines": "blank"}.get(value, value)  # the older names

    @model_validator(mode="after")
    def _mixture_unsorted(self) -> DataConfig:
        if self.mixture is not None and self.order == "sort":
            raise ValueError("data.order=sort reads the stored order; a data.mixture (--mix) "
                             "samples its sources by weight: use one of them")
        return self

    @property
    def family(self) -> families.FamilySpec:
        """The spec of ``objective``, the family the data is prepared for."""
        return families.get(self.objective, "data.objective")

    @property
    def tokenizer_file(self) -> str | None:
        """``tokenizer`` when it names a tokenizer.json to use (None: a kind to train)."""
        return None if self.tokenizer in ("auto", *TOKENIZER_KINDS) else self.tokenizer

    @property
    def row_body(self) -> int:
        """Document tokens in one packed sequence: ``seq_len`` less the family's framing
        (``[CLS] … [SEP]``), which is what prep cuts the token stream into."""
        return self.seq_len - self.family.row_frame

    @property
    def lowercase_resolved(self) -> bool:
        """`lowercase`, with the per-objective default filled in."""
        return self.family.lowercase if self.lowercase is None else self.lowercase


class ModelConfig(_Section):
    """The network: an encoder (masked LM) or a decoder (causal LM), see docs/models.md.

    ``preset`` fills the size fields from a named preset (`shoestring presets` lists them);
    fields given alongside it win. Recipe fields left unset take the objective's recipe.
    """

    preset: str | None = Field(None, description="named size (tiny, mini, small, base, ...)")
    objective: Literal["mlm", "clm", "contrastive", "rtd"] = Field(
        "mlm", description="mlm = BERT-style encoder, clm = GPT/Llama-style decoder, "
        "contrastive = encoder tuned for retrieval (docs/retrieval.md), rtd = encoder trained "
        "by replaced-token detection (ELECTRA; docs/training.md)"
    )
    hidden_size: int = Field(256, ge=16, description="model width")
    num_layers: int = Field(4, ge=1, description="transformer blocks")
    num_heads: int = Field(4, ge=1, description="attention heads (must divide hidden_size)")
    num_kv_heads: int | None = Field(
        None, ge=1, description="key/value heads for grouped-query attention (decoders; null = num_heads)"
    )
    intermediate_size: int = Field(
        512, ge=16, description="feed-forward inner width (after the gate for GeGLU/SwiGLU)"
    )
    norm: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="normalization layer")
    norm_position: Literal["pre", "post"] = Field(
        "pre", description="pre-norm (norm inside the residual branch) or post-norm (original BERT)"
    )
    bias: bool = Field(False, description="biases in linear layers and norms")
    ffn: Literal["geglu", "swiglu", "gelu"] = Field(
        "geglu", description="feed-forward: gated GELU, gated SiLU, or plain GELU MLP"
    )
    positions: Literal["rotary", "learned", "sinusoidal"] = Field(
        "rotary", description="position information: rotary in attention, or added embeddings"
    )
    max_positions: int = Field(
        2048, ge=8, description="longest sequence for learned/sinusoidal positions"
    )
    tie_embeddings: bool = Field(True, description="output projection shares the input embedding")
    embedding_norm: bool = Field(True, description="normalize the embeddings (encoder recipe)")
    sparse_prediction: bool = Field(
        True, description="MLM head only at masked positions (Cramming); false = all positions"
    )
    norm_eps: float = Field(1e-5, gt=0.0)
    rope_theta: float = Field(10000.0, gt=0.0, description="rotary position base")
    init_std: float = Field(0.02, gt=0.0, description="std of the normal weight init")
    # replaced-token detection (objective rtd): the generator and the loss
    generator_width: float = Field(
        1 / 3, gt=0.0, le=1.0, description="rtd: the generator's width as a fraction of the "
        "encoder's (its heads, rounded, at the same head size; ELECTRA: 1/4-1/3)")
    generator_depth: float = Field(
        1.0, gt=0.0, le=1.0, description="rtd: the generator's layers as a fraction of the "
        "encoder's (rounded, at least one)")
    rtd_weight: float = Field(
        DISC_WEIGHT, gt=0.0, description="rtd: weight of the discriminator's loss beside the "
        "generator's MLM loss (ELECTRA: 50)")
    rtd_sharing: Literal["gdes", "plain"] = Field(
        "gdes", description="rtd: how generator and discriminator share the token embeddings: "
        "gdes = the discriminator adds a zero-initialised delta to the generator's table, "
        "which its gradient does not reach (DeBERTaV3); plain = one table (ELECTRA)")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset_and_recipe(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        base: dict[str, Any] = {}
        if data.get("preset") is not None:
            base = families.preset_fields(str(data["preset"]))  # ValueError names the known presets
        objective = data.get("objective", base.get("objective", "mlm"))
        recipe = MODEL_RECIPES.get(objective, {})  # an unknown objective: the Literal reports it
        return {**recipe, **base, **data}

    @model_validator(mode="after")
    def _shapes_fit(self) -> ModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})"
            )
        if self.positions == "rotary" and (self.hidden_size // self.num_heads) % 2:
            raise ValueError("hidden_size / num_heads must be even (rotary embeddings)")
        if self.num_kv_heads is not None and self.num_kv_heads != self.num_heads:
            if not self.family.grouped_query:
                raise ValueError(
                    "num_kv_heads (grouped-query attention) is for decoders (objective "
                    f"{', '.join(f.name for f in families.all_families() if f.grouped_query)}); "
                    "encoders use num_heads for keys and values"
                )
            if self.num_heads % self.num_kv_heads:
                raise ValueError(
                    f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
                )
        return self

    @property
    def family(self) -> families.FamilySpec:
        """The spec of ``objective``: what every floor above asks instead of the name (the
        name, validated above, is what a config file records)."""
        return families.get(self.objective)

    def generator_config(self) -> ModelConfig:
        """The RTD generator's shape (``generator_width``/``_depth`` of this one, the same
        head size and recipe): a masked-LM encoder config that ``model/detector.py`` builds and
        ``model/flops.py`` counts."""
        heads = max(1, round(self.num_heads * self.generator_width))
        hidden = heads * self.head_dim
        return self.model_copy(update={
            "objective": "mlm", "preset": None, "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": None, "num_layers": max(1, round(self.num_layers * self.generator_depth)),
            "intermediate_size": max(1, round(self.intermediate_size * hidden / self.hidden_size))})

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def ffn_input_width(self) -> int:
        """Width of the feed-forward's first projection: a gated FFN computes the value and
        the gate in one matrix, so 2·intermediate_size (what Cramming calls intermed_size)."""
        return 2 * self.intermediate_size if self.ffn != "gelu" else self.intermediate_size


# Each family's recipe (families/): Cramming/ModernBERT for the masked-LM encoder, Llama for
# the causal-LM decoder. A recipe field the user does not set takes its objective's value, so
# `--set model.objective=clm` alone gives a Llama-style decoder.
MODEL_RECIPES: dict[str, dict[str, Any]] = {f.name: f.recipe for f in families.all_families()}
TRAIN_RECIPES: dict[str, dict[str, Any]] = {f.name: f.train_recipe
                                            for f in families.all_families()}


class TrainConfig(_Section):
    """The pretraining loop: budget, batch, optimizer, schedule, masking, precision, checkpoints."""

    budget: _BudgetField = Field(
        "3m", validate_default=True,
        description="90s / 10m / 24h wall clock, 3e15flops, 20Mtok tokens or 500steps")
    steps: int | None = Field(None, ge=1, description="step budget (deterministic; with budget, first wins)")
    batch_size: int = Field(32, ge=1, description="sequences per optimizer step (the recipe's batch)")
    micro_batch_size: int | None = Field(
        None, ge=1, description="sequences per forward/backward (what fits in memory; "
        "gradients accumulate up to batch_size); null = batch_size"
    )
    batch_ramp: float = Field(
        0.0, ge=0.0, le=1.0, description="grow the batch linearly from one micro-batch to "
        "batch_size over this fraction of the budget (Cramming: 0.6); 0 = off"
    )
    optimizer: Literal["adamw"] = Field("adamw", description="optimizer (see docs/training.md)")
    lr: float = Field(2e-3, gt=0.0, description="peak learning rate")
    schedule: Literal["one-cycle", "wsd", "cosine", "linear", "constant"] = Field(
        "one-cycle", description="LR shape over budget progress (docs/training.md)"
    )
    lr_peak_at: float = Field(
        0.75, ge=0.0, le=1.0, description="one-cycle: fraction of the budget where the LR peaks"
    )
    warmup: float = Field(
        0.05, ge=0.0, lt=1.0, description="wsd/cosine/linear/constant: warmup fraction of the budget"
    )
    decay: float = Field(0.2, gt=0.0, le=1.0, description="wsd: final fraction spent cooling down (1-sqrt)")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine/wsd/linear: final LR / peak")
    weight_decay: float = Field(0.01, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.98, ge=0.0, lt=1.0)
    eps: float = Field(1e-12, gt=0.0)
    grad_clip: float = Field(0.5, ge=0.0, description="max global grad norm (0 = off)")
    mask_rate: float = Field(families.DEFAULT_MASK_RATE, gt=0.0, lt=1.0,
                             description="fraction of tokens masked (mlm)")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="auto = bf16 autocast where the device runs it fast, else fp32; "
        "fp16 = autocast with loss scaling (CUDA without bf16)"
    )
    compile: Literal["auto"] | bool = Field(
        "auto", description="torch.compile the model: auto = when the run is expected to end "
        ">=10% sooner with the compile included, from the compile cost and speed-up measured "
        "on this device (docs/training.md)"
    )
    attention: Literal["auto", "sdpa", "eager"] = Field(
        "auto", description="attention kernel: sdpa (fused; FlashAttention on GPU) or eager "
        "(matmuls + fp32 softmax); auto = sdpa on GPU, the faster one measured on a CPU"
    )
    seed: int = Field(0, ge=0)
    log_every: int = Field(10, ge=1, description="steps between metrics.jsonl records")
    val_every: float = Field(
        0.1, ge=0.0, le=1.0, description="validate on a fixed subset every this fraction of the "
        "budget (0 = only at the end)"
    )
    val_sequences: int = Field(128, ge=1, description="size of the periodic validation subset")
    checkpoint_every: _IntervalField = Field(
        "10%", validate_default=True, description="interval between checkpoints: a fraction "
        "of the budget (10%, "
        "capped at 30 minutes of wall clock, so every run is resumable), wall clock (30m) or "
        "steps (500steps); null = only at the end"
    )
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept (oldest deleted)")
    max_nonfinite: int = Field(
        5, ge=1, description="stop after this many non-finite losses in a row (each is skipped)"
    )
    tensorboard: bool = Field(True, description="write TensorBoard events to RUN_DIR/tb")
    init_from: str | None = Field(
        None, description="start from these weights: a Hugging Face folder or a run dir"
    )
    threads: int | None = Field(None, ge=1, description="CPU threads (default: torch's choice)")

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.budget is None and self.steps is None:
            raise ValueError("set a budget (train.budget, e.g. 5m) or a step count (train.steps)")
        micro = self.micro_batch_size or self.batch_size
        if micro > self.batch_size:
            raise ValueError(
                f"micro_batch_size ({micro}) cannot exceed batch_size ({self.batch_size})"
            )
        if self.batch_size % micro:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of micro_batch_size ({micro})"
            )
        return self

    def micro_batch(self, dp: int = 1) -> int:
        """Sequences per data-parallel rank per forward/backward — the one micro-batch rule:
        ``micro_batch_size``, or the rank's whole share of the batch (no accumulation)."""
        return self.micro_batch_size or max(1, self.batch_size // dp)


class EvalConfig(_Section):
    """Held-out evaluation."""

    max_sequences: int = Field(4096, ge=1, description="validation sequences to score (cap)")
    batch_size: int = Field(64, ge=1)
    seed: int = Field(1234, ge=0, description="seed of the fixed evaluation masking")
    mask_rate: float = Field(
        0.25, gt=0.0, lt=1.0, description="masking rate when scoring (fixed, so runs compare)"
    )
    dp_epsilon: float | None = Field(
        None, gt=0.0, description="fine-tuning: DP-SGD target ε (Opacus); null = not private"
    )
    dp_delta: float = Field(1e-5, gt=0.0, lt=1.0, description="fine-tuning: DP-SGD δ")
    dp_max_grad_norm: float = Field(1.0, gt=0.0, description="fine-tuning: per-example clip norm")


_Copies = Annotated[int, Field(ge=1, le=100_000)]


class CurateConfig(_Section):
    """Curation blocks `prep` runs between reading and tokenizing (see docs/data.md).

    Order (after prep's cleaning and data.min_chars): length → Gopher quality → Gopher
    repetition → exact dedup → fuzzy dedup → decontamination; the compressibility filter
    runs while tokenizing. Thresholds are the published defaults (Gopher, Cramming,
    MT-NLG); ``null`` turns a rule off.
    """

    max_chars: int | None = Field(None, ge=1, description="drop documents longer than this")
    filters: Literal["gopher", "none"] = Field(
        "none", description="gopher = Gopher quality + repetition rules and the compressibility filter"
    )
    dedup: Literal["none", "exact", "fuzzy", "substring"] = Field(
        "exact", description="exact = same normalized text; fuzzy = exact + MinHash LSH "
        "near-duplicates; substring = exact + repeated spans of ≥ substring_min_span words cut"
    )
    decontam: list[str] = Field(
        default_factory=list, description="evaluation files/folders whose n-grams are removed"
    )
    explain: int = Field(0, ge=0, description="dropped documents kept per reason for --explain")
    dropped_ids: bool = Field(
        False, description="write dropped.tsv in the data dir: the id (source:line) and the "
        "block of every document curation dropped (to score dedup, e.g. bench/prep_scale.py)"
    )

    gopher_min_words: int | None = Field(50, ge=0, description="fewer words: drop")
    gopher_max_words: int | None = Field(
        100_000, ge=1, validate_default=True, description="more words: drop"
    )
    gopher_min_mean_word_len: float | None = Field(3.0, ge=0.0, description="shorter mean word: drop")
    gopher_max_mean_word_len: float | None = Field(
        10.0, ge=0.0, validate_default=True, description="longer mean word: drop"
    )
    gopher_max_symbol_word_ratio: float | None = Field(
        0.1, ge=0.0, description="'#' or ellipses per word above this: drop"
    )
    gopher_max_bullet_lines: float | None = Field(
        0.9, ge=0.0, le=1.0, description="fraction of lines starting with a bullet above this: drop"
    )
    gopher_max_ellipsis_lines: float | None = Field(
        0.3, ge=0.0, le=1.0, description="fraction of lines ending with an ellipsis above this: drop"
    )
    gopher_min_alpha_words: float | None = Field(
        0.8, ge=0.0, le=1.0, description="fraction of words with a letter below this: drop"
    )
    gopher_min_stop_words: int | None = Field(2, ge=0, description="fewer stop-word occurrences: drop")
    gopher_stop_words: list[str] = Field(
        default_factory=lambda: ["the", "be", "to", "of", "and", "that", "have", "with"],
        description="the stop words counted by gopher_min_stop_words",
    )
    rep_max_dup_line_frac: float | None = Field(0.30, ge=0.0, le=1.0, description="repeated lines")
    rep_max_dup_para_frac: float | None = Field(0.30, ge=0.0, le=1.0, description="repeated paragraphs")
    rep_max_dup_line_char_frac: float | None = Field(
        0.20, ge=0.0, le=1.0, description="characters in repeated lines"
    )
    rep_max_dup_para_char_frac: float | None = Field(
        0.20, ge=0.0, le=1.0, description="characters in repeated paragraphs"
    )
    rep_max_top_ngram_frac: dict[int, float] = Field(
        default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16},
        description="n → max fraction of characters in the most frequent word n-gram",
    )
    rep_max_dup_ngram_frac: dict[int, float] = Field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10},
        description="n → max fraction of characters in repeated word n-grams",
    )
    compress_max_ratio: float | None = Field(
        0.3, gt=0.0, description="Cramming: tokens/characters above this: drop (with "
        "filters=gopher); the floor of the threshold when compress_relative is set"
    )
    compress_relative: float | None = Field(
        1.35, gt=1.0, description="the compressibility threshold is at least this times the "
        "median tokens/characters of a sample of the training documents (the 0.3 above was "
        "set for a 32K vocabulary; smaller ones compress clean text less); null: 0.3 alone"
    )

    minhash_ngram: int = Field(5, ge=1, le=64, description="fuzzy dedup shingles: word n-grams")
    minhash_bands: int = Field(28, ge=1, le=512, description="LSH bands (28 x 4: a pair at "
                               "Jaccard 0.7 is a candidate with probability 0.9995)")
    minhash_rows: int = Field(4, ge=1, le=64, description="MinHash values per band")
    minhash_threshold: float = Field(
        0.65, ge=0.0, le=1.0, description="fuzzy dedup drops a candidate pair only when their "
        "signatures agree on at least this fraction of values (estimated Jaccard; 0: plain LSH)")
    minhash_seed: int = Field(1, ge=0, description="seed of the MinHash permutations")

    decontam_mode: Literal["cut", "drop"] = Field(
        "cut", description="cut the overlapping span (MT-NLG) or drop the whole document"
    )
    decontam_ngram: int = Field(13, ge=1, le=64, description="word n-gram length matched")
    decontam_min_words: int = Field(
        8, ge=1, le=64, validate_default=True,
        description="shorter evaluation segments (≥ this) are matched whole",
    )
    decontam_margin_chars: int = Field(200, ge=0, description="characters cut on each side of a match")
    decontam_max_pieces: int = Field(10, ge=1, description="more pieces after cutting: drop")
    decontam_min_piece_chars: int = Field(200, ge=1, description="shorter pieces after cutting: drop")

    substring_min_span: int = Field(
        50, ge=2, le=100_000, description="substring dedup: shortest repeated span cut (words)"
    )
    substring_max_mb: float = Field(
        200.0, gt=0, description="substring dedup refuses a corpus of more text than this, in "
        "MB (million characters): it holds the corpus and a suffix array, ~20 MB of memory "
        "per MB of text (docs/data.md)"
    )
    dedup_against: list[str] = Field(
        default_factory=list, description="earlier data dirs whose dedup index new documents "
        "are deduplicated against (exact and, with dedup=fuzzy, MinHash), without their text"
    )
    canaries: int = Field(0, ge=0, le=10_000, description="random secrets inserted (docs/privacy.md)")
    canary_repeats: _Copies | list[_Copies] = Field(
        1, description="copies of each canary in train; a list [1, 4, 16] cycles over canaries"
    )
    canary_seed: int = Field(0, ge=0, description="seed of the canary secrets and their hosts")

    @field_validator("dedup_against")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        return unique_paths(value)

    @field_validator("rep_max_top_ngram_frac", "rep_max_dup_ngram_frac")
    @classmethod
    def _ngram_fracs(cls, value: dict[int, float]) -> dict[int, float]:
        for n, frac in value.items():
            if not 1 <= n <= 64:
                raise ValueError(f"n-gram length {n} must be between 1 and 64")
            if not 0.0 <= frac <= 1.0:
                raise ValueError(f"fraction {frac} for {n}-grams must be between 0 and 1")
        return value

    @field_validator("gopher_max_words", "gopher_max_mean_word_len", "decontam_min_words")
    @classmethod
    def _not_below(cls, value: Any, info: ValidationInfo) -> Any:
        lower, upper = {
            "gopher_max_words": ("gopher_min_words", None),
            "gopher_max_mean_word_len": ("gopher_min_mean_word_len", None),
            "decontam_min_words": (None, "decontam_ngram"),
        }[info.field_name]
        if lower is not None and value is not None and info.data.get(lower) is not None:
            if value < info.data[lower]:
                raise ValueError(f"must be at least {lower} ({info.data[lower]})")
        if upper is not None and info.data.get(upper) is not None and value > info.data[upper]:
            raise ValueError(f"must not exceed {upper} ({info.data[upper]})")
        return value


class ParallelConfig(_Section):
    """How one torchrun job spreads the model (docs/distributed.md). ``shoestring plan``
    writes this section, ``train --plan`` reads it, the ``--parallel/--zero/--ac/...`` flags
    set it, and a run's config.yaml records the layout it trained with. Degrees left unset
    mean data parallelism over the ranks that tensor and pipeline parallelism leave."""

    dp: int | None = Field(None, ge=1, description="data-parallel degree (default: the "
                           "ranks left after tp and pp)")
    dp_replicate: int | None = Field(None, ge=1, description="hybrid sharding: replicas")
    dp_shard: int | None = Field(None, ge=1, description="hybrid sharding: shards per replica "
                                 "(needs zero 2 or 3)")
    tp: int = Field(1, ge=1, description="tensor-parallel degree (inside a node)")
    pp: int = Field(1, ge=1, description="pipeline stages")
    zero: int = Field(0, ge=0, le=3, description="ZeRO stage: 0 DDP, 1 sharded optimizer, "
                      "2/3 FSDP2 without/with resharding after forward")
    offload: Literal["none", "cpu"] = Field("none", description="cpu: offload sharded state "
                                            "(ZeRO 2/3, CUDA)")
    ac: Literal["none", "selective", "full"] = Field("none", description="activation "
                                                     "checkpointing")
    pp_schedule: Literal["gpipe", "1f1b", "interleaved"] = Field("1f1b", description=
                                                                 "pipeline schedule")
    microbatches: int | None = Field(None, ge=1, description="pipeline microbatches per step "
                                     "(default: the stages)")

    def degrees(self) -> dict[str, int]:
        """The degrees that were set (``dp=…,tp=…`` keys), as `dist.layout.make_layout`
        takes them."""
        given = {"dp": self.dp, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard,
                 "tp": self.tp if self.tp > 1 else None, "pp": self.pp if self.pp > 1 else None}
        return {k: v for k, v in given.items() if v is not None}


class Config(_Section):
    """Every stage's settings; `config.yaml` in a run dir is this, fully resolved."""

    data: DataConfig = Field(default_factory=DataConfig)
    curate: CurateConfig = Field(default_factory=CurateConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    _given: dict[str, str] = PrivateAttr(default_factory=dict)  # key → "file", option, "--set"

    @model_validator(mode="before")
    @classmethod
    def _apply_train_recipe(cls, data: Any) -> Any:
        """The train settings a user leaves unset take the objective's training recipe
        (``FamilySpec.train_recipe``; RTD's differs from MLM's), as model fields take its
        model recipe. A run's config.yaml is fully resolved, so reading it back changes
        nothing."""
        if not isinstance(data, dict):
            return data
        model = data.get("model") or {}
        if isinstance(model, ModelConfig):
            objective = model.objective
        elif isinstance(model, dict):
            objective = model.get("objective")
            if objective is None and model.get("preset") is not None:
                try:
                    objective = families.preset_fields(str(model["preset"]))["objective"]
                except ValueError:
                    return data  # ModelConfig names the unknown preset
        else:
            return data
        recipe = TRAIN_RECIPES.get(objective)
        if not recipe:
            return data  # none, or an unknown objective: ModelConfig's Literal reports it
        train = data.get("train") or {}
        if isinstance(train, TrainConfig):
            unset = {k: v for k, v in recipe.items() if k not in train.model_fields_set}
            return {**data, "train": train.model_copy(update=unset)}
        if isinstance(train, dict):
            return {**data, "train": {**recipe, **train}}
        return data

    def given(self, section: str, *, file: bool = True) -> set[str]:
        """The keys of ``section`` the user set (the YAML file unless ``file`` is False, an
        option, ``--set``), not a plan's nor the defaults: what `load_config` was told."""
        return {k.split(".", 1)[1] for k, by in self._given.items()
                if k.startswith(f"{section}.") and (file or by != "file")}

    def __eq__(self, other: object) -> bool:
        """Equal settings are equal configs, whoever gave them: `given` is not compared."""
        return type(other) is type(self) and self.__dict__ == other.__dict__

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _section_at(path: list[str]) -> type[BaseModel]:
    """The settings model at a dotted path of `Config` (through optional sections and the
    values of mappings, as in ``data.mixture.sources.NAME``)."""
    section: Any = Config
    for p in path:
        if get_origin(section) is dict:
            section = get_args(section)[1]
        else:
            section = section.model_fields[p].annotation
        if get_origin(section) in (Union, UnionType):  # `X | None`
            section = next(a for a in get_args(section) if a is not type(None))
    return section


def _format_validation_error(
    err: ValidationError, source: str, flags: dict[str, str] | None = None
) -> ShoestringError:
    """One line per problem; a key set by a command-line option is named by that option."""
    flags = flags or {}
    lines, named = [], set()
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if loc in flags:
            named.add(flags[loc])
            loc = flags[loc]
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        if e["type"] == "extra_forbidden":
            section = _section_at([str(p) for p in e["loc"][:-1]])
            allowed = ", ".join(sorted(section.model_fields))
            lines.append(f"unknown key '{loc}'; allowed keys here: {allowed}")
        elif e["type"] == "literal_error":
            lines.append(f"{loc}: {e['msg']}{shown}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if loc and msg.startswith(f"{loc}."):  # the message names its key already
                lines.append(f"{msg}{shown}")
            else:
                lines.append(f"{loc or 'config'}: {msg}{shown}")
    if len(lines) == 1 and named:  # one bad option: name it, as the user typed it
        option = named.pop()
        return ShoestringError(lines[0].removeprefix(f"{option}: "), where=option,
                               fix=f"see {option} in --help")
    return ShoestringError(
        lines[0] if len(lines) == 1 else "invalid configuration:\n  " + "\n  ".join(lines),
        where=source,
        fix="see `shoestring config show` for every key and its default",
    )


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    if len(parts) != 2 or not all(parts):
        raise ShoestringError(
            f"override key '{dotted}' must look like section.key",
            where=source,
            fix=f"sections: {', '.join(Config.model_fields)}; e.g. --set train.lr=1e-3",
        )
    section, key = parts
    if section not in Config.model_fields:
        raise ShoestringError(
            f"unknown section '{section}' in '{dotted}'",
            where=source,
            fix=f"sections are: {', '.join(Config.model_fields)}",
        )
    tree.setdefault(section, {})[key] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=value``; the value is parsed as YAML (so 1e-3, true, null work)."""
    if "=" not in text:
        raise ShoestringError(
            f"override '{text}' has no '='",
            where="--set",
            fix="write it as section.key=value, e.g. --set train.lr=1e-3",
        )
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    # YAML reads 1e-3 as a string (it wants 1.0e-3); numbers are what users mean.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key.strip(), value


def read_plan_sections(path: str | Path) -> dict[str, Any]:
    """A plan file's config sections (``plan:`` dropped), for `train --plan`."""
    tree = read_yaml(path, "plan file", fix="write one with `shoestring plan ... -o plan.yaml`")
    if not isinstance(tree, dict) or "plan" not in tree:
        raise ShoestringError("not a shoestring plan (no 'plan:' section)", where=str(path),
                              fix="write one with `shoestring plan ... -o plan.yaml`")
    return {k: v for k, v in tree.items() if k != "plan"}


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    plan: str | Path | None = None,
    flags: dict[str, Any] | None = None,
) -> Config:
    """Defaults ← plan (``shoestring plan`` output) ← YAML file ← command-line options
    (``flags``: option name → ``(dotted key, value)``) ← ``--set`` overrides, validated."""
    tree: dict[str, Any] = {}
    given: dict[str, str] = {}
    source = "config"
    if plan is not None:  # a plan's model/train/data sections; its `plan:` metadata is dropped
        for section, values in read_plan_sections(plan).items():
            if not isinstance(values, dict):
                raise ShoestringError(f"section '{section}' must be a mapping", where=str(plan))
            tree.setdefault(section, {}).update(values)
        source = str(plan)
    if path is not None:
        source = str(path)
        loaded = read_yaml(path, "config file") or {}
        if not isinstance(loaded, dict):
            raise ShoestringError("a config file must be a mapping of sections", where=source)
        for section, values in loaded.items():
            if not isinstance(values, dict):
                raise ShoestringError(
                    f"section '{section}' must be a mapping of keys to values", where=source
                )
            tree.setdefault(section, {}).update(values)
            given.update({f"{section}.{key}": "file" for key in values})
    named = {}
    for option, (key, value) in (flags or {}).items():
        _set_dotted(tree, key, value, option)
        named[key] = given[key] = option
    for item in overrides or []:
        key, value = parse_override(item)
        _set_dotted(tree, key, value, "--set")
        given[key] = "--set"
        named.pop(key, None)  # --set wins, and is what a problem is then reported as
        source = "--set" if path is None else f"{path} + --set"
    try:
        cfg = Config.model_validate(tree)
    except ValidationError as e:
        raise _format_validation_error(e, source, named) from None
    cfg._given = given
    return cfg
