"""Hugging Face export and import of the decoder as a plain Llama folder, and back.

The decoder's default recipe is Llama's (pre-RMSNorm, SwiGLU, rotary in the half-split
convention, no embedding norm), so the export is a renaming plus two splits of our fused
matrices: ``Wqkv`` into ``q_proj``/``k_proj``/``v_proj`` and ``Wi`` into ``gate_proj`` (the
activated half) and ``up_proj``. ``transformers.AutoModelForCausalLM`` loads the folder with no
custom code and computes our logits (tests/test_hf_llama.py). Recipe options Llama cannot
express (LayerNorm, post-norm, GeGLU or plain GELU, added positions, an embedding norm) refuse
the export by name. Like export/hf.py, neither direction imports ``transformers``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from shoestring.config import ModelConfig
from shoestring.errors import ShoestringError
from shoestring.families.clm import CLM
from shoestring.fsutil import check_output_dir
from shoestring.model.decoder import CausalLM
from shoestring.export.hf import (TRAINING_ONLY, map_options, only, read_weights, refuse,
                                  write_export)

EXPORT_MARKER = ".shoestring-export"
HF_ARCHITECTURE = "LlamaForCausalLM"
MODEL_TYPE = CLM.hf_model_type
WEIGHTS = "model.safetensors"


def _only(option: str, allowed: Any, why: str) -> Callable[[Any], dict[str, Any]]:
    return only(option, allowed, why, target="Llama")


_EXPORT_OPTIONS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "preset": lambda v: {},
    **TRAINING_ONLY,
    "objective": _only("objective", CLM.name, "Llama is a decoder"),
    "hidden_size": lambda v: {"hidden_size": v},
    "num_layers": lambda v: {"num_hidden_layers": v},
    "num_heads": lambda v: {"num_attention_heads": v},
    "num_kv_heads": lambda v: {},  # written below from the resolved count
    "intermediate_size": lambda v: {"intermediate_size": v},
    "norm": _only("norm", "rmsnorm", "Llama uses RMSNorm"),
    "norm_position": _only("norm_position", "pre", "Llama is a pre-norm model"),
    "bias": lambda v: {"attention_bias": v, "mlp_bias": v},
    "ffn": _only("ffn", "swiglu", "Llama's feed-forward is SwiGLU"),
    "positions": _only("positions", "rotary", "Llama uses rotary positions"),
    "max_positions": lambda v: {},
    "tie_embeddings": lambda v: {"tie_word_embeddings": v},
    "embedding_norm": _only("embedding_norm", False, "Llama has no embedding norm"),
    "sparse_prediction": lambda v: {},  # an MLM training option; decoders score every position
    "norm_eps": lambda v: {"rms_norm_eps": v},
    "rope_theta": lambda v: {"rope_theta": v,
                             "rope_parameters": {"rope_type": "default", "rope_theta": v}},
    "init_std": lambda v: {"initializer_range": v},
}


def hf_config(cfg: ModelConfig, vocab_size: int, seq_len: int, ids: dict[str, int]) -> dict:
    """The Llama ``config.json`` for one of our decoders; refuses options it cannot map."""
    fields: dict[str, Any] = {"architectures": [HF_ARCHITECTURE], "model_type": MODEL_TYPE}
    fields.update(map_options(cfg, _EXPORT_OPTIONS, "Llama"))
    eos = ids.get("<|endoftext|>")
    fields.update(
        num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, hidden_act="silu",
        vocab_size=vocab_size,
        max_position_embeddings=seq_len,  # the trained context (lm-eval sizes its windows by it)
        attention_dropout=0.0, pretraining_tp=1, bos_token_id=eos, eos_token_id=eos,
        pad_token_id=ids.get("<|pad|>", eos), dtype="float32", torch_dtype="float32")
    return fields


def _split_sizes(cfg: ModelConfig) -> tuple[list[int], list[int]]:
    qkv = [cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]
    return qkv, [cfg.intermediate_size, cfg.intermediate_size]


def _layer_names(rest: str, t: torch.Tensor, cfg: ModelConfig) -> list[tuple[str, torch.Tensor]]:
    """One of our layer parameters (name inside the layer) → Llama (name, tensor) pairs."""
    qkv, gate_up = _split_sizes(cfg)
    module, _, kind = rest.rpartition(".")  # kind: weight or bias
    if rest == "attn_norm.weight":
        return [("input_layernorm.weight", t)]
    if rest == "mlp_norm.weight":
        return [("post_attention_layernorm.weight", t)]
    if module == "attn.Wqkv":
        return [(f"self_attn.{x}_proj.{kind}", p) for x, p in zip("qkv", t.split(qkv, dim=0))]
    if module == "attn.Wo":
        return [(f"self_attn.o_proj.{kind}", t)]
    if module == "mlp.Wi":
        return [(f"mlp.{x}_proj.{kind}", p) for x, p in zip(("gate", "up"), t.split(gate_up, dim=0))]
    if module == "mlp.Wo":
        return [(f"mlp.down_proj.{kind}", t)]
    return []


_TOP_LEVEL = {"tok_embeddings.weight": "model.embed_tokens.weight",
              "final_norm.weight": "model.norm.weight", "lm_head.weight": "lm_head.weight"}


def hf_state_dict(model: CausalLM) -> dict[str, torch.Tensor]:
    """Our parameters under LlamaForCausalLM's names (fused matrices split), fp32 on the CPU.

    A parameter with no Llama name refuses the export instead of being dropped, which would
    load as a randomly initialised weight on the other side.
    """
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu", torch.float32)
        layer, idx, rest = (name.split(".", 2) + ["", ""])[:3]
        if name in _TOP_LEVEL:
            pairs = [(_TOP_LEVEL[name], t)]
        elif layer == "layers" and idx.isdigit():
            pairs = [(f"model.layers.{idx}.{n}", p) for n, p in _layer_names(rest, t, model.cfg)]
        else:
            pairs = []
        if not pairs:
            raise ShoestringError(f"model parameter '{name}' has no Llama equivalent",
                                  fix="this model cannot be exported to Hugging Face format")
        state.update(pairs)
    return {k: v.contiguous() for k, v in state.items()}


def _our_state(hf: dict[str, torch.Tensor], cfg: ModelConfig, where: Path) -> dict[str, torch.Tensor]:
    """Llama names → ours, fusing q/k/v and gate/up back; unknown names refuse."""
    state: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ShoestringError(f"cannot import: weight '{name}' is missing", where=str(where))
        used.add(name)
        return hf[name].to(torch.float32)

    state["tok_embeddings.weight"] = take("model.embed_tokens.weight")
    state["final_norm.weight"] = take("model.norm.weight")
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = take("lm_head.weight")
    kinds = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        state[f"layers.{i}.attn_norm.weight"] = take(p + "input_layernorm.weight")
        state[f"layers.{i}.mlp_norm.weight"] = take(p + "post_attention_layernorm.weight")
        for kind in kinds:
            state[f"layers.{i}.attn.Wqkv.{kind}"] = torch.cat(
                [take(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv"], dim=0)
            state[f"layers.{i}.attn.Wo.{kind}"] = take(f"{p}self_attn.o_proj.{kind}")
            state[f"layers.{i}.mlp.Wi.{kind}"] = torch.cat(
                [take(f"{p}mlp.{x}_proj.{kind}") for x in ("gate", "up")], dim=0)
            state[f"layers.{i}.mlp.Wo.{kind}"] = take(f"{p}mlp.down_proj.{kind}")
    extra = sorted(set(hf) - used - {"lm_head.weight"})
    if extra:
        raise ShoestringError(f"cannot import: weight '{extra[0]}' has no shoestring equivalent",
                              where=str(where))
    if cfg.tie_embeddings and "lm_head.weight" in hf and not torch.equal(
        hf["lm_head.weight"].float(), state["tok_embeddings.weight"]
    ):
        raise ShoestringError(
            "cannot import: lm_head.weight differs from the embeddings but tie_word_embeddings "
            "is true", where=str(where))
    return state


def _tokenizer_config(ids: dict[str, int], seq_len: int) -> dict[str, Any]:
    by_id = {v: k for k, v in ids.items()}
    eos = by_id.get(ids.get("<|endoftext|>", -1))
    pad = by_id.get(ids.get("<|pad|>", -1), eos)
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eos, "eos_token": eos,
            "pad_token": pad, "unk_token": None, "model_max_length": seq_len,
            "model_input_names": ["input_ids", "attention_mask"],
            "clean_up_tokenization_spaces": False}


def export_decoder(run_dir: Path, out: Path, model: CausalLM, meta: dict,
                   *, overwrite: bool = False) -> Path:
    """Write a trained decoder as a Llama folder (config, safetensors, tokenizer files)."""
    check_output_dir(out, "export", owned=(out / EXPORT_MARKER).is_file(), overwrite=overwrite)
    config = hf_config(model.cfg, meta["vocab_size"], meta["seq_len"], meta["special_ids"])
    state = hf_state_dict(model)
    tok_cfg = _tokenizer_config(meta["special_ids"], meta["seq_len"])
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    tokens = {k: v for k, v in tok_cfg.items() if k.endswith("_token") and v}
    return write_export(out, run_dir, state, {
        "config.json": config, "generation_config.json": {k: config[k] for k in ids},
        "tokenizer_config.json": tok_cfg, "special_tokens_map.json": tokens})


def _refuse(where: Path, field: str, value: Any, why: str) -> ShoestringError:
    return refuse(where, field, value, why, fix="only Llama models that shoestring's decoder "
                  "computes exactly can be imported")


def import_decoder(hf_dir: Path, cfg: dict) -> tuple[CausalLM, dict]:
    """A Llama folder as our ``CausalLM`` (CPU, fp32, eval mode) and a ``load_final`` meta."""
    for field, default, needed, why in [
        ("hidden_act", "silu", "silu", "shoestring's decoder uses SwiGLU"),
        ("rope_scaling", None, None, "shoestring uses plain RoPE"),
        ("attention_dropout", 0.0, 0.0, "shoestring models have no dropout"),
        ("pretraining_tp", 1, 1, "tensor-parallel slicing of the forward is not supported"),
    ]:
        value = cfg.get(field, default)
        if value != needed:
            raise _refuse(hf_dir, field, value, why)
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise _refuse(hf_dir, "rope_parameters.rope_type", rope.get("rope_type"),
                      "shoestring uses plain RoPE")
    if cfg.get("attention_bias", False) != cfg.get("mlp_bias", False):
        raise _refuse(hf_dir, "mlp_bias", cfg.get("mlp_bias", False),
                      "shoestring's model.bias switches attention and MLP biases together")
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    if head_dim * heads != hidden:
        raise _refuse(hf_dir, "head_dim", head_dim, "shoestring heads split hidden_size evenly")
    try:
        model_cfg = ModelConfig(
            objective=CLM.name, hidden_size=hidden, num_layers=cfg["num_hidden_layers"],
            num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
            intermediate_size=cfg["intermediate_size"], norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bias=bool(cfg.get("attention_bias", False)),
            init_std=cfg.get("initializer_range", 0.02))
    except Exception as e:
        raise ShoestringError(
            f"cannot import: the config does not describe a shoestring decoder ({e})",
            where=str(hf_dir / "config.json")) from None
    path = hf_dir / WEIGHTS
    hf_state = read_weights(hf_dir)
    model = CausalLM(model_cfg, cfg["vocab_size"])
    try:
        model.load_state_dict(_our_state(hf_state, model_cfg, path), strict=True)
    except RuntimeError as e:
        raise ShoestringError(f"cannot import: the weights do not fit the config ({e})",
                              where=str(path)) from None
    meta = {"architecture": CLM.architecture, "model": model_cfg.model_dump(mode="json"),
            "vocab_size": cfg["vocab_size"],
            "seq_len": int(cfg.get("max_position_embeddings", 2048)),
            "special_ids": _special_ids(hf_dir, cfg)}
    return model.eval(), meta


def _special_ids(hf_dir: Path, cfg: dict) -> dict[str, int]:
    """Special tokens by name: from tokenizer.json's added tokens, else the config's ids."""
    try:
        spec = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
        found = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        if found:
            return found
    except (OSError, ValueError, KeyError, TypeError):
        pass
    eos = cfg.get("eos_token_id")
    return {"<|endoftext|>": eos} if isinstance(eos, int) else {}
