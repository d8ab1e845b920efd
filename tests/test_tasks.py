"""Custom tasks: TSV/CSV/JSONL with a column mapping from YAML or the command line; errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoestring.errors import ShoestringError
from shoestring.eval.tasks import load_custom_task, parse_task_arg


def _csv(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    _csv(tmp_path / "train.csv", 'id,review,stars\n1,"Great, really great",pos\n2,"Dull\nand long",neg\n'
         '3,fine,pos\n')
    _csv(tmp_path / "dev.csv", "id,review,stars\n4,awful,neg\n5,lovely,pos\n")
    _csv(tmp_path / "train.tsv", "q1\tq2\tsim\nA cat.\tA cat!\t4.5\nA dog.\tThe sun.\t0.2\n")
    _csv(tmp_path / "dev.tsv", "q1\tq2\tsim\nA car.\tA car.\t5\n")
    (tmp_path / "train.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [{"t": "good", "y": 1}, {"t": "bad", "y": 0},
                                           {"t": "ok", "y": 2}]) + "\n")
    (tmp_path / "dev.jsonl").write_text(json.dumps({"t": "meh", "y": 2}) + "\n")
    return tmp_path


def test_csv_classification_by_column_name_on_the_command_line(files: Path) -> None:
    spec = parse_task_arg(f"name=reviews,train={files / 'train.csv'},dev={files / 'dev.csv'},"
                          "text=review,label=stars")
    data = load_custom_task(spec)
    assert data.spec.name == "reviews" and not data.spec.pair
    assert data.spec.labels == ["neg", "pos"] and data.spec.metrics == ["accuracy", "f1"]
    assert [e.a for e in data.train] == ["Great, really great", "Dull\nand long", "fine"]
    assert data.train[2].where.endswith("train.csv:5")  # the quoted field spans lines 3-4
    assert data.label_ids(data.evals["dev"]) == [0, 1]


def test_tsv_pair_regression_from_yaml_with_relative_paths(files: Path) -> None:
    (files / "sim.yaml").write_text(
        "name: sim\ntrain: train.tsv\ndev: dev.tsv\ntext: q1\ntext_pair: q2\nlabel: sim\n"
        "problem: regression\n")
    data = load_custom_task(parse_task_arg(str(files / "sim.yaml")))
    assert data.spec.pair and data.spec.problem == "regression" and data.spec.num_labels == 1
    assert data.spec.metrics == ["pearson", "spearman"]
    assert [(e.a, e.b, e.label) for e in data.train] == [("A cat.", "A cat!", 4.5),
                                                        ("A dog.", "The sun.", 0.2)]


def test_jsonl_multiclass_with_explicit_label_order(files: Path) -> None:
    spec = parse_task_arg(f"train={files / 'train.jsonl'},dev={files / 'dev.jsonl'},text=t,label=y,"
                          "labels=2|1|0,metrics=accuracy")
    data = load_custom_task(spec)
    assert data.spec.labels == ["2", "1", "0"] and data.spec.metrics == ["accuracy"]
    assert data.label_ids(data.train) == [1, 2, 0]


def test_headerless_tsv_by_column_index(tmp_path: Path) -> None:
    _csv(tmp_path / "t.tsv", "x\t0\tfirst\ny\t1\tsecond\n")
    _csv(tmp_path / "d.tsv", "z\t1\tthird\n")
    data = load_custom_task(parse_task_arg(
        f"train={tmp_path / 't.tsv'},dev={tmp_path / 'd.tsv'},text=2,label=1,header=false"))
    assert [(e.a, e.label) for e in data.train] == [("first", "0"), ("second", "1")]


def test_default_labels_sort_numerically(tmp_path: Path) -> None:
    _csv(tmp_path / "t.csv", "t,y\na,10\nb,2\nc,1\n")
    _csv(tmp_path / "d.csv", "t,y\nd,2\n")
    data = load_custom_task(parse_task_arg(f"train={tmp_path / 't.csv'},dev={tmp_path / 'd.csv'},text=t,label=y"))
    assert data.spec.labels == ["1", "2", "10"] and data.spec.metrics == ["accuracy", "macro_f1"]


def test_missing_column_names_the_header_line(files: Path) -> None:
    spec = parse_task_arg(f"train={files / 'train.csv'},dev={files / 'dev.csv'},text=body,label=stars")
    with pytest.raises(ShoestringError, match="column 'body' not found.*'review'") as e:
        load_custom_task(spec)
    assert e.value.where.endswith("train.csv:1")
    spec = parse_task_arg(f"train={files / 'train.jsonl'},dev={files / 'dev.jsonl'},text=text,label=y")
    with pytest.raises(ShoestringError, match="field 'text' missing") as e:
        load_custom_task(spec)
    assert e.value.where.endswith("train.jsonl:1")


def test_unknown_label_in_dev_names_file_and_line(files: Path) -> None:
    _csv(files / "dev.csv", "id,review,stars\n4,awful,neg\n5,so-so,meh\n")
    spec = parse_task_arg(f"train={files / 'train.csv'},dev={files / 'dev.csv'},text=review,label=stars")
    with pytest.raises(ShoestringError, match="label 'meh' is not one of") as e:
        load_custom_task(spec)
    assert e.value.where.endswith("dev.csv:3")


def test_empty_and_header_only_files(files: Path) -> None:
    _csv(files / "dev.csv", "")
    spec = parse_task_arg(f"train={files / 'train.csv'},dev={files / 'dev.csv'},text=review,label=stars")
    with pytest.raises(ShoestringError, match="empty") as e:
        load_custom_task(spec)
    assert e.value.where.endswith("dev.csv")
    _csv(files / "dev.csv", "id,review,stars\n")
    with pytest.raises(ShoestringError, match="only a header"):
        load_custom_task(spec)
    (files / "dev.jsonl").write_text("\n\n")
    with pytest.raises(ShoestringError, match="empty"):
        load_custom_task(parse_task_arg(f"train={files / 'train.jsonl'},dev={files / 'dev.jsonl'},text=t,label=y"))


def test_row_errors(files: Path, tmp_path: Path) -> None:
    _csv(files / "train.tsv", "q1\tq2\tsim\nA cat.\tA cat!\thigh\n")
    with pytest.raises(ShoestringError, match="'high' is not a number") as e:
        load_custom_task(parse_task_arg(f"train={files / 'train.tsv'},dev={files / 'dev.tsv'},"
                                        "text=q1,text_pair=q2,label=sim,problem=regression"))
    assert e.value.where.endswith("train.tsv:2")
    _csv(files / "train.tsv", "q1\tq2\tsim\nA cat.\t4.5\n")
    with pytest.raises(ShoestringError, match="2 field") as e:
        load_custom_task(parse_task_arg(f"train={files / 'train.tsv'},dev={files / 'dev.tsv'},"
                                        "text=q1,text_pair=q2,label=sim,problem=regression"))
    assert e.value.where.endswith("train.tsv:2")
    (files / "train.jsonl").write_text('{"t": "good", "y": 1}\n{"t": "bad", "y": \n')
    with pytest.raises(ShoestringError, match="not valid JSON") as e:
        load_custom_task(parse_task_arg(f"train={files / 'train.jsonl'},dev={files / 'dev.jsonl'},text=t,label=y"))
    assert e.value.where.endswith("train.jsonl:2")
    _csv(tmp_path / "one.csv", "t,y\na,x\nb,x\n")
    with pytest.raises(ShoestringError, match="only one label"):
        load_custom_task(parse_task_arg(f"train={tmp_path / 'one.csv'},dev={tmp_path / 'one.csv'},text=t,label=y"))
    with pytest.raises(ShoestringError, match="file not found"):
        load_custom_task(parse_task_arg(f"train={tmp_path / 'nope.csv'},dev={tmp_path / 'one.csv'},text=t,label=y"))


def test_bad_specs(tmp_path: Path) -> None:
    with pytest.raises(ShoestringError, match="has no '='"):
        parse_task_arg("train=a.csv,oops")
    with pytest.raises(ShoestringError, match="dev: Field required"):
        parse_task_arg("train=a.csv,text=t,label=y")
    with pytest.raises(ShoestringError, match="colour: unknown key"):
        parse_task_arg("train=a.csv,dev=b.csv,text=t,label=y,colour=red")
    with pytest.raises(ShoestringError, match="unknown metric 'bleu'"):
        parse_task_arg("train=a.csv,dev=b.csv,text=t,label=y,metrics=bleu")
    (tmp_path / "t.yaml").write_text("train: [unclosed\n")
    with pytest.raises(ShoestringError, match="not valid YAML") as e:
        parse_task_arg(str(tmp_path / "t.yaml"))
    assert e.value.where.startswith(str(tmp_path / "t.yaml"))
    with pytest.raises(ShoestringError, match="task spec file not found"):
        parse_task_arg(str(tmp_path / "missing.yaml"))
    with pytest.raises(ShoestringError, match="cannot tell the file format"):
        load_custom_task(parse_task_arg(f"train={tmp_path / 't.yaml'},dev={tmp_path / 't.yaml'},text=t,label=y"))
