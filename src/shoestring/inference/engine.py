"""Models behind the server: load any shoestring artifact, tokenize, run batches.

One `Engine` per loaded model. Its work is split by where it runs:

* ``admit_*`` checks one input's token ids against the model (its length against
  ``--max-length``: reject or truncate; a fill-mask input's mask token; token ids inside the
  vocabulary) and returns the payload a batch call takes, or raises `InputError` → HTTP 422;
* `tokenize` turns many texts into token ids in one call: a BERT WordPiece tokenizer's
  printable-ASCII texts word by word from a cache (`inference.wordpiece_cache`, 4-5x less CPU
  than the library, the same ids), the rest in one batch call of the Rust tokenizer, which
  releases the GIL and spreads a batch over the cores. The server calls it on the batcher's
  worker thread for everything queued at once, not on the event loop per request; token ids
  a client sends (``input_ids``) skip it and are admitted on the event loop (a range check);
* ``run(key, payloads)`` runs on the batcher's worker thread on a whole batch: pads, masks
  the padding (``key_mask`` / ``attention_mask``), one forward pass, and turns tensors into
  results there (plain Python, or float32 NumPy rows for embeddings, which the answer's
  encoder writes without making Python floats), so the event loop never touches a tensor.

``prepare_*`` (tokenize + admit, for a list of texts) is the same path for callers outside the
server (retrieval, benchmarks). `load_engine` recognises a run dir (encoder or decoder), a
`shoestring export` (Hugging Face ModernBERT) folder, a fine-tuned classifier folder, and
another project's transformers encoder folder (`hf_folder`).
"""

from __future__ import annotations

import abc
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoestring import families
from shoestring.artifacts import SERVABLE, Kind, identify
from shoestring.classifier import load_classifier
from shoestring.data.tokenizer import load_tokenizer
from shoestring.device import select_device
from shoestring.errors import ShoestringError
from shoestring.export.hub import open_model
from shoestring.fsutil import json_object_or_none
from shoestring.inference.backends import BackendChoice, check_backend, choose
from shoestring.inference.hf_folder import open_hf_folder
from shoestring.inference.wordpiece_cache import encoder_for
from shoestring.inference.laps import Laps, StageTimes
from shoestring.inference.tokens import TextDelta, TokenSink

Loc = tuple[str | int, ...]
DEFAULT_MAX_LENGTH = 512  # --max-length for a model whose metadata records no training length


class InputError(ValueError):
    """One input the model cannot take; ``loc`` is its place in the request body."""

    def __init__(self, message: str, loc: Loc) -> None:
        super().__init__(message)
        self.message, self.loc = message, loc


def trained_context(meta: dict, source: Path) -> int | None:
    """The longest input the model was trained on (None: not recorded): a run's ``seq_len``;
    for a Llama export, whose config advertises at least 2048 positions, its
    tokenizer_config.json ``model_max_length``, which `export` sets to the trained length; for
    a classifier, its encoder's ``seq_len``, else the length it was fine-tuned at. The server
    serves no longer inputs (`--max-length`'s default and limit): positions past it are ones
    the model never learned."""
    base = meta.get("base") or {}
    context = next((m["seq_len"] for m in (meta, base) if isinstance(m.get("seq_len"), int)),
                   meta.get("max_length") if isinstance(meta.get("max_length"), int) else None)
    tok_cfg = Path(source) / "tokenizer_config.json"
    if context is not None and tok_cfg.is_file():
        try:
            trained = json.loads(tok_cfg.read_text(encoding="utf-8")).get("model_max_length")
        except (OSError, ValueError, AttributeError):
            trained = None
        if isinstance(trained, int) and 0 < trained < context:
            context = trained
    return context


