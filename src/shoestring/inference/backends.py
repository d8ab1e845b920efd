"""Which runtime does an engine's forward pass: PyTorch, ONNX Runtime fp32 or int8, chosen by
measurement and kept honest by an accuracy gate.

The seam is the one call an engine makes per batch, ``forward(ids, mask) → tensor``
(`Engine.torch_forward`: ``model.encode`` for an encoder's hidden states, ``model(...)`` for a
classifier's logits). Every backend is a callable of that shape, so any model object with that
interface gets ONNX without its own code; pooling, the fill-mask vocabulary head and the
answers stay where they were.

* ``torch`` — the model as loaded (fp32, or bf16 autocast with ``--precision``).
* ``onnx`` — the same call exported to ONNX and run by ONNX Runtime (`onnx_runtime`).
* ``onnx-int8`` — that graph with int8 weights (dynamic quantization).
* ``auto`` (the server's default) — on a CPU at fp32, times the three on this machine (on the
  gate's own sample, batch by batch in turn: one pass gives both the figures and the times)
  and takes the fastest that passes the gate (and beats PyTorch by `MIN_GAIN`); on a GPU or
  under bf16 it keeps ``torch`` (ONNX Runtime here runs on the CPU, in fp32). Decoders always run on PyTorch: generation is a loop of cached
  steps that this seam does not cover; ``--backend onnx`` for one is refused.

**The accuracy gate** (`MIN_COSINE`, `MIN_AGREEMENT`, `MAX_REGRESSION_ERROR`): on a sample of
the model's own validation text (the run's data dir's val split; otherwise paragraphs of the
built-in corpus, ``builtin:pydocs``), each candidate is compared with PyTorch fp32 on the same
batches: an encoder's mean-pooled sentence vectors by cosine (min and mean), a classifier's
labels by agreement (and its probabilities' largest difference), a regressor's values by the
largest difference. ``auto`` takes a candidate only when it passes; an explicit backend that
fails is served anyway (the user asked for it) with a warning that shows the figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from shoestring.errors import ShoestringError

Forward = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


class Engine(Protocol):
    """What choosing a backend reads and sets on an engine (`inference.engine.Engine` is
    one); named here so that this module needs nothing of the engine's."""

    kind: str
    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    source: Path
    max_length: int
    pad_id: int
    probe_id: int
    vocab_size: int

    def torch_forward(self) -> Forward | None: ...
    def set_forward(self, forward: Forward) -> None: ...
    def tokenize(self, texts: list[Any]) -> list[list[int]]: ...
    def pad(self, seqs: list[list[int]], pad_id: int,
            left: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]: ...

BACKENDS = ("auto", "torch", "onnx", "onnx-int8")
ONNX_BACKENDS = ("onnx", "onnx-int8")

# The gate's thresholds, in one place (docs/serving.md states them).
MIN_COSINE = 0.99       # each sample sentence's vector against PyTorch fp32's
MIN_AGREEMENT = 0.99    # share of sample inputs given the same label
MAX_REGRESSION_ERROR = 0.1  # largest |difference| over the spread (std) of fp32's values
GATE_SAMPLES = 32       # sample inputs, of varied lengths, run in padded batches of 8
GATE_BATCH = 8
GATE_MAX_TOKENS = 128   # sample inputs are at most this long (and --max-length)
MIN_GAIN = 1.10  # auto leaves PyTorch only for a candidate this much faster: a runtime switch
# must pay beyond the timing's noise on a shared machine (and keeps a model whose candidates
# tie on the runtime that answers an input the same batched or alone, bit for bit)
OUTPUTS = {"encoder": "hidden states (batch, sequence, hidden), float32",
           "classifier": "logits (batch, labels), float32"}


