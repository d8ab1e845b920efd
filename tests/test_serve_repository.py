"""The model repository (`shoestring models push/list/tag/rm`), serving by name with routing
by the ``model`` field, a tag moved under a running server, and ``--workers`` replicas.

Real runs (two tiny trainings, one real eval), the real CLI in subprocesses, real servers on
loopback ports."""

from __future__ import annotations

import json
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
    from shoestring.eval.mlm_loss import evaluate_run

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

    # A tagged version (what `serve bert:prod` serves) is removed only with --force, and its
    # tag with it; removing the name removes the rest.
    no = refused("models", "rm", "bert:prod")
    assert "bert:1 is tagged (bert:prod → bert:1)" in no and "--force" in no
    assert [v.version for v in repo.versions("bert")] == [1, 2]
    assert "removed bert:1" in ok("models", "rm", "bert:prod", "--force")
    assert repo.tags("bert") == {} and [v.version for v in repo.versions("bert")] == [2]
    assert repo.remove("bert") == ["bert:2"]
    assert repo.versions() == [] and not (home / "models" / "bert").exists()


def test_an_export_folder_is_pushed_and_served_like_its_run(
    runs: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    from shoestring.export.hf import export_encoder
    from shoestring.inference.engine import load_engine

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


def _two_versions_prod_on_first(runs: tuple[Path, Path], home: Path
                                ) -> tuple[Path, ModelRepository]:
    """A repository with bert:1 (run a) tagged prod and bert:2 (run b)."""
    root = home / "models"
    repo = ModelRepository(root)
    repo.push(runs[0], "bert")
    repo.push(runs[1], "bert")
    repo.tag("bert:1", "prod")
    return root, repo


def test_one_server_routes_by_model_and_follows_a_moved_tag(
    runs: tuple[Path, Path], home: Path
) -> None:
    a, b = runs
    _, repo = _two_versions_prod_on_first(runs, home)
    settings = make_settings(port=0, max_length=64, backend="torch")  # exact compares
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
        assert proc.wait(60) == -signal.SIGTERM  # ended as SIGTERM ends it, as one server is
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- what a repository may not do (issue 37) -------------------------------------------------


def _victim(tmp_path: Path) -> Path:
    """A folder outside the repository, shaped like a model (what `rm ../../victim` deleted)."""
    victim = tmp_path / "victim"
    (victim / "1").mkdir(parents=True)
    (victim / "1" / "manifest.json").write_text("{}")
    (victim / "keep.txt").write_text("precious")
    return victim


def _intact(victim: Path) -> bool:
    kept = (victim / "keep.txt").read_text() == "precious"
    return kept and (victim / "1" / "manifest.json").is_file()


def test_names_and_tags_cannot_leave_the_repository(
    runs: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    a, _ = runs
    root = home / "models"
    repo = ModelRepository(root)
    repo.push(a, "bert")
    repo.tag("bert:1", "prod")
    victim = _victim(tmp_path)
    rel = os.path.relpath(victim, root)
    assert rel == "../../victim"

    # The CLI, as in the report: exit 2 naming the value, nothing outside touched.
    for bad in (rel, str(victim)):
        assert f"model name {bad!r} is not allowed" in refused("models", "rm", bad, "--force")
    assert "is not allowed" in refused("models", "push", str(a), "--name", "../x")
    # The library: every entry point checks names, tags and selectors first.
    for bad in (rel, str(victim), "bert/../../victim", "..", "a/b", "/etc", ".hidden", "Bert"):
        for call in (
            lambda: repo.remove(bad, force=True),
            lambda: repo.push(a, bad),
            lambda: repo.versions(bad),
            lambda: repo.tags(bad),
            lambda: repo.resolve(bad),
            lambda: repo.tag(f"{bad}:1", "prod"),
            lambda: repo.tag("bert:1", bad),
            lambda: repo.resolve(f"bert:{bad}"),
            lambda: repo.remove(f"bert:{bad}", force=True),
        ):
            with pytest.raises(ShoestringError, match="is not allowed"):
                call()
    assert _intact(victim) and [v.ref for v in repo.versions()] == ["bert:1"]

    # Symbolic links in place of a model or a version folder are refused, never followed.
    (root / "evil").symlink_to(victim)
    (root / "bert" / "7").symlink_to(victim / "1")
    (root / "bert" / ".lock").unlink()
    (root / "bert" / ".lock").symlink_to(victim / "lock")
    no = refused("models", "rm", "evil", "--force")
    assert "model 'evil' is a symbolic link" in no and str(victim) in no
    with pytest.raises(ShoestringError, match="symbolic link"):
        repo.resolve("evil")
    with pytest.raises(ShoestringError, match=r"no version 7"):
        repo.resolve("bert:7")
    assert "a symbolic link" in repo.problems[str(root / "bert" / "7")]
    with pytest.raises(ShoestringError, match="cannot lock model 'bert'"):
        repo.tag("bert:1", "staging")
    listing = run_cli("models", "list")
    assert listing.returncode == 0 and re.search(r"bert\s+1\s+prod", listing.stdout)
    assert "evil" not in listing.stdout and "symbolic link" in listing.stderr
    (root / "bert" / ".lock").unlink()
    assert repo.remove("bert", force=True) == ["bert:1"]
    assert _intact(victim) and not (victim / "lock").exists()
    assert not (root / "bert").exists() and (root / "evil").is_symlink()

    # A server: a request's model field cannot name a path either.
    repo.push(a, "bert")
    settings = make_settings(port=0, max_length=64, backend="torch")  # exact compares
    with ServerThread(load_router(["bert"], settings, repo), settings) as srv:
        for model in (f"bert:{rel}", "bert:/etc", "../bert", "bert:.."):
            r = httpx.post(srv.url + "/v1/embed", json={"inputs": "x", "model": model}, timeout=60)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model"]
    assert _intact(victim)


def test_a_corrupted_tags_or_manifest_file_is_reported_and_skipped(
    runs: tuple[Path, Path], home: Path
) -> None:
    root, repo = _two_versions_prod_on_first(runs, home)
    repo.push(runs[1], "enc")
    settings = make_settings(port=0, max_length=64, backend="torch")  # exact compares
    router = load_router(["bert:prod", "enc"], settings, repo)
    tags = root / "bert" / "tags.json"
    with ServerThread(router, settings) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:

        def embed(model: str | None = None) -> httpx.Response:
            return c.post("/v1/embed", json={"inputs": "x", **({"model": model} if model else {})})

        # Bad entries: each skipped and named; the good one keeps working.
        tags.write_text('{"prod": 1, "staging": "two", "../x": 1}')
        assert embed().status_code == 200 and embed("bert:prod").status_code == 200
        problems = c.get("/v1/models").json()["models"][0]["problems"]
        assert "tag 'staging' skipped" in problems[str(tags)]
        assert "tag '../x' skipped" in problems[str(tags)]

        # A file that does not parse: its tags are gone, everything else keeps working.
        tags.write_text('{"prod": 1, "stag')
        r = embed()
        assert r.status_code == 503 and "bert:prod cannot be served now" in r.json()["detail"]
        assert "no tag 'prod'" in r.json()["detail"]
        assert embed("bert:2").status_code == 200 and embed("enc").status_code == 200
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "no tag 'prod'" in ready.json()["problems"][0]
        listed = c.get("/v1/models")
        assert listed.status_code == 200
        problems = listed.json()["models"][0]["problems"]
        assert "cannot be read (JSONDecodeError" in problems[str(tags)]

        # A manifest that does not parse: that version is skipped, the others served.
        manifest = root / "enc" / "1" / "manifest.json"
        manifest.write_text("{")
        r = embed("enc")
        assert r.status_code == 503 and "enc:1 cannot be used: its manifest.json" in r.text
        assert embed("bert:2").status_code == 200

    listing = run_cli("models", "list")
    assert listing.returncode == 0 and "Traceback" not in listing.stderr
    assert re.search(r"bert\s+1\s", listing.stdout) and re.search(r"bert\s+2\s", listing.stdout)
    warned = " ".join(listing.stderr.split())
    assert f"{tags}: cannot be read" in warned and f"{manifest}: enc:1 skipped" in warned
    # Repository files are written whole (write, fsync, rename): a tag rewrites tags.json.
    repo.tag("bert:2", "prod")
    assert json.loads(tags.read_text()) == {"prod": 2}
    assert not list(root.rglob("*.tmp"))
    # The newest version unusable: `latest` is the newest usable one, and says which was not.
    (root / "bert" / "2" / "manifest.json").write_text('{"sha256": "nope", "kind": "run"}')
    assert repo.resolve("bert").version == 1
    assert "bert:2 skipped: manifest.json has no valid sha256" in repo.problems[
        str(root / "bert" / "2" / "manifest.json")
    ]
    with pytest.raises(ShoestringError, match="bert:2 cannot be used"):
        repo.resolve("bert:prod")


def _corrupt(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def test_changed_weights_are_refused_at_load_and_by_models_verify(
    runs: tuple[Path, Path], home: Path
) -> None:
    root, repo = _two_versions_prod_on_first(runs, home)
    assert "2 version(s) match their recorded sha256" in ok("models", "verify")
    recorded = repo.resolve("bert:2").manifest["sha256"]
    weights = root / "bert" / "2" / "model" / "final" / "model.safetensors"
    _corrupt(weights)

    checked = run_cli("models", "verify")
    assert checked.returncode == 2 and "Traceback" not in checked.stderr
    assert re.search(r"bert:1\s+ok", checked.stdout)
    said = " ".join(checked.stdout.split())
    assert f"bert:2 MISMATCH {weights.parent}: " in said and f"recorded {recorded}, now" in said
    assert "1 stored version(s) failed the check: bert:2" in " ".join(checked.stderr.split())
    assert "bert:1 ok" in " ".join(ok("models", "verify", "bert:1").split())

    settings = make_settings(port=0, max_length=64, backend="torch")  # exact compares
    with pytest.raises(ShoestringError, match=f"recorded {recorded}, now [0-9a-f]{{64}}") as e:
        load_router(["bert:2"], settings, repo)
    assert e.value.where == str(weights.parent)

    # Under a running server: the tag moved to the changed version is refused (503), and
    # readiness says so; moved back, it serves again.
    with ServerThread(load_router(["bert:prod"], settings, repo), settings) as srv, httpx.Client(
        base_url=srv.url, timeout=60
    ) as c:
        assert c.post("/v1/embed", json={"inputs": "x"}).status_code == 200
        repo.tag("bert:2", "prod")
        r = c.post("/v1/embed", json={"inputs": "x"})
        assert r.status_code == 503 and f"recorded {recorded}" in r.json()["detail"]
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "bert:2 cannot be served" in ready.json()["problems"][0]
        repo.tag("bert:1", "prod")
        assert c.post("/v1/embed", json={"inputs": "x"}).status_code == 200
        assert c.get("/readyz").status_code == 200


def test_removing_the_version_a_served_tag_points_at_needs_force_and_readyz_tells(
    runs: tuple[Path, Path], home: Path
) -> None:
    a, b = runs
    _, repo = _two_versions_prod_on_first(runs, home)
    settings = make_settings(port=0, max_length=64, backend="torch")  # exact compares
    with ServerThread(load_router(["bert:prod"], settings, repo), settings) as srv, httpx.Client(
        base_url=srv.url, timeout=60
    ) as c:
        assert c.get("/readyz").status_code == 200
        with pytest.raises(ShoestringError, match=r"bert:1 is tagged \(bert:prod → bert:1\)"):
            repo.remove("bert:1")
        with pytest.raises(ShoestringError, match=r"bert is tagged"):
            repo.remove("bert")
        assert c.post("/v1/embed", json={"inputs": "x"}).status_code == 200
        assert repo.remove("bert:1", force=True) == ["bert:1"]
        r = c.post("/v1/embed", json={"inputs": "x"})
        assert r.status_code == 503 and "bert:prod cannot be served now" in r.json()["detail"]
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "cannot serve a model"
        assert c.post("/v1/embed", json={"inputs": "x", "model": "bert:2"}).status_code == 200
        repo.tag("bert:2", "prod")
        assert c.get("/readyz").status_code == 200


def test_concurrent_pushes_of_the_same_content_make_one_version(
    runs: tuple[Path, Path], home: Path
) -> None:
    a, _ = runs
    repo = ModelRepository(home / "models")
    got: list[tuple[int, bool]] = []
    threads = [
        threading.Thread(target=lambda: got.append(((v := repo.push(a, "m"))[0].version, v[1])))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(got) == [(1, False), (1, False), (1, False), (1, True)]
    assert [v.ref for v in repo.versions("m")] == ["m:1"]
    assert sorted(p.name for p in (home / "models" / "m").iterdir()) == [".lock", "1"]


def test_decoder_eval_metrics_are_stored_with_the_version(
    runs: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    from test_serve import save_tiny_decoder

    from shoestring.eval.causal_lm import evaluate_decoder

    a, _ = runs
    clm = save_tiny_decoder(a, tmp_path / "clm")
    text = tmp_path / "held_out.txt"
    text.write_text("a function returns a value.\n\nthe list of words is sorted.\n")
    result = evaluate_decoder(clm, text=text, samples=0, precision="fp32")
    version, _ = ModelRepository(home / "models").push(clm, "gpt")
    metrics = version.manifest["metrics"]
    assert metrics["loss"] == result["perplexity"]["loss"]
    assert metrics["perplexity"] == result["perplexity"]["perplexity"]
    assert re.search(r"gpt\s+1\s.*loss=\S+ perplexity=", ok("models", "list"))
