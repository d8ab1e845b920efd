"""The model repository (`shoestring models push/list/tag/rm`), serving by name with routing
by the ``model`` field, a tag moved under a running server, and ``--workers`` replicas.

Real runs (two tiny trainings, one real eval), the real CLI in subprocesses, real servers on
loopback ports."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import run_cli, tiny_config
from test_serve import announced, metric

from shoestring.errors import ShoestringError
from shoestring.model_repository import ModelRepository
from shoestring.serve.server import ServerThread, load_router
from shoestring.serve.settings import make_settings


@pytest.fixture(scope="module")
def runs(pydocs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two different tiny runs; the first evaluated (its eval.json holds the metrics)."""
    from shoestring.train.loop import train

    base = tmp_path_factory.mktemp("repo")
    a, b = base / "a", base / "b"
    train(tiny_config(steps=8), pydocs_dir, a)
    train(tiny_config(steps=3, seed=1), pydocs_dir, b)
    from shoestring.eval.mlm import evaluate_run

    evaluate_run(a, None)  # writes a/eval.json, whose numbers a pushed version carries
    return a, b


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHOESTRING_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def ok(*args: str) -> str:
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def refused(*args: str) -> str:
    r = run_cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    return " ".join(r.stderr.split())


def test_push_list_tag_rm_from_the_cli(runs: tuple[Path, Path], home: Path) -> None:
    a, b = runs
    repo = ModelRepository(home / "models")
    assert "stored bert:1" in ok("models", "push", str(a), "--name", "bert")
    assert repo.push(a, "bert")[1] is False  # identical content is stored once
    assert repo.push(b, "bert")[0].version == 2
    # The stored version is a servable copy of the run's final model.
    v1 = repo.resolve("bert:1")
    assert (v1.path / "final" / "model.safetensors").read_bytes() == (
        a / "final" / "model.safetensors"
    ).read_bytes()
    assert v1.manifest["source"] == str(a.resolve()) and len(v1.manifest["sha256"]) == 64
    assert v1.manifest["metrics"]["mlm_loss"] > 0  # from the run's eval.json
    assert repo.resolve("bert:2").manifest["metrics"] == {}  # b was never evaluated
    assert "bert:prod → bert:1" in ok("models", "tag", "bert:1", "prod")
    listing = ok("models", "list")
    row1 = next(line for line in listing.splitlines() if re.match(r"\s*bert\s+1\s", line))
    assert "prod" in row1 and "mlm_loss=" in row1
    assert repo.resolve("bert").version == 2  # latest
    assert repo.resolve("bert:prod").version == 1
    # Nothing half-written is left beside the versions.
    assert sorted(p.name for p in (home / "models" / "bert").iterdir()) == [
        ".lock",
        "1",
        "2",
        "tags.json",
    ]

    # Bad input: exit 2 from the CLI, saying what and what to do; the library says the same.
    assert "'Bad Name' is not allowed" in refused("models", "push", str(a), "--name", "Bad Name")
    assert "no model named 'gpt'" in refused("serve", "gpt:prod", "--port", "0")
    for call, message in [
        (lambda: repo.push(a / "nope", "bert"), "no such folder"),
        (lambda: repo.tag("bert:1", "latest"), "reserved"),
        (lambda: repo.tag("bert:7", "prod"), r"no version 7 \(versions: 1, 2\)"),
        (lambda: repo.remove("gpt"), "no model named 'gpt'"),
        (lambda: repo.resolve("bert:staging"), "no tag 'staging' \\(tags: prod\\)"),
    ]:
        with pytest.raises(ShoestringError, match=message):
            call()

    # Removing the tagged version removes its tag; removing the name removes the rest.
    assert "removed bert:1" in ok("models", "rm", "bert:prod")
    assert repo.tags("bert") == {} and [v.version for v in repo.versions("bert")] == [2]
    assert repo.remove("bert") == ["bert:2"]
    assert repo.versions() == [] and not (home / "models" / "bert").exists()


