"""Shared fixtures: a small real corpus prepared once per session, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoestring.config import Config, DataConfig, ModelConfig, TrainConfig

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"



def pytest_configure(config: pytest.Config) -> None:
    """One $SHOESTRING_HOME per test session (unless one is given): the measured peaks and
    compile costs that runs record there are this session's, not the user's, and a record
    left by an earlier session cannot change what ``auto`` chooses in this one."""
    if not os.environ.get("SHOESTRING_HOME"):
        import tempfile

        os.environ["SHOESTRING_HOME"] = tempfile.mkdtemp(prefix="shoestring-test-home-")


# A tiny model keeps every training test to seconds on 2 cores.
TINY_MODEL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
SMALL_DATA = DataConfig(vocab_size=2000, seq_len=64)


@pytest.fixture(scope="session")
def pydocs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:pydocs prepared with a small vocabulary and short sequences (real text)."""
    from shoestring.prep.prep import prep

    out = tmp_path_factory.mktemp("pydocs") / "data"
    prep(["builtin:pydocs"], out, SMALL_DATA)
    return out


def write_jsonl_corpus(path: Path, n_docs: int = 80, field: str = "text") -> Path:
    """A small real corpus: the first ``n_docs`` documents of builtin:pydocs as JSON lines."""
    import json

    from shoestring.data.builtin import iter_pydocs

    with path.open("w", encoding="utf-8") as f:
        for _, doc in zip(range(n_docs), iter_pydocs()):
            f.write(json.dumps({field: doc.text}) + "\n")
    return path


def write_split(root: Path, split: str, rows, dtype, rows_per_shard: int) -> dict:
    """``rows`` as shards of ``rows_per_shard`` sequences, written by prep's own
    ``write_shard``; returns the split's manifest entry (what ``PackedSplit`` reads)."""
    from dataclasses import asdict

    from shoestring.data.shards import write_shard

    shards = [asdict(write_shard(root, split, k, rows[at : at + rows_per_shard], dtype))
              for k, at in enumerate(range(0, len(rows), rows_per_shard))]
    return {"sequences": len(rows), "tokens": int(rows.size), "shards": shards}


def write_tie_corpus(path: Path, n_docs: int = 100) -> Path:
    """JSON lines whose WordPiece training is all ties: 144 two-letter words ("w" + "a",
    ..., "z" + "9"), each once per document. Every pair (initial, ##c) is equally frequent
    and a 128-token vocabulary has room for about a third of them, so the tie-breaking
    decides the vocabulary (upstream, that order changes from process to process)."""
    import json
    import random
    import string

    rng = random.Random(0)
    words = [i + c for i in "wxyz" for c in string.ascii_lowercase + string.digits]
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n_docs):
            rng.shuffle(words)
            f.write(json.dumps({"text": " ".join(words)}) + "\n")
    return path


def data_dir_digests(out: Path) -> dict[str, str]:
    """sha256 of every file of a data dir; the manifest without what differs run to run
    (when it was made and how long it took)."""
    import hashlib
    import json

    digests = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "manifest.json":
            m = json.loads(data)
            for key in ("created", "seconds", "stage_seconds"):
                m.pop(key)
            data = json.dumps(m, sort_keys=True).encode()
        digests[str(path.relative_to(out))] = hashlib.sha256(data).hexdigest()
    return digests


def tiny_config(**train: object) -> Config:
    """The tests' small run. The attention kernel is pinned (sdpa) unless given: ``auto`` times
    the kernels, and the two round differently in the last bits, so two runs compared bit for
    bit must not be left to pick separately (tests/test_speed.py covers ``auto``)."""
    return Config(data=SMALL_DATA, model=TINY_MODEL,
                  train=TrainConfig(**{"budget": None, "attention": "sdpa", **train}))


def fails_cleanly(result: subprocess.CompletedProcess, *needles: str) -> None:
    """A CLI refusal as users must see it: exit 2, an ``error:`` line naming each of
    ``needles``, no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "error:" in result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def torchrun_command(nproc: int, args: list[str], *, module: str = "shoestring",
                     script: str | None = None) -> list[str]:
    """argv for ``torchrun`` on this machine (a private rendezvous on a free local port)
    running ``module`` (or a ``script``) with ``args``."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            "--standalone", *([script] if script else ["-m", module]), *args]


def run_cli(*args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real console entry point in a subprocess (exit codes and stderr as a user sees them)."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "shoestring", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def sigterm_after_records(proc: subprocess.Popen, run: Path, records: int, wait: float,
                          poll: float = 0.05) -> str:
    """Send SIGTERM to a training process once its run's metrics.jsonl has ``records`` lines
    (or after ``wait`` seconds), then return its stderr; the process is killed if it lingers."""
    import signal
    import time

    try:
        deadline = time.time() + wait
        metrics = run / "metrics.jsonl"
        while time.time() < deadline:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= records:
                break
            time.sleep(poll)
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=120)[1]
    finally:
        proc.kill()


def interrupt_cli(args: list[str], when: str, timeout: float = 300) -> tuple[int, str]:
    """Run the real CLI with ``args``, send SIGINT (Ctrl-C) once a stderr line contains
    ``when``, and return its exit code and whole stderr. SIGINT is put back to its default in
    the child, because a shell's background job (a test run under ``&``) inherits it ignored.
    Without such a line the stderr is read to the end, and the caller's assertions fail."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "shoestring", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if when in line:
                proc.send_signal(signal.SIGINT)
                break
        return proc.wait(timeout=timeout), "".join(seen) + proc.communicate(timeout=timeout)[1]
    finally:
        proc.kill()
