"""bench/loader.py end to end on a tiny data dir: it builds a real data dir of many shards
(rows of the prep format), measures real loader processes (1 and 2 ranks at once) and prints
the table; a second run reuses the data dir."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from shoestring.data.datadir import DataDir

BENCH = Path(__file__).resolve().parents[1] / "bench" / "loader.py"


def _bench(cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), "--cache", str(cache), "--shards", "24",
         "--shard-tokens", "2048", "--seconds", "0.2", "--procs", "1,2",
         "--only", "encoder seq 128"],
        capture_output=True, text=True, timeout=600, env={**os.environ})


def test_bench_builds_many_shards_and_measures_ranks(tmp_path: Path) -> None:
    r = _bench(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = DataDir(tmp_path / "mlm-128")
    shards = data.manifest["splits"]["train"]["shards"]
    assert len(shards) == 24 and all(s["sequences"] == 16 for s in shards)
    split = data.split("train", verify="sha256")
    rows = split.take(np.arange(len(split)))
    ids = data.special_ids
    assert (rows[:, 0] == ids["[CLS]"]).all() and (rows[:, -1] == ids["[SEP]"]).all()
    assert rows.max() < data.vocab_size and len(np.unique(rows)) > 1000
    table = [line for line in r.stdout.splitlines() if line.startswith("| encoder seq 128")]
    assert [line.split(" | ")[2] for line in table] == ["1", "2"]
    for line in table:
        per_core = float(line.split(" | ")[5].replace(",", ""))
        assert per_core > 0
    assert "load average" in r.stdout
    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "mlm-128" / "train").iterdir()}
    again = _bench(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "mlm-128" / "train").iterdir()} \
        == written  # reused, not rebuilt


def test_decoder_data_dir_holds_plain_rows_with_document_ends(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("loader_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.build_data_dir(tmp_path / "clm", "clm", 64, shards=7, shard_tokens=1024)
    data = DataDir(out)
    assert data.objective == "clm" and len(data.manifest["splits"]["train"]["shards"]) == 7
    rows = data.split("train").take(np.arange(7 * 16))
    assert (rows == data.special_ids["<|endoftext|>"]).any()
    assert rows.min() >= 0 and rows.max() < data.vocab_size
