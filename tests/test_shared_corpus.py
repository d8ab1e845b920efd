"""prep → train → eval on the real multi-genre corpus in ../shared/data (skipped without it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SHARED_DATA, run_cli

CORPUS = SHARED_DATA / "corpora" / "mixed-en.jsonl"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CORPUS.is_file(), reason=f"shared corpus not found at {CORPUS}"),
]


def test_mixed_en_through_the_cli(tmp_path: Path) -> None:
    with CORPUS.open(encoding="utf-8") as f:
        n_docs = sum(1 for line in f if line.strip())
    p = run_cli("prep", str(CORPUS), "-o", str(tmp_path / "d"), "--set", "data.vocab_size=4096")
    assert p.returncode == 0, p.stderr
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["documents"]["read"] == n_docs
    assert m["documents"]["train"] + m["documents"]["val"] == m["documents"]["kept"]
    assert m["splits"]["train"]["tokens"] > 3_000_000  # ~4M words of English
    assert m["tokenizer"]["vocab_size"] == 4096 and m["dtype"] == "<u2"
    t = run_cli("train", "--data", str(tmp_path / "d"), "-o", str(tmp_path / "r"), "--steps", "20",
                "--set", "model.num_layers=2", "--set", "model.hidden_size=128", "--set", "model.num_heads=2",
                "--set", "model.intermediate_size=256")
    assert t.returncode == 0, t.stderr
    e = run_cli("eval", str(tmp_path / "r"), "--data", str(tmp_path / "d"))
    assert e.returncode == 0, e.stderr
    result = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert result["sequences"] == min(m["splits"]["val"]["sequences"], 4096)
