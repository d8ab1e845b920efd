"""Inference backends (inference/backends.py, inference/onnx_runtime.py): a real tiny model,
exported to ONNX and run by ONNX Runtime fp32 and int8, against PyTorch fp32 within the
accuracy gate; the ONNX cache; auto's choice and its figures; a real server over sockets;
``export --format onnx`` read back by a plain ``onnxruntime.InferenceSession``."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from conftest import fails_cleanly, run_cli
from test_serve import announced, run_dir, save_tiny_decoder, start  # noqa: F401 (fixture)

from shoestring.errors import ShoestringError
from shoestring.inference import backends
from shoestring.inference.engine import load_engine

pytest.importorskip("onnxruntime")

TEXTS = ["a fine module", "this raises an error and fails badly when the list is empty",
         "x", "Return the number of items in a container, or raise TypeError."]
MASKED = ["the [MASK] of the list", "raise a [MASK] when the file is missing"]


def embed(engine, texts: list[str]) -> np.ndarray:
    return np.stack(engine.run(("embed",), engine.prepare_embed(texts, "mean", True, True)))


def fill(engine, texts: list[str]) -> list:
    return engine.run(("fill-mask",), engine.prepare_fill_mask(texts, 3, True))


@pytest.fixture(scope="module")
def engines(run_dir: Path) -> dict:
    return {b: load_engine(run_dir, max_length=64, backend=b)
            for b in ("torch", "onnx", "onnx-int8")}


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_each_backend_answers_as_torch_fp32_within_the_gate(engines: dict, backend: str) -> None:
    ref, eng = engines["torch"], engines[backend]
    assert eng.backend.name == backend and eng.backend.requested == backend
    gate = eng.backend.gates[backend]
    # the run's own validation rows are the sample (its data dir is at hand)
    assert gate.passed and gate.source == "validation" and gate.samples == backends.GATE_SAMPLES
    assert gate.cosine_min >= backends.MIN_COSINE and gate.cosine_mean >= gate.cosine_min
    cos = (embed(eng, TEXTS) * embed(ref, TEXTS)).sum(-1)
    assert cos.min() >= backends.MIN_COSINE
    if backend == "onnx":
        assert cos.min() > 0.99999  # the same fp32 arithmetic, up to summation order
    for got, want in zip(fill(eng, MASKED), fill(ref, MASKED)):
        g, w = got[0]["candidates"][0], want[0]["candidates"][0]
        assert g["id"] == w["id"]
        assert g["score"] == pytest.approx(w["score"], rel=1e-3 if backend == "onnx" else 0.05)


def test_longest_input_served_runs_on_onnx(engines: dict) -> None:
    """The exported graph takes the full --max-length (its position table is primed to it)."""
    ref, eng = engines["torch"], engines["onnx"]
    ids = [[2] + [7 + i % 50 for i in range(62)] + [3]]
    got = eng.run(("embed",), [(ids[0], "mean", True)])[0]
    want = ref.run(("embed",), [(ids[0], "mean", True)])[0]
    assert float(got @ want) > 0.99999


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_batched_answers_equal_single_ones_on_onnx(engines: dict, backend: str) -> None:
    eng = engines[backend]
    batched = embed(eng, TEXTS)
    single = np.stack([embed(eng, [t])[0] for t in TEXTS])
    if backend == "onnx":  # padding is masked: batch-mates change nothing
        np.testing.assert_allclose(batched, single, atol=2e-5)
    else:  # int8 quantizes each call's activations with one scale: batch-mates move it a little
        assert (batched * single).sum(-1).min() > 0.999


def test_classifier_backends_agree_with_torch(run_dir: Path, tmp_path: Path) -> None:
    from shoestring.classifier import SequenceClassifier, save_classifier
    from shoestring.rundir import RunDir

    torch.manual_seed(0)
    encoder, meta = RunDir(run_dir).load_final()
    folder = save_classifier(tmp_path / "clf", SequenceClassifier(encoder, num_labels=3).eval(),
                             meta, run_dir / "final" / "tokenizer.json",
                             labels=["a", "b", "c"], problem="classification", max_length=64)
    ref = load_engine(folder)
    eng = load_engine(folder, backend="onnx-int8")
    gate = eng.backend.gates["onnx-int8"]
    assert gate.source == "pydocs" and gate.agreement >= backends.MIN_AGREEMENT
    assert eng.describe()["backend"]["gate"]["onnx-int8"]["agreement"] == gate.agreement
    payloads = ref.prepare_classify(TEXTS, None, True)
    for g, w in zip(eng.run(("classify",), payloads), ref.run(("classify",), payloads)):
        assert g["label"] == w["label"]
        assert g["score"] == pytest.approx(w["score"], abs=0.02)

    encoder, meta = RunDir(run_dir).load_final()
    reg = save_classifier(tmp_path / "reg", SequenceClassifier(encoder, num_labels=1).eval(),
                          meta, run_dir / "final" / "tokenizer.json", labels=None,
                          problem="regression", max_length=64)
    ref, eng = load_engine(reg), load_engine(reg, backend="onnx")
    assert eng.backend.gates["onnx"].passed and eng.backend.gates["onnx"].max_abs < 1e-4
    payloads = ref.prepare_classify(TEXTS, None, True)
    for g, w in zip(eng.run(("classify",), payloads), ref.run(("classify",), payloads)):
        assert g["value"] == pytest.approx(w["value"], abs=1e-4)


def test_onnx_cache_is_reused_and_rebuilt_when_the_weights_change(run_dir: Path,
                                                                  tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("onnx", "checkpoints"))
    first = load_engine(run, max_length=64, backend="onnx")
    info = first.backend.onnx
    folder = Path(info["folder"])
    assert not info["cached"] and info["export_s"] > 0 and folder.parent == run / "onnx"
    stamp = (folder / "model.onnx").stat().st_mtime_ns
    again = load_engine(run, max_length=64, backend="onnx")
    assert again.backend.onnx["cached"] and again.backend.onnx["folder"] == str(folder)
    assert (folder / "model.onnx").stat().st_mtime_ns == stamp  # not exported again
    old = embed(again, TEXTS)

    weights = run / "final" / "model.safetensors"
    state = load_file(weights)
    name = next(k for k in state if "Wqkv" in k)
    state[name] = state[name] * 3.0
    save_file(state, weights, metadata={"format": "pt"})
    changed = load_engine(run, max_length=64, backend="onnx")
    assert not changed.backend.onnx["cached"] and changed.backend.onnx["folder"] != str(folder)
    new_torch = load_engine(run, max_length=64)
    got = embed(changed, TEXTS)
    assert (got * embed(new_torch, TEXTS)).sum(-1).min() > 0.99999  # the new weights' answers
    assert (got * old).sum(-1).min() < 0.9999  # not the stale graph's


def test_onnx_cache_moves_home_when_the_model_folder_cannot_take_it(
        run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("onnx", "checkpoints"))
    monkeypatch.setenv("SHOESTRING_HOME", str(tmp_path / "home"))
    # a file where the cache folder would go: as unwritable as a read-only mount, and root
    # (these tests' usual user in containers) cannot write past a chmod
    (run / "onnx").write_text("not a folder")
    eng = load_engine(run, max_length=64, backend="onnx")
    assert eng.backend.onnx["folder"].startswith(str(tmp_path / "home" / "onnx"))
    assert "is not writable" in eng.backend.onnx["note"]
    again = load_engine(run, max_length=64, backend="onnx")
    assert again.backend.onnx["cached"] and again.backend.onnx["folder"] == eng.backend.onnx["folder"]


def test_a_repository_version_is_never_written_to(run_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from shoestring.model_repository import ModelRepository

    monkeypatch.setenv("SHOESTRING_HOME", str(tmp_path / "home"))
    repo = ModelRepository(tmp_path / "home" / "models")
    version, _ = repo.push(run_dir, "bert")
    eng = load_engine(repo.resolve("bert").path, max_length=64, backend="onnx")
    assert "model repository version" in eng.backend.onnx["note"]
    assert eng.backend.onnx["folder"].startswith(str(tmp_path / "home" / "onnx"))
    repo.verify(repo.resolve("bert"))  # its files are as pushed


def test_auto_takes_the_fastest_that_passes_and_shows_every_figure(run_dir: Path) -> None:
    eng = load_engine(run_dir, max_length=64, backend="auto")
    b = eng.backend.as_dict()
    assert set(b["seconds"]) == {"torch", "onnx", "onnx-int8"}
    sec = b["seconds"]
    passing = [n for n in sec if n == "torch" or (
        b["gate"][n]["passed"] and sec["torch"] >= backends.MIN_GAIN * sec[n])]
    assert b["name"] == min(passing, key=sec.get) and b["requested"] == "auto"
    assert b["gate"]["min_cosine"] == backends.MIN_COSINE
    line = eng.backend.summary()
    assert line.startswith(f"backend {b['name']}: fastest here (")
    for n in ("onnx", "onnx-int8"):
        assert f"{n} cosine min {b['gate'][n]['cosine_min']:.4f}" in line
    assert eng.describe()["backend"] == b


def test_a_candidate_under_the_gate_is_not_chosen_and_an_asked_one_warns(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "MIN_COSINE", 1.5)  # no candidate can reach it
    auto = load_engine(run_dir, max_length=64, backend="auto")
    assert auto.backend.name == "torch"
    assert "onnx, onnx-int8 failed the gate" in auto.backend.why
    assert "FAILS the gate" in auto.backend.summary()
    asked = load_engine(run_dir, max_length=64, backend="onnx-int8")
    assert asked.backend.name == "onnx-int8"  # served as asked, with the figures in a warning
    assert "fails the accuracy gate" in asked.backend.warning
    assert "cosine min" in asked.backend.warning and "min cosine >= 1.5" in asked.backend.warning


def test_a_decoder_stays_on_torch(run_dir: Path, tmp_path: Path) -> None:
    clm = save_tiny_decoder(run_dir, tmp_path / "clm")
    auto = load_engine(clm, backend="auto")
    assert auto.backend.name == "torch" and "decoders run on PyTorch" in auto.backend.why
    with pytest.raises(ShoestringError, match="runs on PyTorch only") as e:
        load_engine(clm, backend="onnx")
    assert e.value.where == "--backend"


def test_server_over_sockets_on_onnx_int8(run_dir: Path, engines: dict) -> None:
    with start(run_dir, backend="onnx-int8", max_length=64) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/embed", json={"inputs": TEXTS})
        assert r.status_code == 200, r.text
        got = np.array(r.json()["embeddings"])
        info = c.get("/v1/model").json()
    assert (got * embed(engines["torch"], TEXTS)).sum(-1).min() >= backends.MIN_COSINE
    assert info["backend"]["name"] == "onnx-int8"
    assert info["backend"]["gate"]["onnx-int8"]["passed"] is True


def test_cli_serve_announces_the_backend_and_its_figures(run_dir: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "shoestring", "serve", str(run_dir),
                             "--port", "0", "--max-length", "64", "--backend", "onnx-int8"],
                            stderr=subprocess.PIPE, text=True)
    try:
        m = announced(proc, r"serving encoder .*\[(backend onnx-int8: [^\]]*)\] on "
                      r"(http://127\.0\.0\.1:\d+)")
        assert m, "no ready line with the backend"
        assert "as asked; vs torch fp32: onnx-int8 cosine min" in m.group(1)
        r = httpx.post(m.group(2) + "/v1/embed", json={"inputs": "a fine module"}, timeout=60)
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_refuses_an_unknown_backend_and_format(run_dir: Path, tmp_path: Path) -> None:
    fails_cleanly(run_cli("serve", str(run_dir), "--backend", "tensorrt"), "--backend",
                  "onnx-int8")
    fails_cleanly(run_cli("export", str(run_dir), "-o", str(tmp_path / "x"), "--format", "gguf"),
                  "--format", "onnx")


def test_export_format_onnx_loads_in_plain_onnxruntime(run_dir: Path, tmp_path: Path,
                                                       engines: dict) -> None:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    out = tmp_path / "onnx"
    r = run_cli("export", str(run_dir), "-o", str(out), "--format", "onnx")
    assert r.returncode == 0, r.stderr
    desc = json.loads((out / "onnx.json").read_text())
    assert desc["kind"] == "encoder" and set(desc["inputs"]) == {"input_ids", "attention_mask"}
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    encs = [tok.encode(t).ids for t in TEXTS]
    width = max(map(len, encs))
    ids = np.array([e + [desc["pad_id"]] * (width - len(e)) for e in encs], dtype=np.int64)
    mask = np.array([[i < len(e) for i in range(width)] for e in encs])
    want = embed(engines["torch"], TEXTS)
    for name, floor in (("model.onnx", 0.99999), ("model.int8.onnx", backends.MIN_COSINE)):
        sess = ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        (hidden,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        pooled /= np.linalg.norm(pooled, axis=-1, keepdims=True)
        assert (pooled * want).sum(-1).min() > floor, name
