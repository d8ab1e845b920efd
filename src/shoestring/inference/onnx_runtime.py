"""A model's forward pass as an ONNX graph run by ONNX Runtime: export, cache, int8, sessions.

What is exported is exactly the call the engine makes (`backends.ForwardCall`): ``(ids, mask)``
→ hidden states for an encoder (``model.encode``), → logits for a classifier (``model(...)``),
with the batch and sequence axes dynamic. Any model object with that interface gets ONNX this
way; the engine's pooling, fill-mask head and answers stay in PyTorch/NumPy.

* **Export** uses the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``, opset
  `OPSET`): on torch 2.13 it exported our 12 × 768 encoder in 31 s on a loaded 2-core CPU,
  into one self-contained file; the dynamo exporter took 4.7x as long on a 6 × 384 one (11.3 s
  against 2.4 s), wrote the weights to a side file, and both its graphs ran slower (fp32
  0.75x, int8 0.69x; bench/serve_backends.py ``--exporters``, BENCHMARKS.md). Before tracing,
  one forward at the longest length served fills the model's position caches (rotary
  tables), so the graph slices a table of that length for any input up to it rather than
  baking in the example's length.
* **int8** is ONNX Runtime's dynamic quantization (`quantize_dynamic`: int8 weights, each
  activation quantized per call) of the MatMuls, with a scale per output channel, except the
  feed-forward blocks' down-projections (a weight with more input than output features),
  which stay fp32: their inputs (GELU's outputs) carry the outliers one activation scale
  cannot hold. On all-MiniLM-L6-v2 (a real sentence-embedding BERT) `serve`'s gate measured
  a min cosine to fp32 of 0.923 with one scale per weight and 0.988 with this recipe (32
  pydocs inputs, 2026-11-28): better, and still under the gate, so `auto` serves that model
  on fp32 ONNX. Whether int8 is accurate enough for a given model is still the accuracy
  gate's question (`backends`), not assumed here.
* **Cache**: both files live in ``<run dir>/onnx/<key>/`` (beside ``final/``, which stays as
  training wrote it) or ``<model folder>/onnx/<key>/``, ``key`` a digest of every file in the
  model folder (name, size, modification time) and of the exporter's versions and settings,
  so changed weights are never served from a stale graph; a folder that cannot be written,
  or a model repository's version (immutable: its sha256 covers its files), puts them under
  ``$SHOESTRING_HOME/onnx/`` instead. Files are written atomically
  (`fsutil`), and concurrent loaders (``--workers``) export once: the others wait on a lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from shoestring.fsutil import shoestring_home, write_bytes_atomic, write_json_atomic

OPSET = 17
EXPORT_VERSION = 2  # bump when what is exported changes: it is part of the cache key
FP32_FILE, INT8_FILE = "model.onnx", "model.int8.onnx"
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "output"

# Session settings, measured with bench/serve_backends.py --sweep-options (BENCHMARKS.md,
# issue 59; 6 x 384 encoder, 2 cores shared at load 7-10): intra-op threads = the server's
# torch threads (--threads), one inter-op thread with sequential execution (one graph at a
# time is all a server's batch worker runs), all graph optimisations (basic: 0.61-0.93x,
# extended: 0.69-1.09x), the memory arena on (off: 0.77-1.14x, noise at fp32). Thread
# spinning is off: a spinning pool burns the cores between calls that the event loop, the
# tokenizer and the neighbours need; on it measured 0.31-0.78x.
GRAPH_OPTIMIZATION = "ORT_ENABLE_ALL"
MEMORY_ARENA = True
SPINNING = False


class _Call(nn.Module):
    """The engine's call as a module the exporter can trace: ``fn(ids, mask)``."""

    def __init__(self, model: nn.Module, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                 ) -> None:
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fn(ids, mask)


@dataclass
class OnnxFiles:
    """Where a model's ONNX graphs are, and what making them cost (0: taken from the cache)."""

    folder: Path
    export_s: float = 0.0
    quantize_s: float = 0.0
    cached: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def fp32(self) -> Path:
        return self.folder / FP32_FILE

    @property
    def int8(self) -> Path:
        return self.folder / INT8_FILE


