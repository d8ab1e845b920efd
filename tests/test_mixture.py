"""Data mixtures end to end: a recipe → prep (real corpus, real tokenizer) → manifest per
source → the loader's weighted, resumable, rank-sliced order → plan/train's epochs per source.

The corpus is a slice of the shared mixed-en.jsonl (real text, a ``source`` field per
document): Brown and ABC documents selected by that field, and a movie review in a file
of their own (a source given by ``files:``), interleaved so prep has to group them.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import SHARED_DATA, data_dir_digests, fails_cleanly, run_cli
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader, Cursor
from shoestring.data.mixture import epochs_at, parse_mix
from shoestring.prep.driver import is_validation
from shoestring.families.spec import SEP
from shoestring.prep.workers import clean_texts, encode_texts

CORPUS = SHARED_DATA / "corpora" / "mixed-en.jsonl"
pytestmark = pytest.mark.skipif(not CORPUS.is_file(),
                                reason=f"shared corpus not found at {CORPUS}")

TAKE = {"brown": 14, "abc": 90}
WEIGHTS = {"brown": 0.5, "news": 0.2, "reviews": 0.3}
SEQ = 64
VAL = 0.1  # enough held-out documents to split by document


def _corpus(folder: Path) -> dict[str, list[str]]:
    """Write main.jsonl (brown and abc, interleaved) and reviews.jsonl; the texts by source."""
    texts: dict[str, list[str]] = {k: [] for k in TAKE}
    seen: set[str] = set()
    reviews: list[str] = []
    with CORPUS.open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            src = doc["source"]
            if src == "movie_reviews":  # the shortest of 200 that falls in train
                if len(reviews) < 200 and not is_validation(clean_texts([doc["text"]])[0], VAL):
                    reviews.append(doc["text"])
                continue
            if src in TAKE and len(texts[src]) < TAKE[src] and doc["text"] not in seen:
                seen.add(doc["text"])
                texts[src].append(doc["text"])
            if len(reviews) == 200 and all(len(texts[k]) == TAKE[k] for k in ("brown", "abc")):
                break
    texts["movie_reviews"] = [min(reviews, key=len)]
    mixed = []
    for i in range(max(TAKE["brown"], TAKE["abc"])):  # interleaved: prep must group them
        mixed += [(src, texts[src][i]) for src in ("brown", "abc") if i < len(texts[src])]
    with (folder / "main.jsonl").open("w", encoding="utf-8") as f:
        for src, text in mixed:
            f.write(json.dumps({"kind": src, "text": text}) + "\n")
    with (folder / "reviews.jsonl").open("w", encoding="utf-8") as f:
        for text in texts["movie_reviews"]:
            f.write(json.dumps({"text": text}) + "\n")
    return {"brown": texts["brown"], "news": texts["abc"], "reviews": texts["movie_reviews"]}


RECIPE = """\
field: kind
sources:
  brown: 0.5                       # documents whose "kind" is "brown"
  news: {weight: 0.2, value: abc}  # ... whose "kind" is "abc"
  reviews: {weight: 0.3, files: [reviews.jsonl]}
