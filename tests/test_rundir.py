"""RunDir: the one reader/writer of a run dir (docs/artifacts.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shoestring.config import Config, ModelConfig
from shoestring.errors import ShoestringError
from shoestring.model import build_model
from shoestring.rundir import MARKER, RunDir, model_meta


def test_create_refuses_a_folder_without_the_marker(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ShoestringError):
        RunDir.create(mine, overwrite=True)
    assert (mine / "notes.txt").read_text() == "keep me"
    assert not RunDir(mine).is_run


def test_create_replaces_only_its_own_run(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", overwrite=False)
    assert run.is_run and (run.path / MARKER).is_file()
    (run.path / "old.txt").write_text("x")
    with pytest.raises(ShoestringError):
        RunDir.create(run.path, overwrite=False)
    RunDir.create(run.path, overwrite=True)
    assert not (run.path / "old.txt").exists() and run.is_run


def test_config_summary_metrics_and_checkpoints_round_trip(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", overwrite=False)
    cfg = Config(model=ModelConfig(preset="clm-tiny"))
    run.write_config(cfg)
    assert run.read_config() == cfg
    run.write_summary({"data_dir": "/data", "steps": 3})
    assert run.read_summary()["steps"] == 3 and run.data_dir() == "/data"
    run.metrics_path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # killed mid-write
    assert run.read_metrics() == [{"step": 1, "loss": 2.0}]
    assert run.checkpoints() == []
    # complete = DCP metadata and state.json (written last); 30 died before its state file
    for step, complete in ((20, True), (10, True), (30, False)):
        ck = run.checkpoints_dir / f"step_{step:08d}"
        ck.mkdir(parents=True)
        (ck / ".metadata").write_bytes(b"")
        if complete:
            (ck / "state.json").write_text("{}")
    assert [p.name for p in run.checkpoints()] == ["step_00000010", "step_00000020"]
    assert run.checkpoints()[-1] == run.checkpoints_dir / "step_00000020"


def test_missing_summary_says_how_to_get_the_data_dir(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", overwrite=False)
    with pytest.raises(ShoestringError, match="--data"):
        run.data_dir()
    with pytest.raises(ShoestringError):
        run.read_summary()


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_final_round_trips_both_families(tmp_path: Path, objective: str) -> None:
    cfg = ModelConfig(objective=objective, hidden_size=32, num_layers=1, num_heads=2,
                      intermediate_size=48)
    torch.manual_seed(0)
    model = build_model(cfg, 100)
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    run = RunDir.create(tmp_path / "run", overwrite=False)
    run.save_final(model, model_meta(Config(model=cfg), 100, 16, {}), tok)
    loaded, meta = run.load_final()
    assert type(loaded) is type(model) and run.family().name == objective
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    meta["architecture"] = "shoestring-xyz"
    (run.final_dir / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ShoestringError, match="cannot load the trained model"):
        run.load_final()