def cache_key(model_dir: Path, kind: str, max_length: int) -> str:
    """A digest of what the graph depends on: every file of the model folder (name, size,
    mtime), the exported call, the longest length primed, and the exporter's versions."""
    import onnxruntime

    h = hashlib.sha256()
    for p in sorted(model_dir.iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    h.update(f"{kind}|{max_length}|{OPSET}|{EXPORT_VERSION}|{torch.__version__}|"
             f"{onnxruntime.__version__}".encode())
    return h.hexdigest()[:16]


def cache_folder(folder: Path, key: str) -> tuple[Path, str | None]:
    """``<folder>/onnx/<key>`` (``folder``: a run dir, beside its final/, or the model's
    folder), or under ``$SHOESTRING_HOME/onnx/`` when it cannot be written (a read-only mount)
    or must not be (a model repository's version, whose files its sha256 covers); the second
    value says why it moved (None: beside)."""
    beside = folder / "onnx"
    where = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]
    home = shoestring_home() / "onnx" / f"{folder.name}-{where}" / key
    if folder.name == "model" and (folder.parent / "manifest.json").is_file():
        return home, f"{folder} is a model repository version (immutable): the ONNX cache is at {home}"
    try:
        beside.mkdir(exist_ok=True)
        probe = beside / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return beside / key, None
    except OSError as e:
        return home, f"{beside} is not writable ({e.strerror}): the ONNX cache is at {home}"


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """Wait for, then hold, the folder's export lock (other loaders wait, then reuse)."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".export.lock", "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks: export unlocked (writes stay atomic)
            pass
        yield


def export_files(model: nn.Module, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 folder: Path, *, probe_id: int, max_length: int,
                 describe: dict[str, Any] | None = None) -> OnnxFiles:
    """The fp32 and int8 graphs of ``fn`` in ``folder``: reused when both are there, else
    exported (and quantized) now. ``describe`` is written beside them as ``onnx.json``."""
    files = OnnxFiles(folder)
    if files.fp32.is_file() and files.int8.is_file():
        return files
    with _exclusive(folder):
        if files.fp32.is_file() and files.int8.is_file():  # another loader made them meanwhile
            return files
        files.cached = False
        t = time.perf_counter()
        write_bytes_atomic(files.fp32, export_bytes(model, fn, probe_id=probe_id,
                                                    max_length=max_length))
        files.export_s = time.perf_counter() - t
        t = time.perf_counter()
        quantize(files.fp32, files.int8)
        files.quantize_s = time.perf_counter() - t
        write_json_atomic(folder / "onnx.json", io_description(describe or {}))
    return files


def export_bytes(model: nn.Module, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                 probe_id: int, max_length: int) -> bytes:
    """The ONNX graph (fp32, one self-contained file) of ``fn(ids, mask)``, dynamic axes."""
    device = next(model.parameters()).device
    with torch.inference_mode():  # fill position caches up to the longest length served
        long = torch.full((1, max_length), probe_id, dtype=torch.long, device=device)
        fn(long, torch.ones_like(long, dtype=torch.bool))
    ids = torch.full((2, 8), probe_id, dtype=torch.long, device=device)
    mask = torch.ones(2, 8, dtype=torch.bool, device=device)
    mask[1, 5:] = False  # the padded path is the one traced
    buf = io.BytesIO()
    dyn = {name: {0: "batch", 1: "sequence"} for name in (*INPUTS, OUTPUT)}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(_Call(model, fn).eval(), (ids, mask), buf, dynamo=False,
                          opset_version=OPSET, input_names=list(INPUTS),
                          output_names=[OUTPUT], dynamic_axes=dyn)
    return buf.getvalue()


def _down_projections(path: Path) -> list[str]:
    """The MatMuls whose weight (an initializer) has more input than output features: the
    feed-forward blocks' down-projections, whatever the architecture names them."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "MatMul" and len(n.input) == 2
            and len(shapes.get(n.input[1], ())) == 2
            and shapes[n.input[1]][0] > shapes[n.input[1]][1]]


