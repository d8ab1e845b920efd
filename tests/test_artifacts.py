"""One answer to "what is this folder?" (`shoestring.artifacts`), for every kind shoestring
writes, built for real: prep, a 3-step train, export, a classifier and a repository push."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli, write_jsonl_corpus

from shoestring.artifacts import Kind, identify
from shoestring.errors import ShoestringError

TINY = ["--set", "model.hidden_size=64", "--set", "model.num_layers=1", "--set",
        "model.num_heads=2", "--set", "model.intermediate_size=128", "--set",
        "train.batch_size=8"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("artifacts")
    corpus = write_jsonl_corpus(root / "c.jsonl", n_docs=120)
    data, run, hf = root / "data", root / "run", root / "hf"
    for args in (("prep", str(corpus), "-o", str(data)),
                 ("train", "--data", str(data), "-o", str(run), "--steps", "3", *TINY),
                 ("export", str(run), "-o", str(hf))):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
    from shoestring.classifier import SequenceClassifier, save_classifier
    from shoestring.model_repository import ModelRepository
    from shoestring.rundir import RunDir

    encoder, meta = RunDir(run).load_final()
    model = SequenceClassifier(encoder, num_labels=2)
    clf = save_classifier(root / "clf", model, meta, run / "final" / "tokenizer.json",
                          labels=["no", "yes"], problem="single_label_classification",
                          max_length=32)
    version, _ = ModelRepository(root / "repo").push(run, "bert")
    return {"data": data, "run": run, "hf": hf, "clf": Path(clf),
            "repo": version.path.parent, "root": root}


def test_every_kind_is_recognised(folders: dict[str, Path]) -> None:
    expected = {"data": Kind.DATA, "run": Kind.RUN, "hf": Kind.EXPORT,
                "clf": Kind.CLASSIFIER, "repo": Kind.REPOSITORY}
    for name, kind in expected.items():
        assert identify(folders[name]).kind is kind, name
    assert identify(folders["data"]).trained is False
    assert all(identify(folders[n]).trained for n in ("run", "hf", "clf"))


def test_final_names_its_run_and_the_model_folders_hold_a_model(folders: dict[str, Path]) -> None:
    run = identify(folders["run"] / "final")
    assert run.kind is Kind.RUN and run.path == folders["run"]
    assert run.model_dir == folders["run"] / "final"
    for name in ("run", "hf", "clf"):
        a = identify(folders[name])
        assert (a.model_dir / "config.json").is_file() and a.tokenizer_path.is_file(), name
    # the repository stores a run's final/ under model/: that folder is a run's model too
    stored = identify(folders["repo"] / "model")
    assert stored.kind is Kind.RUN and stored.trained


def test_a_wrong_kind_says_what_the_folder_is(folders: dict[str, Path]) -> None:
    with pytest.raises(ShoestringError, match="this is a data dir.*not a run dir") as e:
        identify(folders["data"], want=(Kind.RUN,), command="shoestring eval")
    assert "shoestring eval" in (e.value.fix or "")
    with pytest.raises(ShoestringError, match="Hugging Face export"):
        identify(folders["hf"], want=(Kind.RUN,))
    with pytest.raises(ShoestringError, match="no such folder"):
        identify(folders["root"] / "nope")
    empty = folders["root"] / "empty"
    empty.mkdir()
    with pytest.raises(ShoestringError, match="not a model folder"):
        identify(empty)
    (empty / ".shoestring-run").write_text("shoestring run dir\n")  # started, never finished
    assert identify(empty).kind is Kind.RUN
    with pytest.raises(ShoestringError, match="final/ is missing"):
        identify(empty, want=(Kind.RUN,), trained=True)


def test_commands_share_the_answer(folders: dict[str, Path]) -> None:
    """eval, export and serve refuse a data dir with the same sentence, exit 2."""
    for args in (("eval", str(folders["data"])),
                 ("export", str(folders["data"]), "-o", str(folders["root"] / "x")),
                 ("serve", str(folders["data"]), "--port", "0")):
        r = run_cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "this is a data dir" in r.stderr, (args, r.stderr)
