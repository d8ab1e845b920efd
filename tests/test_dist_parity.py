"""Multi-process tests of the one trainer on CPU/gloo: every layout computes the one-process
losses with gradient accumulation and batch ramp on, validation and MFU are recorded under
every layout, checkpoints resume on another layout, a non-finite loss on one rank is skipped
on all, SIGTERM checkpoints every rank, and a plan for two devices trains as printed.

Each torchrun launch runs several cases (tests/dist_driver.py) inside an outer subprocess
timeout. Tolerance (docs/distributed.md): fp32, |Δloss| ≤ 1e-4 per step (observed ≤ 1e-5:
only the order of floating-point reductions differs between layouts).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
import torch

from conftest import sigterm_after_records, torchrun_command
from shoestring.config import load_config

# every case launches torchrun (2-4 processes on gloo): minutes in all, so `make test-all`
pytestmark = pytest.mark.heavy

DRIVER = str(Path(__file__).with_name("dist_driver.py"))
STEPS = 4
MODEL = ["model.hidden_size=64", "model.num_layers=4", "model.num_heads=4",
         "model.intermediate_size=128"]
TRAIN = [f"train.steps={STEPS}", "train.batch_size=8", "train.precision=fp32",
         "train.log_every=1", "train.lr=1e-3", "train.threads=1", "train.tensorboard=false",
         "train.checkpoint_every=null"]
PLAIN = [*MODEL, *TRAIN, "train.val_every=0"]
# Gradient accumulation and batch ramp on: a micro-step is 4 sequences in every layout (one
# process: 1 × 4; dp=2: 2 × 2), so the ramp runs 4, 4, 8, 8 sequences with 1, 1, 2, 2
# micro-steps; validation at half the budget and at the end.
SETS = [*MODEL, *TRAIN, "train.batch_ramp=0.5", "train.val_every=0.5", "train.val_sequences=16"]
CLM_SETS = [*SETS, "model.objective=clm", "model.num_kv_heads=2"]  # Llama-style, GQA
TOL = 1e-4


def micro(dp: int) -> list[str]:
    return [f"train.micro_batch_size={4 // dp}"]


@pytest.fixture(autouse=True)
def _keep_threads():  # noqa: ANN202
    """In-process runs set train.threads=1; give the rest of the suite its threads back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def plain_pytorch_losses(data_dir: Path, sets: list[str]) -> list[float]:
    """One process, plain PyTorch: the loop's math (same seed, batch order, masking, LR),
    written out independently of the trainer."""
    from shoestring.data.datadir import DataDir
    from shoestring.data.loader import BatchLoader
    from shoestring.model import build_model
    from shoestring.train.objectives import objective_for
    from shoestring.train.optim import build_optimizer
    from shoestring.train.schedule import lr_factor

    cfg = load_config(None, sets)
    data = DataDir(data_dir)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.vocab_size)
    opt = build_optimizer(model, cfg.train)
    loader = BatchLoader(data.split("train", verify=False), cfg.train.batch_size,
                         cfg.train.seed, prefetch=0)
    obj = objective_for(cfg.model.family, data.seq_len, data.vocab_size, data.special_ids,
                        cfg.train.mask_rate, cfg.model.sparse_prediction)
    gen = torch.Generator().manual_seed(cfg.train.seed)
    out = []
    for step in range(cfg.train.steps):
        lr = cfg.train.lr * lr_factor(cfg.train, (step + 0.5) / cfg.train.steps)
        loss = obj.loss(model, obj.make_batch(next(loader), gen))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


def one_process(data_dir: Path, run: Path, sets: list[str]) -> Path:
    from shoestring.train.loop import train

    train(load_config(None, sets), data_dir, run)
    return run


def launch(nproc: int, cases: list[dict], common: dict, timeout: float,
           monitor_interval: float | None = None) -> subprocess.CompletedProcess:
    cmd = torchrun_command(nproc, [json.dumps(cases), json.dumps(common)], script=DRIVER)
    if monitor_interval is not None:  # how long torchrun waits before stopping the survivors
        cmd.insert(3, f"--monitor-interval={monitor_interval}")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def failure(proc: subprocess.CompletedProcess) -> str:
    """What a failed launch printed that matters: every rank's `error:` line (torchrun's
    own report of the failed children fills the tail), then the tail."""
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error")]
    return "\n".join([*errors, proc.stderr[-3000:]])


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def losses_of(run: Path) -> list[float]:
    return [r["loss"] for r in records(run) if "loss" in r]