def quantize(src: Path, dst: Path) -> None:
    """``dst``: ``src`` with int8 MatMul weights (ONNX Runtime's dynamic quantization),
    written atomically."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().disabled, was = True, logging.getLogger().disabled
    try:
        with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".quantize-") as tmp:
            out = Path(tmp) / dst.name
            quantize_dynamic(src, out, weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul"],
                             nodes_to_exclude=_down_projections(src))
            os.replace(out, dst)
    finally:
        logging.getLogger().disabled = was


def io_description(extra: dict[str, Any]) -> dict[str, Any]:
    """What a plain ``onnxruntime.InferenceSession`` user needs to feed and read the graphs."""
    return {
        "files": {"fp32": FP32_FILE, "int8": INT8_FILE},
        "inputs": {"input_ids": {"dtype": "int64", "shape": ["batch", "sequence"]},
                   "attention_mask": {"dtype": "bool", "shape": ["batch", "sequence"],
                                      "meaning": "true at real tokens, false at padding"}},
        "opset": OPSET, **extra,
    }


def session_options(threads: int) -> Any:
    """ONNX Runtime session options as measured best here (see the constants above)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION)
    so.enable_cpu_mem_arena = MEMORY_ARENA
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if SPINNING else "0")
    so.log_severity_level = 3  # errors only: its warnings are about fusions it skipped
    return so


class OnnxForward:
    """One ONNX Runtime session called like the PyTorch forward it replaces:
    ``(ids, mask or None) → tensor``. A missing mask (nothing padded) is fed as all true."""

    def __init__(self, path: Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        self.path = path
        self.threads = threads or torch.get_num_threads()
        self.session = ort.InferenceSession(str(path), session_options(self.threads),
                                            providers=["CPUExecutionProvider"])

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        ids_np = ids.numpy()
        mask_np = (np.ones(ids_np.shape, dtype=bool) if mask is None else mask.numpy())
        (out,) = self.session.run([OUTPUT], {INPUTS[0]: ids_np, INPUTS[1]: mask_np})
        return torch.from_numpy(out)


def export_folder(engine: Any, out: Path, *, overwrite: bool = False) -> Path:
    """``shoestring export --format onnx``: ``engine``'s forward pass as ``model.onnx`` (fp32)
    and ``model.int8.onnx`` in ``out``, with its ``tokenizer.json`` and an ``onnx.json`` saying
    what to feed and what comes out (complete or absent: `fsutil.building_dir`)."""
    import shutil

    from shoestring.errors import ShoestringError
    from shoestring.fsutil import building_dir, check_output_dir

    forward = engine.torch_forward()
    if forward is None:
        raise ShoestringError(f"a {engine.kind} cannot be exported to ONNX: its work is a "
                              "generation loop, not one forward pass", where=str(engine.source),
                              fix="export it with --format hf (Llama)")
    owned = (out / "onnx.json").is_file() and (out / FP32_FILE).is_file()
    check_output_dir(out, "ONNX export", owned=owned, overwrite=overwrite)
    meta = engine.meta
    extra: dict[str, Any] = {"kind": engine.kind, "source": str(engine.source),
                             "max_length": engine.max_length, "pad_id": engine.pad_id,
                             "output": {"name": OUTPUT, "meaning": _OUTPUT_MEANING[engine.kind]}}
    if engine.kind == "classifier":
        extra.update(problem=engine.problem, labels=engine.labels, pair=engine.pair)
    else:
        extra["special_ids"] = meta.get("special_ids", {})
        extra["pooling"] = "mean over attention_mask (as /v1/embed's default), or the first row"
    with building_dir(out) as build:
        t = time.perf_counter()
        (build / FP32_FILE).write_bytes(export_bytes(engine.model, forward,
                                                     probe_id=engine.probe_id,
                                                     max_length=engine.max_length))
        extra["export_s"] = round(time.perf_counter() - t, 2)
        quantize(build / FP32_FILE, build / INT8_FILE)
        shutil.copyfile(Path(engine.model_dir) / "tokenizer.json", build / "tokenizer.json")
        write_json_atomic(build / "onnx.json", io_description(extra))
    return out


_OUTPUT_MEANING = {"encoder": "final hidden states, (batch, sequence, hidden) float32",
                   "classifier": "logits, (batch, labels) float32 (regression: one value)"}