"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    folder = tmp_path_factory.mktemp("mixture")
    texts = _corpus(folder)
    (folder / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    p = run_cli("prep", "main.jsonl", "-o", "data", "--mix", "recipe.yaml",
                "--set", "data.vocab_size=2000", "--set", f"data.seq_len={SEQ}",
                "--set", f"data.val_fraction={VAL}", cwd=folder)
    assert p.returncode == 0, p.stderr
    assert re.search(r"source reviews\s+│ 30\.0% of training", p.stdout), p.stdout
    return folder / "data", texts


def test_manifest_counts_every_source_and_packs_each_contiguously(mixed) -> None:
    data_dir, texts = mixed
    data = DataDir(data_dir)
    m = data.manifest
    assert m["split"]["method"] == "document"
    sources = m["mixture"]["sources"]
    assert list(sources) == list(WEIGHTS)
    assert sources["news"]["takes"] == {"field": "kind", "value": "abc"}
    assert sources["reviews"]["takes"] == {"files": ["reviews.jsonl"]}
    for name, w in WEIGHTS.items():
        assert sources[name]["weight"] == pytest.approx(w)
    # The train stream is each source's train documents, cleaned and tokenized, in order.
    tok = data.tokenizer()
    sep = data.special_ids[SEP]
    body = SEQ - 2
    train = m["splits"]["train"]
    expected = []
    for name, docs in texts.items():
        cleaned = clean_texts(docs)
        kept = [t for t in cleaned if not is_validation(t, m["config"]["val_fraction"])]
        held = [t for t in cleaned if is_validation(t, m["config"]["val_fraction"])]
        part = train["sources"][name]
        assert part["documents"] == len(kept)
        assert sources[name]["val_documents"] == len(held)
        flat, lengths = encode_texts(kept, tok, sep)
        assert part["document_tokens"] == int(lengths.sum())
        lo, hi = part["sequences"]
        assert sources[name]["train_tokens"] == part["tokens"] == (hi - lo) * SEQ
        assert sources[name]["budget_per_epoch"] == round(part["tokens"] / part["weight"])
        assert epochs_at(sources[name]["budget_per_epoch"], {name: sources[name]}) == \
            pytest.approx({name: 1.0}, rel=1e-3)  # budget_per_epoch is rounded
        expected.append(flat)
    stream = np.concatenate(expected)
    n = train["sequences"]
    rows = data.split("train").take(np.arange(n))
    assert np.array_equal(rows[:, 1:-1].reshape(-1), stream[: n * body])
    # Ranges: contiguous, in the recipe's order, covering the split; a sequence counts for
    # the source its first token is in.
    bounds = [train["sources"][k]["sequences"] for k in WEIGHTS]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    start = 0
    for name, (lo, hi) in zip(WEIGHTS, bounds):
        end = start + train["sources"][name]["document_tokens"] + train["sources"][name]["documents"]
        assert lo == -(-start // body) and hi == min(-(-end // body), n)
        start = end


def _source_of(data_dir: Path) -> tuple[np.ndarray, dict]:
    m = DataDir(data_dir).manifest
    parts = m["splits"]["train"]["sources"]
    source = np.empty(m["splits"]["train"]["sequences"], dtype=np.int64)
    for k, part in enumerate(parts.values()):
        lo, hi = part["sequences"]
        source[lo:hi] = k
    return source, parts


def test_loader_draws_sources_by_weight_repeating_and_subsampling(mixed) -> None:
    data_dir, _ = mixed
    split = DataDir(data_dir).split("train")
    source, parts = _source_of(data_dir)
    n = len(split)
    loader = BatchLoader(split, 48, seed=3, prefetch=0)
    picks, cursor = [], Cursor()
    for _ in range(3 * n // 48):  # three epochs and a part, batch by batch
        indices, cursor = loader.global_indices(cursor)
        picks.append(indices)
    drawn = np.concatenate(picks)
    shares = np.bincount(source[drawn], minlength=3) / len(drawn)
    for k, (name, part) in enumerate(parts.items()):
        sigma = math.sqrt(part["weight"] * (1 - part["weight"]) / len(drawn))
        assert abs(shares[k] - part["weight"]) < 4 * sigma, (name, shares[k], part["weight"])
    # Whole epochs: each source's share is exact (to one sequence), and a source is walked
    # in passes: no sequence of it is drawn twice before all have been drawn once.
    epochs = [loader.order(e) for e in range(4)]
    assert all(len(o) == n for o in epochs)
    all_drawn = np.concatenate(epochs)
    for k, part in enumerate(parts.values()):
        lo, hi = part["sequences"]
        per_epoch = np.bincount(source[epochs[0]], minlength=3)[k]
        assert abs(per_epoch - part["weight"] * n) <= 1
        counts = np.bincount(all_drawn[source[all_drawn] == k] - lo, minlength=hi - lo)
        assert counts.max() - counts.min() <= 1, part
    sizes = {k: v["sequences"][1] - v["sequences"][0] for k, v in parts.items()}
    assert parts["reviews"]["weight"] * n > 2 * sizes["reviews"]  # repeated within an epoch
    assert parts["brown"]["weight"] * n < sizes["brown"]  # subsampled
    # Deterministic by seed; another seed, another order.
    again = BatchLoader(split, 48, seed=3, prefetch=0)
    assert np.array_equal(again.order(2), epochs[2])
    assert not np.array_equal(BatchLoader(split, 48, seed=4).order(2), epochs[2])


def test_loader_resumes_mid_epoch_and_ranks_partition(mixed) -> None:
    data_dir, _ = mixed
    split = DataDir(data_dir).split("train")
    steps, stop = 3 * len(split) // 40 + 5, len(split) // 40 + 7  # crosses epochs
    with BatchLoader(split, 40, seed=11) as whole:
        batches = [next(whole) for _ in range(steps)]
    with BatchLoader(split, 40, seed=11) as first:
        head = [next(first) for _ in range(stop)]
        cursor = Cursor.from_dict(first.state_dict())
    assert cursor.epoch == 1 and cursor.offset > 0
    with BatchLoader(split, 40, seed=11, cursor=cursor) as rest:
        tail = [next(rest) for _ in range(steps - stop)]
    assert all(torch.equal(a, b) for a, b in zip(batches, head + tail))
    ranks = [BatchLoader(split, 40, seed=11, rank=r, world=4, prefetch=0) for r in range(4)]
    for step in range(steps):
        parts = [next(r) for r in ranks]
        assert torch.equal(torch.cat(parts), batches[step])


def test_epochs_recipe_sets_weights_from_tokens(mixed, tmp_path: Path) -> None:
    data_dir, _ = mixed
    folder = data_dir.parent
    p = run_cli("prep", "main.jsonl", "-o", str(tmp_path / "e"), "--mix-field", "kind",
                "--mix", "brown=1x,abc=3x", "--set", "data.vocab_size=2000",
                "--set", f"data.seq_len={SEQ}", cwd=folder)
    assert p.returncode == 0, p.stderr
    sources = DataDir(tmp_path / "e").manifest["mixture"]["sources"]
    given = {"brown": 1.0, "abc": 3.0}
    total = sum(given[k] * s["train_tokens"] for k, s in sources.items())
    for name, s in sources.items():
        assert s["given"] == {"epochs": given[name]}
        assert s["weight"] == pytest.approx(given[name] * s["train_tokens"] / total)
    # At a budget of Σ epochs × tokens, each source is seen exactly its epochs.
    assert epochs_at(total, sources) == pytest.approx(given)


def test_plan_and_train_print_epochs_per_source_and_warn(mixed, tmp_path: Path) -> None:
    data_dir, _ = mixed
    sources = DataDir(data_dir).manifest["mixture"]["sources"]
    batch = 32
    # Enough steps that the small reviews source is seen more than 4 times.
    steps = math.ceil(4.5 * sources["reviews"]["train_tokens"]
                      / (sources["reviews"]["weight"] * batch * SEQ))
    tokens = steps * batch * SEQ
    t = run_cli("train", "-d", str(data_dir), "-o", str(tmp_path / "run"), "--steps", str(steps),
                "--set", "model.hidden_size=64", "--set", "model.num_layers=2",
                "--set", "model.num_heads=2", "--set", "model.intermediate_size=128",
                "--set", f"train.batch_size={batch}", "--set", "train.val_every=0",
                "--set", "train.attention=sdpa", "--set", "train.compile=false")
    assert t.returncode == 0, t.stderr
    said = " ".join((t.stdout + t.stderr).split())
    assert f"data mixture at this budget ({tokens:,} tokens)" in said, said
    for name, s in sources.items():
        epochs = tokens * s["weight"] / s["train_tokens"]
        assert f"{name}: {s['weight']:.1%} of training, {s['train_tokens']:,} train tokens → " \
               f"{epochs:.2f} epochs" in said, said
    assert "source reviews would be seen" in said and "Muennighoff" in said
    assert "source brown would be seen" not in said
    p = run_cli("plan", "--hardware", "h100", "--budget", "10m", "-d", str(data_dir))
    assert p.returncode == 0, p.stderr
    plan = " ".join(p.stdout.split())
    for name in WEIGHTS:
        assert re.search(rf"source {name} │ {WEIGHTS[name]:.1%} of training, \S+ train tokens "
                         r"→ [\d.]+ epochs", plan), plan
        assert f"source {name} would be seen" in plan  # 10 minutes of an H100 is a lot


def test_bad_recipes_fail_naming_the_field(mixed, tmp_path: Path) -> None:
    data_dir, _ = mixed
    folder = data_dir.parent
    base = ("prep", "main.jsonl", "--mix-field", "kind", "--set", "data.vocab_size=2000")
    out = iter(str(tmp_path / f"d{i}") for i in range(10))
    fails_cleanly(run_cli(*base, "-o", next(out), "--mix", "brown=-1,abc=1", cwd=folder),
                  "--mix brown=-1,abc=1: source brown: weight should be greater than 0")
    fails_cleanly(run_cli(*base, "-o", next(out), "--mix", "brown=1,abc=2x", cwd=folder),
                  "--mix", "brown give a weight and abc give epochs")
    fails_cleanly(run_cli(*base, "-o", next(out), "--mix", "brown", cwd=folder),
                  "--mix", "NAME=WEIGHT")
    fails_cleanly(run_cli(*base, "-o", next(out), "--mix", "brown=1,abc=1",
                          "--set", "data.order=sort", cwd=folder), "data.order=sort")
    (folder / "typo.yaml").write_text("sources:\n  brown: {wieght: 1}\n  abc: 1\n")
    fails_cleanly(run_cli(*base, "-o", next(out), "--mix", "typo.yaml", cwd=folder),
                  "--mix typo.yaml: source brown: unknown key 'wieght'; the keys are epochs, "
                  "files, value, weight")
    # A source no document has: named, with the values that do occur.
    fails_cleanly(run_cli("prep", "main.jsonl", "reviews.jsonl", "-o", next(out),
                          "--mix-field", "kind", "--mix", "brown=1,abc=1,brwn=1", cwd=folder),
                  "reviews.jsonl:1", "no 'kind' field")
    fails_cleanly(run_cli(*base, "-o", next(out), "--mix", "brown=1,abc=1,brwn=1", cwd=folder),
                  "data.mixture.sources.brwn", "'brown' (14)", "'abc' (90)")
    fails_cleanly(run_cli(*base, "-o", next(out), "--mix", "brown=1", cwd=folder),
                  "main.jsonl:2", "kind='abc'", "no source of data.mixture takes")
    assert not any((tmp_path / f"d{i}").exists() for i in range(10))


def test_every_mix_problem_is_one_message_before_any_reading(tmp_path: Path) -> None:
    """Issue 52: each problem of a --mix spec is one line naming the spec, the source, the
    key and the value, with what to do — raised before any data is read. The input's first
    line is malformed JSON, so a prep that read anything would fail on that instead."""
    (tmp_path / "bad.jsonl").write_text('{not json\n', encoding="utf-8")
    (tmp_path / "other.jsonl").write_text('{"text": "x"}\n', encoding="utf-8")
    (tmp_path / "twice.yaml").write_text("sources:\n  a: {weight: 1, value: x}\n"
                                         "  b: {weight: 1, value: x}\n")
    (tmp_path / "file2.yaml").write_text("sources:\n  a: {weight: 1, files: [bad.jsonl]}\n"
                                         "  b: {weight: 1, files: ['*.jsonl']}\n")
    (tmp_path / "novalue.yaml").write_text("sources:\n  a: {weight: 1, files: [bad.jsonl]}\n"
                                           "  brown: 1\n")
    cases = {
        "a=0.5,b=abc": ["--mix a=0.5,b=abc: source b: weight should be a valid number "
                        "(got 'abc')", "NAME=0.6"],
        "a=inf,b=1": ["source a: weight should be a finite number (got inf)"],
        "a=0x,b=1x": ["source a: epochs should be greater than 0 (got 0.0)"],
        "twice.yaml": ["sources a and b both take the documents of source='x'"],
        "file2.yaml": ["data.mixture.sources.b: sources a and b both take the file bad.jsonl"],
        "novalue.yaml": ["source brown takes documents by their 'source' field, but every "
                         "input belongs to a source with files:"],
    }
    for i, (spec, needles) in enumerate(cases.items()):
        r = run_cli("prep", "bad.jsonl", "-o", f"d{i}", "--mix", spec, cwd=tmp_path)
        fails_cleanly(r, *needles)
        assert r.stderr.count("error:") == 1 and "invalid configuration" not in r.stderr
        assert "read + clean" not in r.stderr and "malformed JSON" not in r.stderr, r.stderr
        assert not (tmp_path / f"d{i}").exists() and not (tmp_path / f".d{i}.partial").exists()
    # the repeated prefix ("data: data.order=sort ...") is gone too
    r = run_cli("prep", "bad.jsonl", "-o", "d", "--mix", "a=1,b=1", "--set", "data.order=sort",
                cwd=tmp_path)
    fails_cleanly(r, "--set: data.order=sort reads the stored order; a data.mixture (--mix)")


def _prep_script(folder: Path, out: Path, fault: str | None) -> subprocess.CompletedProcess:
    """prep of the recipe in a real process, tokenizing 20 documents a batch and journaling
    after each; ``fault``: where it dies like `kill -9`."""
    mixture = {"field": "kind", "sources": {
        "brown": 0.5, "news": {"weight": 0.2, "value": "abc"},
        "reviews": {"weight": 0.3, "files": [str(folder / "reviews.jsonl")]}}}
    data = {"vocab_size": 2000, "seq_len": SEQ, "val_fraction": VAL, "mixture": mixture}
    code = ("import json, sys; import shoestring.prep.prep as p; from shoestring.config import "
            "DataConfig; import shoestring.prep.local as L, shoestring.prep.stages as S; "
            "S.ENCODE_BATCH = 20; "
            "L.CHECKPOINT_CHARS = 1; "
            f"p.prep([{str(folder / 'main.jsonl')!r}], {str(out)!r}, "
            "DataConfig.model_validate(json.loads(sys.argv[1])))")
    env = {k: v for k, v in os.environ.items() if k != "SHOESTRING_PREP_FAULT"}
    if fault is not None:
        env["SHOESTRING_PREP_FAULT"] = fault
    return subprocess.run([sys.executable, "-c", code, json.dumps(data)], env=env, timeout=300,
                          capture_output=True, text=True, check=False)


def test_prep_of_a_mixture_resumes_after_a_kill_while_tokenizing(mixed, tmp_path: Path) -> None:
    folder = mixed[0].parent
    ref = _prep_script(folder, tmp_path / "ref", None)
    assert ref.returncode == 0, ref.stderr
    killed = _prep_script(folder, tmp_path / "d", "encode.train:2")
    assert killed.returncode == 137, killed.stderr
    state = json.loads((tmp_path / ".d.partial" / "journal.json").read_text())["stages"]
    assert state["encode.train"]["documents"] == 40  # two batches of 20, per source so far
    assert sum(state["encode.train"]["source_documents"]) == 40
    resumed = _prep_script(folder, tmp_path / "d", None)
    assert resumed.returncode == 0, resumed.stderr
    m, want = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("d", "ref"))
    assert "encode.train" in m["resumed"]["stages"]
    assert m["splits"]["train"]["sources"] == want["splits"]["train"]["sources"]
    assert m["mixture"] == want["mixture"]
    assert data_dir_digests(tmp_path / "d").keys() == data_dir_digests(tmp_path / "ref").keys()
    shards = {k: v for k, v in data_dir_digests(tmp_path / "d").items() if k != "manifest.json"}
    assert shards == {k: v for k, v in data_dir_digests(tmp_path / "ref").items()
                      if k != "manifest.json"}


def test_parse_mix_sugar() -> None:
    assert parse_mix("a=0.6, b=0.4") == {"sources": {"a": {"weight": 0.6}, "b": {"weight": 0.4}}}
    assert parse_mix("a=2x,b=1X", "src") == {"sources": {"a": {"epochs": 2.0},
                                                         "b": {"epochs": 1.0}}, "field": "src"}
