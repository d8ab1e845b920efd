"""bench/common.py and bench/table.py: the machine header has its fields, a record written by a
bench comes back through the table renderer, every script in bench/ starts (``--help``) and
every ``python bench/<name>.py ...`` command written in the docs still parses."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LIBRARIES = {"common", "peers", "jobs", "scale_corpus", "gpu_default"}  # imported, not run
# Scripts other branches are editing or adding (issue 36 step 6 converts them once merged):
# they print their own header and write no record yet. A script leaves this set when it
# takes `--record` (test_every_script_starts_and_takes_record fails until it does).
NOT_CONVERTED: set[str] = set()
TOOLS = {"table", "gpu_data"}  # render records or prepare data; write none
DOC_ARGUMENTS = {"PART": "all"}  # privacy.py's docstring names its positional argument
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in LIBRARIES)


@pytest.fixture()
def common(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """bench/common.py as the scripts import it (their folder first on sys.path); its generic
    name leaves sys.modules afterwards."""
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    yield common
    for name in ("common", "table"):
        sys.modules.pop(name, None)


def test_header_has_the_machine_and_the_load(common: ModuleType) -> None:
    h = common.machine_header("bf16", "cpu", transformers="4.0")
    assert set(common.HEADER_FIELDS) <= set(h)
    assert h["cores"] == os.cpu_count() and h["torch_threads"] == torch.get_num_threads()
    assert h["torch"] == torch.__version__ and h["precision"] == "bf16" and h["cpu"]
    assert h["load_after"] is None
    assert len(h["load_before"]) == 3 and all(x >= 0 for x in h["load_before"])
    line = common.header_line(h)
    assert f"{h['cores']} cores" in line and "precision bf16" in line
    assert "transformers 4.0" in line and common.format_load(h["load_before"]) in line
    assert common.machine_header(threads=1)["torch_threads"] == 1  # the measured processes'


def test_a_record_round_trips_through_the_table(common: ModuleType, tmp_path: Path) -> None:
    import table

    out = io.StringIO()
    path = tmp_path / "sub" / "results.jsonl"
    bench = common.Bench("demo", argparse.Namespace(record=path), precision="fp32", file=out)
    rows = [{"row": "ours", "tokens/s": 12345.6, "blocks": [1000.4, 2000.6], "ratio": 1.234},
            {"row": "peer | HF", "tokens/s": 10000.0, "blocks": [9.0], "ratio": None}]
    bench.table(rows, formats={"tokens/s": ",.0f", "ratio": ".2f"}, notes=["peer: configured"])
    bench.table([{"context": "x", "perplexity": 3.14159}], "second")
    records = bench.end()
    assert out.getvalue().startswith("machine: ") and "load average at the end: " in out.getvalue()

    back = common.read_records(path)
    assert back == json.loads(json.dumps(records)) and len(back) == 2
    first = back[0]
    assert first["schema"] == common.SCHEMA and first["bench"] == "demo"
    assert first["table"] == "main" and first["rows"] == rows
    assert first["command"].startswith("python ") and first["started"] <= first["finished"]
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", first["commit"])  # tests run in a checkout
    assert first["machine"]["load_after"] is not None
    assert first["machine"]["load_before"] == bench.header["load_before"]

    text = table.render(first)
    assert "| row | tokens/s | blocks | ratio |" in text
    assert "|---|---:|---|---:|" in text  # numbers right-aligned; lists and text left
    assert "| ours | 12,346 | 1,000, 2,001 | 1.23 |" in text
    assert "| peer \\| HF | 10,000 | 9.00 | – |" in text  # a pipe in a cell is escaped
    assert common.header_line(first["machine"]) in text and "- peer: configured" in text
    assert "before," in text and "after" in text  # the load average both sides of the run
    assert table.select(back, table="second") == [back[1]]
    assert "| x | 3.14 |" in table.render(back[1])

    (tmp_path / "file").write_text("")  # a --record that cannot be written: refused up front
    with pytest.raises(SystemExit, match="--record .*--no-record"):
        common.Bench("demo", argparse.Namespace(record=tmp_path / "file" / "r.jsonl"), file=out)


def test_table_cli_shows_the_newest_and_names_bad_lines(common: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    for value in (1.0, 2.0):
        bench = common.Bench("demo", argparse.Namespace(record=path), file=io.StringIO())
        bench.table([{"x": value}])
        bench.end()
    run = [sys.executable, str(BENCH / "table.py"), str(path)]
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| 2.00 |" in r.stdout and "| 1.00 |" not in r.stdout  # the newest only
    r = subprocess.run([*run, "--all"], capture_output=True, text=True, timeout=120)
    assert "| 1.00 |" in r.stdout and "| 2.00 |" in r.stdout
    r = subprocess.run([*run, "--bench", "nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "demo/main" in r.stderr
    with open(path, "a") as f:
        f.write('{"bench": "demo", "rows": [\n')  # an interrupted write
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"{path}:3:" in r.stderr and "Traceback" not in r.stderr


def _help(name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--help"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200"})


def test_every_script_starts_and_takes_record() -> None:
    """`python bench/X.py --help` for every script (in parallel: each imports torch), run
    from the repository root as the docs do; the libraries import on their own."""
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(SCRIPTS, pool.map(_help, SCRIPTS)))
    for name, r in results.items():
        if r.returncode and "ModuleNotFoundError" in r.stderr:
            print(f"{name}: skipped, an optional dependency is missing: "
                  f"{r.stderr.strip().splitlines()[-1]}")
            continue
        assert r.returncode == 0 and r.stdout.startswith("usage:"), (name, r.stderr[-2000:])
        takes = "--record" in r.stdout
        assert takes == (name not in NOT_CONVERTED | TOOLS), (
            f"{name}: {'takes' if takes else 'lacks'} --record; every script takes it, "
            "NOT_CONVERTED lists those that do not yet")
    libs = subprocess.run([sys.executable, "-c", "import common, jobs, peers, gpu_default"], cwd=BENCH,
                          capture_output=True, text=True, timeout=300)
    assert libs.returncode == 0, libs.stderr[-2000:]


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every ``python bench/<name>.py ...`` in README.md, BENCHMARKS.md, docs/ (the
    benchmark history in docs/benchmarks/ too) and the scripts' own docstrings: (where, argv),
    with continuation lines joined, comments and shell syntax cut off and placeholders
    (``<data dir>``, ``$x``) filled in."""
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted(BENCH.glob("*.py"))]
    found = []
    for path in files:
        text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))  # "\" continuations
        for m in re.finditer(r"python (bench/\w+\.py)([^`\n#;|)]*)", text):
            args = re.sub(r"\[([^]]*)\]", r"\1", m.group(2)).replace("\\", " ")  # [--opt X]
            args = re.sub(r"<[^>]*>", "X", re.sub(r"\$\w+", "1", args))  # <dir>, $var
            argv = [DOC_ARGUMENTS.get(a, a) for a in shlex.split(args)]
            found.append((f"{path.relative_to(ROOT)}: {m.group(0).strip()}", [m.group(1), *argv]))
    return found


