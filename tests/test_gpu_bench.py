"""bench/gpu.py on a CPU machine: it refuses to print GPU figures without a GPU, and its
``--device cpu --smoke`` mode runs every side (ours, the HF peers, serving) end to end, so the
first lent GPU runs code that has already run (docs/gpu.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu.py"


def bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_refuses_without_a_gpu_and_says_what_to_do(tmp_path: Path) -> None:
    r = bench("--out", str(tmp_path / "g.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "torch.cuda.is_available() is False" in r.stderr
    assert "--device cpu --smoke" in r.stderr
    r = bench("--device", "cpu", "--out", str(tmp_path / "g.json"))
    assert r.returncode == 2 and "only for --smoke" in r.stderr
    assert not (tmp_path / "g.json").exists()


@pytest.mark.slow
def test_smoke_runs_every_side_on_cpu(tmp_path: Path) -> None:
    out, md, rec = tmp_path / "g.json", tmp_path / "g.md", tmp_path / "g.jsonl"
    r = bench("--device", "cpu", "--smoke", "--only", "mlm-cram,clm-gpt2", "--work",
              str(tmp_path / "work"), "--out", str(out), "--table", str(md), "--record", str(rec))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["smoke"] is True and set(res["shapes"]) == {"mlm-cram", "clm-gpt2"}
    for name, peer in (("mlm-cram", "ModernBertForMaskedLM"), ("clm-gpt2", "LlamaForCausalLM")):
        s = res["shapes"][name]
        ours, theirs = s["ours"], s["peer"]
        assert ours["side"] == "shoestring" and theirs["side"] == peer
        assert ours["params"] == theirs["params"]  # the peer is our architecture
        assert ours["tokens_per_s"] > 0 and theirs["tokens_per_s"] > 0
        assert s["ratio_tokens_per_s"] == pytest.approx(ours["tokens_per_s"]
                                                        / theirs["tokens_per_s"])
        assert ours["windows"] >= 2 and 0 <= ours["data_wait"] <= 1
        assert ours["mfu_ceiling"] > 0 and ours["mfu_datasheet"] is None  # no CPU datasheet
        assert ours["memory_estimate"]["total"] > 0 and ours["first_step_s_cold"] > 0
        # each shape's wall time by phase, for sizing a device command
        assert list(s["phase_s"]) == ["prep", "ours", "ceiling", "peer"]
        assert all(v >= 0 for v in s["phase_s"].values()) and s["phase_s"]["ours"] > 0
        assert f"{name} wall: prep " in r.stderr
    # serving runs after every shape (a command cut off loses serving, not a shape's row)
    assert r.stderr.index("serving wall:") > r.stderr.index("clm-gpt2 wall:")
    assert res["serving"]["phase_s"]["serving"] > 0
    serving = res["serving"]["concurrency"]
    assert set(serving) == {"2", "8"}
    assert all(v["errors"] == 0 and v["throughput"] > 0 for v in serving.values())
    table = md.read_text()
    assert "SMOKE" in table and "| mlm-cram | shoestring |" in table
    assert "| clm-gpt2 | LlamaForCausalLM |" in table and table in r.stdout
    record = json.loads(rec.read_text())  # one line: bench/table.py renders it
    assert record["bench"] == "gpu" and record["machine"]["load_after"] is not None
    assert [(row["shape"], row["side"]) for row in record["rows"]] == [
        ("mlm-cram", "shoestring"), ("mlm-cram", "ModernBertForMaskedLM"),
        ("clm-gpt2", "shoestring"), ("clm-gpt2", "LlamaForCausalLM")]
    # --render prints a saved run's table again, measuring nothing; with a datasheet peak it
    # adds what `plan` would have assumed for each shape beside the measured rate
    assert bench("--render", str(out)).stdout == table
    res["machine"]["datasheet_bf16_flops"] = 1e12
    (tmp_path / "peak.json").write_text(json.dumps(res))
    shown = bench("--render", str(tmp_path / "peak.json")).stdout
    from shoestring.device import ASSUMED_MFU

    ours = res["shapes"]["clm-gpt2"]["ours"]
    rate = ASSUMED_MFU * 1e12 / ours["flops_per_token"]
    assert f"{rate:,.0f} tokens/s, {rate / ours['tokens_per_s']:.2f}x the measured" in shown


def test_every_shoestring_name_the_gpu_check_imports_exists() -> None:
    """The CUDA tests skip on CPU, so a module that moves (``dist/launch`` → ``train/launch``)
    would only break on the first lent GPU: resolve every ``from shoestring… import …`` of the
    GPU check's files here instead."""
    import ast
    import importlib

    root = BENCH.parents[1]
    checked = 0
    for rel in ("tests/test_cuda.py", "tests/cuda_dist_driver.py", "bench/gpu.py"):
        for node in ast.walk(ast.parse((root / rel).read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shoestring"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(
                        f"{node.module}.{alias.name}"), f"{rel}:{node.lineno}: " \
                        f"{node.module}.{alias.name} does not exist"
                    checked += 1
    assert checked > 20
