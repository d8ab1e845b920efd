"""Real runs: prep → train (step budget) → eval, through the library and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import SMALL_DATA, run_cli, tiny_config
from shoestring.data.prep import prep
from shoestring.errors import ShoestringError
from shoestring.eval.mlm import evaluate_run
from shoestring.train.loop import train
from shoestring.train.rundir import load_final

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(pydocs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("run") / "r"
    train(tiny_config(steps=150, batch_size=32, lr=3e-3), pydocs_dir, run)
    return run


def test_loss_falls_below_unigram_baseline(trained: Path) -> None:
    result = evaluate_run(trained)
    assert result["mlm_loss"] < result["unigram_loss"] - 0.2, result
    assert result["accuracy"] > 0.1
    assert json.loads((trained / "eval.json").read_text()) == result


def test_run_dir_artifacts(trained: Path) -> None:
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["steps"] == 150 and summary["tokens"] == 150 * 32 * 64
    assert summary["final_train_loss"] < summary["first_loss"] - 1.0
    assert 0 < summary["mfu"] < 1
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(10, 151, 10))
    assert records[-1]["progress"] == 1.0 and records[-1]["tokens"] == summary["tokens"]
    lrs = [r["lr"] for r in records]
    assert lrs.index(max(lrs)) in (10, 11)  # one-cycle peak at 75% of 150 steps
    cfg = yaml.safe_load((trained / "config.yaml").read_text())
    assert cfg["train"]["steps"] == 150
    assert {p.name for p in (trained / "final").iterdir()} == {"model.safetensors", "config.json", "tokenizer.json"}


def test_final_model_reloads_identically(trained: Path) -> None:
    import torch

    a, _ = load_final(trained)
    b, _ = load_final(trained)
    ids = torch.randint(5, 2000, (2, 64))
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids))


def test_step_budget_runs_are_reproducible(pydocs_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(steps=6, batch_size=8, precision="fp32")
    s1 = train(cfg, pydocs_dir, tmp_path / "a")
    s2 = train(cfg, pydocs_dir, tmp_path / "b")
    l1 = [json.loads(x)["loss"] for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    l2 = [json.loads(x)["loss"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert l1 == l2 and s1["final_train_loss"] == s2["final_train_loss"]


def test_existing_run_dir_is_not_clobbered(pydocs_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(steps=1, batch_size=4)
    train(cfg, pydocs_dir, tmp_path / "r")
    before = (tmp_path / "r" / "final" / "model.safetensors").read_bytes()
    with pytest.raises(ShoestringError, match="--overwrite"):
        train(cfg, pydocs_dir, tmp_path / "r")
    assert (tmp_path / "r" / "final" / "model.safetensors").read_bytes() == before


def test_failed_prep_keeps_the_previous_data_dir(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("Some words that make a corpus of sorts, repeated for the tokenizer. " * 50)
    out = tmp_path / "d"
    cfg = SMALL_DATA.model_copy(update={"vocab_size": 200, "seq_len": 16, "val_fraction": 0.01})
    prep([str(good)], out, cfg)
    before = (out / "manifest.json").read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(ShoestringError, match="bad.jsonl:2"):
        prep([str(good), str(bad)], out, cfg)
    assert (out / "manifest.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_prep_refuses_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    good = tmp_path / "good.txt"
    good.write_text("words " * 100)
    with pytest.raises(ShoestringError, match="not a shoestring data dir"):
        prep([str(good)], tmp_path / "out", SMALL_DATA)
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


def test_cli_prep_train_eval(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    from shoestring.data.builtin import iter_pydocs

    with corpus.open("w") as f:
        for _, doc in zip(range(150), iter_pydocs()):
            f.write(json.dumps({"body": doc.text}) + "\n")
    small = ["--set", "data.vocab_size=1000", "--set", "data.seq_len=64", "--set", "data.text_field=body"]
    p = run_cli("prep", str(corpus), "-o", str(tmp_path / "d"), *small)
    assert p.returncode == 0, p.stderr
    assert "documents read" in p.stdout and "150" in p.stdout
    tiny = ["--set", "model.hidden_size=64", "--set", "model.num_layers=1", "--set", "model.num_heads=2",
            "--set", "model.intermediate_size=64", "--set", "train.batch_size=8"]
    t = run_cli("train", "--data", str(tmp_path / "d"), "-o", str(tmp_path / "r"), "--steps", "3", *tiny)
    assert t.returncode == 0, t.stderr
    assert "tokens/s" in t.stdout
    e = run_cli("eval", str(tmp_path / "r"))
    assert e.returncode == 0, e.stderr
    assert "unigram baseline" in e.stdout
    assert json.loads((tmp_path / "r" / "eval.json").read_text())["sequences"] > 0
