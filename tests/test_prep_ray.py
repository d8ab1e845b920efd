"""prep --executor ray against --executor local: same documents, clusters and shard bytes.

One Ray instance (2 CPUs, no dashboard) serves the whole module; every test that runs Ray
has a timeout.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA, data_dir_digests, run_cli, write_tie_corpus

from shoestring.config import CurateConfig, DataConfig
from shoestring.data.datadir import DataDir
from shoestring.prep.prep import build_dir, prep
from shoestring.errors import ShoestringError

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")

from shoestring.prep.ray.runner import RayOptions  # noqa: E402
from shoestring.prep.ray.shuffle import bucket_firsts, cluster_sizes  # noqa: E402

CORPUS = SHARED_DATA / "corpora" / "mixed-en.jsonl"
# The planted-corpus runs share a tokenizer file (so they test curation, not training); the
# shared-corpus test compares BPE training and the tie corpus WordPiece training.
CFG = DataConfig(vocab_size=700, seq_len=32, shard_tokens=2048, val_fraction=0.1)
CURATE = CurateConfig(dedup="fuzzy", filters="gopher", compress_max_ratio=0.6,
                      gopher_min_words=20)
PLANTED_EXACT = 12
PLANTED_NEAR = 12


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance with 2 CPUs for the module; stopped at the end."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _words(rng: random.Random, vocab: list[str], n: int) -> str:
    return " ".join(rng.choice(vocab) for _ in range(n))


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two JSON-lines files of real text (pydocs) with planted duplicates across files:
    exact copies, copies with one word changed (near duplicates), and an evaluation file
    whose 13-gram occurs in three documents."""
    from shoestring.data.builtin import iter_pydocs

    rng = random.Random(7)
    base = [d.text[:1800] for _, d in zip(range(400), iter_pydocs())
            if len(d.text.split()) >= 80][:160]
    docs = list(base)
    for i in range(PLANTED_EXACT):
        docs.append(base[3 * i])
    for i in range(PLANTED_NEAR):
        words = base[3 * i + 1].split()
        words[len(words) // 2] = "zebra"
        docs.append(" ".join(words))
    vocab = sorted({w for t in base[:40] for w in t.split() if w.isalpha()})
    eval_text = _words(rng, vocab, 16)
    for i in (5, 50, 150):
        docs[i] = docs[i] + "\n\n" + eval_text + "\n\n" + base[i + 1][:600]
    rng.shuffle(docs)
    root = tmp_path_factory.mktemp("planted")
    files = []
    for k, chunk in enumerate((docs[: len(docs) // 2], docs[len(docs) // 2 :])):
        path = root / f"part{k}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in chunk), encoding="utf-8")
        files.append(str(path))
    evals = root / "eval.jsonl"
    evals.write_text(json.dumps({"sentence": eval_text}) + "\n", encoding="utf-8")
    from shoestring.families import MLM
    from shoestring.prep.tokenizer_training import train_tokenizer

    tok = root / "tokenizer.json"
    train_tokenizer(iter(docs), "wordpiece", MLM, 700, True).save(str(tok))
    return {"files": files, "eval": str(evals), "root": root, "cfg": CFG.model_copy(
        update={"tokenizer": str(tok)})}


def _curate(planted: dict) -> CurateConfig:
    return CURATE.model_copy(update={"decontam": [planted["eval"]]})


def _same(local: dict, remote: dict) -> None:
    """Same kept documents (counts per block and split), clusters, tokenizer, shard bytes."""
    assert remote["executor"]["name"] == "ray"
    assert remote["blocks"] == local["blocks"]
    assert remote["documents"] == local["documents"]
    assert remote["tokenizer"]["sha256"] == local["tokenizer"]["sha256"]
    for split in ("train", "val"):
        mine = [(s["bin"], s["sha256_bin"], s["sha256_idx"]) for s in remote["splits"][split]["shards"]]
        theirs = [(s["bin"], s["sha256_bin"], s["sha256_idx"])
                  for s in local["splits"][split]["shards"]]
        assert mine == theirs, split
        assert {k: v for k, v in remote["splits"][split].items() if k != "shards"} == \
            {k: v for k, v in local["splits"][split].items() if k != "shards"}


@pytest.fixture(scope="module")
def local_planted(planted: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("local") / "d"
    return prep(planted["files"], out, planted["cfg"], curate=_curate(planted))


@pytest.mark.timeout(300)
def test_ray_matches_local_on_planted_duplicates(ray_cluster, planted, local_planted,
                                                 tmp_path: Path) -> None:
    blocks = {b["block"]: b for b in local_planted["blocks"]}
    # The planted duplicates are found (so the comparison below compares real work).
    assert blocks["exact_dedup"]["dropped"]["duplicate"] >= PLANTED_EXACT
    assert blocks["fuzzy_dedup"]["dropped"]["near_duplicate"] >= PLANTED_NEAR - 2
    assert blocks["fuzzy_dedup"]["clusters"] >= PLANTED_NEAR - 2
    assert blocks["decontam"]["docs_cut"] == 3
    assert sum(blocks["gopher_quality"]["dropped"].values()) > 0
    # Small parts, so duplicates sit in different parts, files and shuffle partitions.
    remote = prep(planted["files"], tmp_path / "d", planted["cfg"], curate=_curate(planted),
                  executor="ray", executor_options=RayOptions(part_docs=25))
    assert remote["executor"]["parts"] >= 6
    _same(local_planted, remote)
    data = DataDir(tmp_path / "d")  # the loader's view is unchanged
    assert len(data.split("train", verify="sha256")) == local_planted["splits"]["train"]["sequences"]
    assert not build_dir(tmp_path / "d").exists()


@pytest.mark.timeout(300)
def test_a_task_killed_once_is_retried_and_changes_nothing(ray_cluster, planted, local_planted,
                                                           tmp_path: Path) -> None:
    """A worker dies in the read, the fuzzy-dedup map, the tokenize and the pack stage."""
    killed = ["read", "fuzzy", "encode", "pack"]
    opts = RayOptions(part_docs=40, fault=f"{','.join(killed)}@{tmp_path}")
    remote = prep(planted["files"], tmp_path / "d", planted["cfg"], curate=_curate(planted),
                  executor="ray", executor_options=opts)
    assert sorted(p.name for p in tmp_path.glob("fault-*")) == sorted(f"fault-{s}" for s in killed)
    _same(local_planted, remote)
    assert remote["resumed"]["stages"] == []  # retried inside the run, not resumed


@pytest.mark.timeout(400)
def test_killed_ray_prep_resumes_from_finished_stages(ray_cluster, planted, local_planted,
                                                      tmp_path: Path) -> None:
    """The driver is killed (exit 137) after fuzzy dedup; the re-run resumes there."""
    out = tmp_path / "d"
    cmd = [sys.executable, "-m", "shoestring", "prep", *planted["files"], "-o", str(out),
           "--executor", "ray", "--ray-address", ray_cluster, "--dedup", "fuzzy",
           "--filters", "gopher", "--decontam", planted["eval"],
           "--tokenizer", planted["cfg"].tokenizer, "--set", "data.vocab_size=700",
           "--set", "data.seq_len=32",
           "--set", "data.shard_tokens=2048", "--set", "data.val_fraction=0.1",
           "--set", "curate.compress_max_ratio=0.6", "--set", "curate.gopher_min_words=20"]
    env = {**os.environ, "SHOESTRING_PREP_FAULT": "ray.stage1:1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 137, proc.stderr[-2000:]
    journal = json.loads((build_dir(out) / "journal.json").read_text())
    assert {"read", "stage0", "stage1"} <= set(journal["stages"]["ray"])
    assert "final" not in journal["stages"]["ray"]
    remote = prep(planted["files"], out, planted["cfg"], curate=_curate(planted),
                  executor="ray", executor_options=RayOptions(address=ray_cluster))
    assert remote["resumed"]["stages"] == ["ray"]
    _same(local_planted, remote)


@pytest.mark.timeout(300)
def test_bad_input_fails_as_in_local_mode(ray_cluster, planted, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a fine first document of some length"}\n{"text": oops}\n')
    errors = []
    for executor in ("local", "ray"):
        with pytest.raises(ShoestringError) as e:
            prep([planted["files"][0], str(bad)], tmp_path / executor, CFG, executor=executor)
        errors.append(str(e.value))
        assert not build_dir(tmp_path / executor).exists()
    assert errors[0] == errors[1]
    assert f"{bad}:2" in errors[1]


def test_ray_refuses_what_it_does_not_run(tmp_path: Path) -> None:
    """Refused before Ray starts or anything is written, exit 2, naming the option."""
    src = tmp_path / "a.txt"
    src.write_text("some text here that is long enough\n")
    for args, named in ((["--workers", "2"], "--workers"),
                        (["--explain", "3"], "--explain"),
                        (["--canaries", "2"], "--canaries"),
                        (["--set", "curate.dropped_ids=true"], "curate.dropped_ids"),
                        (["--dedup", "substring"], "substring"),
                        (["--dedup-against", str(tmp_path)], "--dedup-against")):
        proc = run_cli("prep", str(src), "-o", str(tmp_path / "d"), "--executor", "ray", *args,
                       timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "not supported by the ray executor" in proc.stderr and named in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "d").exists() and not build_dir(tmp_path / "d").exists()
    proc = run_cli("prep", str(src), "-o", str(tmp_path / "d"), "--ray-address", "auto")
    assert proc.returncode == 2 and "--ray-address needs --executor ray" in proc.stderr


@pytest.mark.timeout(300)
def test_cluster_sizes_over_edge_refs_match_scipy(ray_cluster) -> None:
    """The driver's count (the local run's `Clusters`, one partition's edges at a time from
    the object store, over sparse 64-bit row ids) = scipy's connected components."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(3)
    n = 3000
    edges = rng.integers(0, n, size=(1400, 2))
    edges = edges[edges[:, 0] != edges[:, 1]]
    chain = np.stack([np.arange(2000, 2300), np.arange(2001, 2301)], axis=1)  # a long path
    edges = np.concatenate([edges, chain])
    rid = (np.arange(n, dtype=np.int64) << 20) + 7  # row ids are sparse
    parts = np.array_split(rid[edges], 4)
    summaries = [{"dropped": np.unique(p[:, 0]), "owners": np.unique(p[:, 1])} for p in parts]
    got = cluster_sizes(summaries, [ray.put(p) for p in parts])
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    touched = np.zeros(n, dtype=bool)
    touched[edges.ravel()] = True
    sizes = np.bincount(labels[touched])
    sizes = sizes[sizes >= 2]
    want = dict(zip(*np.unique(sizes, return_counts=True)))
    assert got == {int(k): int(v) for k, v in want.items()}
    assert sum(got.values()) == len(sizes) > 100


def test_buckets_keep_the_first_row_of_each_key() -> None:
    cols = {"k0": np.array([1, 1, 2, 1, 2, 3], np.uint64),
            "k1": np.array([9, 9, 9, 9, 9, 9], np.uint64),
            "order": np.array([50, 10, 7, 30, 3, 1], np.int64)}
    summary, edges = bucket_firsts(cols)
    assert summary["dropped"].tolist() == [7, 30, 50] and summary["owners"].tolist() == [3, 10]
    assert summary["buckets"] == 3 and summary["rows"] == 6
    assert sorted(map(tuple, edges.tolist())) == [(7, 3), (30, 10), (50, 10)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not CORPUS.is_file(), reason=f"shared corpus not found at {CORPUS}")
def test_ray_matches_local_on_the_shared_corpus(ray_cluster, tmp_path: Path) -> None:
    """The first 2,000 documents of mixed-en (a subset: the whole corpus takes minutes
    twice over on 2 shared cores), causal-LM packing, every curation block but decontam,
    the byte-level BPE tokenizer trained by each executor (local in its own process, as a
    user runs it)."""
    subset = tmp_path / "mixed-2000.jsonl"
    with CORPUS.open(encoding="utf-8") as f, subset.open("w", encoding="utf-8") as g:
        for _, line in zip(range(2000), f):
            g.write(line)
    cfg = DataConfig(objective="clm", vocab_size=2000, seq_len=64, shard_tokens=1 << 16)
    curate = CurateConfig(dedup="fuzzy", filters="gopher")
    cmd = [sys.executable, "-m", "shoestring", "prep", str(subset), "-o", str(tmp_path / "local"),
           "--objective", "clm", "--dedup", "fuzzy", "--filters", "gopher",
           "--set", "data.vocab_size=2000", "--set", "data.seq_len=64",
           "--set", f"data.shard_tokens={1 << 16}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    remote = prep([str(subset)], tmp_path / "ray", cfg, curate=curate, executor="ray",
                  executor_options=RayOptions(part_docs=500))
    split = next(b for b in remote["blocks"] if b["block"] == "split")
    assert remote["executor"]["tokenizer_sample"]["documents"] == split["train"]
    _same(local, remote)
    assert remote["splits"]["train"]["sequences"] > 1000


@pytest.mark.timeout(300)
def test_few_documents_split_by_position_as_in_local_mode(ray_cluster, planted,
                                                          tmp_path: Path) -> None:
    """Too few documents to hold out whole ones: the end of the text, cut on the driver."""
    few = tmp_path / "few.jsonl"
    lines = Path(planted["files"][0]).read_text(encoding="utf-8").splitlines()[:12]
    few.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = planted["cfg"].model_copy(update={"val_fraction": 0.2})
    local = prep([str(few)], tmp_path / "local", cfg)
    remote = prep([str(few)], tmp_path / "ray", cfg, executor="ray",
                  executor_options=RayOptions(part_docs=5))
    assert local["split"]["method"] == "position"
    _same(local, remote)


def test_new_blocks_plan_onto_ray_or_are_refused_by_name(monkeypatch) -> None:
    """A stateless block added to the local pipeline joins a Ray map stage as it is; a
    stateful one without a shuffle in SHUFFLES is refused, naming it."""
    from shoestring.prep.curate import Curator
    from shoestring.prep.curate.blocks import Block, Drop
    from shoestring.prep.curate.dedup import ExactDedup
    from shoestring.prep.ray.runner import plan_ray

    class Shouting(Block):
        name = "shouting"

        def apply(self, doc):
            return Drop("shouting") if doc.text.isupper() else doc

    class SubstringDedup(Block):
        name = "substring_dedup"
        stateful = True

    blocks = [Shouting(), ExactDedup(), Shouting()]
    monkeypatch.setattr(Curator, "from_config", classmethod(lambda cls, *a, **k: cls(blocks)))
    plan = plan_ray(CFG, CurateConfig())
    assert [(kind, [b.name for b in bs]) for kind, bs in plan.stages] == [
        ("map", ["clean", "shouting"]), ("shuffle", ["exact_dedup"]), ("map", ["shouting"])]
    blocks.append(SubstringDedup())
    with pytest.raises(ShoestringError, match="the substring_dedup block"):
        plan_ray(CFG, CurateConfig())


@pytest.mark.timeout(300)
def test_sorted_order_matches_local(ray_cluster, planted, tmp_path: Path) -> None:
    """data.order=sort (Cramming): counts and scores in tasks, one argsort, shards gathered."""
    cfg = planted["cfg"].model_copy(update={"order": "sort"})
    local = prep(planted["files"], tmp_path / "local", cfg)
    remote = prep(planted["files"], tmp_path / "ray", cfg, executor="ray",
                  executor_options=RayOptions(part_docs=40))
    assert remote["splits"]["train"]["order"] == "sort"
    assert len(remote["splits"]["train"]["shards"]) >= 3
    _same(local, remote)


@pytest.mark.timeout(300)
def test_ray_trains_the_same_wordpiece_as_local(ray_cluster, tmp_path: Path) -> None:
    """Issue 37: the default (WordPiece) tokenizer differed between a local prep and a Ray
    prep (a per-process tie order in `tokenizers`); on a corpus where ties decide the
    vocabulary, a local prep in its own process and a Ray prep now agree on every file."""
    corpus = write_tie_corpus(tmp_path / "ties.jsonl")
    proc = run_cli("prep", str(corpus), "-o", str(tmp_path / "local"),
                   "--set", "data.vocab_size=128", "--set", "data.seq_len=32")
    assert proc.returncode == 0, proc.stderr
    cfg = DataConfig(vocab_size=128, seq_len=32)
    remote = prep([str(corpus)], tmp_path / "ray", cfg, curate=CurateConfig(), executor="ray",
                  executor_options=RayOptions(part_docs=30))
    _same(json.loads((tmp_path / "local" / "manifest.json").read_text()), remote)
    local, ray_ = data_dir_digests(tmp_path / "local"), data_dir_digests(tmp_path / "ray")
    del local["manifest.json"], ray_["manifest.json"]  # the executor's own figures differ
    # only the local executor keeps a dedup index (for --dedup-against; docs/data.md)
    index = {k for k in local if k.startswith("dedup/")}
    assert index and not any(k.startswith("dedup/") for k in ray_)
    assert {k: v for k, v in local.items() if k not in index} == ray_


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(200)
def test_unreachable_ray_address_fails_fast_naming_it(tmp_path: Path) -> None:
    """Issue 37: `ray.init` retried an unreachable address for ever (and ignored SIGTERM).
    Now it is checked first: exit 2 within the stated timeout, naming the address, and
    nothing written."""
    corpus = write_tie_corpus(tmp_path / "ties.jsonl", n_docs=10)
    address = f"127.0.0.1:{_free_port()}"
    out = tmp_path / "d"
    proc = run_cli("prep", str(corpus), "-o", str(out), "--executor", "ray",
                   "--ray-address", address, timeout=150)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"cannot reach a Ray cluster at {address}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not build_dir(out).exists()


@pytest.mark.timeout(400)
def test_default_ray_is_a_new_local_one_and_sigterm_keeps_the_journal(tmp_path: Path) -> None:
    """Issue 37: without --ray-address, prep joined the address a stopped `ray start` had
    left in Ray's session files and hung. Now it starts its own local Ray; SIGTERM (here
    while it waits after the read stage) stops it with exit 130 and the journal intact,
    and the re-run resumes from there."""
    import signal
    import tempfile

    corpus = write_tie_corpus(tmp_path / "ties.jsonl", n_docs=40)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths
    try:
        (ray_tmp / "ray").mkdir()
        (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_free_port()}\n")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env |= {"RAY_TMPDIR": str(ray_tmp), "COLUMNS": "200"}
        out = tmp_path / "d"
        cmd = [sys.executable, "-m", "shoestring", "prep", str(corpus), "-o", str(out),
               "--executor", "ray", "--set", "data.vocab_size=128", "--set", "data.seq_len=32"]
        proc = subprocess.Popen(cmd, env={**env, "SHOESTRING_PREP_FAULT": "ray.read:1:wait"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        journal = build_dir(out) / "journal.json"
        try:
            _wait_for(lambda: "read" in _ray_stages(journal), proc, seconds=200)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 130, err[-2000:]
        assert "interrupted: finished stages are kept" in err
        assert "read" in _ray_stages(journal)
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-2000:]
        assert DataDir(out).manifest["resumed"]["stages"] == ["ray"]
    finally:
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)


def _ray_stages(journal: Path) -> dict:
    try:
        return json.loads(journal.read_text())["stages"].get("ray") or {}
    except (OSError, ValueError):
        return {}


def _wait_for(done, proc: subprocess.Popen, seconds: float) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"prep ended early: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("prep never reached the point to interrupt")
        time.sleep(0.1)


def test_executors_are_found_by_name_without_importing_their_package() -> None:
    """`prep` imports no executor package: `get_executor` imports a known one by name the first
    time it is asked for (a fresh interpreter, so nothing was imported before)."""
    code = """
import sys
from shoestring.prep.executor import get_executor
from shoestring.errors import ShoestringError
assert "shoestring.prep.ray" not in sys.modules
print(type(get_executor("ray")).__name__, type(get_executor("local")).__name__)
try:
    get_executor("spark")
except ShoestringError as e:
    print(e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "RayExecutor LocalExecutor"
    assert "unknown executor 'spark'" in r.stdout and "use local or ray" in r.stdout
