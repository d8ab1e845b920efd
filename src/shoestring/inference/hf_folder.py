"""Another project's transformers encoder folder as a model the engine serves.

So a user serves a known baseline (BERT, RoBERTa, DistilBERT, XLM-R, ModernBERT, a
sentence-transformers model, an ms-marco cross-encoder, ...) beside their own runs, through
the same engine. transformers loads the folder (`AutoModel`, `AutoModelForMaskedLM` or
`AutoModelForSequenceClassification`, by its config's ``architectures``) and its tokenizer
(`AutoTokenizer`, whose Rust ``backend_tokenizer`` the engine calls, with padding and
truncation off). The model is wrapped in a plain nn.Module with the calls the engine makes:

* `HFEncoder`: ``encode(ids, mask) -> last hidden state`` (and ``forward`` the same), plus
  ``head(hidden) -> logits`` when the folder is a ``*ForMaskedLM`` whose head is found and
  checked against the model's own logits (else the model serves embeddings only);
* `HFClassifier`: ``forward(ids, mask) -> logits``.

Both turn the engine's bool padding mask into the integer ``attention_mask`` transformers
takes, and give ``token_type_ids`` to models that take them (0s, then 1s after the first
separator: what a BERT tokenizer writes for a pair) inside the module, with tensor ops only,
so ``torch.onnx.export`` traces them. A sentence-transformers layout (`sentence_layout`) sets
the default pooling, normalization and the served length. What cannot be served as the
folder's authors meant is refused by name (a decoder, custom code, a missing tokenizer).

This module imports transformers (an extra: ``pip install 'shoestring[hf]'``); nothing else
in shoestring does.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoestring.errors import ShoestringError
from shoestring.inference.sentence_layout import read_layout

INSTALL = "pip install 'shoestring[hf]'"
# A *ForMaskedLM's head: its child modules after the encoder, in order (checked at load).
_HEADS = (("cls",), ("lm_head",), ("predictions",), ("head", "decoder"),
          ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),
          ("generator_predictions", "generator_lm_head"))
# A tokenizer's own files (save_pretrained's, fast or slow): one must be present.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "sentencepiece.bpe.model",
                   "spiece.model", "tokenizer.model")
_NO_LENGTH = 1_000_000  # tokenizers without a limit store ~1e30 as model_max_length


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ShoestringError(
            "serving a transformers folder needs the transformers package, which is not "
            "installed", where="transformers", fix=INSTALL) from None
    transformers.logging.set_verbosity_error()  # its load notes are not the user's problem
    transformers.logging.disable_progress_bar()
    return transformers


def token_types(ids: torch.Tensor, sep_id: int | None) -> torch.Tensor:
    """Each position's segment: 0 up to and including the first separator, 1 after it (a
    BERT pair's ``token_type_ids``; all 0 for a single text)."""
    if sep_id is None:
        return torch.zeros_like(ids)
    sep = (ids == sep_id).long()
    return ((sep.cumsum(1) - sep) > 0).long()


