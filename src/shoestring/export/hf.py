"""Hugging Face export and import: a trained encoder as a plain ModernBERT folder, and back.

Our encoder is built layer for layer like ModernBERT (docs/export.md), so the export is a
renaming of the weights plus a ``config.json`` that pins every ModernBERT option to the
behaviour we trained with: no sliding-window layers, no biases, exact (erf) GELU, a decoder
tied to the embeddings. ``transformers.AutoModelForMaskedLM`` then loads it with no custom code
and gives the same logits as ``MaskedLM`` (within float rounding; tests/test_hf_export.py).

Neither direction imports ``transformers``: the export writes safetensors and JSON, and the
import reads them, so shoestring does not depend on it. Anything that has no exact counterpart
on the other side is refused with the option's name rather than approximated: a model that
loads but computes something slightly different is worse than no model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from shoestring import __version__
from shoestring.config import ModelConfig
from shoestring.families.spec import CLS, MASK, MLM_SPECIAL_TOKENS, NUM_SPECIAL, PAD, SEP, UNK
from shoestring.data.tokenizer import load_tokenizer, special_ids
from shoestring.errors import ShoestringError
from shoestring.families.mlm import MLM
from shoestring.fsutil import building_dir, check_output_dir, save_safetensors
from shoestring.fsutil import write_json_atomic, write_text_atomic
from shoestring.model.encoder import MaskedLM
from shoestring.rundir import RunDir

__all__ = ["EXPORT_MARKER", "TRAINING_ONLY", "export_encoder", "hf_config", "hf_state_dict", "import_encoder",
           "read_weights", "refuse", "write_export"]

EXPORT_MARKER = ".shoestring-export"
HF_ARCHITECTURE = "ModernBertForMaskedLM"
MODEL_TYPE = MLM.hf_model_type
WEIGHTS = "model.safetensors"
TIED_DECODER = "decoder.weight"  # ModernBertForMaskedLM ties it to the token embeddings

# --- weight names -------------------------------------------------------------------------
# Ours → ModernBertForMaskedLM's. Layer parameters keep their names under ``model.``; the rest
# move into ModernBERT's ``model.embeddings`` / ``head`` modules. The decoder is not stored:
# it is tied, and transformers itself saves tied models without ``decoder.weight``.
_TOP_LEVEL_NAMES = {
    "tok_embeddings.weight": "model.embeddings.tok_embeddings.weight",
    "emb_norm.weight": "model.embeddings.norm.weight",
    "final_norm.weight": "model.final_norm.weight",
    "head_dense.weight": "head.dense.weight",
    "head_norm.weight": "head.norm.weight",
    # with model.bias=true
    "emb_norm.bias": "model.embeddings.norm.bias",
    "final_norm.bias": "model.final_norm.bias",
    "head_dense.bias": "head.dense.bias",
    "head_norm.bias": "head.norm.bias",
    "decoder_bias": "decoder.bias",
}
# attn_norm is absent in layer 0 (Identity) on both sides.
_LAYER_PARAMS = {f"{module}.{kind}" for kind in ("weight", "bias") for module in
                 ("attn_norm", "attn.Wqkv", "attn.Wo", "mlp_norm", "mlp.Wi", "mlp.Wo")}


def _to_hf_name(name: str) -> str | None:
    if name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[name]
    parts = name.split(".", 2)
    is_layer = len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit()
    if is_layer and parts[2] in _LAYER_PARAMS:
        return f"model.{name}"
    return None


_FROM_HF_TOP_LEVEL = {v: k for k, v in _TOP_LEVEL_NAMES.items()}


def _from_hf_name(name: str) -> str | None:
    if name in _FROM_HF_TOP_LEVEL:
        return _FROM_HF_TOP_LEVEL[name]
    if name.startswith("model.") and _to_hf_name(name.removeprefix("model.")) == name:
        return name.removeprefix("model.")
    return None


def hf_state_dict(model: MaskedLM) -> dict[str, torch.Tensor]:
    """Our parameters under ModernBertForMaskedLM's names: fp32, contiguous, on the CPU.

    A parameter with no ModernBERT name (a future module) refuses the export instead of being
    dropped, which would load as a randomly initialised weight on the other side.
    """
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        hf_name = _to_hf_name(name)
        if hf_name is None:
            raise ShoestringError(
                f"model parameter '{name}' has no ModernBERT equivalent",
                fix="this model cannot be exported to Hugging Face format")
        state[hf_name] = tensor.detach().to("cpu", torch.float32).contiguous()
    return state


# --- config ------------------------------------------------------------------------------
# One entry per ModelConfig field: how it becomes ModernBertConfig fields. A field missing
# from this table, or whose value the function rejects, refuses the export by name, so a new
# model option (a norm type, learned positions, ...) cannot be exported by silent accident.

def _rope(theta: float) -> dict[str, Any]:
    # transformers ≥ 5 reads rope_parameters; 4.48–4.x read global/local_rope_theta. Every
    # layer is a full-attention layer, so the local theta is unused; set it equal anyway.
    return {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": theta},
                                "sliding_attention": {"rope_type": "default", "rope_theta": theta}},
            "global_rope_theta": theta, "local_rope_theta": theta}


def _layers(n: int) -> dict[str, Any]:
    # ModernBERT alternates sliding-window and global layers by default; we have only global.
    # layer_types says so to transformers ≥ 5, global_attn_every_n_layers=1 to 4.x.
    return {"num_hidden_layers": n, "layer_types": ["full_attention"] * n,
            "global_attn_every_n_layers": 1}


def only(option: str, allowed: Any, why: str, target: str = "ModernBERT"
         ) -> Callable[[Any], dict[str, Any]]:
    """An option ``target`` has no switch for: exportable only at the value it hard-codes."""

    def check(value: Any) -> dict[str, Any]:
        if value != allowed:
            raise ShoestringError(
                f"model option '{option}' = {value!r} has no exact {target} equivalent ({why})",
                fix=f"only models trained with model.{option}={allowed!r} can be exported "
                f"to {target}; the run's own final/ weights still work with eval and serve")
        return {}

    return check


def map_options(cfg: ModelConfig, table: dict[str, Callable[[Any], dict[str, Any]]],
                target: str) -> dict[str, Any]:
    """Every ModelConfig field through ``table`` into HF config fields; a field missing from the
    table refuses the export by name, so a new option cannot be exported by silent accident."""
    fields: dict[str, Any] = {}
    for name, value in cfg.model_dump(mode="json").items():
        if name not in table:
            raise ShoestringError(
                f"model option '{name}' (= {value!r}) has no exact {target} equivalent",
                fix="this model cannot be exported to Hugging Face format")
        fields.update(table[name](value))
    return fields


def _bias(value: bool) -> dict[str, Any]:
    return {name: value for name in
            ("attention_bias", "mlp_bias", "norm_bias", "classifier_bias", "decoder_bias")}


_ACTIVATIONS = {"geglu": "gelu", "swiglu": "silu"}  # ModernBERT's MLP is always gated


def _ffn(value: str) -> dict[str, Any]:
    if value not in _ACTIVATIONS:
        only("ffn", "geglu", "ModernBERT's feed-forward is always gated")(value)
    return {"hidden_activation": _ACTIVATIONS[value]}


# Options of a model's training, not of the function it computes (the RTD generator: a run
# exports its discriminator alone, model/detector.py): every target ignores them.
TRAINING_ONLY: dict[str, Callable[[Any], dict[str, Any]]] = {
    name: lambda v: {} for name in ("generator_width", "generator_depth", "rtd_weight",
                                    "rtd_sharing")}

_EXPORT_OPTIONS: dict[str, Callable[[Any], dict[str, Any]]] = {
    **TRAINING_ONLY,
    "preset": lambda v: {},  # a name for the sizes below, which are exported themselves
    "objective": only("objective", MLM.name, "ModernBERT is an encoder"),
    "hidden_size": lambda v: {"hidden_size": v},
    "num_layers": _layers,
    "num_heads": lambda v: {"num_attention_heads": v},
    "num_kv_heads": lambda v: {},  # config validation ties it to num_heads for encoders
    "intermediate_size": lambda v: {"intermediate_size": v},
    "norm": only("norm", "layernorm", "ModernBERT uses LayerNorm"),
    "norm_position": only("norm_position", "pre", "ModernBERT is a pre-norm model"),
    "bias": _bias,
    "ffn": _ffn,
    "positions": only("positions", "rotary", "ModernBERT uses rotary positions"),
    "max_positions": lambda v: {},  # only used by learned/sinusoidal positions
    "tie_embeddings": only("tie_embeddings", True, "ModernBERT ties its decoder"),
    "embedding_norm": only("embedding_norm", True, "ModernBERT always normalizes embeddings"),
    "sparse_prediction": lambda v: {},  # which positions training scores, not the function
    "norm_eps": lambda v: {"norm_eps": v},
    "rope_theta": _rope,
    # Same scheme in ModernBERT's init (±3σ cut-off, out-projections scaled by 1/sqrt(2·layers));
    # it only matters to someone re-initialising, e.g. a fresh classifier head.
    "init_std": lambda v: {"initializer_range": v, "initializer_cutoff_factor": 3.0},
}

# What our architecture fixes, as ModernBertConfig fields: every value differs from or is
# not guaranteed by ModernBERT's defaults, so all are written out explicitly.
_FIXED: dict[str, Any] = {
    "classifier_activation": "gelu",
    "tie_word_embeddings": True,
    "attention_dropout": 0.0,
    "embedding_dropout": 0.0,
    "mlp_dropout": 0.0,
    "classifier_dropout": 0.0,
    # What a sequence classifier built from the export pools: the mean of the tokens, not
    # [CLS] (ModernBERT's default). MLM pretraining never trains [CLS] as a summary, and
    # through transformers' AutoModelForSequenceClassification mean pooling fine-tuned
    # better (bench/hf_transfer.py; docs/export.md, "Fine-tuning the export").
    "classifier_pooling": "mean",
    "local_attention": 128,  # unused: no sliding-window layers
    "sparse_prediction": False,
}


def hf_config(model_cfg: ModelConfig, vocab_size: int, seq_len: int, ids: dict[str, int]) -> dict:
    """The ModernBERT ``config.json`` for one of our models; refuses options it cannot map."""
    fields: dict[str, Any] = {"architectures": [HF_ARCHITECTURE], "model_type": MODEL_TYPE}
    fields.update(map_options(model_cfg, _EXPORT_OPTIONS, "ModernBERT"))
    fields.update(_FIXED)
    fields.update(
        vocab_size=vocab_size,
        # RoPE has no table that caps the length; this is only the length advertised.
        max_position_embeddings=max(seq_len, 512),
        pad_token_id=ids["[PAD]"], bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
        cls_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"], mask_token_id=ids["[MASK]"],
        dtype="float32", torch_dtype="float32",  # the older name, for transformers 4.x
    )
    return fields


def _special_tokens_map() -> dict[str, str]:
    return {"unk_token": UNK, "cls_token": CLS, "sep_token": SEP, "pad_token": PAD, "mask_token": MASK}


def _tokenizer_config(tokenizer_json: Path, seq_len: int) -> dict[str, Any]:
    """``tokenizer_config.json``: the fast tokenizer as is, with its special tokens named.

    ``PreTrainedTokenizerFast`` runs ``tokenizer.json`` unchanged (normalizer, WordPiece and
    the ``[CLS] $A [SEP]`` template), so its ids equal ours; ``do_lower_case`` only reports
    what the normalizer already does.
    """
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    normalizer = spec.get("normalizer") or {}
    return {"tokenizer_class": "PreTrainedTokenizerFast", **_special_tokens_map(),
            "model_max_length": seq_len, "do_lower_case": bool(normalizer.get("lowercase", False)),
            "model_input_names": ["input_ids", "attention_mask"],  # ModernBERT has no token types
            "clean_up_tokenization_spaces": False}


# --- export ------------------------------------------------------------------------------

def export_encoder(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False,
                   loaded: tuple[MaskedLM, dict[str, Any]] | None = None) -> Path:
    """Write a run's trained model as a Hugging Face ModernBERT folder; returns ``out_dir``.

    The folder holds ``config.json``, ``model.safetensors`` (fp32), ``tokenizer.json``,
    ``tokenizer_config.json``, ``special_tokens_map.json`` and a ``.shoestring-export``
    marker. It is built in a hidden sibling folder and renamed into place, so it is complete
    or absent, and a previous export is only replaced once the new one is whole. ``loaded``:
    the run's encoder and meta when the caller has them (an RTD run's discriminator).
    """
    run_dir, out = Path(run_dir), Path(out_dir)
    check_output_dir(out, "export", owned=(out / EXPORT_MARKER).is_file(), overwrite=overwrite)
    model, meta = loaded if loaded is not None else RunDir(run_dir).load_final()
    config = hf_config(model.cfg, meta["vocab_size"], meta["seq_len"], meta["special_ids"])
    state = hf_state_dict(model)
    tokenizer_json = RunDir(run_dir).tokenizer_path
    special_ids(load_tokenizer(tokenizer_json))  # the fixed special-token layout, checked
    return write_export(out, run_dir, state, {
        "config.json": config,
        "tokenizer_config.json": _tokenizer_config(tokenizer_json, meta["seq_len"]),
        "special_tokens_map.json": _special_tokens_map()})


def write_export(out: Path, run_dir: Path, state: dict[str, torch.Tensor],
                 files: dict[str, dict[str, Any]]) -> Path:
    """Write export folder ``out`` (ModernBERT or Llama): ``state`` as safetensors, the run's
    ``tokenizer.json``, each of ``files`` as JSON, and the marker; built in a hidden sibling
    folder and renamed into place (fsutil.building_dir), so it is complete or absent."""
    with building_dir(out) as build:
        save_safetensors(state, build / WEIGHTS, metadata={"format": "pt"})
        shutil.copyfile(RunDir(run_dir).tokenizer_path, build / "tokenizer.json")
        for name, content in files.items():
            write_json_atomic(build / name, content)
        write_text_atomic(build / EXPORT_MARKER,
                          f"shoestring {__version__} export of {run_dir.resolve()}\n")
    return out


# --- import ------------------------------------------------------------------------------
# (ModernBertConfig field, its default in transformers, the value we need, why). A config that
# leaves a field out gets transformers' default, so the default is what we check then.
_BIAS_FIELDS = {"attention_bias": False, "mlp_bias": False, "norm_bias": False,
                "classifier_bias": False, "decoder_bias": True}  # with transformers' defaults
_REQUIRED: list[tuple[str, Any, Any, str]] = [
    ("classifier_activation", "gelu", "gelu", "shoestring uses exact (erf) GELU in the head"),
    ("tie_word_embeddings", True, True, "the shoestring decoder is tied to the embeddings"),
    ("attention_dropout", 0.0, 0.0, "shoestring models have no dropout"),
    ("embedding_dropout", 0.0, 0.0, "shoestring models have no dropout"),
    ("mlp_dropout", 0.0, 0.0, "shoestring models have no dropout"),
    ("classifier_dropout", 0.0, 0.0, "shoestring models have no dropout"),
    ("rope_scaling", None, None, "shoestring uses plain RoPE"),
]
_DEFAULT_GLOBAL_THETA = 160_000.0  # ModernBertConfig's default for full-attention layers
_OUR_SPECIAL_IDS = dict(zip(MLM_SPECIAL_TOKENS, range(NUM_SPECIAL)))
_SPECIAL_FIELDS = {"pad_token_id": "[PAD]", "cls_token_id": "[CLS]", "sep_token_id": "[SEP]",
                   "mask_token_id": "[MASK]"}


_IMPORT_FIX = "only ModernBERT models with shoestring's exact architecture can be imported"


def refuse(where: Path, field: str, value: Any, why: str,
           fix: str = _IMPORT_FIX) -> ShoestringError:
    """An import refused for one config field (or weight), naming it and its value."""
    return ShoestringError(f"cannot import: {field} = {json.dumps(value)} ({why})",
                           where=str(where), fix=fix)


def _layer_types(cfg: dict) -> list[str]:
    """Each layer's attention kind, the way ModernBertConfig derives it when not given."""
    if cfg.get("layer_types") is not None:
        return list(cfg["layer_types"])
    every = cfg.get("global_attn_every_n_layers", 3)
    return ["sliding_attention" if i % every else "full_attention"
            for i in range(cfg["num_hidden_layers"])]


