"""GLUE readers (real shared files and official-layout fixtures), metrics, report conventions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from shoestring.errors import ShoestringError
from shoestring.eval.glue import GLUE_TASKS, load_glue_task, parse_task_list
from shoestring.eval.metrics import compute_metrics, main_score
from shoestring.eval.downstream_report import (
    GLUE9,
    glue_averages,
    render_chart,
    render_markdown,
    score_columns,
)

GLUE = SHARED_DATA / "glue"


def _need_shared(folder: str) -> None:
    if not (GLUE / folder / "train.tsv").is_file():
        pytest.skip(f"shared GLUE data absent: {GLUE / folder} (see ../shared/data/README.md)")


# ----------------------------------------------------------------------------- real files


@pytest.mark.parametrize(
    "task,folder,n_train,n_dev,labels",
    [("cola", "CoLA", 8551, 1043, {"0", "1"}), ("sst2", "SST-2", 67349, 872, {"0", "1"}),
     ("mrpc", "MRPC", 3668, 408, {"0", "1"})],
)
def test_real_shared_glue_files_parse_completely(task, folder, n_train, n_dev, labels) -> None:
    _need_shared(folder)
    data = load_glue_task(GLUE, task)
    assert len(data.train) == n_train and len(data.evals["dev"]) == n_dev
    assert {e.label for e in data.train} == labels
    assert all(e.a.strip() for e in data.train + data.evals["dev"])
    assert data.spec.pair == (task == "mrpc")
    assert data.skipped == {}


def test_mrpc_bom_header_and_unpaired_quotes_survive() -> None:
    _need_shared("MRPC")
    data = load_glue_task(GLUE, "mrpc")
    first = data.train[0]
    assert first.a.startswith("Amrozi accused his brother") and first.b.startswith("Referring to him")
    # A field that opens a quote it never closes: a quote-aware reader would merge lines here.
    odd = [e for e in data.train if e.b and e.b.startswith('"') and e.b.count('"') % 2 == 1]
    assert odd, "expected MRPC rows with unpaired quotes"
    assert all("\t" not in e.a and "\n" not in (e.b or "") for e in data.train)


def test_cola_has_no_header_and_keeps_first_row() -> None:
    _need_shared("CoLA")
    data = load_glue_task(GLUE, "cola")
    raw_first = (GLUE / "CoLA" / "train.tsv").read_text(encoding="utf-8").split("\n")[0].split("\t")
    assert data.train[0].a == raw_first[3] and data.train[0].label == raw_first[1]
    assert data.train[0].where.endswith("train.tsv:1")


# ----------------------------------------------------------------------------- fixtures


def _write(path: Path, rows: list[list[str]], bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join("\t".join(r) for r in rows) + "\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))


MNLI_TRAIN_HEAD = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                   "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                   "sentence2", "label1", "gold_label"]
MNLI_DEV_HEAD = MNLI_TRAIN_HEAD[:11] + ["label2", "label3", "label4", "label5", "gold_label"]
STSB_HEAD = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
             "sentence1", "sentence2", "score"]


def _mnli_row(i: int, a: str, b: str, label: str, dev: bool) -> list[str]:
    row = [str(i), "1", f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", a, b, label]
    return row + [label] * 4 + [label] if dev else row + [label]


@pytest.fixture()
def glue_dir(tmp_path: Path) -> Path:
    """A GLUE folder with every task in the official layout (few rows, real quirks)."""
    root = tmp_path / "glue"
    _write(root / "CoLA/train.tsv", [["gj04", "1", "", "The sailors rode the breeze."],
                                     ["gj04", "0", "*", 'He said "hi.']])
    _write(root / "CoLA/dev.tsv", [["cj99", "1", "", "If you had eaten more, you would want less."]])
    _write(root / "SST-2/train.tsv", [["sentence", "label"], ["a charming journey ", "1"],
                                      ["bleak and desperate ", "0"]])
    _write(root / "SST-2/dev.tsv", [["sentence", "label"], ["it 's a \" film", "1"]])
    head = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    _write(root / "MRPC/train.tsv", [head, ["1", "1", "2", "He said \"so.", "\"So, he said."],
                                     ["0", "3", "4", "A b.", "C d."]], bom=True)
    _write(root / "MRPC/dev.tsv", [head, ["1", "5", "6", "E f.", "E f!"]], bom=True)
    _write(root / "STS-B/train.tsv", [STSB_HEAD, ["0", "main-captions", "MSRvid", "2012test",
                                      "0001", "none", "none", "A plane is taking off.",
                                      "An air plane is taking off.", "5.000"]])
    _write(root / "STS-B/dev.tsv", [STSB_HEAD, ["0", "main-captions", "MSRvid", "2012test", "0000",
                                    "none", "none", "A man with a hard hat is dancing.",
                                    "A man wearing a hard hat is dancing.", "5.000"],
                                    ["1", "main-news", "x", "y", "1", "none", "none", "It rains.",
                                     "Snow \"falls.", "0.75"]])
    qqp_head = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    _write(root / "QQP/train.tsv", [qqp_head, ["0", "1", "2", "How do I cook?", "How to cook?", "1"],
                                    ["1", "3", "4", "What is \"love", "Why?", "0"],
                                    ["2", "5", "6", "A question with a line"],  # malformed: skipped
                                    ["3", "7", "8", "Where?", "Here?", "0"]])
    _write(root / "QQP/dev.tsv", [qqp_head, ["9", "1", "2", "Is it?", "It is?", "1"]])
    _write(root / "MNLI/train.tsv", [MNLI_TRAIN_HEAD,
                                     _mnli_row(0, "The cat sat.", "A cat sat.", "entailment", False),
                                     _mnli_row(1, 'He said "no.', "He agreed.", "contradiction", False),
                                     _mnli_row(2, "It rained.", "It was wet.", "neutral", False)])
    _write(root / "MNLI/dev_matched.tsv", [MNLI_DEV_HEAD,
                                           _mnli_row(0, "A dog ran.", "An animal ran.", "entailment", True)])
    _write(root / "MNLI/dev_mismatched.tsv", [MNLI_DEV_HEAD,
                                              _mnli_row(0, "Rates rose.", "Rates fell.", "contradiction", True)])
    _write(root / "QNLI/train.tsv", [["index", "question", "sentence", "label"],
                                     ["0", "Who?", "Him.", "entailment"],
                                     ["1", "When?", "Blue.", "not_entailment"]])
    _write(root / "QNLI/dev.tsv", [["index", "question", "sentence", "label"], ["0", "Why?", "So.", "entailment"]])
    for folder in ("RTE", "WNLI"):
        lab = ("entailment", "not_entailment") if folder == "RTE" else ("1", "0")
        head = ["index", "sentence1", "sentence2", "label"]
        _write(root / f"{folder}/train.tsv", [head, ["0", "A is B.", "B is A.", lab[0]],
                                              ["1", "C.", "D.", lab[1]]])
        _write(root / f"{folder}/dev.tsv", [head, ["0", "E.", "F.", lab[1]]])
    return root


def test_every_glue_task_parses_from_the_official_layout(glue_dir: Path) -> None:
    expected = {"cola": 2, "sst2": 2, "mrpc": 2, "stsb": 1, "qqp": 3, "mnli": 3, "qnli": 2,
                "rte": 2, "wnli": 2}
    assert set(expected) == set(GLUE_TASKS)
    for name, n in expected.items():
        data = load_glue_task(glue_dir, name)
        assert len(data.train) == n, name
        assert data.spec.pair == (name not in ("cola", "sst2")), name
        for ex in data.train + [e for v in data.evals.values() for e in v]:
            assert ex.a.strip() and (ex.b is None or ex.b.strip())
        data.label_ids(data.train)  # every label maps to a logit


def test_task_specific_quirks(glue_dir: Path) -> None:
    mnli = load_glue_task(glue_dir, "mnli")
    assert set(mnli.evals) == {"dev_matched", "dev_mismatched"}
    assert [e.label for e in mnli.train] == ["entailment", "contradiction", "neutral"]
    assert mnli.train[1].a == 'He said "no.'  # unpaired quote kept, nothing merged
    assert mnli.evals["dev_mismatched"][0].label == "contradiction"  # last of 16 columns
    stsb = load_glue_task(glue_dir, "stsb")
    assert stsb.spec.problem == "regression"
    assert [e.label for e in stsb.evals["dev"]] == [5.0, 0.75]
    assert stsb.evals["dev"][1].b == 'Snow "falls.'
    qqp = load_glue_task(glue_dir, "qqp")
    assert qqp.skipped == {"train": 1} and [e.a for e in qqp.train][-1] == "Where?"
    mrpc = load_glue_task(glue_dir, "mrpc")
    assert mrpc.train[0].a == 'He said "so.' and mrpc.train[0].b == '"So, he said.'
    assert load_glue_task(glue_dir, "cola").train[1].a == 'He said "hi.'


def test_max_train_keeps_the_first_rows(glue_dir: Path) -> None:
    assert [e.label for e in load_glue_task(glue_dir, "mnli", max_train=2).train] == [
        "entailment", "contradiction"]


def test_task_dir_without_dev_set_is_a_clear_error(glue_dir: Path) -> None:
    (glue_dir / "RTE" / "dev.tsv").unlink()
    with pytest.raises(ShoestringError, match="no dev.tsv") as e:
        load_glue_task(glue_dir, "rte")
    assert "RTE" in str(e.value)
    (glue_dir / "MNLI" / "dev_mismatched.tsv").unlink()
    with pytest.raises(ShoestringError, match="dev_mismatched.tsv"):
        load_glue_task(glue_dir, "mnli")


def test_bad_glue_files_name_file_and_line(glue_dir: Path) -> None:
    _write(glue_dir / "RTE/train.tsv", [["index", "sentence1", "sentence2", "label"],
                                        ["0", "A.", "B.", "entailment"], ["1", "C.", "D.", "maybe"]])
    with pytest.raises(ShoestringError, match="unknown label 'maybe'") as e:
        load_glue_task(glue_dir, "rte")
    assert e.value.where.endswith("RTE/train.tsv:3")
    _write(glue_dir / "SST-2/train.tsv", [["sentence", "label"], ["only one field"]])
    with pytest.raises(ShoestringError, match="1 field") as e:
        load_glue_task(glue_dir, "sst2")
    assert e.value.where.endswith("SST-2/train.tsv:2")
    (glue_dir / "CoLA/train.tsv").write_text("")
    with pytest.raises(ShoestringError, match="empty"):
        load_glue_task(glue_dir, "cola")
    _write(glue_dir / "QNLI/train.tsv", [["index", "question", "sentence", "label"]])
    with pytest.raises(ShoestringError, match="only a header"):
        load_glue_task(glue_dir, "qnli")
    _write(glue_dir / "STS-B/train.tsv", [STSB_HEAD, ["0"] * 9 + ["high"]])
    with pytest.raises(ShoestringError, match="not a number"):
        load_glue_task(glue_dir, "stsb")
    _write(glue_dir / "WNLI/train.tsv", [["idx", "premise", "hypothesis", "label"], ["0", "a", "b", "1"]])
    with pytest.raises(ShoestringError, match="column 'sentence1' not found"):
        load_glue_task(glue_dir, "wnli")
    with pytest.raises(ShoestringError, match="no QQP/ folder"):
        load_glue_task(glue_dir.parent, "qqp")


def test_task_list_parsing() -> None:
    assert parse_task_list("CoLA, sst-2,mrpc") == ["cola", "sst2", "mrpc"]
    assert parse_task_list("glue") == [k for k in GLUE_TASKS if k != "wnli"]
    assert parse_task_list("all,cola") == list(GLUE_TASKS)
    with pytest.raises(ShoestringError, match="unknown GLUE task 'colaa'"):
        parse_task_list("colaa")


# ----------------------------------------------------------------------------- metrics


def test_metrics_agree_with_sklearn_and_scipy() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    p = np.where(rng.random(200) < 0.8, y, 1 - y)
    got = compute_metrics(["mcc", "accuracy", "f1"], y, p)
    assert got["mcc"] == pytest.approx(matthews_corrcoef(y, p))
    assert got["accuracy"] == pytest.approx(accuracy_score(y, p))
    assert got["f1"] == pytest.approx(f1_score(y, p))
    a = rng.normal(size=100)
    b = a + rng.normal(scale=0.5, size=100)
    got = compute_metrics(["pearson", "spearman"], a, b)
    assert got["pearson"] == pytest.approx(pearsonr(a, b)[0])
    assert got["spearman"] == pytest.approx(spearmanr(a, b)[0])
    y3, p3 = rng.integers(0, 3, 90), rng.integers(0, 3, 90)
    assert compute_metrics(["macro_f1"], y3, p3)["macro_f1"] == pytest.approx(
        f1_score(y3, p3, average="macro"))


def test_metrics_on_hand_computed_inputs() -> None:
    # Confusion matrix tp=3 tn=4 fp=1 fn=2: MCC = (12-2)/sqrt(4*5*5*6), F1 = 6/9.
    y = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    p = [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]
    got = compute_metrics(["mcc", "accuracy", "f1"], y, p)
    assert got["mcc"] == pytest.approx(10 / math.sqrt(4 * 5 * 5 * 6))
    assert got["accuracy"] == pytest.approx(0.7) and got["f1"] == pytest.approx(6 / 9)
    assert main_score(got, ["f1", "accuracy"]) == pytest.approx((6 / 9 + 0.7) / 2)
    # A constant prediction has no correlation: 0, not nan (and MCC 0, as sklearn says).
    assert compute_metrics(["pearson"], [1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == {"pearson": 0.0}
    assert compute_metrics(["mcc"], [0, 1, 1], [1, 1, 1]) == {"mcc": 0.0}
    assert compute_metrics(["spearman"], [1, 2, 3, 4], [10, 20, 30, 40])["spearman"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown metric"):
        compute_metrics(["bleu"], [1], [1])


# ----------------------------------------------------------------------------- report


def _fake_task(name: str, metrics: list[str], splits: list[str], score: float) -> dict:
    summ = {m: {"median": score, "mean": score, "std": 0.01, "min": score - 0.02, "max": score + 0.01}
            for m in [*metrics, "score"]}
    seed = {"seed": 0, "train_seconds": 1.0, "eval_seconds": 0.1,
            "splits": {s: {m: score for m in [*metrics, "score"]} for s in splits}}
    return {"metrics": metrics, "summary": {s: summ for s in splits}, "seeds": [seed, seed],
            "train_examples": 10}


def test_glue_average_conventions_and_partial_mean() -> None:
    scores = {"cola": 0.5, "sst2": 0.9, "mrpc": 0.8, "stsb": 0.85, "qqp": 0.87, "qnli": 0.9,
              "rte": 0.6, "mnli": 0.8}
    tasks = {k: _fake_task(k, ["accuracy"], ["dev_matched", "dev_mismatched"] if k == "mnli"
                           else ["dev"], v) for k, v in scores.items()}
    cols = score_columns(tasks)
    assert [c["column"] for c in cols] == GLUE9
    avg = glue_averages(cols)
    assert avg["complete"] and avg["glue9"] == pytest.approx(100 * np.mean(
        [0.8, 0.8, 0.87, 0.9, 0.9, 0.5, 0.85, 0.8, 0.6]))
    assert avg["glue8"] == pytest.approx(100 * np.mean([0.8, 0.87, 0.9, 0.9, 0.5, 0.85, 0.8, 0.6]))
    part = glue_averages(score_columns({k: tasks[k] for k in ("cola", "sst2", "mrpc")}))
    assert not part["complete"] and "glue9" not in part
    assert part["partial_mean"] == pytest.approx(100 * np.mean([0.5, 0.9, 0.8]))
    assert "not comparable" in part["partial_note"]


def test_markdown_keeps_references_apart_and_chart_is_a_png() -> None:
    tasks = {"cola": _fake_task("cola", ["mcc"], ["dev"], 0.1),
             "reviews": _fake_task("reviews", ["accuracy", "f1"], ["dev"], 0.7)}
    cols = score_columns(tasks)
    assert [c["column"] for c in cols] == ["CoLA", "reviews"]
    from dataclasses import asdict

    from shoestring.eval.finetune import PROTOCOLS

    results = {"run": "runs/x", "run_name": "x", "protocol": asdict(PROTOCOLS["sane"]),
               "seeds": [0, 1], "tasks": tasks, "columns": cols,
               "glue_average": glue_averages(cols), "wall_seconds": 3.0, "machine": {}}
    md = render_markdown(results)
    measured, refs = md.split("## External references")
    assert "measured: x" in measured and "crammed BERT" not in measured
    assert "crammed BERT" in refs and "measured: x" not in refs.split("## Details")[0]
    assert "10.0 [8.0–11.0]" in measured and "partial mean" in measured
    assert "arXiv:2212.14034" in refs and "glue9" in refs
    png = render_chart(results)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_hub_layout_datasets_convert_like_the_glue_files() -> None:
    """`--glue hf` needs a network; what it does with the hub's data is tested here on real
    `datasets` objects built with the hub's ``glue`` features (names and ClassLabels)."""
    import datasets

    from shoestring.eval.glue import from_hf_dataset

    cola = datasets.DatasetDict({
        split: datasets.Dataset.from_dict(
            {"sentence": ["Bill sang.", "Sang Bill the."], "label": [1, 0], "idx": [0, 1]},
            features=datasets.Features({
                "sentence": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["unacceptable", "acceptable"]),
                "idx": datasets.Value("int32")}))
        for split in ("train", "validation")})
    data = from_hf_dataset(GLUE_TASKS["cola"], cola)
    assert [(e.a, e.label) for e in data.train] == [("Bill sang.", "1"), ("Sang Bill the.", "0")]
    assert data.label_ids(data.evals["dev"]) == [1, 0]  # index order, as the files give it

    nli = datasets.Features({"premise": datasets.Value("string"),
                             "hypothesis": datasets.Value("string"),
                             "label": datasets.ClassLabel(
                                 names=["entailment", "neutral", "contradiction"])})
    mnli = datasets.DatasetDict({
        split: datasets.Dataset.from_dict(
            {"premise": ["A man sleeps.", "A dog runs."], "hypothesis": ["He naps.", "A cat."],
             "label": [0, 2]}, features=nli)
        for split in ("train", "validation_matched", "validation_mismatched")})
    data = from_hf_dataset(GLUE_TASKS["mnli"], mnli, max_train=1)
    assert len(data.train) == 1 and data.train[0].b == "He naps."
    assert set(data.evals) == {"dev_matched", "dev_mismatched"}
    assert [e.label for e in data.evals["dev_matched"]] == ["entailment", "contradiction"]

    stsb = datasets.DatasetDict({
        split: datasets.Dataset.from_dict(
            {"sentence1": ["a"], "sentence2": ["b"], "label": [3.8]}) for split in ("train", "validation")})
    data = from_hf_dataset(GLUE_TASKS["stsb"], stsb)
    assert data.train[0].label == pytest.approx(3.8) and data.evals["dev"][0].b == "b"
