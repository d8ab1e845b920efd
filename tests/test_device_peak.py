"""The measured CPU peak is robust to a busy machine (issue 37): the best figure measured on
this machine is kept in $SHOESTRING_HOME/peaks.json and a busy probe never lowers the peak;
MFU above 1 comes with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shoestring.device import measure_matmul_flops, peak_note, peaks_path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHOESTRING_HOME", str(tmp_path))
    return tmp_path


def test_a_probe_is_recorded_and_a_lower_one_never_lowers_the_peak(home: Path) -> None:
    first = measure_matmul_flops("cpu", torch.float32)
    records = json.loads(peaks_path().read_text())
    assert peaks_path() == home / "peaks.json" and list(records.values()) == [first]
    (key,) = records
    assert "threads" in key and key.endswith("float32")
    # a quiet run measured far more before: a probe now (however busy) reports that figure
    peaks_path().write_text(json.dumps({key: first * 3}))
    assert measure_matmul_flops("cpu", torch.float32) == first * 3
    # a damaged record is ignored and replaced, not an error
    peaks_path().write_text("not json")
    assert measure_matmul_flops("cpu", torch.float32) == first
    assert json.loads(peaks_path().read_text()) == {key: first}


def test_mfu_above_one_comes_with_its_reason() -> None:
    assert peak_note(0.42, 4e11) is None and peak_note(1.0, 4e11) is None
    note = peak_note(1.62, 1.5e11)
    assert note is not None and "MFU above 100%" in note and "150 GFLOP/s" in note
