"""A sentence-transformers folder's own settings: its pooling, normalization and length.

sentence-transformers saves a model as a transformers folder plus a few files that say how a
vector is made from the last hidden states: ``modules.json`` (the module chain, usually
Transformer → Pooling → Normalize), ``1_Pooling/config.json`` (which pooling), and
``sentence_bert_config.json`` (``max_seq_length``, ``do_lower_case``). Serving such a folder
without them gives other vectors than the model's authors published (all-MiniLM-L6-v2 is
mean-pooled and normalized; many BGE/GTE models take [CLS]), so they are read here and
become the served model's defaults. A chain with a module the engine does not compute (a
Dense projection, max or last-token pooling, ...) is refused by name: a vector that is
slightly different from the published one is worse than none.

Only the files are read; sentence-transformers itself is not needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoestring.errors import ShoestringError

_ST = "sentence_transformers.models."
# 1_Pooling/config.json's modes → the engine's pooling names (None: not computed here).
_POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                  "pooling_mode_max_tokens": None, "pooling_mode_mean_sqrt_len_tokens": None,
                  "pooling_mode_weightedmean_tokens": None, "pooling_mode_lasttoken": None}
_FIX = ("serve it with sentence-transformers itself, or a model whose chain is Transformer → "
        "Pooling (cls or mean) → Normalize")


@dataclass(frozen=True)
class SentenceLayout:
    """What a sentence-transformers folder says about making its vectors."""

    pooling: str            # "mean" or "cls"
    normalize: bool         # a Normalize module ends the chain
    max_seq_length: int | None
    do_lower_case: bool


def read_layout(folder: Path) -> SentenceLayout | None:
    """The layout of ``folder`` (None: not a sentence-transformers folder, no modules.json)."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = _json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ShoestringError("modules.json is not a list of modules", where=str(modules_file),
                              fix="restore the file sentence-transformers wrote")
    pooling, normalize = "mean", False
    seen_transformer = False
    for m in modules:
        kind, sub = str(m.get("type", "")), str(m.get("path", ""))
        name = kind.removeprefix(_ST)
        if name == "Transformer" and not seen_transformer:
            if sub not in ("", "."):
                raise ShoestringError(
                    f"modules.json: the Transformer module lives in {sub!r}, not beside "
                    "modules.json", where=str(modules_file), fix=_FIX)
            seen_transformer = True
        elif name == "Pooling" and seen_transformer:
            pooling = _pooling(folder / sub / "config.json")
        elif name == "Normalize" and seen_transformer:
            normalize = True
        else:
            raise ShoestringError(
                f"modules.json: module {kind or '(no type)'} at {sub or '.'!r} is not computed "
                "by shoestring's engine", where=str(modules_file), fix=_FIX)
    if not seen_transformer:
        raise ShoestringError("modules.json has no Transformer module", where=str(modules_file),
                              fix=_FIX)
    bert_cfg = folder / "sentence_bert_config.json"
    cfg = _json(bert_cfg) if bert_cfg.is_file() else {}
    length = cfg.get("max_seq_length") if isinstance(cfg, dict) else None
    return SentenceLayout(pooling, normalize,
                          length if isinstance(length, int) and length > 0 else None,
                          bool(isinstance(cfg, dict) and cfg.get("do_lower_case", False)))


def _pooling(path: Path) -> str:
    """The one pooling mode set in a Pooling module's config, as the engine names it."""
    cfg = _json(path)
    if not isinstance(cfg, dict):
        raise ShoestringError("the Pooling config is not a JSON object", where=str(path),
                              fix=_FIX)
    on = [field for field in _POOLING_MODES if cfg.get(field)]
    if len(on) != 1:
        raise ShoestringError(
            f"the Pooling config sets {len(on)} modes ({', '.join(on) or 'none'}); shoestring "
            "computes one: pooling_mode_cls_token or pooling_mode_mean_tokens",
            where=str(path), fix=_FIX)
    mode = _POOLING_MODES[on[0]]
    if mode is None:
        raise ShoestringError(f"{on[0]} is not computed by shoestring's engine (it pools by "
                              "cls or mean)", where=str(path), fix=_FIX)
    return mode


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShoestringError("missing", where=str(path),
                              fix="restore the file sentence-transformers wrote") from None
    except (OSError, ValueError) as e:
        raise ShoestringError(f"not readable JSON ({e})", where=str(path),
                              fix="restore the file sentence-transformers wrote") from None
