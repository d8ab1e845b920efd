"""Loading a checkpoint runs no code from it (issue 37): DCP's ``.metadata`` and the
non-tensor values of its shards are pickles, read through allow-lists
(shoestring.train.dcp_safe). Each test plants a payload that would create a marker file."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from conftest import run_cli, tiny_config
from shoestring.data.datadir import DataDir
from shoestring.errors import ShoestringError
from shoestring.rundir import RunDir
from shoestring.train.checkpoint import _dcp, incomplete_checkpoints
from shoestring.train.loop import train


class _Payload:
    """Unpickling this runs a shell command (what a crafted run dir would carry)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_metadata_file_is_refused_on_resume_and_its_payload_never_runs(
        pydocs_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(steps=2, checkpoint_every="1steps"), pydocs_dir, run)
    marker = tmp_path / "pwned"
    newest = RunDir(run).checkpoints()[-1]
    (newest / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(run), "--resume", "--steps", "3")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    text = " ".join(r.stderr.split())
    assert "posix.system is not allowed" in text and str(newest) in text, text[-1500:]
    assert not marker.exists()


def test_a_real_checkpoint_still_loads_through_the_allow_lists(pydocs_dir: Path,
                                                               tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(steps=2), pydocs_dir, run)
    resumed = train(tiny_config(steps=3), pydocs_dir, run, resume=True)
    assert resumed["steps"] == 3 and resumed["resumed"]


def test_a_crafted_non_tensor_value_in_a_shard_is_refused_and_never_runs(tmp_path: Path
                                                                        ) -> None:
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "pwned"
    ckpt = tmp_path / "ckpt"
    _dcp(dcp.save, {"w": torch.ones(3), "lr": _Payload(marker)}, ckpt, no_dist=True)
    assert not marker.exists()
    state = {"w": torch.zeros(3), "lr": 0.0}
    with pytest.raises(ShoestringError, match="refusing a value of the checkpoint"):
        _dcp(dcp.load, state, ckpt, no_dist=True)
    assert not marker.exists()
    # the same container with plain values loads
    _dcp(dcp.save, {"w": torch.ones(3), "lr": (0.9, 0.95)}, tmp_path / "ok", no_dist=True)
    _dcp(dcp.load, state, tmp_path / "ok", no_dist=True)
    assert state["lr"] == (0.9, 0.95) and state["w"].sum() == 3


def test_a_truncated_shard_or_a_bad_state_is_refused_by_name(pydocs_dir: Path,
                                                             tmp_path: Path) -> None:
    """`train --resume` on a checkpoint whose shard was cut short, or whose state.json was
    edited into nonsense, exits 2 naming the checkpoint and what to do (issue 52: a
    `PytorchStreamReader` / `KeyError: 'elapsed'` traceback, exit 1); the run resumes from
    the checkpoint before once the bad one is deleted."""
    import json
    import shutil

    run = tmp_path / "run"
    train(tiny_config(steps=2, checkpoint_every="1steps"), pydocs_dir, run)
    newest = RunDir(run).checkpoints()[-1]
    resume = ["train", "-d", str(pydocs_dir), "-o", str(run), "--resume", "--steps", "3"]
    state = (newest / "state.json").read_text()
    (newest / "state.json").write_text(json.dumps({"step": "NaN", "cursor": -1}))
    r = run_cli(*resume)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    text = " ".join(r.stderr.split())
    assert str(newest / "state.json") in text and "step: Input should be a valid integer" in text
    assert "delete this checkpoint folder" in text
    cut = json.loads(state)  # the random state cut short (issue 62: a RuntimeError traceback)
    cut["rng"]["torch"] = cut["rng"]["torch"][:100]
    (newest / "state.json").write_text(json.dumps(cut))
    r = run_cli(*resume)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    text = " ".join(r.stderr.split())
    assert str(newest / "state.json") in text and "rng.torch is damaged (100 values" in text
    assert "delete this checkpoint folder" in text
    far = json.loads(state)  # a cursor past the data (issue 62: accepted silently)
    far["cursor"]["offset"] = 10**9
    (newest / "state.json").write_text(json.dumps(far))
    r = run_cli(*resume)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    text = " ".join(r.stderr.split())
    sequences = DataDir(pydocs_dir).manifest["splits"]["train"]["sequences"]
    assert str(newest / "state.json") in text and "cursor.offset is 1,000,000,000" in text
    assert f"holds {sequences:,} sequences" in text and str(pydocs_dir) in text
    assert "--data set to the data dir this run trained on" in text
    assert RunDir(run).checkpoints()[-1] == newest  # refused before any step
    (newest / "state.json").write_text(state)
    shard = next(newest.glob("*.distcp"))
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    r = run_cli(*resume)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    text = " ".join(r.stderr.split())
    assert str(newest) in text and "a shard does not read back" in text
    assert "delete this checkpoint folder" in text
    shutil.rmtree(newest)  # what the message says to do
    r = run_cli(*resume)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["resumed"]


def test_an_incomplete_checkpoint_is_named_skipped_and_then_pruned(pydocs_dir: Path,
                                                                  tmp_path: Path) -> None:
    """A ``step_N`` folder without DCP's .metadata (cut off while saved or copied) cannot be
    loaded: `train --resume` says which folder it skips and why, resumes from the newest
    complete one, and the folder is deleted with the next save (issue 62: skipped without a
    word, then pruned)."""
    import json
    import shutil

    run = tmp_path / "run"
    train(tiny_config(steps=3, checkpoint_every="1steps"), pydocs_dir, run)
    older, newest = RunDir(run).checkpoints()
    (newest / ".metadata").unlink()
    copied = newest.parent / "step_00000050"  # a copy cut off: no step re-saves its name
    shutil.copytree(older, copied)
    (copied / ".metadata").unlink()
    assert incomplete_checkpoints(run) == [newest, copied]
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(run), "--resume", "--steps", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    text = " ".join(r.stderr.split())
    for cut in (newest, copied):
        assert (f"warning: skipping the checkpoint {cut}: it has no DCP .metadata, so it was "
                "cut off while it was saved") in text, text[:2000]
    assert "resuming at step 2" in text and "deleted when the run saves its next" in text
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert incomplete_checkpoints(run) == [] and not copied.exists()
    assert [p.name for p in RunDir(run).checkpoints()] == ["step_00000003", "step_00000004"]