def val_losses_of(run: Path) -> list[float]:
    return [r["val_loss"] for r in records(run) if "val_loss" in r]


def assert_close(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), (what, got, want)
    diffs = [abs(a - b) for a, b in zip(got, want)]
    assert max(diffs) <= TOL, f"{what}: {got} vs one process {want} (max Δ {max(diffs):.2e})"


def assert_same_run(run: Path, ref: Path, what: str) -> None:
    """Same training and validation losses as the one-process run, with the batch ramp's
    sizes, MFU and the layout in the records and one summary schema."""
    assert_close(losses_of(run), losses_of(ref), what)
    assert_close(val_losses_of(run), val_losses_of(ref), f"{what} (validation)")
    train_recs = [r for r in records(run) if "loss" in r]
    assert [r["batch_size"] for r in train_recs] == [4, 4, 8, 8], what
    assert all(0 < r["mfu"] < 1 and r["tokens_per_s"] > 0 for r in train_recs), what
    summary = json.loads((run / "summary.json").read_text())
    want_keys = set(json.loads((ref / "summary.json").read_text()))
    assert set(summary) == want_keys, (what, want_keys ^ set(summary))
    assert summary["world_size"] > 1 and len(summary["mfu_per_device"]) == summary["world_size"]
    assert (run / "final" / "model.safetensors").is_file()


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
    want = memory_per_rank(cfg.model, data.vocab_size, data.seq_len, 4 // lay.dp, lay,
                           param_dtype="fp32")
    assert got["params"] == want["params"], (run.name, got, want)
    assert got["grads"] == want["grads"], (run.name, got, want)
    if lay.zero == 1:
        largest = 8 * data.vocab_size * cfg.model.hidden_size
        assert want["optimizer"] <= got["optimizer"] <= want["optimizer"] + largest, (got, want)
    else:
        assert got["optimizer"] == want["optimizer"], (run.name, got, want)


