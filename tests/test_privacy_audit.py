"""Canaries and the memorization audit on real tiny runs: planted copies land in train (and
substring dedup cuts their repeats), a canary repeated many times in an overfit decoder has
far higher exposure than never-inserted ones, membership AUC is > 0.5 after many epochs and
≈ 0.5 untrained, and the CLI writes audit.json (bad input: exit 2)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from conftest import interrupt_cli, run_cli
from rich.console import Console

from shoestring.config import Config, CurateConfig, DataConfig, ModelConfig, TrainConfig
from shoestring.prep import canaries as C
from shoestring.data.builtin import iter_pydocs
from shoestring.prep.prep import prep
from shoestring.privacy.audit import AuditSettings, audit
from shoestring.privacy.exposure import forward_passes
from shoestring.train.loop import train

SETTINGS = AuditSettings(candidates=200, sequences=96, extract=16, prefix_tokens=16,
                         match_tokens=16)


def _data(tmp: Path, objective: str, dedup: str, repeats: int) -> Path:
    """100 short real documents (pydocs, 400 characters each) plus 2 canaries × ``repeats``."""
    corpus = tmp / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as f:
        for _, doc in zip(range(100), iter_pydocs()):
            f.write(json.dumps({"text": doc.text[:400]}) + "\n")
    out = tmp / f"data-{objective}-{dedup}"
    prep([str(corpus)], out, DataConfig(objective=objective, vocab_size=400, seq_len=64,
                                        val_fraction=0.2),
         curate=CurateConfig(dedup=dedup, canaries=2, canary_repeats=repeats))
    return out


def _train(data: Path, run: Path, objective: str, steps: int) -> Path:
    cfg = Config(data=DataConfig(objective=objective, vocab_size=400, seq_len=64),
                 model=ModelConfig(objective=objective, hidden_size=64, num_layers=2, num_heads=2,
                                   intermediate_size=128),
                 train=TrainConfig(budget=None, steps=steps, batch_size=16, lr=5e-3,
                                   precision="fp32", checkpoint_every=None))
    train(cfg, data, run)
    return run


@pytest.fixture(scope="module")
def clm_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _data(tmp_path_factory.mktemp("clm"), "clm", "none", repeats=25)


@pytest.fixture(scope="module")
def overfit_run(clm_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(clm_data, tmp_path_factory.mktemp("over") / "run", "clm", steps=100)


def test_canaries_are_planted_in_train_and_recorded(clm_data: Path) -> None:
    planted, refs, record = C.read(clm_data / C.FILE)
    assert record["repeats"] == 25 and len(planted) == len(refs) == 2
    assert all(c.inserted == 25 and c.in_train == 25 for c in planted)  # hosts kept in train
    assert {c.secret for c in planted}.isdisjoint({c.secret for c in refs})
    assert all(len(c.text.split()) >= 50 for c in planted)  # long enough for substring dedup
    manifest = json.loads((clm_data / "manifest.json").read_text())
    [block] = [b for b in manifest["blocks"] if b["block"] == "canaries"]
    assert block["copies_inserted"] == block["copies_in_train"] == 50
    assert manifest["splits"]["val"]["sequences"] > 0


def test_substring_dedup_keeps_one_copy_of_each_canary(tmp_path: Path) -> None:
    data = _data(tmp_path, "clm", "substring", repeats=10)
    planted, _, _ = C.read(data / C.FILE)
    assert [c.in_train for c in planted] == [1, 1]


@pytest.mark.slow
def test_repeated_canary_is_exposed_and_membership_leaks_after_overfitting(
        overfit_run: Path, clm_data: Path) -> None:
    result = audit(overfit_run, clm_data, SETTINGS)
    c = result["canaries"]
    assert c["mean_exposure_inserted"] > 6.0, c  # near log2(201) = 7.65: ranked first
    assert c["mean_exposure_references"] < c["mean_exposure_inserted"] - 3, c
    assert result["membership"]["auc"] > 0.7, result["membership"]
    ex = result["extraction"]
    assert ex["train"]["prompts"] == ex["held_out"]["prompts"] == 16
    assert ex["train"]["mean_matched_tokens"] > ex["held_out"]["mean_matched_tokens"]
    assert json.loads((overfit_run / "audit.json").read_text())["membership"] == result["membership"]


@pytest.mark.slow
def test_untrained_encoder_has_chance_auc_and_exposure(tmp_path: Path) -> None:
    data = _data(tmp_path, "mlm", "exact", repeats=5)
    run = _train(data, tmp_path / "run", "mlm", steps=1)
    result = audit(run, data, AuditSettings(candidates=100, sequences=128))
    assert json.loads((data / "manifest.json").read_text())["split"]["method"] == "document"
    assert abs(result["membership"]["auc"] - 0.5) < 0.12, result["membership"]
    c = result["canaries"]
    assert c["mean_exposure_inserted"] < 4.5 and c["mean_exposure_references"] < 4.5, c
    assert "no generation" in result["extraction"]["note"]


@pytest.mark.slow
def test_cli_prints_the_table_and_refuses_bad_input(overfit_run: Path, clm_data: Path,
                                                    tmp_path: Path) -> None:
    r = run_cli("audit", str(overfit_run), "--data", str(clm_data), "--candidates", "50",
                "--sequences", "32", "--extract", "4")
    assert r.returncode == 0, r.stderr
    assert "membership inference ROC AUC" in r.stdout and "canary exposure" in r.stdout
    r = run_cli("audit", str(overfit_run), "--data", str(tmp_path / "nope"))
    assert r.returncode == 2 and "data dir not found" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("audit", str(tmp_path), "--data", str(clm_data))
    assert r.returncode == 2 and "final/ is missing" in r.stderr


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An encoder of one step on canaried data: the pseudo-log-likelihood's cost is what
    these tests are about, not what the model learned."""
    tmp = tmp_path_factory.mktemp("mlm")
    data = _data(tmp, "mlm", "none", repeats=3)
    return _train(data, tmp / "run", "mlm", steps=1), data