@dataclass
class Gate:
    """One candidate against PyTorch fp32 on the gate's sample."""

    samples: int
    source: str
    cosine_min: float | None = None
    cosine_mean: float | None = None
    agreement: float | None = None
    max_abs: float | None = None
    passed: bool = True

    def figures(self) -> str:
        """The measured figures, with "FAILS the gate" when they are under the thresholds."""
        if self.cosine_min is not None:
            figs = f"cosine min {self.cosine_min:.4f} mean {self.cosine_mean:.4f}"
        elif self.agreement is not None:
            figs = f"label agreement {self.agreement:.1%}, max prob diff {self.max_abs:.4f}"
        else:
            figs = f"max abs diff {self.max_abs:.4g}"
        return figs + ("" if self.passed else " - FAILS the gate")

    def describe(self) -> str:
        return f"{self.figures()} over {self.samples} {self.source} inputs"

    def as_dict(self) -> dict[str, Any]:
        keys = ("samples", "source", "cosine_min", "cosine_mean", "agreement", "max_abs", "passed")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass
class BackendChoice:
    """The backend an engine runs on, and why: what was asked, timed and measured."""

    name: str = "torch"
    requested: str = "torch"
    why: str = "as asked"
    seconds: dict[str, float] = field(default_factory=dict)  # the gate's sample, per candidate
    gates: dict[str, Gate] = field(default_factory=dict)
    onnx: dict[str, Any] = field(default_factory=dict)  # cache folder, export/quantize seconds
    warning: str | None = None

    def summary(self) -> str:
        """One line for the ready message: ``backend onnx-int8: fastest here (1.6x torch,
        1.2x onnx); vs torch fp32: onnx cosine min …, onnx-int8 cosine min … over 32 …``."""
        line = f"backend {self.name}: {self.why}"
        if self.gates:
            first = next(iter(self.gates.values()))
            figs = ", ".join(f"{n} {g.figures()}" for n, g in self.gates.items())
            line += f"; vs torch fp32: {figs} over {first.samples} {first.source} inputs"
        return line

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "requested": self.requested, "why": self.why,
                "seconds": self.seconds,
                "gate": {"min_cosine": MIN_COSINE, "min_agreement": MIN_AGREEMENT,
                         "max_regression_error": MAX_REGRESSION_ERROR,
                         **{k: g.as_dict() for k, g in self.gates.items()}},
                **({"onnx": self.onnx} if self.onnx else {}),
                **({"warning": self.warning} if self.warning else {})}


def check_backend(name: str) -> str:
    """``name`` if it is a backend, else a ShoestringError naming ``--backend``."""
    if name not in BACKENDS:
        raise ShoestringError(f"{name!r} is not a backend", where="--backend",
                              fix=f"use one of {', '.join(BACKENDS)}")
    return name


def choose(engine: Engine, requested: str, model_dir: Path, cache_root: Path) -> BackendChoice:
    """Put ``engine`` on the backend ``requested`` (``auto``: the fastest that passes the
    gate) and say why; the engine's forward is replaced in place. ``model_dir`` holds the
    weights (the cache key's files), ``cache_root`` the ONNX cache (`onnx_runtime`)."""
    check_backend(requested)
    torch_fwd = engine.torch_forward()
    if torch_fwd is None:
        if requested in ONNX_BACKENDS:
            raise ShoestringError(
                f"a {engine.kind} runs on PyTorch only: --backend {requested} exports an "
                "encoder's or classifier's forward pass, and generation is a loop of cached "
                "steps it does not cover", where="--backend",
                fix="leave --backend out (auto) or use --backend torch for this model")
        return BackendChoice("torch", requested, f"{engine.kind}s run on PyTorch")
    if requested == "torch":
        return BackendChoice("torch", requested, "as asked")
    unsupported = _onnx_unsupported(engine)
    if unsupported:
        if requested != "auto":
            raise ShoestringError(f"--backend {requested} needs {unsupported}",
                                  where="--backend",
                                  fix="leave --backend out (auto) or use --backend torch")
        return BackendChoice("torch", requested, f"kept PyTorch: ONNX Runtime here needs "
                             f"{unsupported}")
    from shoestring.inference import onnx_runtime as ort_rt

    key = ort_rt.cache_key(model_dir, engine.kind, engine.max_length)
    folder, moved = ort_rt.cache_folder(cache_root, key)
    files = ort_rt.export_files(engine.model, torch_fwd, folder, probe_id=engine.probe_id,
                                max_length=engine.max_length,
                                describe={"kind": engine.kind, "output": OUTPUTS[engine.kind]})
    onnx_info = {"folder": str(folder), "cached": files.cached,
                 "export_s": round(files.export_s, 2), "quantize_s": round(files.quantize_s, 2),
                 **({"note": moved} if moved else {})}
    paths = {"onnx": files.fp32, "onnx-int8": files.int8}
    wanted = list(ONNX_BACKENDS) if requested == "auto" else [requested]
    forwards: dict[str, Forward] = {"torch": torch_fwd}
    forwards.update({n: ort_rt.OnnxForward(paths[n]) for n in wanted})
    sample, source = gate_sample(engine)
    outputs, seconds = run_sample(engine, forwards, sample)
    gates = {n: measure_gate(engine, outputs["torch"], outputs[n], source) for n in wanted}
    if requested != "auto":
        gate = gates[requested]
        choice = BackendChoice(requested, requested, "as asked", gates=gates, onnx=onnx_info)
        if not gate.passed:
            choice.warning = (f"--backend {requested} fails the accuracy gate against PyTorch "
                              f"fp32 ({gate.describe()}; the gate asks {_thresholds(engine)}): "
                              "serving it as asked; leave --backend out to serve the fastest "
                              "backend that passes")
    else:
        best, why = pick(seconds, gates)
        choice = BackendChoice(best, requested, why, gates=gates, onnx=onnx_info,
                               seconds={k: round(v, 5) for k, v in seconds.items()})
    engine.set_forward(forwards[choice.name])
    return choice