@pytest.fixture(scope="module")
def reference(pydocs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process run with accumulation and ramp: what every layout must reproduce."""
    return one_process(pydocs_dir, tmp_path_factory.mktemp("ref") / "one", [*SETS, *micro(1)])


def test_one_process_trainer_is_plain_pytorch(pydocs_dir: Path, tmp_path: Path) -> None:
    run = one_process(pydocs_dir, tmp_path / "plain", PLAIN)
    assert_close(losses_of(run), plain_pytorch_losses(pydocs_dir, PLAIN), "one-process trainer")


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


def _dp(parallel: str) -> int:
    from shoestring.dist.layout import make_layout

    return make_layout(parallel).dp


def test_two_process_layouts_match_one_process(pydocs_dir: Path, tmp_path: Path,
                                               reference: Path) -> None:
    cases = [{"output": str(tmp_path / name), **kw, "sets": [*SETS, *micro(_dp(kw["parallel"]))]}
             for name, kw in CASES_2]
    # a NaN loss on rank 1 only, in the first micro-batch of step 3 (loss calls: step 1, step
    # 2, the validation after step 2, then step 3): every rank skips step 3
    cases.append({"output": str(tmp_path / "nan"), "parallel": "dp=2",
                  "sets": [*SETS, *micro(2)], "nan_loss": [1, 4]})
    proc = launch(2, cases, {"data": str(pydocs_dir)}, timeout=600)
    assert proc.returncode == 0, failure(proc)
    for name, kw in CASES_2:
        assert_same_run(tmp_path / name, reference, name)
        check_memory_model(tmp_path / name, pydocs_dir, kw)
    nan = json.loads((tmp_path / "nan" / "summary.json").read_text())  # rank 0 writes it
    assert nan["skipped_steps"] == 1 and nan["steps"] == STEPS
    recs = [r for r in records(tmp_path / "nan") if "loss" in r]
    assert [r["skipped"] for r in recs] == [0, 0, 1, 1]
    # the steps before the bad one are the reference's
    assert_close(losses_of(tmp_path / "nan")[:2], losses_of(reference)[:2], "before the NaN")


def test_dp2_x_pp2_matches_one_process(pydocs_dir: Path, tmp_path: Path,
                                       reference: Path) -> None:
    case = {"parallel": "dp=2,pp=2"}
    proc = launch(4, [{"output": str(tmp_path / "dp2pp2"), **case, "sets": [*SETS, *micro(2)]}],
                  {"data": str(pydocs_dir)}, timeout=400)
    assert proc.returncode == 0, failure(proc)
    assert_same_run(tmp_path / "dp2pp2", reference, "dp=2,pp=2")
    check_memory_model(tmp_path / "dp2pp2", pydocs_dir, case)


def test_3d_layout_matches_and_its_checkpoint_resumes_on_dp2(pydocs_dir: Path, tmp_path: Path,
                                                            reference: Path) -> None:
    run3d = tmp_path / "3d"
    sets = [*SETS, *micro(2), "train.checkpoint_every=2steps", "train.keep_checkpoints=5"]
    proc = launch(8, [{"output": str(run3d), "parallel": "dp=2,tp=2,pp=2", "zero": 2,
                       "sets": sets}], {"data": str(pydocs_dir)}, timeout=600)
    assert proc.returncode == 0, failure(proc)
    assert_same_run(run3d, reference, "dp=2,tp=2,pp=2 zero 2")
    check_memory_model(run3d, pydocs_dir, {"parallel": "dp=2,tp=2,pp=2", "zero": 2})
    ck = run3d / "checkpoints" / "step_00000002"
    assert (ck / ".metadata").is_file() and (ck / "state.json").is_file()
    from shoestring.rundir import RunDir

    # roll a copy back to step 2, as if the job had died there, and resume it on dp=2
    resumed = tmp_path / "resumed"
    shutil.copytree(run3d, resumed)
    for p in (resumed / "checkpoints").iterdir():
        if p.name != ck.name:
            shutil.rmtree(p)
    shutil.rmtree(resumed / "final")
    proc = launch(2, [{"output": str(resumed), "parallel": "dp=2", "resume": True,
                       "sets": sets}], {"data": str(pydocs_dir)}, timeout=300)
    assert proc.returncode == 0, failure(proc)
    assert_close(losses_of(resumed), losses_of(reference), "3D → step 2 → resumed on dp=2")
    assert_close(val_losses_of(resumed), val_losses_of(reference), "validation after resume")
    a, _ = RunDir(run3d).load_final()
    b, _ = RunDir(resumed).load_final()
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-5), name


COMPILED = [
    ("ddp", {"parallel": "dp=2"}),
    ("zero3", {"parallel": "dp=2", "zero": 3}),
    ("tp2", {"parallel": "tp=2"}),
]


@pytest.mark.slow
def _seed_compile_record(home: Path) -> None:
    """A compile.json in which this CPU's fp32 steps (of some other shape) ran 3x faster
    compiled at no compile cost: what a machine that compiled before has learned, so that
    `train.compile=auto` finds even a 4-step run worth compiling."""
    from shoestring.device import select_device
    from shoestring.fsutil import write_json_atomic
    from shoestring.train.compile_costs import shape_key

    name = select_device("fp32", measure_peak=False).name
    write_json_atomic(home / "compile.json", {shape_key(name, "float32", "another shape"): {
        "eager_tokens_per_s": 1000.0, "compiled_tokens_per_s": 3000.0, "compile_s": 0.0}})


def test_compiled_blocks_under_ddp_fsdp_and_tp_match_the_uncompiled_one_process_run(
        pydocs_dir: Path, tmp_path: Path, reference: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """train.compile=true under DDP, FSDP2 (ZeRO-3) and tp=2, in one launch: each block is
    compiled in place before the wrapping (`parallelize.apply_compile`), the per-step and
    validation losses are the one-process *uncompiled* run's, Dynamo compiled the block once
    per launch and layout kind (not once per layer) without a graph break, and the compiled
    DDP run's checkpoint resumes in one process, uncompiled. A fourth case leaves
    train.compile at auto with a recorded pay-off on this device: the two-rank run compiles
    by itself and says why."""
    start = time.perf_counter()
    keep = ["train.checkpoint_every=2steps", "train.keep_checkpoints=5"]
    cases = [{"output": str(tmp_path / name), **kw,
              "sets": [*SETS, *micro(_dp(kw["parallel"])), "train.compile=true",
                       *(keep if name == "ddp" else [])]} for name, kw in COMPILED]
    cases.append({"output": str(tmp_path / "ddp-auto"), "parallel": "dp=2",
                  "sets": [*SETS, *micro(2), "train.compile=auto"]})
    home = tmp_path / "home"
    home.mkdir()
    _seed_compile_record(home)
    monkeypatch.setenv("SHOESTRING_HOME", str(home))  # the launched ranks inherit it
    proc = launch(2, cases, {"data": str(pydocs_dir), "dynamo_stats": True}, timeout=600)
    assert proc.returncode == 0, failure(proc)
    launched = time.perf_counter() - start
    line = next(x for x in proc.stderr.splitlines() if x.startswith("dynamo-stats "))
    stats = json.loads(line.split(" ", 1)[1])
    # block 0 differs (no attention norm after the normalized embedding): 2 graphs per
    # layout (DDP's parameters, FSDP's unsharded ones and TP's DTensors each fail the
    # others' guards); a graph per layer would be 4 per layout
    assert stats["graph_breaks"] == 0 and 1 <= stats["graphs"] <= 2 * (len(COMPILED) + 1), stats
    want = losses_of(reference) + val_losses_of(reference)
    delta = 0.0
    for name, _ in COMPILED:
        assert_same_run(tmp_path / name, reference, f"{name} compiled")
        assert json.loads((tmp_path / name / "summary.json").read_text())["compiled"] is True
        got = losses_of(tmp_path / name) + val_losses_of(tmp_path / name)
        delta = max(delta, *(abs(a - b) for a, b in zip(got, want)))
    auto = json.loads((tmp_path / "ddp-auto" / "summary.json").read_text())
    assert auto["compiled"] is True, auto["speed_choices"]
    assert "compile on" in auto["speed_choices"] and "other shape" in auto["speed_choices"]
    assert_same_run(tmp_path / "ddp-auto", reference, "dp=2 compiled by auto")
    from shoestring.train.loop import train

    resumed = _roll_back(tmp_path / "ddp", tmp_path / "resumed", 2)
    train(load_config(None, [*SETS, *micro(1), *keep, "train.compile=false"]), pydocs_dir,
          resumed, resume=True)
    assert_close(losses_of(resumed), losses_of(reference), "compiled dp=2 → step 2 → one process")
    assert_close(val_losses_of(resumed), val_losses_of(reference), "validation after resume")
    assert json.loads((resumed / "summary.json").read_text())["compiled"] is False
    print(f"\n[compiled ddp+zero3+tp2] max |Δloss| {delta:.1e}; launch {launched:.0f} s "
          f"({stats}), with the resume {time.perf_counter() - start:.0f} s")


def test_bad_layout_fails_on_every_rank_before_any_collective(pydocs_dir: Path,
                                                             tmp_path: Path) -> None:
    # torchrun stops the other ranks when the first one exits; give the slower rank (on a
    # loaded 2-core machine, seconds slower to import torch) time to reach its own check
    proc = launch(2, [{"output": str(tmp_path / "bad"), "parallel": "tp=2",
                       "sets": [*SETS, "model.num_heads=1"]}],
                  {"data": str(pydocs_dir)}, timeout=120, monitor_interval=20)
    assert proc.returncode != 0
    # both ranks report the same clear error
    assert proc.stderr.count("tp=2 must divide model num_heads (1)") == 2, proc.stderr[-3000:]
    # ranks exit 2 with the message only (torchrun's own report follows; no frame of ours)
    assert "exitcode  : 2" in proc.stderr and "shoestring/dist/" not in proc.stderr
    assert not (tmp_path / "bad").exists()


@pytest.fixture(scope="module")
def clm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shoestring.config import DataConfig
    from shoestring.prep.prep import prep

    out = tmp_path_factory.mktemp("clm") / "data"
    prep(["builtin:pydocs"], out, DataConfig(vocab_size=2000, seq_len=64, objective="clm"))
    return out


def test_decoder_tp_pp_zero3_match_one_process(clm_dir: Path, tmp_path: Path) -> None:
    """The Llama-style decoder (grouped-query attention, SwiGLU, RMSNorm) under TP=2 (GQA
    heads split), PP=2 and ZeRO-3, with accumulation and ramp."""
    ref = one_process(clm_dir, tmp_path / "one", [*CLM_SETS, *micro(1)])
    cases = [("tp2", {"parallel": "tp=2"}), ("pp2", {"parallel": "pp=2"}),
             ("zero3", {"parallel": "dp=2", "zero": 3})]
    proc = launch(2, [{"output": str(tmp_path / n), **kw,
                       "sets": [*CLM_SETS, *micro(_dp(kw["parallel"]))]} for n, kw in cases],
                  {"data": str(clm_dir)}, timeout=400)
    assert proc.returncode == 0, failure(proc)
    for name, _ in cases:
        assert_same_run(tmp_path / name, ref, f"decoder {name}")


def test_replaced_token_detection_under_ddp_and_zero3_matches_one_process(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """model.objective=rtd (generator + discriminator in one module, model/detector.py) under
    DDP and FSDP2 (ZeRO-3, one unit per block of either part), with accumulation and ramp:
    the replacements are drawn with the masks, so every layout samples the same tokens."""
    sets = [*SETS, "model.objective=rtd"]
    ref = one_process(pydocs_dir, tmp_path / "one", [*sets, *micro(1)])
    cases = [("ddp", {"parallel": "dp=2"}), ("zero3", {"parallel": "dp=2", "zero": 3})]
    proc = launch(2, [{"output": str(tmp_path / n), **kw, "sets": [*sets, *micro(2)]}
                      for n, kw in cases], {"data": str(pydocs_dir)}, timeout=400)
    assert proc.returncode == 0, failure(proc)
    for name, _ in cases:
        assert_same_run(tmp_path / name, ref, f"rtd {name}")


def _cli_sets(sets: list[str]) -> list[str]:
    return [x for s in sets if not s.startswith("train.steps") for x in ("--set", s)]


def test_cli_train_parallel_then_resume_on_another_layout(pydocs_dir: Path,
                                                          tmp_path: Path) -> None:
    """`torchrun -m shoestring train --parallel ...`, then `--resume` with a larger budget on
    another layout: the newest checkpoint is picked up, whatever layout wrote it."""
    run = tmp_path / "run"
    common = ["-d", str(pydocs_dir), "-o", str(run), *_cli_sets([*PLAIN, *micro(1)])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    first = subprocess.run(
        torchrun_command(2, ["train", *common, "--steps", "2", "--parallel", "pp=2"],
                         module="shoestring"), capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "trained" in first.stdout and first.stdout.count("trained") == 1  # rank 0 prints
    assert (run / "checkpoints" / "step_00000002" / ".metadata").is_file()
    second = subprocess.run(
        torchrun_command(2, ["train", *common, "--steps", "4", "--parallel", "dp=2",
                             "--resume"], module="shoestring"),
        capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    steps = [r["step"] for r in records(run)]
    assert steps == [1, 2, 3, 4]
    assert (run / "final" / "model.safetensors").is_file()


def test_sigterm_checkpoints_every_rank_and_resumes_in_one_process(pydocs_dir: Path,
                                                                   tmp_path: Path) -> None:
    """SIGTERM to torchrun mid-run: every rank stops at the same step, one checkpoint is
    written, the job exits 128+15; `--resume` in ONE process (another layout) finishes with
    the losses of an uninterrupted run."""
    steps = 120
    sets = [*PLAIN, *micro(2), "train.checkpoint_every=null"]
    run = tmp_path / "run"
    args = ["train", "-d", str(pydocs_dir), "-o", str(run), *_cli_sets(sets),
            "--steps", str(steps), "--parallel", "dp=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(torchrun_command(2, args, module="shoestring"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = sigterm_after_records(proc, run, 3, wait=240)
    assert proc.returncode != 0
    assert stderr.count("interrupted by SIGTERM") == 2, stderr[-3000:]  # both ranks, one step
    from shoestring.train.checkpoint import latest_checkpoint

    ck = latest_checkpoint(run)
    assert ck is not None and 3 <= ck.step < steps, stderr[-2000:]
    assert ck.state["world_size"] == 2
    r = subprocess.run([sys.executable, "-m", "shoestring", "train", "-d", str(pydocs_dir),
                        "-o", str(run), "--resume"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    whole = one_process(pydocs_dir, tmp_path / "whole", [*sets[:-1], f"train.steps={steps}",
                                                        "train.checkpoint_every=null"])
    got, want = losses_of(run), losses_of(whole)
    assert len(got) == steps
    assert abs(got[-1] - want[-1]) < 1e-3, (got[-5:], want[-5:])


def test_a_plan_for_two_devices_trains_with_its_printed_torchrun_line(pydocs_dir: Path,
                                                                      tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    p = subprocess.run([sys.executable, "-m", "shoestring", "plan", "--hardware", "auto",
                        "--devices", "2", "--budget", "5s", "--data", str(pydocs_dir),
                        "-o", str(plan)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if "torchrun" in x and "train it with" in x)
    cmd = shlex.split(line.split("train it with:", 1)[1].strip())
    assert cmd[0] == "torchrun" and "--nproc-per-node" in " ".join(cmd)
    cmd = [sys.executable, "-m", "torch.distributed.run", *cmd[1:]]
    cmd = [str(pydocs_dir) if c == "DATA_DIR" else str(tmp_path / "run") if c == "RUN_DIR"
           else c for c in cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] >= 1
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def _roll_back(src: Path, dst: Path, step: int) -> Path:
    """A copy of run ``src`` as if it had died right after its step-``step`` checkpoint."""
    shutil.copytree(src, dst)
    for p in (dst / "checkpoints").iterdir():
        if int(p.name.removeprefix("step_")) > step:
            shutil.rmtree(p)
    shutil.rmtree(dst / "final")
    (dst / "summary.json").unlink()
    return dst


def test_one_process_to_dp2_to_tp2_resumes_without_a_skipped_or_repeated_batch(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """A one-process run's step-2 checkpoint resumed on dp=2, whose step-4 checkpoint is
    resumed on tp=2: the losses are the uninterrupted run's, step for step."""
    sets = [*PLAIN, "train.steps=6", *micro(1), "train.checkpoint_every=2steps",
            "train.keep_checkpoints=5"]
    whole = one_process(pydocs_dir, tmp_path / "whole", sets)
    a = _roll_back(whole, tmp_path / "a", 2)
    proc = launch(2, [{"output": str(a), "parallel": "dp=2", "resume": True,
                       "sets": [*sets[:-3], *micro(2), *sets[-2:]]}],
                  {"data": str(pydocs_dir)}, timeout=300)
    assert proc.returncode == 0, failure(proc)
    assert_close(losses_of(a), losses_of(whole), "one process → dp=2")
    b = _roll_back(a, tmp_path / "b", 4)
    proc = launch(2, [{"output": str(b), "parallel": "tp=2", "resume": True, "sets": sets}],
                  {"data": str(pydocs_dir)}, timeout=300)
    assert proc.returncode == 0, failure(proc)
    assert_close(losses_of(b), losses_of(whole), "one process → dp=2 → tp=2")
    assert [r["step"] for r in records(b)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((b / "summary.json").read_text())["world_size"] == 2


def test_plan_then_torchrun_train_plan_trains_the_planned_layout(pydocs_dir: Path,
                                                                tmp_path: Path) -> None:
    """`shoestring plan --devices 2 -o plan.yaml` writes a `parallel:` section; the torchrun
    line it prints (`train --plan plan.yaml`, no layout flag pasted) trains that layout, and
    the run's config.yaml records it."""
    plan = tmp_path / "plan.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    made = subprocess.run([sys.executable, "-m", "shoestring", "plan", "--devices", "2",
                           "--hardware", "auto", "--budget", "1e13flops", "--mfu", "0.3",
                           "--data", str(pydocs_dir), "-o", str(plan)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    planned = yaml.safe_load(plan.read_text())["parallel"]
    assert planned["dp"] * planned["tp"] * planned["pp"] == 2
    assert "--parallel" not in made.stdout and "--plan" in made.stdout
    run = tmp_path / "run"
    small = [*_cli_sets([*PLAIN, *micro(2)]), "--steps", "2"]  # the plan's layout, a tiny model
    trained = subprocess.run(
        torchrun_command(2, ["train", "-d", str(pydocs_dir), "--plan", str(plan), "-o",
                             str(run), *small], module="shoestring"),
        capture_output=True, text=True, timeout=300, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    recorded = yaml.safe_load((run / "config.yaml").read_text())["parallel"]
    assert {k: recorded[k] for k in ("dp", "tp", "pp", "zero", "ac")} == planned
    assert all(r.get("world_size") == 2 for r in records(run) if "loss" in r)
