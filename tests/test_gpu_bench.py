"""bench/gpu.py on a CPU machine: it refuses to print GPU figures without a GPU, and its
``--device cpu --smoke`` mode runs every side (ours, the HF peers, serving) end to end, so the
first lent GPU runs code that has already run (docs/gpu.md)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu.py"
SHARED_GLUE = BENCH.parents[2] / "shared" / "data" / "glue"


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
@pytest.mark.heavy
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
    for rel in ("tests/test_cuda.py", "tests/cuda_dist_driver.py", "bench/gpu.py",
                "bench/gpu_default.py", "bench/gpu_data.py", "bench/objective_transfer.py"):
        for node in ast.walk(ast.parse((root / rel).read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shoestring"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(
                        f"{node.module}.{alias.name}"), f"{rel}:{node.lineno}: " \
                        f"{node.module}.{alias.name} does not exist"
                    checked += 1
    assert checked > 20


# ---------------------------------------------------------------------------- issue 48's rows


def test_the_default_rows_refuse_without_their_data_and_say_what_to_run(tmp_path: Path) -> None:
    """The default-path and quality rows train on the wiki-books slice carried to the GPU
    machine; without it both bench/gpu.py and the device command stop before measuring."""
    r = bench("--only", "default,quality", "--data", str(tmp_path / "absent"),
              "--out", str(tmp_path / "g.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--data" in r.stderr and "absent" in r.stderr and "make gpu-data" in r.stderr
    assert not (tmp_path / "g.json").exists()
    check = BENCH.with_name("gpu_check.sh")
    for part in ("default", "planner", "rtd"):  # issues 51 and 60 train on the slice too
        r = subprocess.run(["bash", str(check)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "GPU_PART": part,
                                "GPU_DATA": str(tmp_path / "absent"),
                                "GPU_OUT": str(tmp_path / "o")})
        assert r.returncode == 2
        assert "make gpu-data" in r.stderr and '".gpu-data"' in r.stderr  # what to carry
        assert f"GPU_PART={part}" in r.stderr
        assert not (tmp_path / "o").exists()  # refused before installing or writing anything
    (tmp_path / "slice").mkdir()
    (tmp_path / "slice" / "manifest.json").write_text("{}")
    r = subprocess.run(["bash", str(check)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPU_PART": "rtd", "GPU_DATA": str(tmp_path / "slice"),
                            "GPU_OUT": str(tmp_path / "o")})
    assert r.returncode == 2 and "make gpu-data" in r.stderr  # the data without its SST-2
    assert not (tmp_path / "o").exists()
    r = subprocess.run(["bash", str(check)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPU_PART": "nonsense", "GPU_OUT": str(tmp_path / "o")})
    assert r.returncode == 2 and "serve" in r.stderr and "planner" in r.stderr
    assert not (tmp_path / "o").exists()


def test_the_slice_keeps_every_nth_document_of_each_source(tmp_path: Path) -> None:
    import zstandard

    sys.path.insert(0, str(BENCH.parent))
    from gpu_data import write_slice

    docs = [{"id": f"w{i}", "source": "wikipedia", "text": f"article {i}"} for i in range(7)]
    docs += [{"id": f"g{i}", "source": "gutenberg", "text": f"chapter {i}"} for i in range(5)]
    corpus = tmp_path / "c.jsonl.zst"
    corpus.write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(d) + "\n" for d in docs).encode()))
    kept = write_slice(corpus, 3, tmp_path / "s.jsonl")
    ids = [json.loads(x)["id"] for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert ids == ["w0", "w3", "w6", "g0", "g3"]  # counted within each source, corpus order
    assert kept == {"wikipedia": 3, "gutenberg": 2}
    assert write_slice(corpus, 3, tmp_path / "t.jsonl") == kept  # deterministic
    assert (tmp_path / "t.jsonl").read_text() == (tmp_path / "s.jsonl").read_text()
    # one source, the last of every three
    one = write_slice(corpus, 3, tmp_path / "u.jsonl", source="wikipedia", phase=2)
    ids = [json.loads(x)["id"] for x in (tmp_path / "u.jsonl").read_text().splitlines()]
    assert ids == ["w2", "w5"] and one == {"wikipedia": 2}
    # ... the first of every three, until 15 characters are kept (each text has 9)
    write_slice(corpus, 3, tmp_path / "v.jsonl", source="wikipedia", max_chars=15)
    ids = [json.loads(x)["id"] for x in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert ids == ["w0", "w3"]


def test_the_glue_slice_keeps_the_header_the_first_rows_and_the_whole_dev(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH.parent))
    from gpu_data import glue_slice

    src = tmp_path / "glue" / "SST-2"
    src.mkdir(parents=True)
    rows = [f"sentence {i}\t{i % 2}\n" for i in range(9)]
    (src / "train.tsv").write_text("sentence\tlabel\n" + "".join(rows))
    (src / "dev.tsv").write_text("sentence\tlabel\nx\t1\n")
    out = glue_slice(tmp_path / "glue", tmp_path / "carried", rows=4)
    assert (out / "SST-2" / "train.tsv").read_text() == "sentence\tlabel\n" + "".join(rows[:4])
    assert (out / "SST-2" / "dev.tsv").read_bytes() == (src / "dev.tsv").read_bytes()


def rtd_row_command() -> list[str]:
    """The objective_transfer.py command GPU_PART=rtd runs, read from bench/gpu_check.sh."""
    text = re.sub(r"\\\n\s*", " ", BENCH.with_name("gpu_check.sh").read_text())
    line = next(x for x in text.splitlines() if "bench/objective_transfer.py" in x)
    return shlex.split(line.split("2>&1")[0].strip())[1:]


@pytest.mark.slow
@pytest.mark.heavy
def test_the_rtd_row_runs_on_cpu_as_the_device_command_runs_it(tmp_path: Path,
                                                              pydocs_dir: Path) -> None:
    """Issue 60's GPU row, tested up to the device: the command gpu_check.sh runs, with the
    BERT-base preset, the 120 s budget and 2,000 rows swapped for CPU sizes, on SST-2's slice
    as `make gpu-data` cuts it: both arms pretrain, are evaluated held-out, fine-tune beside
    the random twin, and the JSON has every comparison."""
    if not (SHARED_GLUE / "SST-2" / "train.tsv").is_file():
        pytest.skip(f"no {SHARED_GLUE / 'SST-2'} (the shared GLUE data, ../shared/data)")
    sys.path.insert(0, str(BENCH.parent))
    from gpu_data import glue_slice

    glue = glue_slice(SHARED_GLUE, tmp_path / "glue", rows=200)
    env = {"$DATA": str(pydocs_dir), "$GLUE": str(glue), "$RTD_BUDGET": "6steps",
           "$OUTDIR": str(tmp_path / "out")}
    argv = rtd_row_command()
    assert argv[0] == "bench/objective_transfer.py" and "--preset" in argv
    for var, value in env.items():
        argv = [a.replace(var, value) for a in argv]
    sizes = {"--preset": None, "--max-train": "32", "--work": str(tmp_path / "work")}
    cmd, i = [], 0
    while i < len(argv):
        if argv[i] in sizes:
            cmd += [] if sizes[argv[i]] is None else [argv[i], sizes[argv[i]]]
            i += 2
        else:
            cmd.append(argv[i])
            i += 1
    (tmp_path / "out").mkdir()
    r = subprocess.run([sys.executable, str(BENCH.with_name("objective_transfer.py")), *cmd[1:]],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "out" / "gpu-rtd.json").read_text())["rows"]
    assert {(x["arm"], x["against"]) for x in rows} == {
        ("mlm", "random twin"), ("rtd", "random twin"), ("rtd", "mlm")}
    assert all(x["task"] == "sst2" and x["pretrain_seeds"] == 1 for x in rows)
    assert "detection accuracy" in r.stdout and "held-out MLM loss" in r.stdout
    for arm in ("mlm", "rtd"):
        summary = json.loads((tmp_path / "work" / f"{arm}-6steps-p0" / "summary.json").read_text())
        assert summary["objective"] == arm and summary["steps"] == 6
    assert (tmp_path / "out" / "gpu-rtd.jsonl").is_file()
    # The ledger keeps each finished comparison: a later checkout (a fresh work dir) trains
    # nothing again and prints the same table from it.
    kept = sorted(p.name for p in (tmp_path / "out" / "rtd-ledger").iterdir())
    assert kept == ["mlm-6steps-p0.json", "rtd-6steps-p0.json"]
    again = [a if a != str(tmp_path / "work") else str(tmp_path / "work2") for a in cmd[1:]]
    r2 = subprocess.run([sys.executable, str(BENCH.with_name("objective_transfer.py")), *again],
                        capture_output=True, text=True, timeout=300,
                        env={**os.environ, "COLUMNS": "200"})
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "pretrain-" not in r2.stderr and r2.stdout.count("from the ledger") == 2
    assert not any(p.name.endswith("-p0") for p in (tmp_path / "work2").iterdir())
    assert json.loads((tmp_path / "out" / "gpu-rtd.json").read_text())["rows"] == rows


@pytest.mark.slow
@pytest.mark.heavy
def test_smoke_runs_the_default_path_and_the_equal_wall_clock_quality_row(tmp_path: Path) -> None:
    """`--smoke` runs issue 48's rows end to end on pydocs (no slice needed): `shoestring
    train` as a user types it, its choices read back; the HF peer for the same seconds with
    our run's batch and LR; both scored on one held-out set; the hand-configured mlm-base
    row beside them for the default path's ratios."""
    import math

    import yaml

    out, md, rec = tmp_path / "g.json", tmp_path / "g.md", tmp_path / "g.jsonl"
    work = tmp_path / "work"
    r = bench("--device", "cpu", "--smoke", "--only", "default,quality,mlm-base", "--no-serve",
              "--quality-seconds", "5", "--heldout-sequences", "96", "--work", str(work),
              "--out", str(out), "--table", str(md), "--record", str(rec))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["shapes"]) == {"mlm-base"} and "errors" not in res

    # the default path: the CLI with the model size and a budget, nothing the trainer chooses
    d = res["default_path"]
    assert d["command"].startswith("shoestring train --data ") and "--budget 5s" in d["command"]
    assert "model.preset=null" in d["command"]
    for chosen_by_train in ("compile", "batch_size", "micro_batch", "train.lr", "attention",
                            "precision"):
        assert chosen_by_train not in d["command"]
    run = Path(d["run_dir"])
    summary = json.loads((run / "summary.json").read_text())
    config = yaml.safe_load((run / "config.yaml").read_text())
    c = d["chosen"]
    assert c["compiled"] == summary["compiled"] and c["attention"] == summary["attention"]
    assert c["batch_size"] == config["train"]["batch_size"] and c["lr"] == config["train"]["lr"]
    assert c["micro_batch"] == summary["micro_batch"]
    assert d["steps"] == summary["steps"] > 0 and d["windows"] >= 2 and d["tokens_per_s"] > 0
    assert d["mfu_datasheet"] is None and d["mfu_met"] is None  # no datasheet for a CPU
    base = res["shapes"]["mlm-base"]
    assert d["ratios"]["ours / hand-configured ours"] == pytest.approx(
        d["tokens_per_s"] / base["ours"]["tokens_per_s"])
    assert d["ratios"]["ours / hand-configured peer"] == pytest.approx(
        d["tokens_per_s"] / base["peer"]["tokens_per_s"])

    # the quality row: both sides trained for the budget, on the same data, at our batch/LR
    q = res["quality"]
    ours, peer = q["ours"], q["peer"]
    assert ours["tokens"] == summary["tokens"] > 0 and ours["steps"] == summary["steps"]
    assert peer["side"] == "ModernBertForMaskedLM" and peer["steps"] >= 1 and peer["tokens"] > 0
    assert peer["train_seconds"] >= 5 and q["seconds_each"] == 5
    assert peer["params"] == ours["params"]  # the peer is our architecture
    assert (peer["batch_size"], peer["lr"]) == (c["batch_size"], c["lr"])
    assert "not separately tuned" in peer["recipe"]
    assert math.isfinite(ours["loss"]) and math.isfinite(peer["loss"])
    assert ours["masked_positions"] == peer["masked_positions"] == q["heldout"][
        "masked_positions"] > 0
    assert q["heldout"]["sequences"] == 96
    assert q["ratio_tokens_per_s"] == pytest.approx(ours["tokens_per_s"] / peer["tokens_per_s"])
    assert q["loss_difference"] == pytest.approx(ours["loss"] - peer["loss"])
    assert q["loss_met"] == (ours["loss"] < peer["loss"])
    # the held-out set is fixed: scoring our saved model again gives the same loss
    sys.path.insert(0, str(BENCH.parent))
    from gpu_default import heldout, score_ours

    from shoestring.data.datadir import DataDir

    class Cpu:
        kind, torch, dtype = "cpu", torch.device("cpu"), torch.float32

    again = score_ours(run, heldout(DataDir(d["data"]), q["heldout"]["mask_rate"], 96), Cpu())
    assert again["masked_positions"] == ours["masked_positions"]
    assert again["loss"] == pytest.approx(ours["loss"], rel=1e-4)

    table = md.read_text()
    assert table in r.stdout and "SMOKE" in table
    assert "| default path |" in table and "| mlm-base | shoestring |" in table
    assert "| shoestring (default path) |" in table and "| ModernBertForMaskedLM |" in table
    assert "held-out MLM loss" in table and "target ≥ 1.3x" in table
    records = [json.loads(x) for x in rec.read_text().splitlines()]
    assert [x["table"] for x in records] == ["main", "default", "quality"]
    assert [row["side"] for row in records[2]["rows"]] == ["shoestring (default path)",
                                                           "ModernBertForMaskedLM"]
    assert bench("--render", str(out)).stdout == table
