"""Inference backends offline (issue 59): sentences/s of the engine alone (``Engine.run`` on
``/v1/embed`` payloads, no server) per backend — PyTorch fp32 eager, ONNX Runtime fp32, ONNX
Runtime int8 — for a 6 × 384 and a 12 × 768 encoder of ours, at batch 1 and 32, on real
sentences (bench/serve_load.py's ``make_texts``, 512 of them, batched in length order), with
each backend's accuracy-gate figures
and what ``--backend auto`` takes on this machine.

The encoders are our default recipe (rotary, GeGLU, pre-norm, no biases; 8k vocabulary),
trained 2 steps on builtin:pydocs (speed does not depend on the weights; the gate's figures
do, a little: a trained model's activations have larger outliers). Rounds are interleaved
(each round runs every backend for ``--seconds``); the median round is reported, with the
load average.

``--sweep-options`` instead times ONNX Runtime session settings (threads, spinning, graph
optimisation, memory arena) on the 6 × 384 model: what inference/onnx_runtime.py keeps.
``--exporters`` times the two torch.onnx exporters (TorchScript, dynamo) on it.

    python bench/serve_backends.py                       # both sizes, batch 1 and 32
    python bench/serve_backends.py --sizes 6x384 --repeats 5
    python bench/serve_backends.py --sweep-options
    python bench/serve_backends.py --exporters
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
from common import Bench, add_repeats, format_load, load_average, parser
from serve_load import make_texts

SIZES = {"6x384": {"num_layers": 6, "hidden_size": 384, "num_heads": 6,
                   "intermediate_size": 768},
         "12x768": {"num_layers": 12, "hidden_size": 768, "num_heads": 12,
                    "intermediate_size": 1536}}
BACKENDS = ("torch", "onnx", "onnx-int8")


def build_run(work: Path, size: str) -> Path:
    """A run dir of our encoder at ``size``, trained 2 steps (built once per --work)."""
    from shoestring.config import load_config
    from shoestring.prep.prep import prep
    from shoestring.train.loop import train

    run = work / f"run-{size}"
    if (run / "final" / "model.safetensors").is_file():
        return run
    sets = ["train.budget=null", "train.steps=2", "train.batch_size=8", "train.val_every=0",
            "train.val_sequences=8", "train.checkpoint_every=null", "train.attention=sdpa",
            *(f"model.{k}={v}" for k, v in SIZES[size].items())]
    cfg = load_config(None, sets)
    if not (work / "data" / "manifest.json").is_file():
        prep(["builtin:pydocs"], work / "data", cfg.data)
    train(cfg, work / "data", run, overwrite=True)
    return run


def rate(engine, chunks: list[list], seconds: float) -> float:
    """Sentences/s running ``chunks`` (batches of payloads) in turn for ``seconds``."""
    n, i, t0 = 0, 0, time.perf_counter()
    while True:
        c = chunks[i % len(chunks)]
        engine.run(("embed",), c)
        n, i = n + len(c), i + 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds and i >= 2:
            return n / elapsed


def throughput(args) -> None:
    from shoestring.inference.engine import load_engine

    texts = make_texts(512)
    bench = Bench("serve_backends", args, precision="fp32", threads=args.threads)
    rows, notes = [], []
    for size in args.sizes:
        run = build_run(args.work, size)
        t = time.perf_counter()
        auto = load_engine(run, truncate=True, backend="auto")
        auto_s = time.perf_counter() - t
        info = auto.backend.onnx
        print(f"{size}: auto took {auto_s:.1f} s to load ({'cached ONNX' if info['cached'] else 'export %.1f s + int8 %.1f s' % (info['export_s'], info['quantize_s'])}): "
              f"{auto.backend.summary()}", flush=True)
        if not info["cached"]:  # the cost a first load pays; then again from the cache
            t = time.perf_counter()
            auto = load_engine(run, truncate=True, backend="auto")
            print(f"{size}: auto again from the cache: {time.perf_counter() - t:.1f} s -> "
                  f"{auto.backend.name}", flush=True)
        notes.append(f"{size}: auto chose {auto.backend.summary()} (first load "
                     f"{auto_s:.1f} s incl. export {info['export_s']} s, int8 "
                     f"{info['quantize_s']} s)")
        engines = {b: load_engine(run, truncate=True, backend=b) for b in BACKENDS}
        # sorted by length, as the batcher groups a busy queue: padding is not what is compared
        payloads = sorted(engines["torch"].prepare_embed(texts, "mean", True, True),
                          key=lambda p: len(p[0]))
        for batch in args.batches:
            chunks = [payloads[i : i + batch] for i in range(0, len(payloads), batch)]
            per: dict[str, list[float]] = {b: [] for b in BACKENDS}
            for e in engines.values():
                e.run(("embed",), chunks[0])  # warm
            for r in range(args.repeats):
                order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
                for b in order:
                    per[b].append(rate(engines[b], chunks, args.seconds))
            base = statistics.median(per["torch"])
            for b in BACKENDS:
                med = statistics.median(per[b])
                gate = engines[b].backend.gates.get(b)
                rows.append({"model": size, "batch": batch, "backend": b,
                             "sentences_per_s": round(med, 1), "vs_torch": round(med / base, 2),
                             "gate": gate.figures() if gate else "reference",
                             "auto": "<-" if b == auto.backend.name else ""})
                print(f"{size} batch {batch:>2} {b:>9}: {med:8.1f} sentences/s "
                      f"({med / base:.2f}x torch; rounds {', '.join(f'{x:.1f}' for x in per[b])}) "
                      f"{rows[-1]['gate']}  load {format_load(load_average())}", flush=True)
    bench.table(rows, formats={"sentences_per_s": ",.1f", "vs_torch": ".2f"}, notes=notes)
    bench.end()


def sweep_options(args) -> None:
    """ONNX Runtime session settings on the 6 x 384 model, interleaved rounds."""
    import onnxruntime as ort

    from shoestring.inference import onnx_runtime as ortrt
    from shoestring.inference.engine import load_engine

    run = build_run(args.work, "6x384")
    engine = load_engine(run, truncate=True, backend="onnx")
    folder = Path(engine.backend.onnx["folder"])
    texts = make_texts(256)
    payloads = engine.prepare_embed(texts, "mean", True, True)
    threads = args.threads or torch.get_num_threads()

    def options(spin: bool = ortrt.SPINNING, level: str = ortrt.GRAPH_OPTIMIZATION,
                arena: bool = ortrt.MEMORY_ARENA, intra: int = threads) -> ort.SessionOptions:
        so = ortrt.session_options(intra)
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.enable_cpu_mem_arena = arena
        return so

    variants = {"kept (no spin, all, arena)": {}, "spinning on": {"spin": True},
                "graph basic": {"level": "ORT_ENABLE_BASIC"},
                "graph extended": {"level": "ORT_ENABLE_EXTENDED"},
                "arena off": {"arena": False}, "1 intra thread": {"intra": 1}}
    bench = Bench("serve_backends_options", args, precision="fp32", threads=threads)
    rows = []
    for file in (ortrt.FP32_FILE, ortrt.INT8_FILE):
        fwds = {}
        for name, kw in variants.items():
            f = ortrt.OnnxForward(folder / file, threads)
            f.session = ort.InferenceSession(str(folder / file), options(**kw),
                                             providers=["CPUExecutionProvider"])
            fwds[name] = f
        for batch in args.batches:
            chunks = [payloads[i : i + batch] for i in range(0, len(payloads), batch)]
            per: dict[str, list[float]] = {n: [] for n in fwds}
            for _ in range(args.repeats):
                for n, f in fwds.items():
                    engine.set_forward(f)
                    per[n].append(rate(engine, chunks, args.seconds))
            base = statistics.median(per["kept (no spin, all, arena)"])
            for n in fwds:
                med = statistics.median(per[n])
                rows.append({"graph": file, "batch": batch, "setting": n,
                             "sentences_per_s": round(med, 1), "vs_kept": round(med / base, 2)})
                print(f"{file} batch {batch:>2} {n:>28}: {med:8.1f} sentences/s "
                      f"({med / base:.2f}x kept)  load {format_load(load_average())}",
                      flush=True)
    bench.table(rows, formats={"sentences_per_s": ",.1f", "vs_kept": ".2f"})
    bench.end()


def exporters(args) -> None:
    """TorchScript vs dynamo export of the 6 x 384 encoder: export seconds, files, speed."""
    import io
    import tempfile
    import warnings

    from shoestring.inference import onnx_runtime as ortrt
    from shoestring.inference.engine import load_engine

    run = build_run(args.work, "6x384")
    engine = load_engine(run, truncate=True)
    fwd = engine.torch_forward()
    payloads = engine.prepare_embed(make_texts(256), "mean", True, True)
    chunks = [payloads[i : i + 32] for i in range(0, len(payloads), 32)]
    bench = Bench("serve_backends_exporters", args, precision="fp32", threads=args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("torchscript", "dynamo"):
            path = Path(tmp) / name / "model.onnx"
            path.parent.mkdir()
            t = time.perf_counter()
            if name == "torchscript":
                path.write_bytes(ortrt.export_bytes(engine.model, fwd, probe_id=engine.probe_id,
                                                    max_length=engine.max_length))
            else:
                from torch.export import Dim

                ids = torch.full((2, 8), engine.probe_id, dtype=torch.long)
                mask = torch.ones(2, 8, dtype=torch.bool)
                mask[1, 5:] = False
                b, s = Dim("batch"), Dim("sequence", max=engine.max_length)
                with warnings.catch_warnings(), torch.no_grad(), \
                        open(os.devnull, "w") as null:
                    warnings.simplefilter("ignore")
                    import contextlib

                    with contextlib.redirect_stdout(null):
                        torch.onnx.export(ortrt._Call(engine.model, fwd), (ids, mask), str(path),
                                          dynamo=True, input_names=list(ortrt.INPUTS),
                                          output_names=[ortrt.OUTPUT],
                                          dynamic_shapes={"ids": {0: b, 1: s},
                                                          "mask": {0: b, 1: s}})
            export_s = time.perf_counter() - t
            ortrt.quantize(path, path.with_name(ortrt.INT8_FILE))
            files = sorted(p.name for p in path.parent.iterdir())
            for file in (ortrt.FP32_FILE, ortrt.INT8_FILE):
                engine.set_forward(ortrt.OnnxForward(path.parent / file))
                r = statistics.median(rate(engine, chunks, args.seconds)
                                      for _ in range(args.repeats))
                rows.append({"exporter": name, "graph": file, "export_s": round(export_s, 1),
                             "files": " ".join(files), "sentences_per_s_b32": round(r, 1)})
                print(f"{name:>11} {file:>16}: export {export_s:.1f} s, {r:.1f} sentences/s "
                      f"at batch 32 (files: {' '.join(files)})  load "
                      f"{format_load(load_average())}", flush=True)
        engine.set_forward(fwd)
        r = statistics.median(rate(engine, chunks, args.seconds) for _ in range(args.repeats))
        rows.append({"exporter": "(torch eager)", "graph": "-", "export_s": 0, "files": "-",
                     "sentences_per_s_b32": round(r, 1)})
        print(f"torch eager: {r:.1f} sentences/s at batch 32", flush=True)
    bench.table(rows)
    bench.end()


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--seconds", type=float, default=2.0, help="per backend per round")
    ap.add_argument("--threads", type=int, default=None, help="torch and ONNX Runtime threads")
    ap.add_argument("--work", type=Path, default=Path("runs/bench/serve_backends"))
    ap.add_argument("--sweep-options", action="store_true")
    ap.add_argument("--exporters", action="store_true")
    add_repeats(ap, 3)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.sweep_options:
        sweep_options(args)
    elif args.exporters:
        exporters(args)
    else:
        throughput(args)


if __name__ == "__main__":
    main()
