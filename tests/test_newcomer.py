"""A newcomer's first hour through the real CLI (issue 22): one plain .txt file in, prep →
train → eval → export with defaults, and the edges around it (exit codes, messages, nothing
lost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SHARED_DATA, run_cli

WIKITEXT = SHARED_DATA / "corpora" / "wikitext2-valid.raw.txt"
TINY = ["--set", "model.hidden_size=64", "--set", "model.num_layers=1", "--set", "model.num_heads=2",
        "--set", "model.intermediate_size=128", "--set", "train.batch_size=8"]


def _pydocs_text(limit: int) -> str:
    from shoestring.data.builtin import iter_pydocs

    parts, size = [], 0
    for doc in iter_pydocs():
        parts.append(doc.text)
        size += len(doc.text)
        if size >= limit:
            break
    return "\n\n".join(parts)


@pytest.fixture(scope="module")
def one_txt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~300 KB of real text in one .txt file: WikiText-2 when ../shared/data has it, else
    the built-in corpus (Python's docs)."""
    path = tmp_path_factory.mktemp("txt") / "novel.txt"
    if WIKITEXT.is_file():
        path.write_text(WIKITEXT.read_text(encoding="utf-8")[:300_000], encoding="utf-8")
    else:
        path.write_text(_pydocs_text(300_000), encoding="utf-8")
    return path


