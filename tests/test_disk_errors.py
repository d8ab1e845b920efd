"""A full or read-only output filesystem (issue 37): every writing command stops with exit 2,
a message naming the path and the reason, no traceback, no temporary files left behind, and
an earlier output untouched. The filesystems are real: small tmpfs mounts (root only; the
tests skip with the reason elsewhere)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import run_cli, tiny_config
from shoestring.errors import ShoestringError
from shoestring.fsutil import output_error, write_bytes_atomic

TINY = ["--set", "model.hidden_size=64", "--set", "model.num_layers=2", "--set",
        "model.num_heads=2", "--set", "model.intermediate_size=128", "--set",
        "train.attention=sdpa", "--set", "train.compile=false"]


def _mount(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or 'not root'}): the "
                    "full/read-only disk tests need one")


def _mounted(mnt: Path, options: str) -> Iterator[Path]:
    _mount(mnt, options)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB filesystem: a model checkpoint or a data dir does not fit."""
    yield from _mounted(tmp_path / "small", "size=1m")


@pytest.fixture
def readonly_fs(tmp_path: Path) -> Iterator[Path]:
    yield from _mounted(tmp_path / "ro", "ro,size=1m")


def _fill(fs: Path) -> None:
    """Leave no free block on ``fs``."""
    try:
        with open(fs / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    except OSError as e:
        assert e.errno == errno.ENOSPC


def _used(fs: Path) -> int:
    st = os.statvfs(fs)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _refused(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    text = " ".join(r.stderr.split())
    for n in needles:
        assert n in text, (n, text[-2000:])
    return text


def _hidden_leftovers(fs: Path) -> list[str]:
    return sorted(str(p.relative_to(fs)) for p in fs.rglob("*")
                  if p.name.endswith((".tmp", ".partial")) or p.name.startswith(".push-"))


# --------------------------------------------------------------------------- the translation


@pytest.mark.parametrize(("code", "fix"), [
    (errno.ENOSPC, "free space on that filesystem"), (errno.EDQUOT, "quota"),
    (errno.EROFS, "read-only"), (errno.EACCES, "permissions"),
])
def test_a_refused_write_becomes_the_standard_error_wherever_it_is_wrapped(code: int, fix: str
                                                                          ) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    raw = OSError(code, os.strerror(code), "/out/model.safetensors")
    try:
        try:
            raise raw
        except OSError as e:
            raise RuntimeError("a library's wrapper") from e
    except RuntimeError as wrapped:
        chained = wrapped
    dcp = CheckpointException("save failed", {0: (raw, None)})
    for exc in (raw, chained, dcp):
        found = output_error(exc)
        assert isinstance(found, ShoestringError), exc
        assert found.where == "/out/model.safetensors" and fix in found.fix
        assert os.strerror(code) in found.what
    assert output_error(FileNotFoundError(errno.ENOENT, "gone", "x")) is None
    assert output_error(ValueError("a bug keeps its traceback")) is None


def test_an_atomic_write_on_a_full_disk_leaves_the_old_file_and_no_temporary(small_fs: Path
                                                                            ) -> None:
    target = small_fs / "summary.json"
    target.write_text("old")
    _fill(small_fs)
    with pytest.raises(OSError) as e:
        write_bytes_atomic(target, b"x" * 2_000_000)
    assert e.value.errno == errno.ENOSPC
    assert target.read_text() == "old"
    assert not (small_fs / "summary.json.tmp").exists()


# --------------------------------------------------------------------------- the commands


def test_prep_on_a_full_disk_frees_what_it_wrote(small_fs: Path) -> None:
    before = _used(small_fs)
    r = run_cli("prep", "builtin:pydocs", "-o", str(small_fs / "data"), "--set",
                "data.vocab_size=2000", "--set", "data.seq_len=64")
    _refused(r, "the filesystem refused: No space left on device", str(small_fs))
    assert list(small_fs.iterdir()) == [] and _used(small_fs) <= before


def test_prep_over_an_existing_data_dir_on_a_full_disk_leaves_it_whole(tmp_path: Path) -> None:
    fs = tmp_path / "mid"
    _mount(fs, "size=6m")
    try:
        out = fs / "data"
        args = ["prep", "builtin:pydocs", "-o", str(out), "--set", "data.vocab_size=2000",
                "--set", "data.seq_len=64"]
        assert run_cli(*args).returncode == 0
        kept = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        _fill(fs)
        _refused(run_cli(*args, "--set", "data.seq_len=32", "--overwrite"),
                 "No space left on device", str(out))
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept
        assert sorted(p.name for p in fs.iterdir()) == ["data", "filler"]  # no build folder
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def test_prep_into_a_read_only_folder_is_refused(readonly_fs: Path) -> None:
    r = run_cli("prep", "builtin:pydocs", "-o", str(readonly_fs / "data"))
    _refused(r, "Read-only file system", "write the output elsewhere")


def test_train_whose_checkpoint_fills_the_disk_stops_cleanly(pydocs_dir: Path,
                                                             small_fs: Path) -> None:
    run = small_fs / "run"
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(run), "--steps", "2",
                "--set", "train.tensorboard=false", *TINY)
    _refused(r, "the filesystem refused: No space left on device", str(run / "checkpoints"))
    assert _hidden_leftovers(small_fs) == []
    assert not (run / "final").exists() and (run / "config.yaml").is_file()


def test_export_and_index_on_a_full_disk_keep_the_previous_output(pydocs_dir: Path,
                                                                  small_fs: Path,
                                                                  tmp_path: Path) -> None:
    from shoestring.train.loop import train

    run = tmp_path / "run"
    train(tiny_config(steps=1, tensorboard=False), pydocs_dir, run)
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(f"passage {i} about topic {i % 7}" for i in range(200)))
    export, index = small_fs / "hf", small_fs / "index"
    assert run_cli("export", str(run), "-o", str(export)).returncode == 0
    assert run_cli("index", str(corpus), "-o", str(index)).returncode == 0
    kept = {p: p.read_bytes() for p in [*export.rglob("*"), *index.rglob("*")] if p.is_file()}
    _fill(small_fs)
    _refused(run_cli("export", str(run), "-o", str(export), "--overwrite"),
             "No space left on device")
    corpus.write_text(corpus.read_text() + "\n\nanother passage")  # a rebuild is due
    _refused(run_cli("index", str(corpus), "-o", str(index), "--overwrite"),
             "No space left on device")
    assert {p: p.read_bytes() for p in kept} == kept
    assert _hidden_leftovers(small_fs) == []


def test_models_push_into_a_full_or_read_only_repository_is_refused(
        pydocs_dir: Path, small_fs: Path, readonly_fs: Path, tmp_path: Path) -> None:
    from shoestring.train.loop import train

    run = tmp_path / "run"
    train(tiny_config(steps=1, tensorboard=False), pydocs_dir, run)
    for home, needle in ((small_fs, "No space left on device"),
                         (readonly_fs, "Read-only file system")):
        env = {**os.environ, "SHOESTRING_HOME": str(home)}
        if home == small_fs:
            (small_fs / "models").mkdir()
            _fill(small_fs)
        r = _run_env(env, "models", "push", str(run), "-n", "tiny")
        _refused(r, needle)
        assert _hidden_leftovers(home) == []


def _run_env(env: dict, *args: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-m", "shoestring", *args], capture_output=True,
                          text=True, timeout=300, env={**env, "COLUMNS": "200"})