def _rope_theta(cfg: dict, where: Path) -> float:
    params = (cfg.get("rope_parameters") or {}).get("full_attention") or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise refuse(where, "rope_parameters.full_attention.rope_type", rope_type,
                      "shoestring uses plain RoPE")
    return float(params.get("rope_theta", cfg.get("global_rope_theta", _DEFAULT_GLOBAL_THETA)))


def _check_config(cfg: dict, where: Path) -> None:
    if cfg.get("model_type") != MODEL_TYPE:
        raise refuse(where, "model_type", cfg.get("model_type"), "only ModernBERT is supported")
    for field, default, needed, why in _REQUIRED:
        value = cfg.get(field, default)
        if value != needed:
            raise refuse(where, field, value, why)
    biases = {field: bool(cfg.get(field, default)) for field, default in _BIAS_FIELDS.items()}
    if len(set(biases.values())) > 1:
        field = next(f for f, v in biases.items() if v != biases["attention_bias"])
        raise refuse(where, field, biases[field],
                      "shoestring's model.bias switches every bias together; here they differ")
    activation = cfg.get("hidden_activation", "gelu")
    if activation not in _ACTIVATIONS.values():
        raise refuse(where, "hidden_activation", activation,
                      "shoestring's gated feed-forward uses exact GELU (geglu) or SiLU (swiglu)")
    for i, kind in enumerate(_layer_types(cfg)):
        if kind != "full_attention":
            given = cfg.get("layer_types") is not None
            field = "layer_types" if given else "global_attn_every_n_layers"
            raise refuse(where, field, cfg.get(field, 3),
                          f"layer {i} is {kind!r}; shoestring has only full-attention layers")
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim * cfg["num_attention_heads"] != cfg["hidden_size"]:
        raise refuse(where, "head_dim", head_dim, "shoestring heads split hidden_size evenly")
    for field, token in _SPECIAL_FIELDS.items():
        want = _OUR_SPECIAL_IDS[token]
        if cfg.get(field, want) != want:
            raise refuse(where, field, cfg.get(field),
                          f"shoestring's tokenizer has {token} at id {want}")


