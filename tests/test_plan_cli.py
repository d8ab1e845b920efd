"""`shoestring plan`, `train --plan`, `sweep` and `plan --fit` through the real CLI and library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import fails_cleanly as _fails
from conftest import run_cli
from shoestring.errors import ShoestringError
from shoestring.families import MLM


def test_plan_cli_writes_yaml(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    r = run_cli("plan", "--hardware", "h100", "--devices", "8", "--budget", "24h",
                "--objective", "mlm", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "PF/s-days" in r.stdout and "compute-optimal" in r.stdout
    tree = yaml.safe_load(out.read_text())
    assert set(tree) == {"model", "train", "parallel", "data", "plan"}  # 8 devices: a layout
    assert tree["plan"]["hardware"]["devices"] == 8
    assert tree["parallel"]["dp"] * tree["parallel"]["tp"] * tree["parallel"]["pp"] == 8
    assert tree["plan"]["hardware"]["source"].startswith("https://")


def test_plan_cli_impossible_requests(tmp_path: Path) -> None:
    _fails(run_cli("plan", "--hardware", "h100", "--devices", "0", "--budget", "1h"), "--devices")
    _fails(run_cli("plan", "--hardware", "tpu-v9000", "--budget", "1h"),
           "unknown hardware", "h100")
    _fails(run_cli("plan", "--hardware", "t4", "--budget", "1e9flops"), "budget too small",
           "at least")
    _fails(run_cli("plan", "--hardware", "t4", "--budget", "soon"), "--budget")
    _fails(run_cli("plan", "--hardware", "t4", "--law", str(tmp_path / "none.yaml")), "--law")
    _fails(run_cli("plan", "--fit", str(tmp_path / "no-sweep")), "sweep dir not found")
    bad = tmp_path / "plan.yaml"
    bad.write_text("model: {hidden_size: 64}\n")  # a config file, not a plan
    _fails(run_cli("train", "--data", str(tmp_path), "--plan", str(bad), "-o",
                   str(tmp_path / "r")), "not a shoestring plan")


def test_plan_round_trips_through_train(tmp_path: Path, pydocs_dir: Path) -> None:
    """plan → YAML → `train --plan`: the run trains exactly the planned model and compute."""
    plan_file = tmp_path / "plan.yaml"
    r = run_cli("plan", "--hardware", "t4", "--budget", "6e10flops", "--data", str(pydocs_dir),
                "-o", str(plan_file))
    assert r.returncode == 0, r.stderr
    tree = yaml.safe_load(plan_file.read_text())
    r = run_cli("train", "--data", str(pydocs_dir), "--plan", str(plan_file), "-o",
                str(tmp_path / "run"), "--set", "train.val_every=0", timeout=600)
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    for key, value in tree["model"].items():
        assert resolved["model"][key] == value, key
    assert resolved["train"]["batch_size"] == tree["train"]["batch_size"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["flops_per_token"] == pytest.approx(tree["plan"]["model"]["flops_per_token"])
    planned = tree["plan"]["budget"]["flops"]
    step_flops = tree["plan"]["batch"]["tokens_per_step"] * summary["flops_per_token"]
    assert abs(summary["total_flops"] - planned) <= step_flops  # within one step of the plan


def test_sweep_trains_to_budget_and_resumes(tmp_path: Path, pydocs_dir: Path) -> None:
    from rich.console import Console

    from shoestring.plan.sweep import read_points, run_sweep

    quiet = Console(file=open(tmp_path / "log.txt", "w"), width=120)
    sweep = tmp_path / "sweep"
    kw = {"eval_sequences": 8, "console": quiet,
          "overrides": ["train.val_every=0", "train.tensorboard=false"]}
    points = run_sweep(pydocs_dir, sweep, [4e10], factors=[1], **kw)
    assert len(points) == 1 and points[0]["val_loss"] > 0 and points[0]["is_pick"]
    first = {p["id"]: p["run"] for p in points}
    stamps = {pid: (Path(run) / "summary.json").stat().st_mtime_ns for pid, run in first.items()}
    # re-run with one more size: the finished point is not trained again
    points = run_sweep(pydocs_dir, sweep, [4e10], factors=[1, 2], **kw)
    assert len(points) == 2 and len({p["id"] for p in points}) == 2
    assert sum(p["is_pick"] for p in points) == 1
    for pid, run in first.items():
        assert (Path(run) / "summary.json").stat().st_mtime_ns == stamps[pid]
    for p in read_points(sweep):
        # every point spent its budget, to within one step
        step = p["flops_per_token"] * p["batch_size"] * p["seq_len"]
        assert abs(p["flops"] - p["budget_flops"]) <= step
        summary = json.loads((Path(p["run"]) / "summary.json").read_text())
        assert summary["total_flops"] == pytest.approx(p["flops"])
    # different settings are refused rather than mixed into the same sweep
    with pytest.raises(ShoestringError, match="started with"):
        run_sweep(pydocs_dir, sweep, [4e10], factors=[1], law="chinchilla", **kw)
    # a point retrained with an override of its own (another seed), the way benches do
    from shoestring.plan.sweep import train_points

    base = next(p for p in points if p["is_pick"])
    again = {**base, "id": base["id"] + "-seed7", "overrides": ["train.seed=7"]}
    train_points(tmp_path / "again", [again], str(pydocs_dir), MLM, eval_sequences=8,
                 console=quiet, overrides=kw["overrides"])
    (redone,) = read_points(tmp_path / "again")
    resolved = yaml.safe_load((Path(redone["run"]) / "config.yaml").read_text())
    assert resolved["train"]["seed"] == 7 and resolved["train"]["val_every"] == 0
    assert resolved["train"]["steps"] == base["steps"]
    assert redone["val_loss"] != base["val_loss"]  # another initialisation, another loss


def test_fit_cli_writes_law_and_plots(tmp_path: Path, pydocs_dir: Path) -> None:
    """`plan --fit` on a sweep dir (points from a known law, as a sweep writes them)."""
    from shoestring.plan.laws import Law, load_law

    truth = Law("truth", E=2.0, A=300.0, B=900.0, alpha=0.35, beta=0.33)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"format": "shoestring-sweep/1",
                                                  "objective": "mlm", "data_dir": "x"}))
    with open(sweep / "points.jsonl", "w") as f:
        for c in (1e12, 1e13, 1e14):
            n0, _ = truth.optimal(c)
            for k in (0.25, 0.5, 1, 2, 4):
                n, d = n0 * k, c / (6 * n0 * k)
                f.write(json.dumps({"id": f"{c}-{k}", "budget_flops": c,
                                    "model": {"objective": "mlm"},
                                    "params_non_embedding": n, "tokens": d,
                                    "val_loss": truth.loss(n, d), "shape": "x"}) + "\n")
        f.write('{"id": "torn li')  # a crash mid-write leaves a torn last line: ignored
    r = run_cli("plan", "--fit", str(sweep))
    assert r.returncode == 0, r.stderr
    law = load_law(str(sweep / "law.yaml"))
    assert law.alpha == pytest.approx(0.35, abs=0.02) and law.beta == pytest.approx(0.33, abs=0.02)
    for png in ("isoflops.png", "frontier.png", "predicted_vs_observed.png"):
        data = (sweep / "plots" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    r = run_cli("plan", "--hardware", "t4", "--budget", "1e12flops", "--law",
                str(sweep / "law.yaml"), "--data", str(pydocs_dir))
    assert r.returncode == 0, r.stderr
    assert "fit:sweep" in r.stdout


@pytest.mark.heavy
def test_sweep_trains_points_in_parallel_processes_like_one_at_a_time(
        tmp_path: Path, pydocs_dir: Path) -> None:
    """`sweep --jobs 2`: the same points, steps and (up to the threads' summation order) losses
    as the serial sweep, each run with its share of the cores; a worker's bad input comes
    back as the CLI's clear error."""
    import os

    sets = ["--set", "train.val_every=0", "--set", "train.tensorboard=false"]
    common = ["--data", str(pydocs_dir), "--budgets", "4e10", "--sizes", "1,2",
              "--eval-sequences", "8", *sets]
    r = run_cli("sweep", *common, "-o", str(tmp_path / "serial"), timeout=600)
    assert r.returncode == 0, r.stderr
    r = run_cli("sweep", *common, "--jobs", "2", "-o", str(tmp_path / "parallel"), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "2 at a time" in r.stderr
    from shoestring.plan.sweep import read_points

    serial = {p["id"]: p for p in read_points(tmp_path / "serial")}
    parallel = {p["id"]: p for p in read_points(tmp_path / "parallel")}
    assert set(serial) == set(parallel) and len(serial) == 2
    for pid, p in parallel.items():
        assert p["steps"] == serial[pid]["steps"] and p["tokens"] == serial[pid]["tokens"]
        assert p["val_loss"] == pytest.approx(serial[pid]["val_loss"], rel=2e-2)
        cfg = yaml.safe_load((Path(p["run"]) / "config.yaml").read_text())
        assert cfg["train"]["threads"] == max(1, (os.cpu_count() or 1) // 2)
        assert str(tmp_path / "parallel") in p["run"]
    r = run_cli("sweep", *common, "--jobs", "2", "--set", "train.lr=-1", "-o",
                str(tmp_path / "bad"), timeout=600)
    _fails(r, "train.lr")
    assert read_points(tmp_path / "bad") == []


@pytest.mark.slow
def test_branched_sweep_points_are_wsd_runs_of_their_length(tmp_path: Path,
                                                           pydocs_dir: Path) -> None:
    """A calibration's learning curve: each branch off the shared constant-LR trunk ends
    where a warmup-stable-decay run of its length trained from scratch ends, and costs only
    its trunk stretch and cool-down."""
    from rich.console import Console

    from shoestring.config import load_config
    from shoestring.eval.held_out import held_out_loss
    from shoestring.plan.sweep import cost, read_points, run_sweep
    from shoestring.train.loop import train

    log = tmp_path / "log.txt"
    quiet = Console(file=open(log, "w"), width=200)
    # the kernel and dtype pinned: ``auto`` times them per run, and a trunk that picked eager
    # attention ended 8e-4 off a straight run that picked sdpa (the two round differently)
    over = ["train.tensorboard=false", "train.attention=sdpa", "train.precision=fp32"]
    args = dict(factors=[1, 2], eval_sequences=8, overrides=over, branched=True, min_sizes=2,
                floor=False)
    points = run_sweep(pydocs_dir, tmp_path / "sweep", [1.5e10, 4e10], console=quiet, **args)
    shapes = {p["shape"] for p in points}
    assert len(points) == 4 and len({p["trunk"] for p in points}) == 2
    # trunk by trunk, not level by level, and the progress counts them in that order (issue
    # 62: [1/25], [6/25], … then "4 of 25 points finished"); a rerun counts its skips
    quiet.file.flush()
    assert _progress(log) == [(1, 4), (2, 4), (3, 4), (4, 4)]
    again = tmp_path / "again.txt"
    run_sweep(pydocs_dir, tmp_path / "sweep", [1.5e10, 4e10],
              console=Console(file=open(again, "w"), width=200), **args)
    assert _progress(again) == [(1, 4), (2, 4), (3, 4), (4, 4)]
    curve = sorted((p for p in points if p["shape"] == min(shapes)), key=lambda p: p["steps"])
    assert len(curve) == 2, points  # one shape at both levels: one trunk, two branches
    low, high = curve
    assert low["trunk"] == high["trunk"] and low["warmup_steps"] == high["warmup_steps"]
    assert low["warmup_steps"] < low["branch_step"] < low["steps"] < high["branch_step"]
    per_step = high["batch_size"] * high["seq_len"] * high["flops_per_token"]
    assert cost(low) == pytest.approx(low["steps"] * per_step)
    assert cost(high) == pytest.approx((high["steps"] - low["branch_step"]) * per_step)
    assert cost(high) < high["flops"]  # the shared trunk is paid once
    for p in curve:  # the same schedule, trained straight through
        sets = [f"model.{k}={v}" for k, v in p["model"].items()] + over + [
            f"train.steps={p['steps']}", "train.budget=null", "train.val_every=0",
            f"train.batch_size={p['batch_size']}", f"train.lr={p['lr']}",
            "train.schedule=wsd", f"train.warmup={p['warmup_steps'] / p['steps']!r}",
            f"train.decay={(p['steps'] - p['branch_step']) / p['steps']!r}"]
        run = tmp_path / f"straight-{p['id']}"
        summary = train(load_config(None, sets), pydocs_dir, run, console=quiet)
        branch = json.loads((Path(p["run"]) / "summary.json").read_text())
        assert branch["tokens"] == summary["tokens"] == p["tokens"]
        assert branch["final_train_loss"] == pytest.approx(summary["final_train_loss"],
                                                           rel=1e-4)
        straight = held_out_loss(MLM, run, 8, p["seq_len"], quiet)
        assert p["val_loss"] == pytest.approx(straight, rel=1e-4)
    assert {p["id"] for p in read_points(tmp_path / "sweep")} == {p["id"] for p in points}



def _progress(log: Path) -> list[tuple[int, int]]:
    """The [k/n] progress counts a sweep's log printed, in order."""
    import re

    return [(int(a), int(b)) for a, b in re.findall(r"^\[(\d+)/(\d+)\]",
                                                    log.read_text(encoding="utf-8"), re.M)]
