"""The trainer's promises: budgets stop it, checkpoints are atomic, resume is exact, SIGTERM
saves and exits cleanly, non-finite losses are skipped then stop it, metrics are complete."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import run_cli, sigterm_after_records, tiny_config
from shoestring.errors import ShoestringError
from shoestring.rundir import RunDir
from shoestring.train.checkpoint import latest_checkpoint
from shoestring.train.loop import train


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in _records(run) if "loss" in r]


def test_metrics_records_and_tensorboard(pydocs_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(steps=12, log_every=2, val_every=0.5, val_sequences=16)
    summary = train(cfg, pydocs_dir, tmp_path / "run")
    recs = _records(tmp_path / "run")
    train_recs = [r for r in recs if "loss" in r]
    val_recs = [r for r in recs if "val_loss" in r]
    assert [r["step"] for r in train_recs] == [2, 4, 6, 8, 10, 12]
    for key in ("lr", "batch_size", "tokens", "flops", "tokens_per_s", "mfu", "grad_norm",
                "data_wait", "elapsed_s", "progress"):
        assert all(key in r for r in train_recs), key
    assert train_recs[-1]["tokens"] == 12 * 32 * 64 == summary["tokens"]
    assert train_recs[-1]["flops"] == pytest.approx(summary["total_flops"])
    assert 0.0 <= min(r["data_wait"] for r in train_recs) <= 1.0
    assert len(val_recs) >= 2 and val_recs[-1]["step"] == 12  # periodic + the end
    assert summary["val_loss_subset"] == val_recs[-1]["val_loss"]
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    assert RunDir(tmp_path / "run").checkpoints()  # the end-of-training checkpoint


def test_token_and_flop_budgets_stop_training(pydocs_dir: Path, tmp_path: Path) -> None:
    s = train(tiny_config(budget="5000tok"), pydocs_dir, tmp_path / "tok")
    assert s["tokens"] == 3 * 32 * 64  # the first step at or past 5,000 tokens
    flops = 4.5 * 32 * 64 * s["flops_per_token"]
    s = train(tiny_config(budget=f"{flops:.6e}flops"), pydocs_dir, tmp_path / "flops")
    assert s["steps"] == 5 and s["total_flops"] >= flops


def test_gradient_accumulation_equals_the_full_batch(pydocs_dir: Path, tmp_path: Path) -> None:
    full = train(tiny_config(steps=3, precision="fp32", log_every=1), pydocs_dir, tmp_path / "a")
    acc = train(tiny_config(steps=3, precision="fp32", log_every=1, micro_batch_size=8),
                pydocs_dir, tmp_path / "b")
    assert full["steps"] == acc["steps"] == 3
    # same sequences in the same order, same masks: equal up to summation order
    for a, b in zip(_losses(tmp_path / "a"), _losses(tmp_path / "b")):
        assert a == pytest.approx(b, abs=2e-4)


def test_batch_ramp_is_logged(pydocs_dir: Path, tmp_path: Path) -> None:
    train(tiny_config(steps=10, log_every=1, micro_batch_size=8, batch_ramp=0.6),
          pydocs_dir, tmp_path / "r")
    sizes = [r["batch_size"] for r in _records(tmp_path / "r") if "loss" in r]
    assert sizes[0] == 8 and sizes[-1] == 32 and sizes == sorted(sizes)


def test_resume_reproduces_the_uninterrupted_losses(pydocs_dir: Path, tmp_path: Path) -> None:
    kw = dict(steps=16, log_every=1, checkpoint_every="8steps", keep_checkpoints=5,
              val_every=0.25, val_sequences=8)
    train(tiny_config(**kw), pydocs_dir, tmp_path / "whole")
    train(tiny_config(**kw), pydocs_dir, tmp_path / "cut")
    # roll the second run back to its step-8 checkpoint, as if it had died right after it
    cut = tmp_path / "cut"
    for ckpt in RunDir(cut).checkpoints():
        if latest_checkpoint(cut).step > 8:
            shutil.rmtree(RunDir(cut).checkpoints()[-1])
    assert latest_checkpoint(cut).step == 8
    shutil.rmtree(cut / "final")
    summary = train(tiny_config(**kw), pydocs_dir, cut, resume=True)
    assert summary["resumed"] and summary["steps"] == 16
    assert _records(cut)[-1]["step"] == 16
    whole = [(r["step"], r.get("loss"), r.get("val_loss")) for r in _records(tmp_path / "whole")]
    again = [(r["step"], r.get("loss"), r.get("val_loss")) for r in _records(cut)]
    assert again == whole  # bit-for-bit, including the periodic validations

    a, _ = RunDir(tmp_path / "whole").load_final()
    b, _ = RunDir(cut).load_final()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_resumed_auto_run_keeps_the_precision_it_was_trained_in(pydocs_dir: Path,
                                                                   tmp_path: Path) -> None:
    """On a CPU ``auto`` picks bf16 by a timed probe, which the machine's load can tip: a run
    resumed with ``auto`` trains on in the dtype its checkpoint was written in, whichever the
    probe would pick now, and its losses are the uninterrupted run's."""
    kw = dict(steps=8, log_every=1, checkpoint_every="4steps", keep_checkpoints=5)
    for started, dtype in (("bf16", "bfloat16"), ("fp32", "float32")):
        whole = train(tiny_config(precision=started, **kw), pydocs_dir, tmp_path / started)
        assert whole["dtype"] == dtype
        cut = tmp_path / f"{started}-cut"
        train(tiny_config(precision=started, **kw), pydocs_dir, cut)
        while latest_checkpoint(cut).step > 4:
            shutil.rmtree(RunDir(cut).checkpoints()[-1])
        shutil.rmtree(cut / "final")
        again = train(tiny_config(precision="auto", **kw), pydocs_dir, cut, resume=True)
        assert again["resumed"] and again["dtype"] == dtype
        losses = [(r["step"], r.get("loss")) for r in _records(tmp_path / started)]
        assert [(r["step"], r.get("loss")) for r in _records(cut)] == losses