def _ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _refused(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


def test_one_txt_file_prep_train_eval_export_with_defaults(one_txt: Path, tmp_path: Path) -> None:
    data, run, hf = tmp_path / "data", tmp_path / "run", tmp_path / "hf"
    _ok(run_cli("prep", str(one_txt), "-o", str(data)))
    m = json.loads((data / "manifest.json").read_text())
    assert m["documents"]["read"] > 100  # paragraphs, not one document
    assert m["splits"]["val"]["sequences"] > 0
    _ok(run_cli("train", "--data", str(data), "-o", str(run), "--steps", "3", *TINY))
    ev = _ok(run_cli("eval", str(run)))
    assert "validation MLM loss" in ev.stdout
    _ok(run_cli("export", str(run), "-o", str(hf)))
    for f in (hf / "model.safetensors", run / "final" / "model.safetensors"):
        assert f.stat().st_mode & 0o777 == 0o666 & ~_umask(), f
    # a path that is not a run dir says what it is
    _refused(run_cli("eval", str(hf)), "Hugging Face export", "not a run dir")
    _refused(run_cli("export", str(tmp_path / "nope"), "-o", str(tmp_path / "x")), "not found")
    _refused(run_cli("export", str(data), "-o", str(tmp_path / "x")), "data dir")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_file_without_blank_lines_takes_validation_from_its_end(tmp_path: Path) -> None:
    text = "\n".join(line for line in _pydocs_text(200_000).splitlines() if line.strip())
    log = tmp_path / "log.txt"
    log.write_text(text, encoding="utf-8")
    r = _ok(run_cli("prep", str(log), "-o", str(tmp_path / "d")))
    assert "the last 5% of the text" in r.stdout
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["split"]["method"] == "position" and "1 document kept" in m["split"]["reason"]
    assert m["documents"]["train"] == m["documents"]["val"] == 1
    assert m["splits"]["val"]["sequences"] > 0
    # one count everywhere: the table's kept row is the manifest's
    assert f"kept (train / val)      │ {m['documents']['kept']:,} (1 / 1)" in r.stdout


def test_split_on_lines_and_a_bad_value_names_the_option(tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text(_pydocs_text(120_000), encoding="utf-8")
    _ok(run_cli("prep", str(lines), "-o", str(tmp_path / "d"), "--split-on", "lines"))
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    non_blank = sum(1 for line in lines.read_text(encoding="utf-8").splitlines() if line.strip())
    assert m["documents"]["read"] == non_blank and m["config"]["split_on"] == "lines"
    r = run_cli("prep", str(lines), "-o", str(tmp_path / "e"), "--split-on", "paragraphs")
    _refused(r, "--split-on", "'blank', 'lines' or 'none'", "paragraphs")
    assert "--set" not in r.stderr and not (tmp_path / "e").exists()


def test_prep_replaces_a_data_dir_only_with_overwrite(one_txt: Path, tmp_path: Path) -> None:
    out = tmp_path / "d"
    _ok(run_cli("prep", str(one_txt), "-o", str(out), "--set", "data.vocab_size=1000"))
    before = (out / "manifest.json").read_bytes()
    _refused(run_cli("prep", str(one_txt), "-o", str(out)), "already exists", "--overwrite")
    assert (out / "manifest.json").read_bytes() == before
    _ok(run_cli("prep", str(one_txt), "-o", str(out), "--overwrite"))
    assert json.loads((out / "manifest.json").read_text())["tokenizer"]["vocab_size"] > 1000
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    _refused(run_cli("prep", str(one_txt), "-o", str(foreign), "--overwrite"), "not a shoestring")
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_train_refuses_data_settings_the_data_dir_was_not_prepared_with(
    one_txt: Path, tmp_path: Path
) -> None:
    data = tmp_path / "d"
    _ok(run_cli("prep", str(one_txt), "-o", str(data), "--set", "data.vocab_size=1000"))
    r = run_cli("train", "--data", str(data), "-o", str(tmp_path / "r"), "--steps", "1",
                "--set", "data.seq_len=64", *TINY)
    _refused(r, "data.seq_len=64", "seq_len=128", "manifest.json")
    assert not (tmp_path / "r").exists()


def test_prep_tokenizer_is_reproducible_for_bpe(one_txt: Path, tmp_path: Path) -> None:
    shas = set()
    for name in ("a", "b"):
        _ok(run_cli("prep", str(one_txt), "-o", str(tmp_path / name), "--objective", "clm"))
        shas.add(json.loads((tmp_path / name / "manifest.json").read_text())["tokenizer"]["sha256"])
    assert len(shas) == 1


def test_prep_on_ctrl_c_says_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "d"
    cmd = [sys.executable, "-m", "shoestring", "prep", "builtin:pydocs", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = tmp_path / ".d.partial" / "journal.json"
    deadline = time.monotonic() + 60
    while not journal.is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("prep finished before the interrupt arrived")
    assert proc.returncode == 130, stderr[-3000:]
    assert "run the same command again to resume" in stderr and "Traceback" not in stderr
    assert not out.exists() and journal.is_file()
    _ok(run_cli("prep", "builtin:pydocs", "-o", str(out)))
    assert (out / "manifest.json").is_file() and not (tmp_path / ".d.partial").exists()


def test_plan_clamps_a_loss_above_a_uniform_guess() -> None:
    r = _ok(run_cli("plan", "--budget", "1e11flops", "--hardware", "h100"))
    assert "predicted loss 9.011" in r.stdout  # ln(8192)
    assert "uniform guess (ln(vocabulary) = 9.01)" in " ".join(r.stdout.split())


def test_help_shows_no_python_types_and_models_fits_80_columns() -> None:
    for command in ("prep", "train", "eval", "export", "serve", "plan", "sweep", "report", "cram"):
        r = _ok(run_cli(command, "--help"))
        assert "list[" not in r.stdout and "{" not in r.stdout, (command, r.stdout)
    assert "prep [OPTIONS] SOURCES...\n" in run_cli("prep", "--help").stdout
    for command in ("train", "cram", "plan"):  # every budget form the grammar takes is named
        text = " ".join(run_cli(command, "--help").stdout.split())
        assert all(form in text for form in ("24h", "3e15flops", "2pf-days", "20Mtok",
                                             "1000steps")), (command, text)
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "shoestring", "presets"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    assert "…" not in r.stdout and "llama-1b" in r.stdout and "CPU minutes" in r.stdout
