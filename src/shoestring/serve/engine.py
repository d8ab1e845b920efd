"""Models behind the server: load any shoestring artifact, tokenize, run batches.

One `Engine` per loaded model. Its two halves run in different places on purpose:

* ``prepare_*`` runs on the event loop per request: tokenizes, applies ``--max-length``
  (reject or truncate) and checks the input (a fill-mask text needs a mask token), raising
  `InputError` → HTTP 422 before anything is queued;
* ``run(key, payloads)`` runs on the batcher's worker thread on a whole batch: pads, masks
  the padding (``key_mask`` / ``attention_mask``), one forward pass, and turns tensors into
  plain Python results there, so the event loop never touches a tensor.

`load_engine` recognises a run dir (encoder or decoder), a `shoestring export` (Hugging Face
ModernBERT) folder, and a fine-tuned classifier folder.
"""

from __future__ import annotations

import abc
import contextlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoestring import families
from shoestring.serve.streaming import TextDelta, TokenStream


class InputError(ValueError):
    """One input the model cannot take; ``loc`` is its place in the request body."""

    def __init__(self, message: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.message, self.loc = message, loc


def input_loc(index: int, many: bool) -> tuple[str | int, ...]:
    """Where input ``index`` sits in the body: ``inputs`` itself, or ``inputs[index]``."""
    return ("body", "inputs", index) if many else ("body", "inputs")


class Engine(abc.ABC):
    """A loaded model with its tokenizer; subclasses serve some of the tasks fill-mask, embed,
    classify and generate."""

    kind = ""
    tasks: frozenset[str] = frozenset()

    def __init__(self, model: nn.Module, tokenizer: Any, meta: dict, source: Path, *,
                 max_length: int, truncate: bool, precision: str = "fp32") -> None:
        from shoestring.device import select_device

        info = select_device(precision, measure_peak=False)
        self.device, self.dtype = info.device, info.dtype
        self._autocast = info.autocast
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.meta = meta
        self.source = source
        self.max_length = max_length
        self.truncate = truncate

    # --- shared helpers -----------------------------------------------------------------------

    def _context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(self._autocast())
        return stack

    def _fit(self, ids: list[int], loc: tuple, keep_last: bool) -> list[int]:
        """Apply ``--max-length``: reject, or cut keeping the closing special token."""
        if len(ids) <= self.max_length:
            return ids
        if not self.truncate:
            raise InputError(f"input is {len(ids)} tokens, over this server's limit of "
                             f"{self.max_length}: send shorter text (or start the server with "
                             "--truncate)", loc)
        return ids[: self.max_length - 1] + ids[-1:] if keep_last else ids[-self.max_length :]

    def _pad(self, seqs: list[list[int]], pad_id: int,
             left: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) ids and a (B, T) bool mask of real tokens (None when nothing is padded)."""
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.bool)
        for i, s in enumerate(seqs):
            sl = slice(width - len(s), width) if left else slice(0, len(s))
            ids[i, sl] = torch.tensor(s, dtype=torch.long)
            mask[i, sl] = True
        return ids.to(self.device), None if bool(mask.all()) else mask.to(self.device)

    def describe(self) -> dict[str, Any]:
        params = sum(p.numel() for p in self.model.parameters())
        return {"kind": self.kind, "source": str(self.source), "tasks": sorted(self.tasks),
                "parameters": params, "max_length": self.max_length, "truncate": self.truncate,
                "device": str(self.device), "precision": str(self.dtype).removeprefix("torch.")}

    def pad_batches(self, key: tuple) -> bool:
        """Whether inputs of different lengths may share a call (the model masks padding)."""
        return True

    @abc.abstractmethod
    def run(self, key: tuple, payloads: list[Any]) -> list[Any]:
        """Run one batch of prepared payloads sharing ``key``; one result per payload."""

    def warmup(self) -> None:
        """One tiny batch per task, so the first request does not pay for lazy init."""

    # Each subclass defines one ``prepare_*`` per task in its `tasks` (prepare_fill_mask,
    # prepare_embed, prepare_classify, prepare_generate); the app calls only served tasks'.


def _tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    # One text at a time: encode_batch fans out to a thread pool, which for the few short
    # texts of one request costs more than it saves and competes with the model's threads.
    return [tokenizer.encode(t).ids for t in texts]


class EncoderEngine(Engine):
    """A masked-LM encoder (run dir or HF export): fill-mask and embeddings."""

    kind = "encoder"
    tasks = frozenset({"fill-mask", "embed"})

    def __init__(self, model: nn.Module, tokenizer: Any, meta: dict, source: Path,
                 **kw: Any) -> None:
        super().__init__(model, tokenizer, meta, source, **kw)
        ids = meta["special_ids"]
        self.pad_id, self.mask_id = ids["[PAD]"], ids["[MASK]"]
        self.mask_token = "[MASK]"

    def prepare_fill_mask(self, texts: list[str], top_k: int,
                          many: bool) -> list[tuple[list[int], list[int], int]]:
        out = []
        for i, ids in enumerate(_tokenize(self.tokenizer, texts)):
            loc = input_loc(i, many)
            had_mask = self.mask_id in ids
            ids = self._fit(ids, loc, keep_last=True)
            positions = [p for p, t in enumerate(ids) if t == self.mask_id]
            if not positions:
                why = ("its [MASK] token was cut off by --truncate; put it earlier" if had_mask
                       else f"it has no {self.mask_token} token: write {self.mask_token} where "
                       "a word should be predicted (exactly so, in capitals)")
                raise InputError(f"fill-mask needs a {self.mask_token} token, and {why}", loc)
            out.append((ids, positions, top_k))
        return out

    def prepare_embed(self, texts: list[str], pooling: str, normalize: bool,
                      many: bool) -> list[tuple[list[int], str, bool]]:
        return [(self._fit(ids, input_loc(i, many), keep_last=True), pooling, normalize)
                for i, ids in enumerate(_tokenize(self.tokenizer, texts))]

    def _hidden(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids, mask = self._pad(seqs, self.pad_id)
        return self.model.encode(ids, mask), mask

    def run(self, key: tuple, payloads: list[Any]) -> list[Any]:
        with self._context():
            if key[0] == "fill-mask":
                return self._fill_mask(payloads)
            if key[0] == "embed":
                return self._embed(payloads)
        raise ValueError(f"unknown task {key[0]!r}")

    def _fill_mask(self, payloads: list[tuple[list[int], list[int], int]]) -> list[Any]:
        hidden, _ = self._hidden([p[0] for p in payloads])
        rows = [i for i, p in enumerate(payloads) for _ in p[1]]
        cols = [c for p in payloads for c in p[1]]
        logits = self.model.head(hidden[rows, cols]).float()
        k = max(p[2] for p in payloads)
        top = logits.softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)
        scores, ids = top.values.cpu().tolist(), top.indices.cpu().tolist()
        results, m = [], 0
        for ids_i, positions, top_k in payloads:
            masks = []
            for pos in positions:
                cand = [
                    {"token": self.tokenizer.id_to_token(t), "id": t, "score": s}
                    for t, s in zip(ids[m][:top_k], scores[m][:top_k])
                ]
                masks.append({"position": pos, "candidates": cand})
                m += 1
            results.append(masks)
        return results

    def _embed(self, payloads: list[tuple[list[int], str, bool]]) -> list[Any]:
        hidden, mask = self._hidden([p[0] for p in payloads])
        hidden = hidden.float()
        if mask is None:
            mean = hidden.mean(1)
        else:
            m = mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
        cls = hidden[:, 0]
        pooled = torch.stack([mean[i] if p[1] == "mean" else cls[i]
                              for i, p in enumerate(payloads)])
        norms = pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        want = torch.tensor([p[2] for p in payloads], device=pooled.device)[:, None]
        pooled = torch.where(want, pooled / norms, pooled)
        return pooled.cpu().tolist()

    def warmup(self) -> None:
        seq = [self.meta["special_ids"]["[CLS]"], self.mask_id, self.meta["special_ids"]["[SEP]"]]
        self.run(("fill-mask",), [(seq, [1], 1)] * 2)
        self.run(("embed",), [(seq, "mean", True), (seq[:2], "mean", True)])


class ClassifierEngine(Engine):
    """A fine-tuned classifier or regressor folder (shoestring.eval.classifier)."""

    kind = "classifier"
    tasks = frozenset({"classify"})

    def __init__(self, model: nn.Module, tokenizer: Any, meta: dict, source: Path,
                 **kw: Any) -> None:
        super().__init__(model, tokenizer, meta, source, **kw)
        self.pad_id = meta["base"].get("special_ids", {}).get("[PAD]", 0)
        self.problem = meta.get("problem", "classification")
        n = int(meta["num_labels"])
        self.labels = list(meta.get("labels") or [str(i) for i in range(n)])
        self.pair = bool(meta.get("pair", False))

    def prepare_classify(self, texts: list[str], pairs: list[str] | None,
                         many: bool) -> list[list[int]]:
        if self.pair and pairs is None:
            raise InputError("this classifier takes text pairs: send 'pairs' (one second text "
                             "per input) beside 'inputs'", ("body", "pairs"))
        if not self.pair and pairs is not None:
            raise InputError("this classifier takes single texts: leave out 'pairs'",
                             ("body", "pairs"))
        if pairs is not None and len(pairs) != len(texts):
            raise InputError(f"'pairs' has {len(pairs)} texts for {len(texts)} inputs; give one "
                             "per input", ("body", "pairs"))
        encs = ([self.tokenizer.encode(t) for t in texts] if pairs is None
                else [self.tokenizer.encode(t, p) for t, p in zip(texts, pairs)])
        return [self._fit(e.ids, input_loc(i, many), keep_last=True) for i, e in enumerate(encs)]

    def run(self, key: tuple, payloads: list[Any]) -> list[Any]:
        with self._context():
            ids, mask = self._pad(payloads, self.pad_id)
            logits = self.model(ids, mask).float()
        if self.problem == "regression":
            return [{"value": v} for v in logits[:, 0].cpu().tolist()]
        out = []
        for row in logits.softmax(-1).cpu().tolist():
            best = max(range(len(row)), key=row.__getitem__)
            out.append({"label": self.labels[best], "score": row[best],
                        "scores": dict(zip(self.labels, row))})
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "problem": self.problem, "labels": self.labels,
                "pair": self.pair, "task": self.meta.get("task")}

    def warmup(self) -> None:
        self.run(("classify",), [[2, 3], [2, 1, 3]])


class DecoderEngine(Engine):
    """A causal-LM decoder run: text generation."""

    kind = "decoder"
    tasks = frozenset({"generate"})

    def __init__(self, model: nn.Module, tokenizer: Any, meta: dict, source: Path,
                 **kw: Any) -> None:
        super().__init__(model, tokenizer, meta, source, **kw)
        ids = meta.get("special_ids", {})
        self.eos_id = ids.get("<|endoftext|>", tokenizer.token_to_id("<|endoftext|>"))
        pad = ids.get("<|pad|>", tokenizer.token_to_id("<|pad|>"))
        self.pad_id = pad if pad is not None else (self.eos_id or 0)

    def prepare_generate(self, texts: list[str], many: bool) -> list[list[int]]:
        out = []
        for i, ids in enumerate(_tokenize(self.tokenizer, texts)):
            # Training rows are documents joined by <|endoftext|>: a prompt is a document start.
            if self.eos_id is not None and (not ids or ids[0] != self.eos_id):
                ids = [self.eos_id, *ids]
            out.append(self._fit(ids, input_loc(i, many), keep_last=False))
        return out

    def run(self, key: tuple, payloads: list[Any]) -> list[Any]:
        if key[0] == "generate-stream":
            return [self._stream(key[1:6], *payloads[0])]
        with self._context():
            ids, mask = self._pad(payloads, self.pad_id, left=True)
            out = self._generate(ids, key[1:], attention_mask=mask, pad_id=self.pad_id)
        new = out[:, ids.shape[1] :].cpu().tolist()
        results = []
        for row in new:
            finish = "length"
            if self.eos_id is not None and self.eos_id in row:
                row, finish = row[: row.index(self.eos_id)], "stop"
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            results.append({"text": text, "tokens": len(row), "finish_reason": finish})
        return results

    def _generate(self, ids: torch.Tensor, options: tuple, **kw: Any) -> torch.Tensor:
        """``model.generate`` with a request's (max_new, temperature, top_k, top_p, seed); a
        seed gets its own generator, so that request's sampling is repeatable."""
        max_new, temperature, top_k, top_p, seed = options
        gen = None if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        return self.model.generate(ids, max_new, temperature=temperature, top_k=top_k,
                                   top_p=top_p, eos_id=self.eos_id, generator=gen, **kw)

    def _stream(self, options: tuple, ids: list[int], stream: TokenStream) -> dict[str, Any]:
        """One prompt, token by token into ``stream``; stops early when the client has gone."""
        text = TextDelta(lambda t: self.tokenizer.decode(t, skip_special_tokens=True))
        finish = "length"

        def on_token(token: torch.Tensor) -> bool:
            nonlocal finish
            t = int(token[0])
            if self.eos_id is not None and t == self.eos_id:
                finish = "stop"
                return False
            if not stream.push({"token": t, "text": text.add(t)}):
                finish = "cancelled"
                return False
            return True

        with self._context():
            self._generate(torch.tensor([ids], dtype=torch.long, device=self.device), options,
                           on_token=on_token)
        full = self.tokenizer.decode(text.ids, skip_special_tokens=True)
        return {"text": full, "tokens": len(text.ids), "finish_reason": finish}

    def warmup(self) -> None:
        seq = [self.eos_id if self.eos_id is not None else 0]
        self.run(("generate", 2, 0.0, None, None, None), [seq, seq * 2])


# --- loading --------------------------------------------------------------------------------


def _tokenizer(path: Path) -> Any:
    from shoestring.data.tokenizer import load_tokenizer

    tok = load_tokenizer(path)
    tok.no_truncation()
    tok.no_padding()
    return tok


# This floor's part of a model family: the engine that serves its model (families/spec.py).
ENGINES: dict[str, type[Engine]] = {
    "mlm": EncoderEngine, "clm": DecoderEngine, "contrastive": EncoderEngine}


def load_engine(path: str | Path, *, max_length: int = 512, truncate: bool = False,
                precision: str = "fp32") -> Engine:
    """The right engine for folder ``path``: a run dir (``final/`` inside, or ``final/``
    itself), an export (`shoestring export`: ModernBERT or Llama), or a classifier folder."""
    from shoestring.artifacts import Kind, identify

    kw = {"max_length": max_length, "truncate": truncate, "precision": precision}
    artifact = identify(path, want=(Kind.RUN, Kind.EXPORT, Kind.CLASSIFIER),
                        command="shoestring serve", trained=True)
    if artifact.kind is Kind.CLASSIFIER:
        from shoestring.eval.classifier import load_classifier

        model, meta = load_classifier(artifact.path)
        return ClassifierEngine(model, _tokenizer(artifact.tokenizer_path), meta, artifact.path,
                                **kw)
    from shoestring.export.hub import open_model

    model, meta, _ = open_model(artifact.path)
    family = families.by_architecture(meta.get("architecture"), where=str(artifact.model_dir))
    return ENGINES[family.name](model, _tokenizer(artifact.tokenizer_path), meta, artifact.path,
                                **kw)
