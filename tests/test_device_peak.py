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


def test_the_cpu_probe_grows_its_operands_only_while_a_product_stays_short() -> None:
    """bf16 on a CPU without bf16 units takes seconds a 1024 product; the probe must not pay
    that on every `train`. With no time to spare it stays at the smallest size; with ample
    time fp32 reaches 1024, where the dense peak is measured; the operands are warm either
    way and the caller's RNG stream is untouched."""
    from shoestring.device import probe_operands

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        a, b = probe_operands("cpu", dtype, seconds=1e-9)
        assert a.shape == b.shape == (256, 256) and a.dtype == dtype
    assert torch.equal(torch.rand(3), expected)
    a, _ = probe_operands("cpu", torch.float32, seconds=60.0)
    assert a.shape == (1024, 1024)