PARSE_ONLY = """
import argparse, json, runpy, sys
class Parsed(Exception): pass
def parse(self, args=None, namespace=None):
    real(self, args, namespace)
    raise Parsed
real = argparse.ArgumentParser.parse_args
argparse.ArgumentParser.parse_args = parse
sys.path.insert(0, "bench")  # what `python bench/X.py` puts first on sys.path
failed = []
for where, argv in json.loads(sys.stdin.read()):
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
        failed.append((where, "ran without parsing its arguments"))
    except Parsed:
        pass
    except SystemExit as e:
        failed.append((where, f"exit {e.code}"))
print(json.dumps(failed))
"""


def test_documented_commands_still_parse() -> None:
    """The commands in the docs parse with today's scripts (parse only: nothing runs)."""
    commands = documented_commands()
    assert len(commands) > 40 and {"bench/model_step.py", "bench/serve_tail.py"} <= {
        argv[0] for _, argv in commands}
    assert any(where.startswith("docs/benchmarks/") for where, _ in commands)  # the history
    r = subprocess.run([sys.executable, "-c", PARSE_ONLY], input=json.dumps(commands),
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [], r.stderr[-3000:]


def test_objective_comparison_is_paired_by_both_seeds_and_clustered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/objective_transfer.py: a difference is paired by (pretraining seed, fine-tuning
    seed), averaged over the fine-tuning seeds of each pretraining seed, and its interval is
    t over the pretraining seeds — not over every fine-tune, which would count one
    pretraining run's luck several times."""
    from scipy.stats import t

    monkeypatch.syspath_prepend(str(BENCH))
    import objective_transfer as ot

    arm = {0: {0: 70.0, 1: 72.0}, 1: {0: 68.0, 1: 70.0}, 2: {0: 71.0, 1: 75.0}}
    base = {0: {0: 69.0, 1: 69.0}, 1: {0: 69.0, 1: 69.0}, 2: {0: 69.0, 1: 69.0, 2: 90.0}}
    c = ot.clustered(arm, base)
    per = [np.mean([arm[p][f] - base[p][f] for f in (0, 1)]) for p in (0, 1, 2)]
    half = t.ppf(0.975, 2) * np.std(per, ddof=1) / np.sqrt(3)
    assert c["pretrain_seeds"] == 3 and list(c["per_seed"].values()) == pytest.approx(per)
    assert c["ci95"] == pytest.approx([np.mean(per) - half, np.mean(per) + half])
    assert c["verdict"].startswith("within noise")  # [+2 ± 5.0]: the seeds disagree
    # The same gap on every pretraining seed resolves, and pairing follows the seeds: the
    # base's seed 2 scores 69 on fine-tuning seeds 0 and 1, its unpaired seed 2 counts nowhere.
    steady = {p: {f: v + 3.0 + 0.1 * p for f, v in base[p].items() if f < 2} for p in base}
    assert ot.clustered(steady, base)["verdict"] == "ahead"
    assert ot.clustered(base, steady)["verdict"] == "behind"
    assert ot.clustered(base, base)["verdict"].startswith("no difference")
    one = ot.clustered({0: arm[0]}, base)
    assert one["ci95"] is None and one["verdict"].startswith("one pretraining seed")
    # the mean over the tasks, and its interval over the pretraining seeds every task has:
    # each seed's mean over the tasks is the unit (seed 2 is missing from sst2: not counted)
    rows = [{"task": t_, "arm": "rtd", "against": against, "difference_mean": float(
                np.mean(list(per_seed.values()))), "per_seed": per_seed}
            for t_, per_seed in (("cola", {0: 6.0, 1: 2.0, 2: 9.0}), ("sst2", {0: 2.0, 1: 0.0}))
            for against in ("twin", "mlm")]
    grouped = ot.mean_differences(rows)
    assert list(grouped) == [("rtd", "twin"), ("rtd", "mlm")]
    assert [r["task"] for r in grouped[("rtd", "mlm")]] == ["cola", "sst2"]
    line = ot.mean_line("rtd", "mlm", grouped[("rtd", "mlm")])
    seeds = np.array([4.0, 1.0])  # seed 0: (6 + 2) / 2, seed 1: (2 + 0) / 2
    half = t.ppf(0.975, 1) * np.std(seeds, ddof=1) / np.sqrt(2)
    assert line == (f"mean over 2 tasks: rtd − mlm +3.3 points; over its 2 pretraining seeds "
                    f"+2.5 [{2.5 - half:+.1f}, {2.5 + half:+.1f}] (per seed +4.0 +1.0)")
    assert ot.mean_line("rtd", "mlm", [{**rows[0], "per_seed": {0: 6.0}}]) == (
        "mean over 1 tasks: rtd − mlm +5.7 points")
    for name in ("common", "jobs", "transfer_curve", "objective_transfer"):
        sys.modules.pop(name, None)