def specials(meta: dict) -> dict[str, Any]:
    """The ids of the pad, mask, cls and sep tokens (None: the tokenizer has none) and the
    mask token's text, whatever the tokenizer calls them: a transformers folder's meta says
    (``specials``); our models have the fixed layout ``[PAD]``, ``[MASK]``, ... (a
    classifier's under its ``base``)."""
    if "specials" in meta:
        return meta["specials"]
    ids = meta.get("special_ids") or (meta.get("base") or {}).get("special_ids") or {}
    return {"pad": ids.get("[PAD]", 0), "mask": ids.get("[MASK]"), "cls": ids.get("[CLS]"),
            "sep": ids.get("[SEP]"), "mask_token": "[MASK]"}


def input_loc(index: int, many: bool, field: str = "inputs") -> Loc:
    """Where input ``index`` sits in the body: ``field`` itself, or ``field[index]``."""
    return ("body", field, index) if many else ("body", field)


class Engine(abc.ABC):
    """A loaded model with its tokenizer; subclasses serve some of the tasks fill-mask, embed,
    classify and generate."""

    kind = ""
    tasks: frozenset[str] = frozenset()

    def __init__(self, model: nn.Module, tokenizer: Any, meta: dict, source: Path, *,
                 max_length: int | None, truncate: bool, precision: str = "fp32") -> None:
        info = select_device(precision, measure_peak=False)
        self.device, self.dtype = info.device, info.dtype
        self._autocast = info.autocast
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.meta = meta
        self.source = source
        # The folder holding the weights and tokenizer (a run's final/; `load_engine` sets it).
        self.model_dir = source
        # None: the training length is not recorded (`trained_context`).
        self.context = trained_context(meta, source)
        # The longest input served (`fit`): the caller's, else the trained context.
        self.max_length = max_length or self.context or DEFAULT_MAX_LENGTH
        self.truncate = truncate
        self.vocab_size = _vocab_size(model, tokenizer)
        # Where forward and pooling times go (the server's metrics); None: not recorded.
        self.stages: StageTimes | None = None
        # A model call's fixed cost in token positions (`calibrate`); None: not measured, the
        # batcher's default applies.
        self.call_overhead_tokens: float | None = None
        # The one forward call per batch and the runtime doing it (`inference.backends`):
        # PyTorch until `load_engine` chooses another.
        self.backend = BackendChoice()
        self._forward: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = (
            self.torch_forward())
        # A WordPiece tokenizer's common case from a word cache; else the Rust tokenizer's
        # batch call (`wordpiece_cache.encoder_for`).
        self._encode: Callable[[list[Any]], list[list[int]]] = encoder_for(tokenizer)
        self._bare: dict[bool, int] = {}  # ids of an empty text (pair: of two), `_has_content`

    # --- shared helpers -----------------------------------------------------------------------

    def _context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(self._autocast())
        return stack

    def _laps(self, task: str) -> Laps | None:
        return None if self.stages is None else Laps(self.stages, task)

    def tokenize(self, texts: list[Any]) -> list[list[int]]:
        """Token ids of each text (or ``(text, pair)``), special tokens added, in one call."""
        return self._encode(texts)

    def check_ids(self, ids: list[int], loc: Loc) -> list[int]:
        """Token ids a client sent: not empty and inside this model's vocabulary."""
        if not ids:
            raise InputError("the token id list is empty: send at least one id", loc)
        low, high = min(ids), max(ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InputError(f"token id {bad} at position {ids.index(bad)} is outside this "
                             f"model's vocabulary (0 to {self.vocab_size - 1})", loc)
        return ids

    def _has_content(self, ids: list[int], loc: Loc, pair: bool = False) -> list[int]:
        """``ids`` hold more than the special tokens the tokenizer adds to an empty text: a
        text its normaliser empties (only control, zero-width, combining or replacement
        characters: ``"\u0000"``, ``"\u200b"``) is the empty text the schema refuses."""
        bare = self._bare.get(pair)
        if bare is None:
            bare = self._bare[pair] = len(self._encode([("", "") if pair else ""])[0])
        if len(ids) <= bare:
            raise InputError("the text is empty once this model's tokenizer has normalised "
                             "it (it holds only characters the tokenizer drops: control, "
                             "zero-width, combining or replacement ones): send some content",
                             loc)
        return ids

    def _fit(self, ids: list[int], loc: Loc, keep_last: bool) -> list[int]:
        """Apply ``--max-length``: reject, or cut keeping the closing special token."""
        if len(ids) <= self.max_length:
            return ids
        if not self.truncate:
            raise InputError(f"input is {len(ids)} tokens, over this server's limit of "
                             f"{self.max_length}: send shorter text (or start the server with "
                             "--truncate)", loc)
        return ids[: self.max_length - 1] + ids[-1:] if keep_last else ids[-self.max_length :]

    def pad(self, seqs: list[list[int]], pad_id: int,
             left: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) ids and a (B, T) bool mask of real tokens (None when nothing is padded).

        One tensor from one flat list: a tensor per row costs more than the model call
        itself for a tiny model's batch."""
        lengths = [len(s) for s in seqs]
        width = max(lengths)
        flat: list[int] = []
        for s, n in zip(seqs, lengths):
            fill = [pad_id] * (width - n)
            flat += (fill + s) if left else (s + fill)
        ids = torch.tensor(flat, dtype=torch.long).view(len(seqs), width)
        if min(lengths) == width:
            return ids.to(self.device), None
        n = torch.tensor(lengths)[:, None]
        pos = torch.arange(width)[None, :]
        mask = pos >= width - n if left else pos < n
        return ids.to(self.device), mask.to(self.device)

    def torch_forward(self) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None:
        """The model's one call per batch, ``(ids, mask) → tensor``, as PyTorch runs it: the
        seam a backend replaces (None: this engine's work is not one forward, e.g. generation)."""
        return None

    def set_forward(self, forward: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
                    ) -> None:
        """Run each batch's forward call through ``forward`` (`inference.backends.choose`)."""
        self._forward = forward

    def describe(self) -> dict[str, Any]:
        params = sum(p.numel() for p in self.model.parameters())
        out = {"kind": self.kind, "source": str(self.source), "tasks": sorted(self.tasks),
               "parameters": params, "max_length": self.max_length, "truncate": self.truncate,
               "vocab_size": self.vocab_size, "call_overhead_tokens": self.call_overhead_tokens,
               "device": str(self.device),
               "precision": str(self.dtype).removeprefix("torch."),
               "backend": self.backend.as_dict()}
        if "transformers" in self.meta:  # a transformers folder: what it is, how it loaded
            out["transformers"] = self.meta["transformers"]
        return out

    def pad_batches(self, key: tuple) -> bool:
        """Whether inputs of different lengths may share a call (the model masks padding)."""
        return True

    @abc.abstractmethod
    def run(self, key: tuple, payloads: list[Any]) -> list[Any]:
        """Run one batch of prepared payloads sharing ``key``; one result per payload."""

    def warmup(self) -> None:
        """One tiny batch per task, so the first request does not pay for lazy init."""

    def calibrate(self, repeats: int = 5) -> float | None:
        """Measure what one more model call costs, in token positions, and keep it in
        `call_overhead_tokens` (None where the engine has no single-forward task).

        The batcher splits a batch into length groups only when the padding saved is worth
        more than a call. That price differs by orders of magnitude between devices and
        models: a tiny model on a CPU spends most of a call in Python and dispatch, a GPU
        pays kernel launches and gets padding almost free. So it is measured here, on this
        model and device (the fastest of ``repeats`` runs of one short input and of 16 long
        ones: a fixed cost plus a cost per padded position)."""
        probe = self._probe()
        if probe is None:
            return None
        key, payload = probe

        def best(seqs: list[list[int]]) -> float:
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                self.run(key, [payload(s) for s in seqs])
                times.append(time.perf_counter() - t)
            return min(times)

        short, long_ = [[self.probe_id] * 8], [[self.probe_id] * 64] * 16
        t_short, t_long = best(short), best(long_)
        per_token = max(t_long - t_short, 1e-9) / (16 * 64 - 8)
        fixed = max(t_short - 8 * per_token, 0.0)
        self.call_overhead_tokens = min(max(fixed / per_token, 1.0), 1e6)
        return self.call_overhead_tokens

    def _probe(self) -> tuple[tuple, Any] | None:
        """(key, ids → payload) of one forward pass of this engine's model, for `calibrate`."""
        return None

    def probe_memory(self, batch_tokens: int, length: int) -> None:
        """Run the largest batch the limits allow (``batch_tokens`` padded positions of
        inputs ``length`` long), so the memory it takes is in the process's peak."""
        probe = self._probe()
        if probe is None:
            return
        key, payload = probe
        n = max(1, batch_tokens // length)
        self.run(key, [payload([self.probe_id] * length)] * n)

    @property
    def probe_id(self) -> int:
        """A token id every model takes, for timing runs."""
        return min(2, self.vocab_size - 1)

    # Each subclass defines, per task in its `tasks`, ``admit_<task>(ids, loc, *options) ->
    # (payload, token positions)`` and ``prepare_<task>`` (texts → payloads).


def _vocab_size(model: nn.Module, tokenizer: Any) -> int:
    """Token ids this model takes: the tokenizer's vocabulary, within the embedding's rows."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    for name, module in model.named_modules():
        if name.endswith(("tok_embeddings", "word_embeddings")) and isinstance(module,
                                                                         nn.Embedding):
            return min(size, module.num_embeddings)
    return size


class EncoderEngine(Engine):
    """A masked-LM encoder (run dir, HF export or transformers folder): fill-mask (where it
    has a masked-LM head) and embeddings, pooled and normalised as the request says, else
    as the model's own defaults (``meta["embedding"]``; mean and unit length for ours)."""

    kind = "encoder"
    tasks = frozenset({"fill-mask", "embed"})

    def __init__(self, model: nn.Module, tokenizer: Any, meta: dict, source: Path,
                 **kw: Any) -> None:
        super().__init__(model, tokenizer, meta, source, **kw)
        self.specials = specials(meta)
        self.pad_id, self.mask_id = self.specials["pad"], self.specials["mask"]
        self.mask_token = self.specials["mask_token"] or "[MASK]"
        if self.mask_id is None or getattr(model, "mlm_head", True) is None:
            self.tasks = frozenset({"embed"})  # no mask token, or (hf_folder) no MLM head
        defaults = meta.get("embedding") or {}
        self.pooling: str = defaults.get("pooling", "mean")
        self.normalize: bool = defaults.get("normalize", True)

    def admit_fill_mask(self, ids: list[int], loc: Loc,
                        top_k: int) -> tuple[tuple[list[int], list[int], int], int]:
        had_mask = self.mask_id in ids
        ids = self._fit(ids, loc, keep_last=True)
        positions = [p for p, t in enumerate(ids) if t == self.mask_id]
        if not positions:
            why = (f"its {self.mask_token} token was cut off by --truncate; put it earlier"
                   if had_mask else f"it has no {self.mask_token} token: write "
                   f"{self.mask_token} where a word should be predicted (exactly so"
                   + (", in capitals)" if self.mask_token.isupper() else ")"))
            raise InputError(f"fill-mask needs a {self.mask_token} token, and {why}", loc)
        return (ids, positions, top_k), len(ids)

    def admit_embed(self, ids: list[int], loc: Loc, pooling: str | None,
                    normalize: bool | None, *, empty_ok: bool = False
                    ) -> tuple[tuple[list[int], str, bool], int]:
        """None for ``pooling`` or ``normalize``: the model's default. ``empty_ok``: a text
        the tokenizer empties is embedded as the empty text (a corpus being indexed), not
        refused (a client's request)."""
        ids = self._fit(ids if empty_ok else self._has_content(ids, loc), loc, keep_last=True)
        return (ids, pooling or self.pooling,
                self.normalize if normalize is None else normalize), len(ids)

    def prepare_fill_mask(self, texts: list[str], top_k: int,
                          many: bool) -> list[tuple[list[int], list[int], int]]:
        return [self.admit_fill_mask(ids, input_loc(i, many), top_k)[0]
                for i, ids in enumerate(self.tokenize(texts))]

    def prepare_embed(self, texts: list[str], pooling: str | None, normalize: bool | None,
                      many: bool) -> list[tuple[list[int], str, bool]]:
        return [self.admit_embed(ids, input_loc(i, many), pooling, normalize, empty_ok=True)[0]
                for i, ids in enumerate(self.tokenize(texts))]

    def torch_forward(self) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        return self.model.encode

    def _hidden(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids, mask = self.pad(seqs, self.pad_id)
        assert self._forward is not None
        return self._forward(ids, mask), mask

    def run(self, key: tuple, payloads: list[Any]) -> list[Any]:
        with self._context():
            if key[0] == "fill-mask":
                return self._fill_mask(payloads)
            if key[0] == "embed":
                return self._embed(payloads)
        raise ValueError(f"unknown task {key[0]!r}")

    def _fill_mask(self, payloads: list[tuple[list[int], list[int], int]]) -> list[Any]:
        laps = self._laps("fill-mask")
        hidden, _ = self._hidden([p[0] for p in payloads])
        if laps:
            laps.lap("forward", len(payloads))
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
        if laps:
            laps.lap("pooling", len(payloads))
        return results

    def _embed(self, payloads: list[tuple[list[int], str, bool]]) -> list[Any]:
        """One float32 vector (a NumPy row) per payload: pooled, normalised if asked."""
        laps = self._laps("embed")
        hidden, mask = self._hidden([p[0] for p in payloads])
        if laps:
            laps.lap("forward", len(payloads))
        hidden = hidden.float()
        if mask is None:
            mean = hidden.mean(1)
        else:
            m = mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
        cls_rows = [p[1] == "cls" for p in payloads]
        if not any(cls_rows):
            pooled = mean
        elif all(cls_rows):
            pooled = hidden[:, 0]
        else:
            pick = torch.tensor(cls_rows, device=mean.device)[:, None]
            pooled = torch.where(pick, hidden[:, 0], mean)
        want = [p[2] for p in payloads]
        if any(want):
            norms = pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            scaled = pooled / norms
            pooled = scaled if all(want) else torch.where(
                torch.tensor(want, device=pooled.device)[:, None], scaled, pooled)
        out = list(pooled.cpu().numpy())
        if laps:
            laps.lap("pooling", len(payloads))
        return out

    def _probe(self) -> tuple[tuple, Any] | None:
        return ("embed",), lambda ids: (ids, self.pooling, self.normalize)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(),
                "embedding": {"pooling": self.pooling, "normalize": self.normalize}}

    def warmup(self) -> None:
        s = self.specials
        seq = [t for t in (s["cls"], self.mask_id, s["sep"]) if t is not None] or [self.probe_id]
        if "fill-mask" in self.tasks:
            self.run(("fill-mask",), [(seq, [seq.index(self.mask_id)], 1)] * 2)
        self.run(("embed",), [(seq, "mean", True), (seq[:2] or seq, "mean", True)])


class ClassifierEngine(Engine):
    """A fine-tuned classifier or regressor folder (shoestring.classifier)."""

    kind = "classifier"
    tasks = frozenset({"classify"})

    def __init__(self, model: nn.Module, tokenizer: Any, meta: dict, source: Path,
                 **kw: Any) -> None:
        super().__init__(model, tokenizer, meta, source, **kw)
        self.pad_id = specials(meta)["pad"]
        self.problem = meta.get("problem", "classification")
        n = int(meta["num_labels"])
        self.labels = list(meta.get("labels") or [str(i) for i in range(n)])
        # True: pairs only; False: single texts only; None: either (a transformers
        # classifier whose tokenizer has a pair template: a cross-encoder or not).
        pair = meta.get("pair", False)
        self.pair: bool | None = None if pair is None else bool(pair)

    def check_pairs(self, n: int, pairs: list[str] | None, ids_given: bool = False) -> None:
        """A request's ``pairs`` against this classifier: given exactly when it takes pairs,
        one per input (token ids already hold both texts of a pair)."""
        if ids_given:
            if pairs is not None:
                raise InputError("'input_ids' already hold both texts of each pair: leave out "
                                 "'pairs'", ("body", "pairs"))
            return
        if self.pair is True and pairs is None:
            raise InputError("this classifier takes text pairs: send 'pairs' (one second text "
                             "per input) beside 'inputs'", ("body", "pairs"))
        if self.pair is False and pairs is not None:
            raise InputError("this classifier takes single texts: leave out 'pairs'",
                             ("body", "pairs"))
        if pairs is not None and len(pairs) != n:
            raise InputError(f"'pairs' has {len(pairs)} texts for {n} inputs; give one "
                             "per input", ("body", "pairs"))

    def admit_classify(self, ids: list[int], loc: Loc) -> tuple[list[int], int]:
        ids = self._fit(self._has_content(ids, loc, self.pair is True), loc, keep_last=True)
        return ids, len(ids)

    def prepare_classify(self, texts: list[str], pairs: list[str] | None,
                         many: bool) -> list[list[int]]:
        self.check_pairs(len(texts), pairs)
        encs = self.tokenize(texts if pairs is None else list(zip(texts, pairs)))
        return [self.admit_classify(ids, input_loc(i, many))[0] for i, ids in enumerate(encs)]

    def torch_forward(self) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        return self.model

    def run(self, key: tuple, payloads: list[Any]) -> list[Any]:
        laps = self._laps("classify")
        with self._context():
            ids, mask = self.pad(payloads, self.pad_id)
            assert self._forward is not None
            logits = self._forward(ids, mask).float()
        if laps:
            laps.lap("forward", len(payloads))
        if self.problem == "regression":
            out: list[Any] = [{"value": v} for v in logits[:, 0].cpu().tolist()]
        else:
            out = []
            for row in logits.softmax(-1).cpu().tolist():
                best = max(range(len(row)), key=row.__getitem__)
                out.append({"label": self.labels[best], "score": row[best],
                            "scores": dict(zip(self.labels, row))})
        if laps:
            laps.lap("pooling", len(payloads))
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "problem": self.problem, "labels": self.labels,
                "pair": self.pair, "task": self.meta.get("task")}

    def _probe(self) -> tuple[tuple, Any] | None:
        return ("classify",), lambda ids: ids

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

    def admit_generate(self, ids: list[int], loc: Loc) -> tuple[list[int], int]:
        # Training rows are documents joined by <|endoftext|>: a prompt is a document start.
        if self.eos_id is not None and (not ids or ids[0] != self.eos_id):
            ids = [self.eos_id, *ids]
        ids = self._fit(ids, loc, keep_last=False)
        return ids, len(ids)

    def prepare_generate(self, texts: list[str], many: bool) -> list[list[int]]:
        return [self.admit_generate(ids, input_loc(i, many))[0]
                for i, ids in enumerate(self.tokenize(texts))]

    def run(self, key: tuple, payloads: list[Any]) -> list[Any]:
        if key[0] == "generate-stream":
            return [self._stream(key[1:6], *payloads[0])]
        laps = self._laps("generate")
        with self._context():
            ids, mask = self.pad(payloads, self.pad_id, left=True)
            out = self._generate(ids, key[1:], attention_mask=mask, pad_id=self.pad_id)
        new = out[:, ids.shape[1] :].cpu().tolist()
        if laps:
            laps.lap("forward", len(payloads))
        results = []
        for row in new:
            finish = "length"
            if self.eos_id is not None and self.eos_id in row:
                row, finish = row[: row.index(self.eos_id)], "stop"
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            results.append({"text": text, "tokens": len(row), "finish_reason": finish})
        if laps:
            laps.lap("pooling", len(payloads))
        return results

    def _generate(self, ids: torch.Tensor, options: tuple, **kw: Any) -> torch.Tensor:
        """``model.generate`` with a request's (max_new, temperature, top_k, top_p, seed); a
        seed gets its own generator, so that request's sampling is repeatable."""
        max_new, temperature, top_k, top_p, seed = options
        gen = None if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        return self.model.generate(ids, max_new, temperature=temperature, top_k=top_k,
                                   top_p=top_p, eos_id=self.eos_id, generator=gen, **kw)

    def _stream(self, options: tuple, ids: list[int], stream: TokenSink) -> dict[str, Any]:
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
    tok = load_tokenizer(path)
    tok.no_truncation()
    tok.no_padding()
    return tok


# This floor's part of a model family: the engine that serves its model (families/spec.py).
ENGINES: dict[str, type[Engine]] = {
    "mlm": EncoderEngine, "clm": DecoderEngine, "contrastive": EncoderEngine,
    "rtd": EncoderEngine}  # open_model gives an RTD run's discriminator, an mlm encoder


def load_engine(path: str | Path, *, max_length: int | None = None, truncate: bool = False,
                precision: str = "fp32", backend: str = "torch") -> Engine:
    """The right engine for folder ``path``: a run dir (``final/`` inside, or ``final/``
    itself), an export (`shoestring export`: ModernBERT or Llama), a classifier folder, or a
    transformers encoder folder (`hf_folder`); its forward pass on ``backend``
    (`inference.backends`: torch, onnx, onnx-int8, or auto, which measures them here)."""
    check_backend(backend)
    kw = {"max_length": max_length, "truncate": truncate, "precision": precision}
    artifact = identify(path, want=SERVABLE, command="shoestring serve", trained=True)
    engine: Engine
    if artifact.kind is Kind.HF_ENCODER:
        engine = _transformers_engine(artifact.path, kw)
    elif artifact.kind is Kind.CLASSIFIER:
        model, meta = load_classifier(artifact.path)
        engine = ClassifierEngine(model, _tokenizer(artifact.tokenizer_path), meta,
                                  artifact.path, **kw)
    else:
        try:
            model, meta, _ = open_model(artifact.path)
        except ShoestringError:
            if not _foreign_encoder(artifact.path):
                raise
            # A ModernBERT that `shoestring export` did not write and our importer does not
            # compute exactly (the hub's, with sliding-window layers): transformers does.
            engine = _transformers_engine(artifact.path, kw)
        else:
            family = families.by_architecture(meta.get("architecture"),
                                              where=str(artifact.model_dir))
            engine = ENGINES[family.name](model, _tokenizer(artifact.tokenizer_path), meta,
                                          artifact.path, **kw)
    engine.model_dir = artifact.model_dir
    engine.backend = choose(engine, backend, artifact.model_dir, artifact.path)
    return engine


def _transformers_engine(path: Path, kw: dict[str, Any]) -> Engine:
    """The engine of a transformers encoder folder (`hf_folder`)."""
    model, tok, meta, kind = open_hf_folder(path)
    engine = ClassifierEngine if kind == "classifier" else EncoderEngine
    return engine(model, tok, meta, path, **kw)


def _foreign_encoder(path: Path) -> bool:
    """An encoder export folder not written by `shoestring export` (no marker)."""
    if (path / ".shoestring-export").is_file():
        return False
    model_type = (json_object_or_none(path / "config.json") or {}).get("model_type")
    family = next((f for f in families.all_families() if f.hf_model_type == model_type), None)
    return family is not None and not family.causal