def pick(seconds: dict[str, float], gates: dict[str, Gate]) -> tuple[str, str]:
    """``auto``'s rule: the fastest of torch and the candidates that pass their gate and beat
    torch by `MIN_GAIN`; and the reason, with every ratio."""
    passing = [n for n in seconds if n == "torch" or gates[n].passed]
    fast = [n for n in passing if n == "torch" or seconds["torch"] >= MIN_GAIN * seconds[n]]
    best = min(fast, key=seconds.__getitem__)
    ratio = ", ".join(f"{seconds[n] / seconds[best]:.2f}x {n}" for n in seconds if n != best)
    failed = [n for n in seconds if n not in passing]
    slow = [n for n in passing if n not in fast]
    return best, (f"fastest here ({ratio})"
                  + (f"; {', '.join(slow)} under {MIN_GAIN:.2f}x torch" if slow else "")
                  + (f"; {', '.join(failed)} failed the gate" if failed else ""))


def _onnx_unsupported(engine: Engine) -> str | None:
    """What ONNX Runtime (CPU, fp32 graphs) lacks for this engine's settings (None: fine)."""
    if engine.device.type != "cpu":
        return f"a CPU (this engine runs on {engine.device}; PyTorch is the GPU backend)"
    if engine.dtype != torch.float32:
        return "--precision fp32 (its graphs are fp32 or int8)"
    return None


def _thresholds(engine: Engine) -> str:
    if engine.kind != "classifier":
        return f"min cosine >= {MIN_COSINE}"
    if getattr(engine, "problem", "") == "regression":
        return f"max diff <= {MAX_REGRESSION_ERROR} x the values' spread"
    return f"label agreement >= {MIN_AGREEMENT:.0%}"


def gate_sample(engine: Engine) -> tuple[list[list[int]], str]:
    """`GATE_SAMPLES` token id lists of varied lengths: the run's own validation rows when its
    data dir is at hand, else paragraphs of ``builtin:pydocs``; and which of the two."""
    cap = max(4, min(engine.max_length, GATE_MAX_TOKENS))
    lengths = [4 + (i * 37) % (cap - 3) for i in range(GATE_SAMPLES)]
    rows = _val_rows(engine)
    if rows is not None:
        return [r[:n] for r, n in zip(rows, lengths)], "validation"
    from shoestring.data.builtin import iter_pydocs

    paragraphs: list[str] = []
    for doc in iter_pydocs():
        paragraphs += [p.strip() for p in doc.text.split("\n\n") if len(p.split()) >= 8]
        if len(paragraphs) >= GATE_SAMPLES + 1:
            break
    texts: list[Any] = paragraphs[:GATE_SAMPLES]
    if getattr(engine, "pair", False):
        texts = list(zip(texts, paragraphs[1 : GATE_SAMPLES + 1]))
    ids = engine.tokenize(texts)
    return [s if len(s) <= n else s[: n - 1] + s[-1:] for s, n in zip(ids, lengths)], "pydocs"