def test_a_failed_checkpoint_write_leaves_the_previous_one(pydocs_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    train(tiny_config(steps=4, checkpoint_every="2steps"), pydocs_dir, run)
    before = latest_checkpoint(run)
    import shoestring.train.checkpoint as ck

    def broken_write(*args, **kwargs):
        raise OSError("disk full")

    # the shards are written, then the state file (the completion mark) fails
    monkeypatch.setattr(ck, "write_json_atomic", broken_write)
    with pytest.raises(OSError, match="disk full"):
        train(tiny_config(steps=6, checkpoint_every="2steps"), pydocs_dir, run, resume=True)
    after = latest_checkpoint(run)
    assert after.step == before.step == 4
    # no half-written folder is left behind, and the kept checkpoint still loads
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [p.name for p in RunDir(run).checkpoints()]
    monkeypatch.undo()
    summary = train(tiny_config(steps=6, checkpoint_every="2steps"), pydocs_dir, run, resume=True)
    assert summary["steps"] == 6 and summary["resumed"]


def test_nonfinite_losses_are_skipped_then_stop_with_a_clear_error(pydocs_dir: Path, tmp_path: Path) -> None:
    # An absurd learning rate blows the weights up after the first update.
    cfg = tiny_config(steps=50, lr=1e30, precision="fp32", max_nonfinite=3, grad_clip=0.0,
                      schedule="constant", warmup=0.0)
    with pytest.raises(ShoestringError, match="non-finite.*3 steps in a row") as e:
        train(cfg, pydocs_dir, tmp_path / "nan")
    assert "lower train.lr" in str(e.value)
    assert not (tmp_path / "nan" / "final").exists()


def test_sigterm_saves_a_checkpoint_and_resume_finishes(pydocs_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", "--data", str(pydocs_dir), "-o", str(run), "--steps", "100000",
            "--set", "model.hidden_size=64", "--set", "model.num_layers=2",
            "--set", "model.num_heads=2", "--set", "model.intermediate_size=128",
            "--set", "train.log_every=1", "--set", "train.tensorboard=false"]
    proc = subprocess.Popen([sys.executable, "-m", "shoestring", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    stderr = sigterm_after_records(proc, run, 3, wait=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.step >= 3
    assert not (run / "final").exists()
    r = run_cli("train", "--data", str(pydocs_dir), "-o", str(run), "--resume",
                "--set", f"train.steps={ckpt.step + 2}", "--set", "train.budget=null")
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == ckpt.step + 2


def test_init_from_a_run_starts_where_it_ended(pydocs_dir: Path, tmp_path: Path) -> None:
    first = train(tiny_config(steps=30), pydocs_dir, tmp_path / "a")
    second = train(tiny_config(steps=2, init_from=str(tmp_path / "a")), pydocs_dir, tmp_path / "b")
    assert second["first_loss"] < first["first_loss"] - 0.5
    bad = tiny_config(steps=2, init_from=str(tmp_path / "a"))
    bad = bad.model_copy(update={"model": bad.model.model_copy(update={"hidden_size": 128})})
    with pytest.raises(ShoestringError, match="model.hidden_size: ours 128, theirs 64"):
        train(bad, pydocs_dir, tmp_path / "c")


def test_objective_mismatch_is_refused(pydocs_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(steps=2)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"objective": "clm"})})
    with pytest.raises(ShoestringError, match="prepared for objective 'mlm'"):
        train(cfg, pydocs_dir, tmp_path / "x")


def _write_old_format_checkpoint(run: Path, step: int) -> None:
    """A checkpoint as shoestring wrote them before the one trainer: model.safetensors,
    a positional optimizer.pt and state.json (the writer was these three calls)."""
    from safetensors.torch import save_file

    from shoestring.train.checkpoint import consolidate

    new = latest_checkpoint(run)
    model, _ = RunDir(run).load_final()
    model = consolidate(new.path, model)
    from shoestring.train.optim import build_optimizer

    opt = build_optimizer(model, tiny_config(steps=2).train)
    old = run / "checkpoints" / f"step_{step:08d}"
    shutil.rmtree(run / "checkpoints")
    old.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(old / "model.safetensors"))
    torch.save(opt.state_dict(), old / "optimizer.pt")
    state = {k: v for k, v in new.state.items() if k not in ("format", "layout", "world_size")}
    (old / "state.json").write_text(json.dumps(state))


