"""Real runs: prep → train (step budget) → eval, through the library and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import SMALL_DATA, run_cli, tiny_config, write_jsonl_corpus
from shoestring.prep.prep import prep
from shoestring.errors import ShoestringError
from shoestring.eval.mlm_loss import evaluate_run
from shoestring.train.loop import train
from shoestring.device import _measure
from shoestring.rundir import RunDir
from shoestring.train.schedule import one_cycle

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
    assert summary["mfu"] == pytest.approx(
        summary["tokens_per_s"] * summary["flops_per_token"] / summary["peak_flops"]
    )
    lines = (trained / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "loss" in r]  # training records
    assert [r["step"] for r in records] == list(range(10, 151, 10))
    val = [r for r in map(json.loads, lines) if "val_loss" in r]
    assert val and val[-1]["step"] == 150 and val[-1]["val_loss"] == summary["val_loss_subset"]
    assert records[-1]["progress"] == 1.0 and records[-1]["tokens"] == summary["tokens"]
    for r in records:  # the lr of the record's last step: one-cycle at that step's midpoint
        assert r["lr"] == pytest.approx(3e-3 * one_cycle((r["step"] - 0.5) / 150, 0.75))
    cfg = yaml.safe_load((trained / "config.yaml").read_text())
    assert cfg["train"]["steps"] == 150
    assert {p.name for p in (trained / "final").iterdir()} == {"model.safetensors", "config.json", "tokenizer.json"}
    # every 10% of the budget by default, the newest train.keep_checkpoints (2) kept
    assert sorted(p.name for p in (trained / "checkpoints").iterdir()) == ["step_00000135",
                                                                           "step_00000150"]


def test_final_model_reloads_identically(trained: Path) -> None:
    import torch

    a, _ = RunDir(trained).load_final()
    b, _ = RunDir(trained).load_final()
    ids = torch.randint(5, 2000, (2, 64))
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids))


def test_step_budget_runs_are_reproducible(pydocs_dir: Path, tmp_path: Path) -> None:
    _measure.cache_clear()  # the first run measures the peak, the second reuses it
    cfg = tiny_config(steps=6, batch_size=8, precision="fp32")
    s1 = train(cfg, pydocs_dir, tmp_path / "a")
    s2 = train(cfg, pydocs_dir, tmp_path / "b")
    def losses(run: Path) -> list[float]:
        return [json.loads(x).get("loss", json.loads(x).get("val_loss"))
                for x in (run / "metrics.jsonl").read_text().splitlines()]

    l1, l2 = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert l1 == l2 and s1["final_train_loss"] == s2["final_train_loss"]


def test_budget_smaller_than_a_step_still_trains_one(pydocs_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(budget="0.001s", batch_size=4)
    summary = train(cfg, pydocs_dir, tmp_path / "r")
    assert summary["steps"] == 1
    assert (tmp_path / "r" / "final" / "model.safetensors").is_file()


def test_eval_rejects_data_from_another_tokenizer(trained: Path, tmp_path: Path) -> None:
    other = write_jsonl_corpus(tmp_path / "other.jsonl", 120)
    prep([str(other)], tmp_path / "d2", SMALL_DATA)
    before = (trained / "eval.json").read_bytes() if (trained / "eval.json").exists() else None
    with pytest.raises(ShoestringError, match="different tokenizer"):
        evaluate_run(trained, tmp_path / "d2")
    after = (trained / "eval.json").read_bytes() if (trained / "eval.json").exists() else None
    assert before == after


def test_eval_positions_do_not_depend_on_batch_size(trained: Path) -> None:
    a = evaluate_run(trained, overrides=["eval.batch_size=7", "eval.max_sequences=40"])
    b = evaluate_run(trained, overrides=["eval.batch_size=40", "eval.max_sequences=40"])
    assert a["unigram_loss"] == pytest.approx(b["unigram_loss"], rel=1e-12)  # same targets
    assert a["masked_tokens"] == b["masked_tokens"]
    assert a["mlm_loss"] == pytest.approx(b["mlm_loss"], abs=0.02)  # bf16 batching noise only


def test_unigram_baseline_from_known_counts(pydocs_dir: Path) -> None:
    import numpy as np

    from shoestring.data.datadir import DataDir

    data = DataDir(pydocs_dir)
    logp = data.unigram_logprobs()
    split = data.split("train")
    counts = np.bincount(split.take(np.arange(len(split))).ravel(), minlength=data.vocab_size)
    n_special = len(data.special_ids)
    assert np.isneginf(logp[:n_special]).all()
    smoothed = counts[n_special:] + 1.0
    np.testing.assert_allclose(np.exp(logp[n_special:]), smoothed / smoothed.sum(), rtol=1e-12)


def test_overwrite_refuses_a_folder_that_is_not_a_run(pydocs_dir: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "config.yaml").write_text("name: my app\n")
    (proj / "notes.txt").write_text("precious")
    with pytest.raises(ShoestringError, match="not a shoestring run dir"):
        train(tiny_config(steps=1, batch_size=4), pydocs_dir, proj, overwrite=True)
    assert (proj / "notes.txt").read_text() == "precious"


def test_cram_reuses_intact_data_and_rebuilds_damaged(tmp_path: Path) -> None:
    small = ["--set", "data.vocab_size=1000", "--set", "data.seq_len=64", "--set", "model.hidden_size=64",
             "--set", "model.num_layers=1", "--set", "model.num_heads=2", "--set", "model.intermediate_size=64",
             "--set", "train.batch_size=8"]
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 120)
    first = run_cli("cram", str(corpus), "-o", str(tmp_path / "out"), "--steps", "2", *small)
    assert first.returncode == 0, first.stderr
    assert "validation MLM loss" in first.stdout and "reusing" not in first.stderr
    second = run_cli("cram", str(corpus), "-o", str(tmp_path / "out"), "--steps", "2", *small)
    assert second.returncode == 0 and "reusing prepared data" in second.stderr
    shard = tmp_path / "out" / "data" / "val" / "00000.bin"
    shard.write_bytes(b"\x00\x00" + shard.read_bytes()[2:])
    third = run_cli("cram", str(corpus), "-o", str(tmp_path / "out"), "--steps", "2", *small)
    assert third.returncode == 0 and "reusing" not in third.stderr, third.stderr


def test_cram_curates_like_prep_and_a_changed_curation_rebuilds(tmp_path: Path) -> None:
    """cram's data is what `shoestring prep` with the same settings makes: exact dedup by
    default, and curation settings are part of what decides reuse."""
    import json

    small = ["--set", "data.vocab_size=1000", "--set", "data.seq_len=64", "--set", "model.hidden_size=64",
             "--set", "model.num_layers=1", "--set", "model.num_heads=2", "--set", "model.intermediate_size=64",
             "--set", "train.batch_size=8"]
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 60)
    lines = corpus.read_text().splitlines()
    corpus.write_text("\n".join(lines + lines[:10]) + "\n")  # ten exact duplicates
    out = tmp_path / "out"
    first = run_cli("cram", str(corpus), "-o", str(out), "--steps", "1", *small)
    assert first.returncode == 0, first.stderr
    blocks = {b["block"]: b for b in
              json.loads((out / "data" / "manifest.json").read_text())["blocks"]}
    dropped = blocks["exact_dedup"]["documents_in"] - blocks["exact_dedup"]["documents_out"]
    assert dropped >= 10 and blocks["split"]["documents_in"] == 70 - dropped  # the ten copies
    second = run_cli("cram", str(corpus), "-o", str(out), "--steps", "1", *small,
                     "--set", "curate.dedup=none")
    assert second.returncode == 0 and "reusing" not in second.stderr, second.stderr
    blocks = {b["block"]: b for b in
              json.loads((out / "data" / "manifest.json").read_text())["blocks"]}
    assert "exact_dedup" not in blocks and blocks["split"]["documents_in"] == 70


def test_cli_budget_replaces_steps_from_a_config_file(tmp_path: Path) -> None:
    from shoestring.cli import _length
    from shoestring.config import load_config

    f = tmp_path / "c.yaml"
    f.write_text("train:\n  steps: 2\n  budget: null\n")
    assert load_config(f, flags=_length("10m", None)).train.steps is None
    assert load_config(f, flags=_length("10m", None)).train.budget.text == "10m"
    assert load_config(f, flags=_length(None, 7)).train.steps == 7


def test_existing_run_dir_is_not_clobbered(pydocs_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(steps=1, batch_size=4)
    train(cfg, pydocs_dir, tmp_path / "r")
    before = (tmp_path / "r" / "final" / "model.safetensors").read_bytes()
    with pytest.raises(ShoestringError, match="--overwrite"):
        train(cfg, pydocs_dir, tmp_path / "r")
    assert (tmp_path / "r" / "final" / "model.safetensors").read_bytes() == before


def test_failed_prep_keeps_the_previous_data_dir(tmp_path: Path) -> None:
    good = write_jsonl_corpus(tmp_path / "good.jsonl", 60)
    out = tmp_path / "d"
    cfg = SMALL_DATA.model_copy(update={"vocab_size": 500})
    prep([str(good)], out, cfg)
    before = (out / "manifest.json").read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(ShoestringError, match="bad.jsonl:2"):
        prep([str(good), str(bad)], out, cfg, overwrite=True)
    assert (out / "manifest.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_interrupted_swap_is_recovered(tmp_path: Path) -> None:
    """A prep killed between its two renames left the old data dir as .d.old: the next prep
    (or a failing one) must bring it back rather than delete it."""
    good = write_jsonl_corpus(tmp_path / "good.jsonl", 60)
    cfg = SMALL_DATA.model_copy(update={"vocab_size": 500})
    prep([str(good)], tmp_path / "d", cfg)
    before = (tmp_path / "d" / "manifest.json").read_bytes()
    (tmp_path / "d").rename(tmp_path / ".d.old")
    with pytest.raises(ShoestringError):
        prep([str(tmp_path / "missing.jsonl")], tmp_path / "d", cfg)
    assert (tmp_path / "d" / "manifest.json").read_bytes() == before
    assert not (tmp_path / ".d.old").exists()


def test_prep_refuses_a_foreign_folder_with_a_manifest(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "manifest.json").write_text('{"name": "my web app"}')
    (site / "index.html").write_text("<html></html>")
    good = write_jsonl_corpus(tmp_path / "good.jsonl", 60)
    with pytest.raises(ShoestringError, match="not a shoestring data dir"):
        prep([str(good)], site, SMALL_DATA)
    assert (site / "index.html").is_file()


def test_prep_needs_a_validation_sequence_and_every_hint_works(tmp_path: Path) -> None:
    import re

    one = tmp_path / "one.txt"
    one.write_text("Only one document here, with a handful of words in it. " * 20)
    with pytest.raises(ShoestringError, match=r"validation split \(the end of the text.*"
                       "has no complete sequence") as info:
        prep([str(one)], tmp_path / "d", SMALL_DATA)
    assert not (tmp_path / "d").exists()
    hints = re.findall(r"--set data\.(\w+)=(\S+)", info.value.fix or "")
    assert {key for key, _ in hints} == {"val_fraction", "seq_len"}
    for i, (key, value) in enumerate(hints):
        m = prep([str(one)], tmp_path / f"d{i}", SMALL_DATA.model_copy(update={key: float(value)
                 if key == "val_fraction" else int(value)}))
        assert m["splits"]["val"]["sequences"] > 0 and m["split"]["method"] == "position"


def test_prep_refuses_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    good = write_jsonl_corpus(tmp_path / "good.jsonl", 60)
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


def test_cli_cram_and_train_with_replaced_token_detection(tmp_path: Path) -> None:
    """`cram --objective rtd` and `train --set model.objective=rtd` run to an evaluated,
    exported encoder (model/detector.py); cram refuses an objective that is no encoder's."""
    small = ["--set", "data.vocab_size=1000", "--set", "data.seq_len=64", "--set", "model.hidden_size=64",
             "--set", "model.num_layers=1", "--set", "model.num_heads=2", "--set", "model.intermediate_size=64",
             "--set", "train.batch_size=8"]
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 120)
    c = run_cli("cram", str(corpus), "-o", str(tmp_path / "out"), "--steps", "2", "--objective", "rtd",
                *small)
    assert c.returncode == 0, c.stderr
    assert "discriminator (RTD)" in c.stdout and "validation MLM loss" in c.stdout
    t = run_cli("train", "--data", str(tmp_path / "out" / "data"), "-o", str(tmp_path / "r"),
                "--steps", "2", "--set", "model.objective=rtd", "--set", "model.rtd_sharing=plain",
                *small[4:])
    assert t.returncode == 0, t.stderr
    e = run_cli("eval", str(tmp_path / "r"))
    assert e.returncode == 0 and "discriminator (RTD)" in e.stdout, e.stderr
    assert 0 < json.loads((tmp_path / "r" / "eval.json").read_text())["rtd_disc_accuracy"] <= 1
    x = run_cli("export", str(tmp_path / "r"), "-o", str(tmp_path / "hf"))
    assert x.returncode == 0, x.stderr
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "modernbert"
    bad = run_cli("cram", str(corpus), "-o", str(tmp_path / "out"), "--steps", "1", "--objective", "clm")
    assert bad.returncode == 2 and "model.objective" in bad.stderr
