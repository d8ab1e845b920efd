"""One writer per run dir (issue 37): `train` and `train --resume` hold an OS lock on the run
dir; a second writer is refused with exit 2 and leaves the first one's files alone; the lock
of a killed process is taken over."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from shoestring.errors import ShoestringError
from shoestring.fsutil import WRITER_LOCK
from shoestring.rundir import RunDir

TINY = ["--set", "model.hidden_size=64", "--set", "model.num_layers=2", "--set",
        "model.num_heads=2", "--set", "model.intermediate_size=128", "--set", "train.batch_size=8",
        "--set", "train.compile=false", "--set", "train.attention=sdpa"]


def _wait_for(cond, timeout: float = 120.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the first writer"
        time.sleep(0.1)


def test_a_second_writer_is_refused_and_a_killed_writers_lock_is_taken_over(
        pydocs_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(
        [sys.executable, "-m", "shoestring", "train", "-d", str(pydocs_dir), "-o", str(run),
         "--budget", "100000steps", "--set", "train.checkpoint_every=2steps", *TINY],
        stdout=subprocess.DEVNULL, stderr=log)
    try:
        _wait_for(lambda: len(RunDir(run).checkpoints()) >= 1 or first.poll() is not None)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
        for second in (["--resume", "--budget", "100000steps"], ["--overwrite", "--steps", "1"]):
            r = run_cli("train", "-d", str(pydocs_dir), "-o", str(run), *second, *TINY)
            assert r.returncode == 2, r.stderr[-2000:]
            assert "Traceback" not in r.stderr
            text = " ".join(r.stderr.split())
            assert f"another process (pid {first.pid}) is writing this run dir" in text, text
            assert first.poll() is None  # the first writer goes on, its run dir intact
            assert RunDir(run).is_run and RunDir(run).checkpoints()
    finally:
        first.send_signal(signal.SIGKILL)  # a dead writer: its lock file stays behind
        first.wait(timeout=60)
        log.close()
    assert (run / WRITER_LOCK).is_file()
    step = int(RunDir(run).checkpoints()[-1].name.split("_")[-1])
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(run), "--resume",
                "--budget", f"{step + 1}steps", *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (run / "final" / "model.safetensors").is_file()


def test_the_lock_is_released_when_its_block_ends_however_it_ends(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with run.writing():
        with pytest.raises(ShoestringError, match="is writing this run dir"), run.writing():
            pass
        with run.writing(enabled=False):  # another rank of the same job
            pass
    with pytest.raises(RuntimeError), run.writing():
        raise RuntimeError("a crash inside")
    with run.writing():  # free again after both exits
        pass


def test_overwriting_a_run_keeps_the_lock_it_holds(pydocs_dir: Path, tmp_path: Path) -> None:
    # RunDir.create empties the folder rather than removing it: a removed folder would take
    # the held lock with it, and a second writer could lock a fresh one
    run = RunDir.create(tmp_path / "run", overwrite=False)
    (run.path / "metrics.jsonl").write_text("{}\n")
    with run.writing():
        inode = (run.path / WRITER_LOCK).stat().st_ino
        RunDir.create(run.path, overwrite=True)
        assert (run.path / WRITER_LOCK).stat().st_ino == inode
        assert not (run.path / "metrics.jsonl").exists() and run.is_run
        with pytest.raises(ShoestringError, match="is writing this run dir"), run.writing():
            pass