def test_old_format_checkpoints_are_refused_with_the_command_that_converts_them(
        pydocs_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(steps=2, checkpoint_every="2steps"), pydocs_dir, run)
    _write_old_format_checkpoint(run, 2)
    args = ["train", "--data", str(pydocs_dir), "-o", str(run), "--resume",
            "--set", "train.steps=4"]
    r = run_cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"python -m shoestring.train.checkpoint upgrade {run}" in r.stderr.replace("\n", " ")
    up = subprocess.run([sys.executable, "-m", "shoestring.train.checkpoint", "upgrade", str(run)],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    ck = latest_checkpoint(run)
    assert ck.step == 2 and ck.state["format"] == 2 and (ck.path / ".metadata").is_file()
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


def test_resume_on_a_finished_budget_says_so(pydocs_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(steps=2), pydocs_dir, run)
    with pytest.raises(ShoestringError, match="nothing to resume: the checkpoint at step 2 has "
                       "used the whole budget"):
        train(tiny_config(steps=2), pydocs_dir, run, resume=True)
    assert train(tiny_config(steps=3), pydocs_dir, run, resume=True)["steps"] == 3


@pytest.mark.slow
@pytest.mark.heavy
def test_compile_trains_the_same_losses(pydocs_dir: Path, tmp_path: Path) -> None:
    """`train.compile` (the one torch.compile test: ~40 s on a CPU) runs through the same
    parallelism seam and gives the eager run's losses."""
    kw = dict(steps=3, precision="fp32", log_every=1, micro_batch_size=16)
    train(tiny_config(**kw), pydocs_dir, tmp_path / "eager")
    train(tiny_config(**kw, compile=True), pydocs_dir, tmp_path / "compiled")
    for a, b in zip(_losses(tmp_path / "eager"), _losses(tmp_path / "compiled")):
        assert a == pytest.approx(b, abs=1e-3)
    assert len(_losses(tmp_path / "compiled")) == 3


def test_old_distributed_checkpoints_are_converted_and_resume(pydocs_dir: Path,
                                                              tmp_path: Path) -> None:
    """A run dir of the earlier distributed trainer (dist_checkpoints/step_N: DCP shards,
    which were already this format's, plus trainer.json) converts and resumes."""
    import base64

    run = tmp_path / "run"
    train(tiny_config(steps=2, checkpoint_every="2steps"), pydocs_dir, run)
    ck = latest_checkpoint(run)
    old = run / "dist_checkpoints" / "step_0000002"
    old.parent.mkdir()
    shutil.move(str(ck.path), str(old))
    st = ck.state
    mask = base64.b64encode(bytes(st["rng"]["masking"])).decode("ascii")
    (old / "trainer.json").write_text(json.dumps({
        "step": st["step"], "tokens": st["tokens"], "elapsed_s": st["elapsed"],
        "cursor": st["cursor"], "mask_rng": mask, "layout": st["layout"], "world_size": 2}))
    (old / "state.json").unlink()
    with pytest.raises(ShoestringError, match="upgrade"):
        train(tiny_config(steps=4), pydocs_dir, run, resume=True)
    from shoestring.train.checkpoint import upgrade_run

    assert [p.name for p in upgrade_run(run)] == ["step_00000002"]
    assert not (run / "dist_checkpoints").exists()
    assert train(tiny_config(steps=4), pydocs_dir, run, resume=True)["steps"] == 4


def test_adamw_is_fused_on_plain_parameters_and_foreach_on_dtensors(tmp_path: Path) -> None:
    """`build_optimizer` takes the fused kernel where every parameter is a plain tensor and
    it steps exactly as foreach does (to float rounding); sharded DTensor parameters (a real
    one-rank gloo mesh) keep foreach."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from shoestring.model import build_model
    from shoestring.train.optim import build_optimizer, kernel, param_groups

    cfg = tiny_config(steps=1)
    torch.manual_seed(0)
    a = build_model(cfg.model, 300)
    b = build_model(cfg.model, 300)
    b.load_state_dict(a.state_dict())
    fused = build_optimizer(a, cfg.train)
    assert all(g["fused"] for g in fused.param_groups)
    foreach = torch.optim.AdamW(param_groups(b, cfg.train.weight_decay), lr=cfg.train.lr,
                                betas=(cfg.train.beta1, cfg.train.beta2), eps=cfg.train.eps,
                                foreach=True)
    for step in range(3):
        for m in (a, b):
            torch.manual_seed(step)
            for p in m.parameters():
                p.grad = torch.randn_like(p)
        fused.step()
        foreach.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert not torch.equal(p, torch.zeros_like(p))
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        shard = distribute_tensor(torch.randn(8, 4), mesh)
        assert kernel([shard]) == {"foreach": True}
        assert kernel([torch.randn(3)]) == {"fused": True}
    finally:
        dist.destroy_process_group()
