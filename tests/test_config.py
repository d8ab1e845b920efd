from __future__ import annotations

from pathlib import Path

import pytest

from shoestring.config import Config, load_config, parse_override
from shoestring.errors import ShoestringError


def test_defaults_are_the_cramming_recipe() -> None:
    cfg = Config()
    assert cfg.train.mask_rate == 0.40 and cfg.train.lr == 2e-3 and cfg.train.lr_peak_at == 0.75
    assert cfg.data.seq_len == 128 and cfg.train.budget.text == "3m"


def test_yaml_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 0.01\n  batch_size: 8\nmodel:\n  num_layers: 2\n")
    cfg = load_config(f, ["train.lr=1e-4", "data.lowercase=false", "train.budget=null", "train.steps=5"])
    assert cfg.train.lr == 1e-4 and cfg.train.batch_size == 8 and cfg.model.num_layers == 2
    assert cfg.data.lowercase is False and cfg.train.budget is None and cfg.train.steps == 5


def test_round_trip_through_yaml(tmp_path: Path) -> None:
    cfg = load_config(None, ["model.hidden_size=128", "train.precision=fp32"])
    f = tmp_path / "c.yaml"
    f.write_text(cfg.to_yaml())
    assert load_config(f) == cfg


def test_parse_override_types() -> None:
    assert parse_override("a.b=1e-3") == ("a.b", 1e-3)
    assert parse_override("a.b=12") == ("a.b", 12)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=hello") == ("a.b", "hello")


def _message(*overrides: str) -> str:
    with pytest.raises(ShoestringError) as e:
        load_config(None, list(overrides))
    return str(e.value)


def test_unknown_key_lists_allowed_keys() -> None:
    msg = _message("train.learning_rate=1")
    assert "unknown key 'train.learning_rate'" in msg and "lr" in msg and "batch_size" in msg


def test_unknown_section() -> None:
    assert "unknown section 'trian'" in _message("trian.lr=1")


def test_bad_value_names_field_and_allowed_values() -> None:
    msg = _message("train.precision=fp8")
    assert "train.precision" in msg and "'bf16'" in msg and "fp8" in msg
    assert "train.lr" in _message("train.lr=-1")
    assert "budget '5x' is not a duration" in _message("train.budget=5x")


@pytest.mark.parametrize(("key", "value"), [
    ("train.budget", "5x"), ("train.budget", "0.1steps"), ("train.checkpoint_every", "200%"),
    ("train.checkpoint_every", "3e15flops")])
def test_a_bad_budget_or_interval_names_its_field_and_value(key: str, value: str) -> None:
    msg = _message(f"{key}={value}")
    assert f"--set: {key}: " in msg and f"(got '{value}')" in msg


def test_budget_and_interval_are_parsed_once_and_written_back_as_given(tmp_path: Path) -> None:
    """The config holds the parsed budget and checkpoint interval; its file keeps the text."""
    from shoestring.units import PF_DAY

    cfg = load_config(None, ["train.budget=2pf-days", "train.checkpoint_every=500steps"])
    b, every = cfg.train.budget, cfg.train.checkpoint_every
    assert (b.kind, b.amount) == ("flops", pytest.approx(2 * PF_DAY))
    assert (every.kind, every.amount) == ("steps", 500)
    default = Config().train.checkpoint_every
    assert (default.kind, default.amount) == ("fraction", 0.1)
    f = tmp_path / "config.yaml"
    f.write_text(cfg.to_yaml())
    assert "budget: 2pf-days" in f.read_text() and "checkpoint_every: 500steps" in f.read_text()
    again = load_config(f)
    assert again == cfg and again.to_yaml() == cfg.to_yaml()


def test_the_family_is_resolved_by_the_config_and_recorded_by_name() -> None:
    from shoestring import families

    cfg = load_config(None, ["model.objective=clm", "data.objective=clm"])
    assert cfg.model.family is families.get("clm") and cfg.data.family.causal
    assert cfg.model_dump(mode="json")["model"]["objective"] == "clm"


def test_heads_must_divide_hidden() -> None:
    assert "must divide hidden_size" in _message("model.num_heads=3")


def test_no_budget_at_all() -> None:
    assert "set a budget" in _message("train.budget=null")


def test_bad_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: [1,\n")
    with pytest.raises(ShoestringError, match=r"c\.yaml:\d+"):
        load_config(f)
    with pytest.raises(ShoestringError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_a_data_dir_given_twice_to_dedup_against_counts_once(tmp_path: Path) -> None:
    """`--dedup-against D --dedup-against D` (or D and ./D/) lists D once (issue 62)."""
    d = tmp_path / "d"
    cfg = load_config(overrides=[f"curate.dedup_against=[{d},{d}/,{tmp_path}/./d,other]"])
    assert cfg.curate.dedup_against == [str(d), "other"]