def test_encoder_audit_states_its_forward_passes_up_front_and_reports_progress_in_a_log(
        mlm_run: tuple[Path, Path]) -> None:
    """Before the exposure: the candidates, canaries, exact forward passes and an estimate; in
    a log (not a terminal, where rich draws nothing until the end) a progress line after."""
    run, data = mlm_run
    log = io.StringIO()
    audit(run, data, AuditSettings(candidates=40, sequences=8),
          console=Console(file=log, width=200))
    planted, refs, _ = C.read(data / C.FILE)
    from shoestring.data.datadir import DataDir

    tokenizer = DataDir(data).tokenizer()
    passes = sum(forward_passes(False, tokenizer, c, 40, 0) for c in [*planted, *refs])
    assert passes > 41 * 4  # one per candidate *and* secret token: more than one a candidate
    text = log.getvalue()
    assert f"audit: 40 candidates × 4 canaries, {passes:,} forward passes" in text, text
    assert re.search(r"estimated ~[\d.]+ min on this machine", text), text
    assert "log2(40 + 1) = 5.4 bits" in text, text
    assert f"canary exposure: {passes:,} of {passes:,} passes (100%" in text, text


def test_ctrl_c_in_audit_says_how_far_it_got_and_exits_130(mlm_run: tuple[Path, Path]) -> None:
    """The real CLI, SIGINT once it has said what the exposure will cost: exit 130, the
    canaries finished, nothing written, and the command to start again, on stderr."""
    run, data = mlm_run
    before = (run / "audit.json").read_bytes() if (run / "audit.json").exists() else None
    code, stderr = interrupt_cli(["audit", str(run), "--data", str(data), "--candidates",
                                  "20000"], when="audit: 20,000 candidates")
    assert code == 130, stderr
    assert re.search(r"audit interrupted after \d of 4 canaries; nothing written to \S+audit.json",
                     stderr), stderr
    assert f"shoestring audit {run} --data {data} --candidates 20000" in stderr, stderr
    assert "Traceback" not in stderr
    after = (run / "audit.json").read_bytes() if (run / "audit.json").exists() else None
    assert after == before  # an earlier audit's file is left as it was
