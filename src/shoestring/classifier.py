"""A sequence classifier (or regressor) on the pretrained encoder trunk, and its folder format.

Fine-tuning adds a small head to the encoder: the hidden state of the first token ([CLS]) or
the mean over real tokens goes through dense → tanh → dropout → linear, the pooler BERT and
Cramming's GLUE evaluation use. The MLM head of the pretrained model is kept in the
weights (it costs nothing at inference and keeps one state-dict layout) but is not used.

Classifier folder (what `save_classifier` writes and `load_classifier` / `serve` read)::

    DIR/model.safetensors   fp32 weights: "encoder.*" (MaskedLM names) and "head.*"
    DIR/config.json         {"architecture": "shoestring-classifier", "base": <run meta>,
                             "num_labels", "labels": [...] | null, "problem":
                             "classification" | "regression", "max_length", "pooling",
                             "pair": bool, "task": name | null, ...}
    DIR/tokenizer.json      the run's tokenizer (pairs encode as [CLS] a [SEP] b [SEP])

``labels[i]`` is the label string of logit ``i`` (null for regression, one logit).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from shoestring.config import ModelConfig
from shoestring.errors import ShoestringError
from shoestring.fsutil import building_dir, check_output_dir, json_object_or_none
from shoestring.fsutil import write_json_atomic
from shoestring.model import build_model
from shoestring.model.encoder import MaskedLM

ARCHITECTURE = "shoestring-classifier"
Problem = Literal["classification", "regression"]
Pooling = Literal["cls", "mean"]

__all__ = ["ARCHITECTURE", "SequenceClassifier", "collate", "load_classifier", "predict",
           "save_classifier", "token_ids"]


class ClassifierHead(nn.Module):
    """Pooled hidden state → dense → tanh → dropout → num_labels logits (BERT's pooler, and
    Cramming's ``include_ff_layer`` + ``Tanh`` head)."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_labels)
        for lin in (self.dense, self.out):
            nn.init.trunc_normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)

    def forward(self, pooled: Tensor) -> Tensor:
        return self.out(self.dropout(torch.tanh(self.dense(pooled))))


class SequenceClassifier(nn.Module):
    """``forward(ids, key_mask)`` → (B, num_labels) logits (one output for regression).

    ``key_mask`` (B, T) bool marks real tokens (True) and padding (False); None means no
    padding. Sequences start with [CLS] (the tokenizer's post-processor adds it).
    """

    def __init__(
        self,
        encoder: MaskedLM,
        num_labels: int,
        pooling: Pooling = "cls",
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if num_labels < 1:
            raise ValueError("num_labels must be at least 1")
        self.encoder = encoder
        self.num_labels = num_labels
        self.pooling = pooling
        self.head = ClassifierHead(encoder.cfg.hidden_size, num_labels, dropout)

    def pool(self, hidden: Tensor, key_mask: Tensor | None) -> Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        if key_mask is None:
            return hidden.mean(1)
        m = key_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)

    def forward(self, ids: Tensor, key_mask: Tensor | None = None) -> Tensor:
        hidden = self.encoder.encode(ids, key_mask)
        return self.head(self.pool(hidden, key_mask))


def save_classifier(
    out: str | Path,
    model: SequenceClassifier,
    base_meta: dict[str, Any],
    tokenizer_path: str | Path,
    *,
    labels: list[str] | None,
    problem: Problem,
    max_length: int,
    pair: bool = False,
    task: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the classifier folder atomically (complete or absent)."""
    out = Path(out)
    owned = (json_object_or_none(out / "config.json") or {}).get("architecture") == ARCHITECTURE
    check_output_dir(out, "classifier", owned=owned, overwrite=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    meta = {
        "architecture": ARCHITECTURE,
        "base": base_meta,
        "num_labels": model.num_labels,
        "labels": list(labels) if labels is not None else None,
        "problem": problem,
        "max_length": int(max_length),
        "pooling": model.pooling,
        "pair": bool(pair),
        "task": task,
        **(extra or {}),
    }
    with building_dir(out) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_json_atomic(tmp / "config.json", meta)
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
    return out


def load_classifier(path: str | Path) -> tuple[SequenceClassifier, dict[str, Any]]:
    """The classifier in folder ``path`` (CPU, fp32, eval mode) and its config.json."""
    path = Path(path)
    if not (path / "model.safetensors").is_file() or not (path / "config.json").is_file():
        raise ShoestringError(
            "not a classifier folder (model.safetensors or config.json missing)",
            where=str(path),
            fix="fine-tune one with `shoestring eval RUN --glue DIR` or `--task FILE`",
        )
    try:
        meta = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if meta.get("architecture") != ARCHITECTURE:
            raise ValueError(f"architecture is {meta.get('architecture')!r}, not {ARCHITECTURE!r}")
        base = meta["base"]
        encoder = build_model(ModelConfig.model_validate(base["model"]), base["vocab_size"])
        if not isinstance(encoder, MaskedLM):
            raise TypeError("the base model is not an encoder (masked LM)")
        model = SequenceClassifier(encoder, int(meta["num_labels"]), meta.get("pooling", "cls"))
        model.load_state_dict(load_file(str(path / "model.safetensors")))
    except Exception as e:  # noqa: BLE001 - JSON, schema, safetensors and shape errors alike
        raise ShoestringError(
            f"cannot load the classifier ({type(e).__name__}: {e})",
            where=str(path),
            fix="the folder is damaged or from another version; fine-tune again",
        ) from None
    return model.eval(), meta


def token_ids(tokenizer: Any, texts: list[str], pairs: list[str] | None,
              max_length: int) -> list[np.ndarray]:
    """Each text's (or pair's: [CLS] a [SEP] b [SEP]) token ids, truncated longest-first."""
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    tokenizer.no_padding()
    if pairs is None:
        encs = tokenizer.encode_batch(list(texts))
    else:
        if len(pairs) != len(texts):
            raise ValueError("texts and pairs must have the same length")
        encs = tokenizer.encode_batch(list(zip(texts, pairs)))
    return [np.asarray(e.ids, dtype=np.int64) for e in encs]


def collate(seqs: list[np.ndarray], idx: np.ndarray, pad_id: int) -> tuple[Tensor, Tensor]:
    """Pad the chosen sequences to the longest → (ids, key_mask)."""
    width = max((len(seqs[i]) for i in idx), default=1)
    ids = np.full((len(idx), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(idx), width), dtype=bool)
    for row, i in enumerate(idx):
        n = len(seqs[i])
        ids[row, :n] = seqs[i]
        mask[row, :n] = True
    return torch.from_numpy(ids), torch.from_numpy(mask)


@torch.no_grad()
def predict(
    model: SequenceClassifier,
    meta: dict[str, Any],
    tokenizer: Any,
    texts: list[str],
    pairs: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Predictions for serving: per text ``{"label", "score", "scores"}`` for classification
    (``scores`` maps every label to its probability), ``{"value"}`` for regression."""
    pad = meta["base"].get("special_ids", {}).get("[PAD]", 0)
    seqs = token_ids(tokenizer, texts, pairs, meta["max_length"])
    ids, mask = collate(seqs, np.arange(len(seqs)), pad)
    logits = model(ids, mask).float()
    if meta["problem"] == "regression":
        return [{"value": float(v)} for v in logits[:, 0]]
    labels = meta.get("labels") or [str(i) for i in range(model.num_labels)]
    probs = logits.softmax(-1)
    out = []
    for row in probs:
        k = int(row.argmax())
        out.append({"label": labels[k], "score": float(row[k]),
                    "scores": {lab: float(p) for lab, p in zip(labels, row)}})
    return out
