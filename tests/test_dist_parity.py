"""Multi-process tests of shoestring.dist on CPU/gloo: every layout computes the
single-process losses, and a 3D checkpoint resumes on another layout.

Each torchrun launch runs several cases (tests/dist_driver.py) inside an outer subprocess
timeout. Tolerance: fp32, |Δloss| ≤ 1e-4 per step (observed ≤ 2e-6: only the order of
floating-point reductions differs between layouts).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from shoestring.config import load_config
from shoestring.dist.launch import torchrun_command

DRIVER = str(Path(__file__).with_name("dist_driver.py"))
STEPS = 4
SETS = ["model.hidden_size=64", "model.num_layers=4", "model.num_heads=4",
        "model.intermediate_size=128", f"train.steps={STEPS}", "train.batch_size=8",
        "train.precision=fp32", "train.log_every=1", "train.lr=1e-3", "train.threads=1"]
TOL = 1e-4


CLM_SETS = [*SETS, "model.objective=clm", "model.num_kv_heads=2"]  # Llama-style, GQA


def reference_losses(data_dir: Path, steps: int = STEPS, sets: list[str] = SETS) -> list[float]:
    """One process, plain PyTorch: the loop's math (same seed, batch order, masking, LR)."""
    from shoestring.data.datadir import DataDir
    from shoestring.data.loader import BatchLoader
    from shoestring.dist.trainer import _lr_factor, global_batch
    from shoestring.model import build_model
    from shoestring.train.objective import objective_for
    from shoestring.train.optim import build_optimizer

    cfg = load_config(None, sets)
    data = DataDir(data_dir)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.vocab_size)
    opt = build_optimizer(model, cfg.train)
    loader = BatchLoader(data.split("train", verify=False), cfg.train.batch_size,
                         cfg.train.seed, prefetch=0)
    obj = objective_for(cfg.model.objective, data.seq_len, data.vocab_size, data.special_ids,
                        cfg.train.mask_rate, cfg.model.sparse_prediction)
    gen = torch.Generator().manual_seed(cfg.train.seed)
    out = []
    for step in range(steps):
        lr = cfg.train.lr * _lr_factor(cfg, (step + 0.5) / cfg.train.steps)
        loss = obj.loss(model, global_batch(next(loader), obj, gen, 0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


def launch(nproc: int, cases: list[dict], common: dict, timeout: float
           ) -> subprocess.CompletedProcess:
    cmd = torchrun_command(nproc, [json.dumps(cases), json.dumps(common)], script=DRIVER)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def losses_of(run: Path) -> list[float]:
    return json.loads((run / "summary.json").read_text())["losses"]


def assert_close(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), (what, got, want)
    diffs = [abs(a - b) for a, b in zip(got, want)]
    assert max(diffs) <= TOL, f"{what}: {got} vs single-process {want} (max Δ {max(diffs):.2e})"


def check_memory_model(run: Path, data_dir: Path, case: dict) -> None:
    """The memory model's parameter/gradient/optimizer bytes equal the tensors the busiest
    rank really held after its first step (ZeRO-1: up to one parameter of imbalance, since
    ZeroRedundancyOptimizer assigns whole parameters to ranks)."""
    from shoestring.data.datadir import DataDir
    from shoestring.dist.layout import make_layout
    from shoestring.dist.memory import memory_per_rank

    got = json.loads((run / "summary.json").read_text())["memory_measured"]
    cfg = load_config(None, SETS)
    data = DataDir(data_dir)
    lay = make_layout(case["parallel"], zero=case.get("zero", 0), ac=case.get("ac", "none"),
                      pp_schedule=case.get("pp_schedule", "1f1b"),
                      microbatches=case.get("microbatches"))
    want = memory_per_rank(cfg.model, data.vocab_size, data.seq_len, 8 // lay.dp, lay,
                           param_dtype="fp32")
    assert got["params"] == want["params"], (run.name, got, want)
    assert got["grads"] == want["grads"], (run.name, got, want)
    if lay.zero == 1:
        largest = 8 * data.vocab_size * cfg.model.hidden_size
        assert want["optimizer"] <= got["optimizer"] <= want["optimizer"] + largest, (got, want)
    else:
        assert got["optimizer"] == want["optimizer"], (run.name, got, want)


@pytest.fixture(scope="module")
def reference(pydocs_dir: Path) -> list[float]:
    return reference_losses(pydocs_dir)


CASES_2 = [
    ("ddp", {"parallel": "dp=2"}),
    ("zero1", {"parallel": "dp=2", "zero": 1}),
    ("zero2", {"parallel": "dp=2", "zero": 2}),
    ("zero3+selective-ac", {"parallel": "dp=2", "zero": 3, "ac": "selective"}),
    ("tp2", {"parallel": "tp=2"}),
    ("pp2-gpipe", {"parallel": "pp=2", "pp_schedule": "gpipe"}),
    ("pp2-1f1b+full-ac", {"parallel": "pp=2", "pp_schedule": "1f1b", "ac": "full"}),
    ("pp2-interleaved", {"parallel": "pp=2", "pp_schedule": "interleaved", "microbatches": 4}),
]


def test_two_process_layouts_match_single_process(pydocs_dir: Path, tmp_path: Path,
                                                  reference: list[float]) -> None:
    cases = [{"output": str(tmp_path / name), **kw} for name, kw in CASES_2]
    proc = launch(2, cases, {"data": str(pydocs_dir), "sets": SETS}, timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name, kw in CASES_2:
        assert_close(losses_of(tmp_path / name), reference, name)
        check_memory_model(tmp_path / name, pydocs_dir, kw)


def test_3d_layout_matches_and_its_checkpoint_resumes_on_dp2(pydocs_dir: Path, tmp_path: Path,
                                                            reference: list[float]) -> None:
    run3d = tmp_path / "3d"
    proc = launch(8, [{"output": str(run3d), "parallel": "dp=2,tp=2,pp=2", "zero": 2,
                       "checkpoint_every": 2}],
                  {"data": str(pydocs_dir), "sets": SETS}, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_close(losses_of(run3d), reference, "dp=2,tp=2,pp=2 zero 2")
    check_memory_model(run3d, pydocs_dir, {"parallel": "dp=2,tp=2,pp=2", "zero": 2})
    ck = run3d / "dist_checkpoints" / "step_0000002"
    assert (ck / ".metadata").is_file() and (ck / "trainer.json").is_file()
    # the consolidated final/ is the single-device format (loads without any process group)
    from shoestring.train.rundir import load_final

    model, meta = load_final(run3d)
    assert meta["vocab_size"] > 0 and sum(p.numel() for p in model.parameters()) > 0

    resumed = tmp_path / "resumed"
    proc = launch(2, [{"output": str(resumed), "parallel": "dp=2", "resume": str(ck)}],
                  {"data": str(pydocs_dir), "sets": SETS}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_close(losses_of(resumed), reference[2:], "3D step 2 → resumed on dp=2")
    # and the two runs end with the same weights (up to reduction order)
    a, _ = load_final(run3d)
    b, _ = load_final(resumed)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-5), name


def test_bad_layout_fails_on_every_rank_before_any_collective(pydocs_dir: Path,
                                                             tmp_path: Path) -> None:
    proc = launch(2, [{"output": str(tmp_path / "bad"), "parallel": "tp=2",
                       "sets": [*SETS, "model.num_heads=1"]}],
                  {"data": str(pydocs_dir), "sets": SETS}, timeout=120)
    assert proc.returncode != 0
    # both ranks report the same clear error
    assert proc.stderr.count("tp=2 must divide model num_heads (1)") == 2, proc.stderr[-3000:]
    # ranks exit 2 with the message only (torchrun's own report follows; no frame of ours)
    assert "exitcode  : 2" in proc.stderr and "shoestring/dist/" not in proc.stderr
    assert not (tmp_path / "bad").exists()


@pytest.fixture(scope="module")
def clm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shoestring.config import DataConfig
    from shoestring.data.prep import prep

    out = tmp_path_factory.mktemp("clm") / "data"
    prep(["builtin:pydocs"], out, DataConfig(vocab_size=2000, seq_len=64, objective="clm"))
    return out


def test_decoder_tp_pp_zero3_match_single_process(clm_dir: Path, tmp_path: Path) -> None:
    """The Llama-style decoder (grouped-query attention, SwiGLU, RMSNorm) under TP=2 (GQA
    heads split), PP=2 and ZeRO-3."""
    want = reference_losses(clm_dir, sets=CLM_SETS)
    cases = [("tp2", {"parallel": "tp=2"}), ("pp2", {"parallel": "pp=2"}),
             ("zero3", {"parallel": "dp=2", "zero": 3})]
    proc = launch(2, [{"output": str(tmp_path / n), **kw} for n, kw in cases],
                  {"data": str(clm_dir), "sets": CLM_SETS}, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name, _ in cases:
        assert_close(losses_of(tmp_path / name), want, f"decoder {name}")


def test_cli_train_parallel_then_resume(pydocs_dir: Path, tmp_path: Path) -> None:
    """`torchrun -m shoestring train --parallel ...`, then `--resume` with a larger budget on
    another layout: the newest distributed checkpoint is picked up."""
    run = tmp_path / "run"
    common = ["-d", str(pydocs_dir), "-o", str(run),
              *[x for s in SETS if not s.startswith("train.steps") for x in ("--set", s)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    first = subprocess.run(
        torchrun_command(2, ["train", *common, "--steps", "2", "--parallel", "pp=2"],
                         module="shoestring"), capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 steps on" in first.stdout
    assert (run / "dist_checkpoints" / "step_0000002" / ".metadata").is_file()
    second = subprocess.run(
        torchrun_command(2, ["train", *common, "--steps", "4", "--parallel", "dp=2",
                             "--resume"], module="shoestring"),
        capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert (run / "final" / "model.safetensors").is_file()