def _model_config(cfg: dict, where: Path) -> ModelConfig:
    try:
        return ModelConfig(
            hidden_size=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"], intermediate_size=cfg["intermediate_size"],
            norm_eps=cfg.get("norm_eps", 1e-5), rope_theta=_rope_theta(cfg, where),
            init_std=cfg.get("initializer_range", 0.02),
            bias=bool(cfg.get("attention_bias", False)),
            ffn={v: k for k, v in _ACTIVATIONS.items()}[cfg.get("hidden_activation", "gelu")])
    except ShoestringError:
        raise
    except Exception as e:  # missing keys and pydantic validation alike
        raise ShoestringError(
            "cannot import: the config does not describe a shoestring model "
            f"({type(e).__name__}: {e})",
            where=str(where / "config.json")) from None


def read_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """``model.safetensors`` of a Hugging Face folder (one file: shards are refused)."""
    path = hf_dir / WEIGHTS
    if not path.is_file():
        sharded = (hf_dir / f"{WEIGHTS}.index.json").is_file()
        why = " (sharded checkpoints are not supported)" if sharded else ""
        raise ShoestringError(f"cannot import: no {WEIGHTS}{why}", where=str(hf_dir),
                              fix="save the model as one file: save_pretrained(..., "
                              "max_shard_size='100GB')")
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _our_state(hf_state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """ModernBERT names → ours; the tied decoder must equal the embeddings if it is stored."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in hf_state.items():
        if name == TIED_DECODER:
            continue
        ours = _from_hf_name(name)
        if ours is None:
            raise refuse(where, "weight", name, "shoestring has no such parameter")
        state[ours] = tensor.to(torch.float32)
    decoder = hf_state.get(TIED_DECODER)
    embeddings = state.get("tok_embeddings.weight")
    if decoder is not None and (embeddings is None or not torch.equal(decoder.float(), embeddings)):
        raise refuse(where, "weight", TIED_DECODER,
                      "a decoder that differs from the embeddings; shoestring's is tied")
    return state


def _seq_len(hf_dir: Path, cfg: dict) -> int:
    """The trained length: the tokenizer's model_max_length, else max_position_embeddings."""
    try:
        tc = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        length = tc.get("model_max_length")
        if isinstance(length, int) and 0 < length < 1 << 30:
            return length
    except (OSError, ValueError, AttributeError):
        pass
    return int(cfg.get("max_position_embeddings", 8192))


def import_encoder(hf_dir: Path, cfg: dict) -> tuple[MaskedLM, dict]:
    """A ModernBERT folder as our ``MaskedLM`` (CPU, fp32, eval mode) and a ``load_final`` meta.

    Reads ``cfg`` (its ``config.json``, as `hub.import_hf` read it) and ``model.safetensors``
    directly (no ``transformers``). Refuses, naming the field and its value, any configuration
    our model cannot compute exactly: sliding-window layers, biases, another activation, an
    untied decoder, dropout, scaled RoPE, or special tokens at other ids than shoestring's
    tokenizer uses.
    """
    _check_config(cfg, hf_dir)
    model_cfg = _model_config(cfg, hf_dir)
    if (hf_dir / "tokenizer.json").is_file():
        special_ids(load_tokenizer(hf_dir / "tokenizer.json"))  # raises if the layout differs
    model = MaskedLM(model_cfg, cfg["vocab_size"])
    try:
        model.load_state_dict(_our_state(read_weights(hf_dir), hf_dir), strict=True)
    except RuntimeError as e:  # missing weights or wrong shapes
        raise ShoestringError(f"cannot import: the weights do not fit the config ({e})",
                              where=str(hf_dir / WEIGHTS)) from None
    meta = {"architecture": MLM.architecture, "model": model_cfg.model_dump(mode="json"),
            "vocab_size": cfg["vocab_size"], "seq_len": _seq_len(hf_dir, cfg),
            "special_ids": dict(_OUR_SPECIAL_IDS)}
    return model.eval(), meta
