"""Fine-tuning: bucketing, learning a synthetic task, the classifier folder, and the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from conftest import run_cli, tiny_config

from shoestring.config import ModelConfig
from shoestring.data.tokenizer import special_ids
from shoestring.prep.tokenizer_training import train_wordpiece
from shoestring.errors import ShoestringError
from shoestring.classifier import (
    SequenceClassifier,
    load_classifier,
    predict,
    save_classifier,
    token_ids,
)
from shoestring.eval.finetune import Pretrained, Protocol, TaskSettings, collate, run_task
from shoestring.eval.finetune import length_bucketed_batches
from shoestring.eval.tasks import Example, TaskData, TaskSpec
from shoestring.model.encoder import MaskedLM

POS = ["good", "great", "fine", "superb", "lovely"]
NEG = ["bad", "awful", "poor", "terrible", "dull"]
FILL = ["the", "a", "film", "movie", "plot", "was", "is", "and", "very", "quite", "really", "story", "acting", "actors", "scene", "music"]


def encode_texts(tok, texts: list[str], pairs: list[str] | None, max_length: int):
    """(ids, key_mask) of (pairs of) texts, padded to the longest row, as `predict` builds them."""
    seqs = token_ids(tok, texts, pairs, max_length)
    return collate(seqs, np.arange(len(seqs)), 0)


def synthetic(n: int, seed: int, pair: bool = False) -> list[Example]:
    """Sentiment by keyword: one polar word hidden among filler (pair: label = same polarity)."""
    r = random.Random(seed)

    def sentence(pos: bool) -> str:
        words = [r.choice(FILL) for _ in range(r.randint(3, 14))]
        words.insert(r.randint(0, len(words)), r.choice(POS if pos else NEG))
        return " ".join(words)

    out = []
    for i in range(n):
        y = r.random() < 0.5
        if pair:
            first = r.random() < 0.5
            out.append(Example(sentence(first), sentence(first if y else not first), str(int(y)), f"syn:{i}"))
        else:
            out.append(Example(sentence(y), None, str(int(y)), f"syn:{i}"))
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """A real WordPiece tokenizer on the synthetic vocabulary and a tiny (untrained) encoder."""
    tok = train_wordpiece([e.a for e in synthetic(300, 99)] + [" ".join(POS + NEG + FILL)], 200)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    cfg = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    torch.manual_seed(0)
    base = MaskedLM(cfg, tok.get_vocab_size()).eval()
    meta = {"architecture": "shoestring-mlm", "model": cfg.model_dump(mode="json"),
            "vocab_size": tok.get_vocab_size(), "seq_len": 64, "special_ids": special_ids(tok)}
    return base, meta, tok, path


def test_length_buckets_cover_every_example_once_and_pad_little() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 128, 1000)
    batches = length_bucketed_batches(lengths, 16, np.random.default_rng(1), pool=10)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(1000))
    assert all(len(b) <= 16 for b in batches)
    padded = sum(len(b) * lengths[b].max() for b in batches)
    shuffled = np.random.default_rng(2).permutation(1000)
    naive = sum(16 * lengths[shuffled[i:i + 16]].max() for i in range(0, 1000, 16))
    assert padded < 0.75 * naive  # sorted pools waste far less on padding
    assert len(batches) > 1 and not np.array_equal(flat, np.sort(flat))
    again = length_bucketed_batches(lengths, 16, np.random.default_rng(1), pool=10)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))  # seeded: reproducible


def test_collate_pads_and_masks() -> None:
    ids, mask = collate([np.array([2, 7, 3]), np.array([2, 3])], np.array([1, 0]), pad_id=0)
    assert ids.tolist() == [[2, 3, 0], [2, 7, 3]]
    assert mask.tolist() == [[True, True, False], [True, True, True]]


def test_padding_does_not_change_the_prediction(tiny) -> None:
    base, _, tok, _ = tiny
    torch.manual_seed(0)
    clf = SequenceClassifier(base, 2).eval()
    alone, m1 = encode_texts(tok, ["the film was good"], None, 128)
    both, m2 = encode_texts(tok, ["the film was good", "a very very long story and plot " * 3], None, 128)
    assert m2[0].sum() < m2.shape[1]  # row 0 really is padded
    with torch.no_grad():
        assert torch.allclose(clf(alone, m1)[0], clf(both, m2)[0], atol=1e-5)


def test_finetune_learns_a_synthetic_task_well_above_chance(tiny, tmp_path: Path) -> None:
    base, meta, tok, tok_path = tiny
    data = TaskData(TaskSpec("syn", "classification", False, ["0", "1"], ["accuracy", "f1"]),
                    synthetic(400, 0), {"dev": synthetic(200, 1)}, "synthetic")
    before = base.state_dict()["tok_embeddings.weight"].clone()
    res = run_task(Pretrained(*tiny), data, TaskSettings(
        Protocol(lr=1e-3, epochs=3), [0, 1], out_dir=tmp_path / "clf", precision="bf16"))
    dev = res["summary"]["dev"]
    assert dev["accuracy"]["median"] > 0.9, res["summary"]
    assert dev["score"]["median"] == pytest.approx(np.mean(
        [dev["accuracy"]["median"], dev["f1"]["median"]]), abs=0.05)
    assert [s["seed"] for s in res["seeds"]] == [0, 1]
    assert all(s["steps"] == 3 * 25 and s["final_loss"] < s["first_loss"] for s in res["seeds"])
    assert torch.equal(base.state_dict()["tok_embeddings.weight"], before)  # base untouched
    # The saved classifier (median seed) reloads and predicts what it scored.
    model, cmeta = load_classifier(res["classifier"])
    assert cmeta["architecture"] == "shoestring-classifier" and cmeta["labels"] == ["0", "1"]
    assert cmeta["problem"] == "classification" and cmeta["max_length"] == 128
    assert cmeta["seed"] == res["median_seed"]
    preds = predict(model, cmeta, tok, ["the movie was really superb", "awful acting and plot"])
    assert [p["label"] for p in preds] == ["1", "0"]
    assert all(abs(sum(p["scores"].values()) - 1) < 1e-5 for p in preds)


def test_pair_regression_learns(tiny) -> None:
    def scored(n: int, seed: int) -> list[Example]:  # score = 2 × positive sentences (0, 2, 4)
        a, b = synthetic(n, seed), synthetic(n, seed + 100)
        return [Example(x.a, y.a, 2.0 * (int(x.label) + int(y.label)), x.where) for x, y in zip(a, b)]

    train, dev = scored(400, 2), scored(150, 3)
    data = TaskData(TaskSpec("sim", "regression", True, None, ["pearson", "spearman"]), train,
                    {"dev": dev}, "synthetic")
    res = run_task(Pretrained(*tiny), data,
                   TaskSettings(Protocol(lr=1e-3, epochs=4), [0], precision="fp32"))
    assert res["summary"]["dev"]["pearson"]["median"] > 0.5, res["summary"]


def test_sweep_picks_the_best_grid_point(tiny) -> None:
    data = TaskData(TaskSpec("syn", "classification", False, ["0", "1"], ["accuracy"]),
                    synthetic(400, 4), {"dev": synthetic(100, 5)}, "synthetic")
    grid = [{"lr": 1e-7, "batch_size": 16}, {"lr": 1e-3, "batch_size": 16}]
    res = run_task(Pretrained(*tiny), data, TaskSettings(Protocol(name="sweep", epochs=3), [0],
                                                         grid=grid, precision="fp32"))
    assert [g["lr"] for g in res["sweep"]] == [1e-7, 1e-3]
    assert res["protocol"]["lr"] == 1e-3
    assert res["sweep"][1]["median_dev_score"] >= res["sweep"][0]["median_dev_score"]


def test_classifier_folder_round_trip_and_errors(tiny, tmp_path: Path) -> None:
    base, meta, tok, tok_path = tiny
    torch.manual_seed(3)
    clf = SequenceClassifier(base, 3, pooling="mean").eval()
    out = save_classifier(tmp_path / "c", clf, meta, tok_path, labels=["a", "b", "c"],
                          problem="classification", max_length=32, pair=True, task="t")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    again, cmeta = load_classifier(out)
    ids, mask = encode_texts(tok, ["good film", "bad"], ["fine", "dull plot"], 32)
    with torch.no_grad():
        assert torch.equal(clf(ids, mask), again(ids, mask))
    assert cmeta["pooling"] == "mean" and cmeta["pair"] and cmeta["base"] == meta
    save_classifier(out, clf, meta, tok_path, labels=["a", "b", "c"], problem="classification",
                    max_length=32)  # replacing our own folder is fine
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(ShoestringError, match="not a shoestring classifier"):
        save_classifier(tmp_path / "foreign", clf, meta, tok_path, labels=None,
                        problem="regression", max_length=32)
    with pytest.raises(ShoestringError, match="not a classifier folder"):
        load_classifier(tmp_path / "foreign")
    (out / "config.json").write_text("{broken")
    with pytest.raises(ShoestringError, match="cannot load the classifier"):
        load_classifier(out)


# ----------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def tiny_run(pydocs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shoestring.train.loop import train

    run = tmp_path_factory.mktemp("ftrun") / "run"
    train(tiny_config(steps=4, batch_size=8), pydocs_dir, run)
    return run


def test_cli_fine_tunes_a_custom_task_and_writes_the_report(tiny_run: Path, tmp_path: Path) -> None:
    rows = synthetic(60, 7)
    (tmp_path / "train.jsonl").write_text("\n".join(
        json.dumps({"text": e.a, "sentiment": "pos" if e.label == "1" else "neg"}) for e in rows))
    (tmp_path / "dev.tsv").write_text("text\tsentiment\n" + "\n".join(
        f"{e.a}\t{'pos' if e.label == '1' else 'neg'}" for e in synthetic(30, 8)) + "\n")
    (tmp_path / "task.yaml").write_text(
        "name: mood\ntrain: train.jsonl\ndev: dev.tsv\ntext: text\nlabel: sentiment\n")
    out = tmp_path / "out"
    r = run_cli("eval", str(tiny_run), "--task", str(tmp_path / "task.yaml"), "--seeds", "2",
                "-o", str(out), "--precision", "fp32", timeout=900)
    assert r.returncode == 0, r.stderr
    assert "mood" in r.stdout and "results.md" in r.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["seeds"] == [0, 1]
    assert results["protocol"]["lr"] == 4e-5 and results["protocol"]["epochs"] == 5
    mood = results["tasks"]["mood"]
    assert mood["train_examples"] == 60 and [s["steps"] for s in mood["seeds"]] == [20, 20]
    # The scratch control ran by default, with the same seeds, and is compared by seed.
    assert [s["seed"] for s in mood["control"]["seeds"]] == [0, 1]
    assert mood["comparison"]["dev"]["seeds"] == 2 and "scratch" in results["columns"][0]
    assert "control: same architecture from scratch" in (out / "results.md").read_text()
    assert "scratch median" in r.stdout
    assert results["columns"][0]["column"] == "mood"
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"
    assert "## External references" not in (out / "results.md").read_text()  # no GLUE columns
    _, meta = load_classifier(out / "classifiers" / "mood")
    assert meta["labels"] == ["neg", "pos"] and meta["task"] == "mood"
    # Re-running replaces our own output folder.
    r = run_cli("eval", str(tiny_run), "--task", str(tmp_path / "task.yaml"), "--seeds", "1",
                "-o", str(out), "--max-train", "16", "--precision", "fp32", "--control", "none",
                timeout=900)
    assert r.returncode == 0, r.stderr
    again = json.loads((out / "results.json").read_text())
    assert again["tasks"]["mood"]["train_examples"] == 16 and "control" not in again["tasks"]["mood"]
    assert "control:" not in (out / "results.md").read_text()


def test_cli_glue_and_bad_input_exit_2_without_traceback(tiny_run: Path, tmp_path: Path) -> None:
    glue = tmp_path / "glue"
    (glue / "RTE").mkdir(parents=True)
    head = "index\tsentence1\tsentence2\tlabel\n"
    (glue / "RTE" / "train.tsv").write_text(head + "".join(
        f"{i}\tA {i}.\tB {i}.\t{'entailment' if i % 2 else 'not_entailment'}\n" for i in range(20)))
    r = run_cli("eval", str(tiny_run), "--glue", str(glue), "--seeds", "1", "-o", str(tmp_path / "o"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no dev.tsv" in r.stderr
    (glue / "RTE" / "dev.tsv").write_text(head + "0\tC.\tD.\tentailment\n")
    r = run_cli("eval", str(tiny_run), "--glue", str(glue), "--tasks", "rte", "--seeds", "1",
                "-o", str(tmp_path / "o"), "--precision", "fp32", timeout=900)
    assert r.returncode == 0, r.stderr
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert [c["column"] for c in results["columns"]] == ["RTE"]
    assert results["glue_average"]["complete"] is False
    assert "## External references" in (tmp_path / "o" / "results.md").read_text()
    r = run_cli("eval", str(tiny_run), "--tasks", "cola")
    assert r.returncode == 2 and "--glue" in r.stderr
    r = run_cli("eval", str(tiny_run), "--task", f"train={glue}/RTE/train.tsv,dev={glue}/RTE/dev.tsv,"
                "text=premise,label=label")
    assert r.returncode == 2 and "column 'premise' not found" in r.stderr and "train.tsv:1" in r.stderr
    assert "Traceback" not in r.stderr
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "x.txt").write_text("mine")
    r = run_cli("eval", str(tiny_run), "--glue", str(glue), "-o", str(tmp_path / "foreign"))
    assert r.returncode == 2 and "not a shoestring" in r.stderr
    assert (tmp_path / "foreign" / "x.txt").read_text() == "mine"


def test_cli_without_task_flags_keeps_the_mlm_eval(tiny_run: Path) -> None:
    r = run_cli("eval", str(tiny_run))
    assert r.returncode == 0, r.stderr
    assert "validation MLM loss" in r.stdout and (tiny_run / "eval.json").is_file()


def test_sweep_with_control_records_and_reports_each_arms_choice(
        tiny_run: Path, tmp_path: Path) -> None:
    """A sweep selects a setting for each arm on its own: both arms keep their whole grid, the
    kept setting is each grid's best, and the report names both choices."""
    from shoestring.eval.downstream import evaluate_downstream
    from shoestring.eval.finetune import SWEEP_GRID
    from shoestring.eval.tasks import parse_task_arg

    (tmp_path / "train.jsonl").write_text("\n".join(
        json.dumps({"text": e.a, "y": e.label}) for e in synthetic(16, 21)))
    (tmp_path / "dev.jsonl").write_text("\n".join(
        json.dumps({"text": e.a, "y": e.label}) for e in synthetic(12, 22)))
    spec = parse_task_arg(f"name=t,train={tmp_path}/train.jsonl,dev={tmp_path}/dev.jsonl,"
                          "text=text,label=y")
    out = tmp_path / "out"
    res = evaluate_downstream(tiny_run, custom=[spec], out=out, seeds=1, protocol="sweep",
                              control="scratch", precision="fp32", overrides={"epochs": 1})
    task = res["tasks"]["t"]
    md = (out / "results.md").read_text()
    for arm in (task, task["control"]):
        grid = [(g["lr"], g["batch_size"]) for g in arm["sweep"]]
        assert grid == [(g["lr"], g["batch_size"]) for g in SWEEP_GRID]
        best = max(arm["sweep"], key=lambda g: g["median_dev_score"])
        assert best["median_dev_score"] == arm["summary"]["dev"]["score"]["median"]
        assert arm["protocol"]["name"] == "sweep"
    line = next(x for x in md.splitlines() if x.startswith("- t: "))
    p, c = task["protocol"], task["control"]["protocol"]
    assert line.startswith(f"- t: lr {p['lr']:g}, batch {p['batch_size']} (grid")
    assert f"; scratch control: lr {c['lr']:g}, batch {c['batch_size']} (grid" in line


