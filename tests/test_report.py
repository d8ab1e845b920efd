"""`shoestring report`: plots and an HTML page from real (tiny) training runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli, tiny_config
from rich.console import Console

from shoestring.errors import ShoestringError
from shoestring.report import load_run, read_metrics, write_report
from shoestring.train.loop import train

LOSS_PLOTS = {"loss_vs_time.png", "loss_vs_tokens.png", "loss_vs_flops.png"}


@pytest.fixture(scope="module")
def runs(pydocs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two real runs with different recipes (batch, LR, schedule), periodic validation on."""
    root = tmp_path_factory.mktemp("report_runs")
    common: dict = {"steps": 20, "log_every": 4, "val_every": 0.5, "val_sequences": 8,
                    "checkpoint_every": None, "tensorboard": False}
    quiet = Console(quiet=True)
    train(tiny_config(batch_size=16, lr=2e-3, **common), pydocs_dir, root / "alpha", console=quiet)
    train(tiny_config(batch_size=8, lr=1e-3, schedule="cosine", **common), pydocs_dir,
          root / "beta", console=quiet)
    return [root / "alpha", root / "beta"]


def _png_shape(path: Path) -> tuple[int, ...]:
    from matplotlib.image import imread

    return imread(path).shape


def test_report_files_for_two_runs(runs: list[Path], tmp_path: Path) -> None:
    out = write_report(runs, tmp_path / "rep")
    names = {p.name for p in out.iterdir()}
    assert LOSS_PLOTS | {"lr.png", "batch_size.png", "index.html", "report.json"} <= names
    for png in out.glob("*.png"):
        h, w, channels = _png_shape(png)  # decodes: a real PNG
        assert 300 <= h <= 2000 and 500 <= w <= 3000 and channels in (3, 4), (png.name, h, w)
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "alpha" in page and "beta" in page
    assert page.count("data:image/png;base64,") == len(list(out.glob("*.png")))  # self-contained
    report = json.loads((out / "report.json").read_text())
    tables = {r["name"]: r["table"] for r in report["runs"]}
    assert tables["alpha"]["steps"] == "20" and tables["beta"]["steps"] == "20"
    assert tables["alpha"]["tokens"] == f"{20 * 16 * 64:,}"
    assert "cosine" in tables["beta"]["recipe"]
    assert tables["alpha"]["last validation loss"] != "—"  # periodic val records are read
    assert tables["alpha"]["held-out eval loss"] == "—"  # no eval.json yet


def test_metrics_records_split_and_series(runs: list[Path]) -> None:
    from shoestring.report import series

    run = load_run(runs[0])
    assert [r["step"] for r in run.train] == [4, 8, 12, 16, 20]
    assert run.val and all("val_loss" in r for r in run.val)
    xs, _ = series(run, "flops", "loss")
    assert len(xs) == 5 and xs == sorted(xs)
    assert xs[-1] == pytest.approx(run.summary["total_flops"])
    vx, _ = series(run, "tokens", "val_loss", run.val)
    assert vx[-1] == run.summary["tokens"]


def test_eval_json_appears_in_report(runs: list[Path], tmp_path: Path) -> None:
    run = tmp_path / "gamma"
    shutil.copytree(runs[0], run)
    (run / "eval.json").write_text(json.dumps({"mlm_loss": 6.5, "unigram_loss": 7.0}))
    out = write_report([run], tmp_path / "rep")
    table = json.loads((out / "report.json").read_text())["runs"][0]["table"]
    assert table["held-out eval loss"] == "6.500 (unigram 7.000)"


def test_rewrites_own_report_refuses_foreign_folder(runs: list[Path], tmp_path: Path) -> None:
    out = write_report(runs[:1], tmp_path / "rep")
    write_report(runs, out)  # an earlier report is replaced whole
    assert "beta" in (out / "index.html").read_text()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ShoestringError, match="not a shoestring report"):
        write_report(runs, foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_malformed_metrics_names_the_line(runs: list[Path], tmp_path: Path) -> None:
    run = tmp_path / "broken"
    shutil.copytree(runs[0], run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:-5]  # a truncated record in the middle
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ShoestringError) as e:
        write_report([run], tmp_path / "rep")
    assert e.value.where == f"{run / 'metrics.jsonl'}:3" and "line 3" in e.value.what
    assert not (tmp_path / "rep").exists()

    lines[2] = json.dumps({"step": 3, "lr": 0.1})  # valid JSON, but no loss
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ShoestringError, match="line 3 has neither"):
        write_report([run], tmp_path / "rep")

    (run / "metrics.jsonl").write_text("\n\n")
    with pytest.raises(ShoestringError, match="no run has metrics yet"):
        write_report([run], tmp_path / "rep")


def test_a_run_without_metrics_is_listed_beside_the_others(runs: list[Path],
                                                           tmp_path: Path) -> None:
    """`report A B` where B has started (config.yaml) but logged nothing: the report of A,
    with B listed as interrupted — not a refusal of both."""
    import shutil

    starting = tmp_path / "starting"
    starting.mkdir()
    shutil.copy(runs[0] / "config.yaml", starting / "config.yaml")
    done = run_cli("report", str(runs[0]), str(starting), "-o", str(tmp_path / "rep"),
                   timeout=120)
    assert done.returncode == 0, done.stderr
    listed = json.loads((tmp_path / "rep" / "report.json").read_text())["runs"]
    assert [r["name"] for r in listed] == [runs[0].name, "starting"]
    assert any("no metrics yet" in n for n in listed[1]["notes"])
    assert listed[0]["table"] and not any("no metrics" in n for n in listed[0]["notes"])
    assert "no metrics yet" in (tmp_path / "rep" / "index.html").read_text()


def test_interrupted_run_unterminated_line_and_relogged_steps(tmp_path: Path) -> None:
    """A killed run: no summary, a half-written last line; a resumed one re-logs steps."""
    path = tmp_path / "metrics.jsonl"
    records = [{"step": s, "loss": 5.0 - s / 10, "tokens": 100 * s, "elapsed_s": s}
               for s in (1, 2, 3)]
    records += [{"step": 2, "loss": 4.0, "tokens": 200, "elapsed_s": 2.5}]  # resumed from step 1
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 3, "lo')
    train_records, val, notes = read_metrics(path)
    assert [(r["step"], r["loss"]) for r in train_records] == [(1, 4.9), (2, 4.0)]
    assert val == [] and "incomplete last line (5)" in notes[0]


def test_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(ShoestringError, match="not a shoestring run dir"):
        load_run(tmp_path)
    with pytest.raises(ShoestringError, match="run dir not found"):
        load_run(tmp_path / "nope")


def test_cli_report(runs: list[Path], tmp_path: Path) -> None:
    done = run_cli("report", *map(str, runs), "-o", str(tmp_path / "rep"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "rep" / "index.html").is_file()
    bad = run_cli("report", str(tmp_path / "rep"), timeout=120)  # a report is not a run dir
    assert bad.returncode == 2 and "not a shoestring run dir" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_run_named_twice_is_reported_once(runs: list[Path], tmp_path: Path) -> None:
    """`report R R` (or R and ./R/) plots R once (issue 62: it was drawn twice)."""
    run = runs[0]
    out = write_report([run, Path(f"{run}/"), run.parent / "." / run.name], tmp_path / "rep")
    report = json.loads((out / "report.json").read_text())
    assert [r["name"] for r in report["runs"]] == ["alpha"]
