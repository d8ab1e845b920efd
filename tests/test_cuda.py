"""Every CUDA path, on a real GPU (`make gpu-check`, docs/gpu.md): training with every feature
on, DCP resume bit for bit, SIGTERM, DDP and FSDP2 on NCCL, the decoder, the Hugging Face
export's logits from weights trained on the GPU, serving under concurrent load, DP-SGD.

Marked ``cuda``; on a machine without a CUDA device every test skips and says why (the CPU
suite pays only this module's import). The same promises are tested on CPU elsewhere
(test_train_loop.py, test_dist_parity.py, test_hf_export.py, test_serve.py,
test_privacy_dp.py); here they are asserted with the device, dtype and kernels a GPU run
takes, so that a CUDA-only bug cannot hide behind the CPU suite.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

# cuBLAS picks deterministic kernels only with a fixed workspace, which must be set before
# the first cuBLAS call of the process (the bit-for-bit resume test needs it).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest  # noqa: E402
import torch  # noqa: E402

from conftest import (  # noqa: E402
    SMALL_DATA, run_cli, sigterm_after_records, tiny_config, torchrun_command)

NO_CUDA = "no CUDA device (torch.cuda.is_available() is False): run `make gpu-check` on a GPU"
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]

# Every feature of the one-process trainer at once (the list): bf16 autocast, the
# kernel `auto` picks, compile, accumulation (micro 8 of 32), the batch ramp, periodic
# validation, and the non-finite guard armed.
EVERYTHING = dict(steps=24, precision="bf16", attention="auto", compile=True,
                  micro_batch_size=8, batch_ramp=0.5, val_every=0.25, val_sequences=16,
                  log_every=2, max_nonfinite=3, tensorboard=False)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _gpu() -> str:
    return torch.cuda.get_device_name(0)


@pytest.fixture(scope="module")
def clm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:pydocs prepared for the decoder (same vocabulary and length as pydocs_dir)."""
    from shoestring.prep.prep import prep

    out = tmp_path_factory.mktemp("pydocs-clm") / "data"
    prep(["builtin:pydocs"], out, SMALL_DATA.model_copy(update={"objective": "clm"}))
    return out