class _Inputs(nn.Module):
    """The keyword inputs of a transformers model, from the engine's ids and bool mask."""

    def __init__(self, model: nn.Module, sep_id: int | None) -> None:
        super().__init__()
        takes = inspect.signature(model.forward).parameters
        self.types = "token_type_ids" in takes
        self.sep_id = sep_id

    def inputs(self, ids: torch.Tensor, mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
        attention = torch.ones_like(ids) if mask is None else mask.long()
        kw = {"input_ids": ids, "attention_mask": attention}
        if self.types:
            kw["token_type_ids"] = token_types(ids, self.sep_id)
        return kw


class HFEncoder(_Inputs):
    """A transformers encoder with the engine's interface: ``encode`` and (MLM) ``head``."""

    def __init__(self, backbone: nn.Module, mlm_head: nn.Module | None,
                 sep_id: int | None) -> None:
        super().__init__(backbone, sep_id)
        self.backbone = backbone
        self.mlm_head = mlm_head

    def encode(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.backbone(**self.inputs(ids, mask)).last_hidden_state

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encode(ids, mask)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.mlm_head is None:
            raise ValueError("this encoder has no masked-LM head")
        return self.mlm_head(hidden)


class HFClassifier(_Inputs):
    """A transformers sequence classifier with the engine's interface: ``forward`` → logits."""

    def __init__(self, model: nn.Module, sep_id: int | None) -> None:
        super().__init__(model, sep_id)
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(**self.inputs(ids, mask)).logits


def open_hf_folder(path: Path) -> tuple[nn.Module, Any, dict[str, Any], str]:
    """(model, tokenizer, meta, "encoder" or "classifier") of transformers folder ``path``;
    meta holds what the engine reads of a run's (`specials`, ``seq_len``, ``embedding``,
    a classifier's labels)."""
    transformers = _transformers()
    cfg_file = path / "config.json"
    try:
        cfg = transformers.AutoConfig.from_pretrained(str(path))
    except Exception as e:  # transformers raises ValueError/KeyError/OSError for bad configs
        raise ShoestringError(f"transformers cannot read its config ({_first_line(e)})",
                              where=str(cfg_file), fix="point at a folder written by "
                              "save_pretrained") from None
    _check_encoder(transformers, cfg, cfg_file)
    tokenizer, hf_tok = _tokenizer(transformers, path)
    layout = read_layout(path)
    if layout is not None and layout.do_lower_case:
        from tokenizers import normalizers

        norm = tokenizer.normalizer
        tokenizer.normalizer = (normalizers.Lowercase() if norm is None
                                else normalizers.Sequence([normalizers.Lowercase(), norm]))
    specials = _specials(tokenizer, hf_tok, cfg)
    archs = [str(a) for a in cfg.architectures or []]
    classifier = any(a.endswith("ForSequenceClassification") for a in archs)
    mlm = any(a.endswith("ForMaskedLM") for a in archs) and not classifier
    auto = (transformers.AutoModelForSequenceClassification if classifier else
            transformers.AutoModelForMaskedLM if mlm else transformers.AutoModel)
    try:
        loaded = auto.from_pretrained(str(path)).float().eval()
    except Exception as e:  # missing or damaged weights, shapes that do not match
        raise ShoestringError(f"transformers cannot load its weights with {auto.__name__} "
                              f"({_first_line(e)})", where=str(path),
                              fix="check the folder's weights match its config.json") from None
    types_ok = _types_checked(tokenizer, specials["sep"])
    sep = specials["sep"] if types_ok else None
    meta: dict[str, Any] = {
        "architecture": f"transformers:{cfg.model_type}",
        "model": {"hidden_size": int(cfg.hidden_size) if hasattr(cfg, "hidden_size")
                  else int(getattr(cfg, "dim", 0))},
        "seq_len": _context(cfg, hf_tok, layout, loaded),
        "specials": specials,
        "transformers": {"model_type": cfg.model_type, "architectures": archs,
                         "class": type(loaded).__name__,
                         "sentence_transformers": layout is not None},
    }
    if classifier:
        n = int(cfg.num_labels)
        id2label = getattr(cfg, "id2label", None) or {}
        single = getattr(cfg, "problem_type", None) == "regression" or n == 1
        meta |= {"problem": "regression" if single else "single_label_classification",
                 "num_labels": n,
                 "labels": [str(id2label.get(i, id2label.get(str(i), i))) for i in range(n)],
                 # None: single texts or pairs (a pair template); False: single texts only
                 "pair": None if _has_pair_template(tokenizer) and types_ok else False}
        return HFClassifier(loaded, sep), tokenizer, meta, "classifier"
    head, why = _mlm_head(loaded) if mlm else (None, "the folder is not a *ForMaskedLM")
    if head is not None and specials["mask"] is None:
        head, why = None, "its tokenizer has no mask token"
    backbone = loaded.base_model if mlm else loaded
    meta["embedding"] = ({"pooling": layout.pooling, "normalize": layout.normalize}
                         if layout is not None else {"pooling": "mean", "normalize": True})
    meta["transformers"]["fill_mask"] = why or "yes"
    return HFEncoder(backbone, head, sep), tokenizer, meta, "encoder"


def _check_encoder(transformers: Any, cfg: Any, where: Path) -> None:
    """Refuse what the engine would serve wrongly: code from the folder, a decoder."""
    # transformers' table of masked-LM model types lives in an internal module (the one name
    # read there; tested at the version constraints.txt pins). Should a release move it, the
    # decoder flags below and `artifacts.identify`'s architecture check still refuse decoders.
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
    except ImportError:
        MODEL_FOR_MASKED_LM_MAPPING_NAMES = {cfg.model_type: None}  # noqa: N806

    if getattr(cfg, "auto_map", None):
        raise ShoestringError("this model needs its own code (config.json auto_map, "
                              "trust_remote_code), which shoestring does not run",
                              where=str(where), fix="serve it with the project that wrote it")
    kind = cfg.model_type
    if (kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or getattr(cfg, "is_decoder", False)
            or getattr(cfg, "is_encoder_decoder", False)):
        raise ShoestringError(
            f"model_type {kind!r} is not an encoder (serve takes transformers encoders such as "
            "BERT, RoBERTa, DistilBERT, XLM-R, ModernBERT; decoders only from shoestring runs "
            "and exports)", where=str(where),
            fix="serve a decoder you trained (shoestring train/export), or an encoder folder")


def _tokenizer(transformers: Any, path: Path) -> tuple[Any, Any]:
    """(the Rust tokenizer the engine calls, transformers' tokenizer around it)."""
    from tokenizers import Tokenizer

    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer from the config alone
        raise ShoestringError(
            "no tokenizer here (none of " + ", ".join(TOKENIZER_FILES) + ")", where=str(path),
            fix="copy the model's tokenizer files (tokenizer.json, tokenizer_config.json) in "
                "beside config.json")
    try:
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # no tokenizer files, or files transformers cannot read
        raise ShoestringError(f"transformers cannot load its tokenizer ({_first_line(e)})",
                              where=str(path), fix="copy the model's tokenizer files "
                              "(tokenizer.json, tokenizer_config.json) in beside config.json"
                              ) from None
    backend = getattr(hf_tok, "backend_tokenizer", None)
    if not getattr(hf_tok, "is_fast", False) or not isinstance(backend, Tokenizer):
        raise ShoestringError(
            f"its tokenizer ({type(hf_tok).__name__}) has no fast (Rust) version, which the "
            "server calls", where=str(path / "tokenizer.json"),
            fix="save a fast tokenizer: AutoTokenizer.from_pretrained(..., use_fast=True)"
                ".save_pretrained(DIR) writes tokenizer.json")
    tok = Tokenizer.from_str(backend.to_str())  # our own copy, as transformers configured it
    tok.no_truncation()
    tok.no_padding()
    return tok, hf_tok


def _specials(tok: Any, hf_tok: Any, cfg: Any) -> dict[str, Any]:
    """Ids of the pad, mask, cls and sep tokens (whatever they are called) and the mask's
    text, from the tokenizer's config; padding falls back to the model's pad_token_id."""
    out: dict[str, Any] = {}
    for role in ("pad", "mask", "cls", "sep"):
        text = getattr(hf_tok, f"{role}_token", None)
        out[role] = tok.token_to_id(str(text)) if text is not None else None
    out["mask_token"] = str(hf_tok.mask_token) if out["mask"] is not None else None
    if out["pad"] is None:
        out["pad"] = getattr(cfg, "pad_token_id", None) or 0  # padding is masked out anyway
    return out


def _has_pair_template(tok: Any) -> bool:
    def pairs(p: dict | None) -> bool:
        if not p:
            return False
        if p.get("type") == "Sequence":
            return any(pairs(q) for q in p.get("processors") or [])
        return p.get("type") in ("BertProcessing", "RobertaProcessing") or bool(
            p.get("type") == "TemplateProcessing" and p.get("pair"))

    return pairs(json.loads(tok.to_str()).get("post_processor"))


def _types_checked(tok: Any, sep_id: int | None) -> bool:
    """Whether `token_types` gives what the tokenizer writes, for a text and for a pair."""
    for enc in (tok.encode("a b"), tok.encode("a", "b")):
        got = token_types(torch.tensor([enc.ids]), sep_id)[0].tolist()
        if got != list(enc.type_ids):
            return False
    return True


def _context(cfg: Any, hf_tok: Any, layout: Any, model: nn.Module) -> int | None:
    """The longest input served by default: the smallest of the positions the model has
    (RoBERTa-style embeddings start after the pad id), the tokenizer's model_max_length and
    a sentence-transformers max_seq_length."""
    found = []
    positions = getattr(cfg, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        embeddings = getattr(getattr(model, "base_model", model), "embeddings", None)
        offset = getattr(embeddings, "padding_idx", None)
        found.append(positions - (offset + 1 if isinstance(offset, int) else 0))
    limit = getattr(hf_tok, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < _NO_LENGTH:
        found.append(limit)
    if layout is not None and layout.max_seq_length:
        found.append(layout.max_seq_length)
    return min(found) if found else None


def _mlm_head(mlm: nn.Module) -> tuple[nn.Module | None, str | None]:
    """The head of a *ForMaskedLM (hidden → vocabulary logits), checked to give the model's
    own logits on a probe; (None, why) when no known layout of child modules does."""
    children = dict(mlm.named_children())
    vocab = mlm.config.vocab_size
    ids = torch.arange(min(7, vocab))[None, :] % vocab
    with torch.inference_mode():
        want = mlm(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        hidden = mlm.base_model(input_ids=ids, attention_mask=torch.ones_like(ids))[0]
        for names in _HEADS:
            if not all(n in children for n in names):
                continue
            head = nn.Sequential(*(children[n] for n in names)) if len(names) > 1 \
                else children[names[0]]
            try:
                got = head(hidden)
            except (RuntimeError, TypeError):
                continue
            if got.shape == want.shape and torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                return head, None
    return None, f"no known masked-LM head layout in {type(mlm).__name__}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