def test_resume_keeps_finished_tasks_only_while_what_they_depend_on_is_unchanged(
        tiny_run: Path, tmp_path: Path) -> None:
    """An evaluation of task a, then of a and b with resume: a is kept (its numbers are the
    file's, not refitted), b is fitted. New weights, other task data or other seeds refit a."""
    from shoestring.eval.downstream import evaluate_downstream
    from shoestring.eval.tasks import parse_task_arg

    for name, seed in (("a", 11), ("b", 12)):
        (tmp_path / f"{name}-train.jsonl").write_text("\n".join(
            json.dumps({"text": e.a, "y": e.label}) for e in synthetic(24, seed)))
        (tmp_path / f"{name}-dev.jsonl").write_text("\n".join(
            json.dumps({"text": e.a, "y": e.label}) for e in synthetic(10, seed + 50)))

    def spec(name: str) -> object:
        return parse_task_arg(f"name={name},train={tmp_path}/{name}-train.jsonl,"
                              f"dev={tmp_path}/{name}-dev.jsonl,text=text,label=y")

    out = tmp_path / "out"

    def run(names: str, seeds: int = 1) -> dict:
        return evaluate_downstream(tiny_run, custom=[spec(n) for n in names], out=out,
                                   seeds=seeds, control="none", precision="fp32", resume=True)

    first = run("a")["tasks"]["a"]
    assert "resumed" not in json.loads((out / "results.json").read_text())
    both = run("ab")
    assert both["complete"] and both["resumed"] == {"kept_tasks": ["a"]}
    assert both["tasks"]["a"] == first  # kept as written, wall_seconds and all
    assert list(both["tasks"]) == ["a", "b"]
    assert both["tasks"]["b"]["seeds"][0]["steps"] > 0
    assert {p.name for p in (out / "classifiers").iterdir()} == {"a", "b"}
    assert "| a " in (out / "results.md").read_text() and "| b " in (out / "results.md").read_text()
    # Only b now: a's classifier goes with it, nothing is refitted.
    only_b = run("b")
    assert only_b["resumed"] == {"kept_tasks": ["b"]}
    assert {p.name for p in (out / "classifiers").iterdir()} == {"b"}
    # Other seeds: nothing qualifies, everything is fitted afresh.
    two = run("b", seeds=2)
    assert "resumed" not in two and [s["seed"] for s in two["tasks"]["b"]["seeds"]] == [0, 1]
    # Changed task data: refitted.
    with (tmp_path / "b-train.jsonl").open("a") as f:
        f.write("\n" + json.dumps({"text": "one more row", "y": "1"}))
    grown = run("b", seeds=2)
    assert "resumed" not in grown and grown["tasks"]["b"]["train_examples"] == 25
    # Changed weights (the run retrained in place): refitted.
    from shoestring.fsutil import file_sha256

    weights = tiny_run / "final" / "model.safetensors"
    saved = weights.read_bytes()
    state = load_file(weights)
    name = next(iter(state))
    state[name] = state[name] + 0.01
    save_file(state, weights, metadata={"format": "pt"})
    try:
        moved = run("b", seeds=2)
    finally:
        weights.write_bytes(saved)
    assert "resumed" not in moved
    assert moved["base"]["weights_sha256"] != grown["base"]["weights_sha256"]
    assert grown["base"]["weights_sha256"] == file_sha256(weights)


def test_cli_resume_flag(tiny_run: Path, tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("\n".join(
        json.dumps({"text": e.a, "y": e.label}) for e in synthetic(20, 3)))
    spec = f"name=t,train={tmp_path}/t.jsonl,dev={tmp_path}/t.jsonl,text=text,label=y"
    args = ("eval", str(tiny_run), "--task", spec, "--seeds", "1", "--control", "none",
            "-o", str(tmp_path / "o"), "--precision", "fp32", "--resume")
    assert run_cli(*args, timeout=900).returncode == 0
    r = run_cli(*args, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "keeping t" in r.stderr
    assert json.loads((tmp_path / "o" / "results.json").read_text())["resumed"] == {"kept_tasks": ["t"]}
    r = run_cli("eval", str(tiny_run), "--resume")
    assert r.returncode == 2 and "--resume applies to fine-tuning" in r.stderr