@pytest.fixture(scope="module")
def mlm_run(pydocs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One run with every feature on (shared by the export and serving tests)."""
    from shoestring.train.loop import train

    run = tmp_path_factory.mktemp("cuda-mlm") / "run"
    torch.cuda.reset_peak_memory_stats()
    summary = train(tiny_config(**EVERYTHING), pydocs_dir, run)
    summary["_peak_bytes"] = torch.cuda.max_memory_allocated()
    return run, summary


@pytest.fixture(scope="module")
def clm_run(clm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from shoestring.train.loop import train

    from shoestring.config import Config, ModelConfig, TrainConfig

    cfg = Config(data=SMALL_DATA.model_copy(update={"objective": "clm"}),
                 model=ModelConfig(objective="clm", hidden_size=64, num_layers=2, num_heads=4,
                                   num_kv_heads=2, intermediate_size=128),  # Llama-style GQA
                 train=TrainConfig(budget=None, **EVERYTHING))
    run = tmp_path_factory.mktemp("cuda-clm") / "run"
    return run, train(cfg, clm_dir, run)


# --------------------------------------------------------------------------- training


def test_training_with_every_feature_runs_on_the_gpu(mlm_run: tuple[Path, dict]) -> None:
    run, s = mlm_run
    assert s["device"] == _gpu() and s["dtype"] == "bfloat16"
    assert s["attention"] == "sdpa" and s["compiled"] is True  # what auto picks on CUDA
    assert s["steps"] == 24 and s["skipped_steps"] == 0
    assert s["final_train_loss"] < s["first_loss"] - 0.5  # it learned
    train_recs = [r for r in _records(run) if "loss" in r]
    sizes = [r["batch_size"] for r in train_recs]
    assert sizes[0] == 8 and sizes[-1] == 32 and sizes == sorted(sizes)  # ramp + accumulation
    assert len([r for r in _records(run) if "val_loss" in r]) >= 4
    assert all(math.isfinite(r["val_loss"]) for r in _records(run) if "val_loss" in r)
    assert all(0 < r["mfu"] < 1 for r in train_recs)
    if s["datasheet_device"]:  # a card in the planner's table: MFU against its datasheet too
        assert 0 < s["mfu_datasheet"] < 1
    mem = s["memory_measured"]
    print(f"\n[cuda] {s['device']}: first step {s['first_step_s']} s (compile), "
          f"{s['tokens_per_s']:,.0f} tok/s, peak allocated {s['_peak_bytes'] / 2**20:.0f} MiB, "
          f"measured state {mem}")


def test_the_optimizer_steps_cuda_parameters_with_multi_tensor_kernels() -> None:
    from shoestring.model import build_model
    from shoestring.train.optim import build_optimizer

    cfg = tiny_config(steps=1)
    model = build_model(cfg.model, 500).cuda()
    opt = build_optimizer(model, cfg.train)
    assert all(g["fused"] for g in opt.param_groups)  # plain CUDA parameters: one kernel
    before = [p.detach().clone() for p in model.parameters()]
    ids = torch.randint(5, 500, (4, 32), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(ids).float().logsumexp(-1).mean().backward()
    opt.step()
    assert all(p.is_cuda for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    state = next(iter(opt.state.values()))
    assert state["exp_avg"].is_cuda


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_our_attention_runs_on_the_flash_kernel(objective: str) -> None:
    """bf16 with no padding mask is what training runs: SDPA must be able to take its flash
    kernel for it (restricted to that backend, an unsupported call raises)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from shoestring.config import ModelConfig
    from shoestring.model import build_model

    cfg = ModelConfig(objective=objective, hidden_size=256, num_layers=2, num_heads=4,
                      intermediate_size=512)
    model = build_model(cfg, 1000).cuda()
    ids = torch.randint(5, 1000, (8, 128), device="cuda")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        model(ids).float().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_nonfinite_losses_stop_a_bf16_cuda_run(pydocs_dir: Path, tmp_path: Path) -> None:
    from shoestring.errors import ShoestringError
    from shoestring.train.loop import train

    cfg = tiny_config(steps=50, lr=1e30, precision="bf16", max_nonfinite=3, grad_clip=0.0,
                      schedule="constant", warmup=0.0)
    with pytest.raises(ShoestringError, match="non-finite.*3 steps in a row"):
        train(cfg, pydocs_dir, tmp_path / "nan")
    assert not (tmp_path / "nan" / "final").exists()


@pytest.fixture()
def deterministic():  # noqa: ANN201
    """Deterministic CUDA kernels where torch has them (scatter/gather backward, flash
    backward): two runs of the same steps must then agree bit for bit."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)


def test_dcp_checkpoint_resumes_bit_for_bit_on_cuda(pydocs_dir: Path, tmp_path: Path,
                                                    deterministic: None) -> None:
    from shoestring.rundir import RunDir
    from shoestring.train.checkpoint import latest_checkpoint
    from shoestring.train.loop import train

    kw = dict(steps=16, log_every=1, checkpoint_every="8steps", keep_checkpoints=5,
              val_every=0.25, val_sequences=8, precision="bf16", tensorboard=False)
    train(tiny_config(**kw), pydocs_dir, tmp_path / "whole")
    cut = tmp_path / "cut"
    train(tiny_config(**kw), pydocs_dir, cut)
    while latest_checkpoint(cut).step > 8:  # as if it had died right after step 8
        shutil.rmtree(RunDir(cut).checkpoints()[-1])
    shutil.rmtree(cut / "final")
    summary = train(tiny_config(**kw), pydocs_dir, cut, resume=True)
    assert summary["resumed"] and summary["steps"] == 16 and summary["device"] == _gpu()
    whole = [(r["step"], r.get("loss"), r.get("val_loss")) for r in _records(tmp_path / "whole")]
    again = [(r["step"], r.get("loss"), r.get("val_loss")) for r in _records(cut)]
    assert again == whole
    a, _ = RunDir(tmp_path / "whole").load_final()
    b, _ = RunDir(cut).load_final()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_sigterm_checkpoints_a_cuda_run_and_resume_finishes(pydocs_dir: Path,
                                                            tmp_path: Path) -> None:
    from shoestring.train.checkpoint import latest_checkpoint

    run = tmp_path / "run"
    args = ["train", "--data", str(pydocs_dir), "-o", str(run), "--steps", "100000",
            "--set", "model.hidden_size=64", "--set", "model.num_layers=2",
            "--set", "model.num_heads=2", "--set", "model.intermediate_size=128",
            "--set", "train.log_every=1", "--set", "train.tensorboard=false",
            "--set", "train.precision=bf16"]
    proc = subprocess.Popen([sys.executable, "-m", "shoestring", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    stderr = sigterm_after_records(proc, run, 3, wait=180)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.step >= 3
    r = run_cli("train", "--data", str(pydocs_dir), "-o", str(run), "--resume",
                "--set", f"train.steps={ckpt.step + 2}", "--set", "train.budget=null")
    assert r.returncode == 0, r.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == ckpt.step + 2 and summary["device"] == _gpu()


# --------------------------------------------------------------------------- NCCL


def test_ddp_and_fsdp2_at_world_size_one_on_nccl(pydocs_dir: Path) -> None:
    driver = str(Path(__file__).with_name("cuda_dist_driver.py"))
    sets = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=2",
            "model.intermediate_size=128", "train.batch_size=16", "train.lr=1e-3"]
    cmd = torchrun_command(1, [str(pydocs_dir), json.dumps(sets)], script=driver)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["backend"] == "nccl" and res["world_size"] == 1 and res["device"] == _gpu()
    for wrap in ("ddp", "fsdp2"):
        plain, got = res["fp32"]["plain"], res["fp32"][wrap]
        assert max(abs(a - b) for a, b in zip(plain, got)) <= 1e-4, (wrap, plain, got)
        plain, got = res["bf16"]["plain"], res["bf16"][wrap]
        assert all(math.isfinite(x) for x in got)
        assert max(abs(a - b) for a, b in zip(plain, got)) <= 2e-2, (wrap, "bf16", plain, got)
    assert res["fp32"]["plain"][-1] < res["fp32"]["plain"][0]


# --------------------------------------------------------------------------- the decoder


def test_the_decoder_trains_and_generates_on_cuda(clm_run: tuple[Path, dict]) -> None:
    from shoestring.rundir import RunDir

    run, s = clm_run
    assert s["objective"] == "clm" and s["device"] == _gpu() and s["compiled"] is True
    assert s["final_train_loss"] < s["first_loss"] - 0.5
    model, meta = RunDir(run).load_final()
    model = model.cuda()
    ids = torch.randint(5, meta["vocab_size"], (2, 7), device="cuda")
    with torch.no_grad():
        expected = ids
        for _ in range(10):  # greedy by recomputing everything: what the KV cache must equal
            nxt = model(expected)[:, -1].argmax(-1, keepdim=True)
            expected = torch.cat([expected, nxt], dim=1)
    got = model.generate(ids, 10, temperature=0)
    assert got.is_cuda and torch.equal(got, expected)


# --------------------------------------------------------------------------- export


def _export_parity(run: Path, out: Path, auto_class: str, ids: torch.Tensor) -> float:
    """Max |logit difference| between our model and transformers' load of our export, both
    on the GPU in fp32, for weights trained on the GPU."""
    import transformers

    from shoestring.rundir import RunDir

    r = run_cli("export", str(run), "-o", str(out))
    assert r.returncode == 0, r.stderr
    ours, _ = RunDir(run).load_final()
    theirs = getattr(transformers, auto_class).from_pretrained(out).eval()
    ours, theirs, ids = ours.cuda(), theirs.cuda(), ids.cuda()
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # true fp32: no TF32 on either side
    try:
        with torch.no_grad():
            a, b = ours(ids), theirs(input_ids=ids).logits
    finally:
        torch.set_float32_matmul_precision(before)
    assert a.shape == b.shape and a.abs().max() > 0.5
    return (a - b).abs().max().item()


def test_hf_export_of_cuda_weights_gives_our_logits(mlm_run: tuple[Path, dict],
                                                    clm_run: tuple[Path, dict],
                                                    tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, SMALL_DATA.vocab_size, (2, 48), generator=gen)
    mlm = _export_parity(mlm_run[0], tmp_path / "mlm", "AutoModelForMaskedLM", ids)
    clm = _export_parity(clm_run[0], tmp_path / "clm", "AutoModelForCausalLM", ids)
    print(f"\n[cuda] export parity on the GPU (fp32): ModernBERT {mlm:.2e}, Llama {clm:.2e}")
    # fp32 on the GPU: kernels differ between the two implementations (SDPA backends, fused
    # norms), so not bit for bit as on CPU, but far inside what a wrong mapping gives (>0.1).
    assert mlm <= 2e-3 and clm <= 2e-3


# --------------------------------------------------------------------------- serving


def test_serve_on_cuda_under_concurrent_load(mlm_run: tuple[Path, dict]) -> None:
    import httpx

    from shoestring.rundir import RunDir
    from shoestring.serve.server import ServerThread, load
    from shoestring.serve.settings import make_settings

    run, _ = mlm_run
    settings = make_settings(port=0, max_wait_ms=20, max_queue=1024)
    srv = ServerThread(load(run, settings), settings).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            info = c.get("/v1/model").json()
            assert info["device"].startswith("cuda"), info
            texts = [f"the [MASK] of list number {i}" for i in range(64)]
            alone = c.post("/v1/fill-mask", json={"inputs": texts[0], "top_k": 3}).json()
            embed_alone = c.post("/v1/embed", json={"inputs": texts[1]}).json()["embeddings"][0]

        async def fire() -> tuple[list, list]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=120,
                                         limits=httpx.Limits(max_connections=128)) as ac:
                fills = [ac.post("/v1/fill-mask", json={"inputs": t, "top_k": 3}) for t in texts]
                embeds = [ac.post("/v1/embed", json={"inputs": t}) for t in texts]
                rs = await asyncio.gather(*fills, *embeds)
            return rs[:len(texts)], rs[len(texts):]

        fills, embeds = asyncio.run(fire())
        assert [r.status_code for r in fills + embeds] == [200] * (2 * len(texts))
        m = fills[0].json()["results"][0][0]  # the first input's first [MASK]
        assert [c["id"] for c in m["candidates"]] == \
            [c["id"] for c in alone["results"][0][0]["candidates"]]
        vec = torch.tensor(embeds[1].json()["embeddings"][0])
        assert math.isclose(float(vec.norm()), 1.0, rel_tol=1e-3)
        assert torch.allclose(vec, torch.tensor(embed_alone), atol=2e-2)  # batched vs alone
        # the served fill-mask agrees with the model run directly on CPU in fp32
        from tokenizers import Tokenizer

        model, _ = RunDir(run).load_final()
        tok = Tokenizer.from_file(str(run / "final" / "tokenizer.json"))
        ids = tok.encode(texts[0]).ids
        with torch.no_grad():
            probs = model(torch.tensor([ids])).softmax(-1)[0]
        best = m["candidates"][0]
        assert abs(best["score"] - float(probs[m["position"], best["id"]])) <= 2e-2
    finally:
        srv.stop()


# --------------------------------------------------------------------------- DP-SGD


def test_dp_sgd_fine_tuning_on_cuda(mlm_run: tuple[Path, dict], tmp_path: Path) -> None:
    pytest.importorskip("opacus", reason="opacus is not installed (make gpu-wheels carries it)")
    from test_finetune import synthetic

    run, _ = mlm_run
    for name, n, seed in (("train", 96, 7), ("dev", 40, 8)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(
            json.dumps({"text": e.a, "label": e.label}) for e in synthetic(n, seed)))
    spec = f"train={tmp_path}/train.jsonl,dev={tmp_path}/dev.jsonl,text=text,label=label"
    out = tmp_path / "out"
    r = run_cli("eval", str(run), "--task", spec, "--seeds", "1", "-o", str(out),
                "--dp-epsilon", "3", "--dp-delta", "1e-3", timeout=600)
    assert r.returncode == 0, r.stderr
    results = json.loads((out / "results.json").read_text())
    task = next(iter(results["tasks"].values()))
    [seed] = task["seeds"]
    assert seed["privacy"]["epsilon_spent"] <= 3.0 and seed["privacy"]["delta"] == 1e-3
    assert task["device"] == _gpu(), "the private fine-tuning did not run on the GPU"
