"""Bad input through the real CLI: a clear message naming what and where, exit 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import fails_cleanly as _fails
from conftest import run_cli, write_jsonl_corpus


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    _fails(run_cli("prep", str(missing), "-o", str(tmp_path / "d")), str(missing))


def test_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("   \n\n")
    _fails(run_cli("prep", str(tmp_path / "empty.txt"), "-o", str(tmp_path / "d")), "empty")
    assert not (tmp_path / "d").exists()


def test_malformed_json_line_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "fine"}\n{"text": "broken\n')
    _fails(run_cli("prep", str(f), "-o", str(tmp_path / "d")), f"{f}:2", "malformed JSON")


def test_missing_text_field(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"body": "hello"}) + "\n")
    _fails(run_cli("prep", str(f), "-o", str(tmp_path / "d")), f"{f}:1", "text", "body")


def test_binary_file(tmp_path: Path) -> None:
    f = tmp_path / "blob.txt"
    f.write_bytes(b"\x00\x01\x02binary\x00" * 100)
    _fails(run_cli("prep", str(f), "-o", str(tmp_path / "d")), str(f), "binary")


def test_non_utf8_file_and_skip_option(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait".encode("latin-1"))
    _fails(run_cli("prep", str(bad), "-o", str(tmp_path / "d")), str(bad), "UTF-8")
    good = write_jsonl_corpus(tmp_path / "good.jsonl", 60)
    ok = run_cli("prep", str(bad), str(good), "-o", str(tmp_path / "d"),
                 "--set", "data.on_error=skip", "--set", "data.vocab_size=500")
    assert ok.returncode == 0, ok.stderr
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["documents"]["skipped_bad_input"] == 1
    assert str(bad) in manifest["skipped_examples"][0]


def test_bad_budget(tmp_path: Path) -> None:
    _fails(run_cli("train", "--data", str(tmp_path), "-o", str(tmp_path / "r"), "--budget", "5x"),
           "5x", "duration")


def test_unknown_set_key() -> None:
    _fails(run_cli("config", "show", "--set", "model.depth=3"), "model.depth", "num_layers")


def test_train_on_missing_data_dir(tmp_path: Path) -> None:
    _fails(run_cli("train", "--data", str(tmp_path / "none"), "-o", str(tmp_path / "r"), "--steps", "1"),
           "data dir not found")


def test_eval_without_a_trained_model(tmp_path: Path) -> None:
    _fails(run_cli("eval", str(tmp_path)), "final/ is missing")


def test_version_and_help() -> None:
    from shoestring import __version__

    v = run_cli("--version")
    assert v.returncode == 0 and __version__ in v.stdout
    h = run_cli("--help")
    assert h.returncode == 0 and all(c in h.stdout for c in ("prep", "train", "eval", "cram", "config"))


def test_tables_in_a_log_are_not_cut_at_80_columns() -> None:
    """With no terminal and no COLUMNS (a log file, CI), tables use LOG_WIDTH columns: the
    presets table's rows fit on one line each instead of wrapping at 80."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-m", "shoestring", "presets"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    widths = [len(line) for line in r.stdout.splitlines()]
    assert max(widths) > 80, r.stdout
    assert max(widths) <= 160


def test_eval_says_when_the_model_is_worse_than_the_unigram_baseline(
        capsys: pytest.CaptureFixture) -> None:
    from shoestring.cli_eval import print_mlm

    result = {"mlm_loss": 7.2, "perplexity": 1339.4, "mask_rate": 0.25, "unigram_loss": 6.9,
              "accuracy": 0.05, "masked_tokens": 1000, "sequences": 10}
    print_mlm(result, Path("runs/x"))
    worse = capsys.readouterr().out
    assert "0.300 worse" in worse and "train longer" in worse
    print_mlm({**result, "mlm_loss": 4.0}, Path("runs/x"))
    assert "2.900 better" in capsys.readouterr().out


def test_help_does_not_import_torch() -> None:
    """`shoestring --help` and a command's --help answer without loading torch (it cost 2.5-4
    s of start-up per call): the heavy stacks are imported by the commands that use them."""
    import subprocess
    import sys

    code = ("import sys\nfor argv in (['shoestring', '--help'], ['shoestring', 'train', "
            "'--help'], ['shoestring', 'serve', '--help']):\n"
            "    sys.argv = argv\n    from shoestring.cli import main\n    try:\n        main()\n"
            "    except SystemExit as e:\n        assert e.code == 0, e.code\n"
            "print('TORCH', 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TORCH False" in r.stdout


def test_errors_cross_a_process_boundary_whole() -> None:
    """A sweep's worker process hands its error back pickled: what, where and fix (and an
    interruption's signal, checkpoint and step) must survive, or the CLI's message loses them."""
    import pickle
    import signal

    from shoestring.errors import ShoestringError, TrainingInterrupted

    e = pickle.loads(pickle.dumps(ShoestringError("bad value", where="c.yaml:3", fix="use 1")))
    assert (e.what, e.where, e.fix) == ("bad value", "c.yaml:3", "use 1")
    assert str(e) == "c.yaml:3: bad value\n  → use 1"
    t = pickle.loads(pickle.dumps(TrainingInterrupted(signal.SIGTERM, Path("/r/ckpt"), 7)))
    assert (t.signum, t.checkpoint, t.step) == (signal.SIGTERM, Path("/r/ckpt"), 7)
    assert "SIGTERM at step 7" in str(t)