def test_an_export_folder_is_pushed_and_served_like_its_run(
    runs: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    from shoestring.export.hf import export_encoder
    from shoestring.serve.engine import load_engine

    a, _ = runs
    hf = export_encoder(a, tmp_path / "hf")
    repo = ModelRepository(home / "models")
    version, new = repo.push(hf, "bert-hf")
    assert new and version.manifest["kind"] == "folder" and version.manifest["metrics"] == {}
    texts = ["a list of words", "the [MASK] of a list"]
    want = load_engine(a).run(("embed",), load_engine(a).prepare_embed(texts, "mean", True, True))
    stored = load_engine(repo.resolve("bert-hf").path)
    got = stored.run(("embed",), stored.prepare_embed(texts, "mean", True, True))
    for g, w in zip(got, want):
        assert max(abs(x - y) for x, y in zip(g, w)) < 1e-4


def test_concurrent_pushes_get_distinct_versions(runs: tuple[Path, Path], home: Path) -> None:
    repo = ModelRepository(home / "models")
    got: list[int] = []
    threads = [
        threading.Thread(target=lambda r=r: got.append(repo.push(r, "m")[0].version)) for r in runs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == [1, 2]


def test_one_server_routes_by_model_and_follows_a_moved_tag(
    runs: tuple[Path, Path], home: Path
) -> None:
    a, b = runs
    repo = ModelRepository(home / "models")
    repo.push(a, "bert")
    repo.push(b, "bert")
    repo.tag("bert:1", "prod")
    settings = make_settings(port=0, max_length=64)
    router = load_router(["bert:prod", str(b)], settings, repo)
    with ServerThread(router, settings) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:

        def vec(model: str | None) -> list[float]:
            body = {"inputs": "a list of words", **({"model": model} if model else {})}
            r = c.post("/v1/embed", json=body)
            assert r.status_code == 200, r.text
            return r.json()["embeddings"][0]

        v1, v2, folder = vec("bert:1"), vec("bert:2"), vec(b.name)
        assert v1 != v2 and v2 == folder  # version 2 is run b, served by path as well
        assert vec(None) == v1 and vec("bert") == v1  # the default follows bert:prod
        models = c.get("/v1/models").json()["models"]
        bert = next(m for m in models if m["name"] == "bert")
        assert bert["current"] == "bert:1" and bert["default"] is True
        assert [v["tags"] for v in bert["versions"]] == [["prod"], []]
        assert bert["versions"][0]["metrics"]["mlm_loss"] > 0
        loaded = metric(c.get("/metrics").text, "shoestring_models_loaded")

        repo.tag("bert:2", "prod")  # under the running server
        assert vec(None) == v2 and vec("bert:prod") == v2
        assert metric(c.get("/metrics").text, "shoestring_models_loaded") == loaded

        unknown = c.post("/v1/embed", json={"inputs": "x", "model": "gpt"})
        assert unknown.status_code == 422 and "serves no model 'gpt'" in unknown.text
        assert "bert" in unknown.text
        missing = c.post("/v1/embed", json={"inputs": "x", "model": "bert:9"})
        assert missing.status_code == 422 and "no version 9" in missing.text
        pathver = c.post("/v1/embed", json={"inputs": "x", "model": f"{b.name}:1"})
        assert pathver.status_code == 422 and "no versions or tags" in pathver.text


@pytest.mark.slow  # two engine processes start, ~20 s
def test_workers_share_one_port_and_drain_on_sigterm(runs: tuple[Path, Path], home: Path) -> None:
    a, _ = runs
    ModelRepository(home / "models").push(a, "bert")
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoestring",
            "serve",
            "bert",
            "--workers",
            "2",
            "--port",
            "0",
            "--max-length",
            "64",
            "--max-wait-ms",
            "1500",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        m = announced(proc, r"with 2 workers \(pids (\d+), (\d+),.* on (http://127\.0\.0\.1:\d+)")
        url = m.group(3) if m else None
        pids = [int(m.group(1)), int(m.group(2))] if m else []
        assert url, "the server did not announce its address"
        seen = set()
        for _ in range(200):  # a new connection each time: the kernel picks a worker
            seen.add(httpx.get(url + "/v1/model", timeout=30).json()["worker"])
            if len(seen) == 2:
                break
        assert seen == set(pids)

        answers: list[int] = []

        def one(i: int) -> None:
            r = httpx.post(url + "/v1/embed", json={"inputs": f"in flight {i}"}, timeout=60)
            answers.append(r.status_code)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        # Let them reach a worker's queue (each then waits 1.5 s there for batch-mates).
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert answers == [200] * 6
        assert proc.wait(60) == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