def _val_rows(engine: Engine) -> list[list[int]] | None:
    """The first `GATE_SAMPLES` rows of the run's val split (None: not a run, or its data dir
    is gone or has none)."""
    from shoestring.data.datadir import DataDir
    from shoestring.rundir import RunDir

    try:
        data = DataDir(RunDir(engine.source).data_dir())
        split = data.split("val")
        n = min(len(split), GATE_SAMPLES)
        rows = split.take(torch.arange(n).numpy()).tolist()
    except (ShoestringError, OSError, KeyError, ValueError):
        return None
    if n == 0 or max(max(r) for r in rows) >= engine.vocab_size:
        return None
    return [rows[i % n] for i in range(GATE_SAMPLES)]


Outputs = list[tuple[torch.Tensor, torch.Tensor]]  # per batch: (output, mask of real tokens)


def run_sample(engine: Engine, forwards: dict[str, Forward], sample: list[list[int]]
               ) -> tuple[dict[str, Outputs], dict[str, float]]:
    """Each backend's outputs on ``sample`` (padded batches of `GATE_BATCH`) and its seconds
    for the whole sample: the gate and ``auto``'s timing from one pass. The backends take
    each batch in turn, the order rotating, so a burst of load hits them alike; each runs one
    small batch first (first-call allocations are not what is timed)."""
    outputs: dict[str, Outputs] = {n: [] for n in forwards}
    seconds = dict.fromkeys(forwards, 0.0)
    names = list(forwards)
    with torch.inference_mode():
        warm = torch.full((1, 8), engine.probe_id, dtype=torch.long, device=engine.device)
        for fwd in forwards.values():
            fwd(warm, None)
        for k, i in enumerate(range(0, len(sample), GATE_BATCH)):
            ids, mask = engine.pad(sample[i : i + GATE_BATCH], engine.pad_id)
            real = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask
            for n in names[k % len(names):] + names[: k % len(names)]:
                t = time.perf_counter()
                out = forwards[n](ids, mask)
                seconds[n] += time.perf_counter() - t
                outputs[n].append((out.float(), real))
    return outputs, seconds


def measure_gate(engine: Engine, reference: Outputs, candidate: Outputs, source: str) -> Gate:
    """A candidate's outputs against PyTorch fp32's on the same batches (`run_sample`)."""
    ref = [r for r, _ in reference]
    got = [g for g, _ in candidate]
    masks = [m for _, m in reference]
    gate = Gate(samples=sum(len(m) for m in masks), source=source)
    if engine.kind != "classifier":
        cos = torch.cat([F.cosine_similarity(_mean(r, m), _mean(g, m), dim=-1)
                         for r, g, m in zip(ref, got, masks)])
        gate.cosine_min, gate.cosine_mean = float(cos.min()), float(cos.mean())
        gate.passed = gate.cosine_min >= MIN_COSINE
        return gate
    r, g = torch.cat(ref), torch.cat(got)
    if getattr(engine, "problem", "") == "regression":
        gate.max_abs = float((r[:, 0] - g[:, 0]).abs().max())
        spread = float(r[:, 0].std()) if len(r) > 1 else 0.0
        gate.passed = gate.max_abs <= MAX_REGRESSION_ERROR * max(spread, 1e-6)
        return gate
    gate.agreement = float((r.argmax(-1) == g.argmax(-1)).float().mean())
    gate.max_abs = float((r.softmax(-1) - g.softmax(-1)).abs().max())
    gate.passed = gate.agreement >= MIN_AGREEMENT
    return gate


def _mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
