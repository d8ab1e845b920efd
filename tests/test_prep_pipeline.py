"""prep as a pipeline: CLM and MLM packing, document offsets, ordering, workers, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import data_dir_digests, run_cli, write_tie_corpus

from shoestring.config import DataConfig
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader
from shoestring.prep.driver import is_validation
from shoestring.prep.packing import unigram_sort_order
from shoestring.prep.prep import prep
from shoestring.data.shards import read_index
from shoestring.families.spec import EOT, SEP
from shoestring.prep.tokenizer_training import train_tokenizer
from shoestring.families import CLM
from shoestring.errors import ShoestringError

N_DOCS = 160


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """160 real documents (pydocs, cut to 1,500 characters) as JSON lines."""
    from shoestring.data.builtin import iter_pydocs

    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for _, doc in zip(range(N_DOCS), iter_pydocs()):
            f.write(json.dumps({"text": doc.text[:1500]}) + "\n")
    return path


@pytest.fixture(scope="module")
def bpe_path(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer given to prep as a file, so runs compare byte for byte."""
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]
    tok = train_tokenizer(texts, "bpe", CLM, vocab_size=700, lowercase=False)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _cfg(**kw: object) -> DataConfig:
    base = {"vocab_size": 700, "seq_len": 32, "shard_tokens": 1024, "val_fraction": 0.1}
    return DataConfig(**{**base, **kw})  # type: ignore[arg-type]


def _shards(out: Path) -> dict[str, list[tuple[str, str]]]:
    m = json.loads((out / "manifest.json").read_text())
    return {s: [(sh["sha256_bin"], sh["sha256_idx"]) for sh in m["splits"][s]["shards"]]
            for s in ("train", "val")}


def _train_texts(corpus: Path, frac: float = 0.1) -> list[str]:
    from shoestring.prep.clean import clean_text

    texts = [clean_text(json.loads(line)["text"]) for line in corpus.read_text().splitlines()]
    return [t for t in texts if len(t) >= 16 and not is_validation(t, frac)]


def _all_rows(data: DataDir, split: str = "train") -> np.ndarray:
    s = data.split(split, verify="sha256")
    return s.take(np.arange(len(s)))


def test_clm_rows_are_the_document_stream_joined_by_endoftext(corpus: Path, tmp_path: Path) -> None:
    m = prep([str(corpus)], tmp_path / "d", _cfg(objective="clm"))
    data = DataDir(tmp_path / "d")
    assert m["objective"] == "clm" and data.objective == "clm"
    assert m["tokenizer"]["kind"] == "bpe" and data.special_ids == {EOT: 0, "<|pad|>": 1}
    tok = data.tokenizer()
    texts = _train_texts(corpus)
    assert len(texts) == m["documents"]["train"]
    stream = np.concatenate([np.array(e.ids + [0]) for e in
                             tok.encode_batch(texts, add_special_tokens=False)])
    rows = _all_rows(data)
    assert rows.shape[1] == 32 and (rows != 1).all()  # no padding anywhere
    np.testing.assert_array_equal(rows.ravel(), stream[: rows.size])
    assert m["splits"]["train"]["dropped_tail_tokens"] == len(stream) - rows.size < 32
    # the index: every document start inside the shards, at its first token
    starts = np.concatenate([[0], np.cumsum([len(e.ids) + 1 for e in tok.encode_batch(
        texts, add_special_tokens=False)])[:-1]])
    found = []
    base = 0
    for sh in m["splits"]["train"]["shards"]:
        offsets, doc_starts = read_index(tmp_path / "d" / sh["idx"], sh["sequences"])
        np.testing.assert_array_equal(offsets, np.arange(sh["sequences"] + 1) * 32)
        assert len(doc_starts) == sh["doc_starts"]
        found.extend(base + doc_starts.astype(np.int64))
        base += sh["tokens"]
    np.testing.assert_array_equal(found, starts[starts < rows.size])


def test_mlm_index_points_at_document_starts(corpus: Path, tmp_path: Path) -> None:
    m = prep([str(corpus)], tmp_path / "d", _cfg())
    data = DataDir(tmp_path / "d")
    sep = data.special_ids[SEP]
    for sh in m["splits"]["train"]["shards"]:
        tokens = np.fromfile(tmp_path / "d" / sh["bin"], dtype=m["dtype"])
        _, doc_starts = read_index(tmp_path / "d" / sh["idx"], sh["sequences"])
        assert len(doc_starts) > 0
        for off in doc_starts.astype(np.int64):
            col = off % 32
            assert 1 <= col <= 30  # inside the body, never on [CLS]/[SEP]
            if off == 1:
                continue  # the previous body token is in the previous shard
            prev = tokens[off - 1] if col > 1 else tokens[off - 3]  # skip [SEP] [CLS] at a row edge
            assert prev == sep  # the previous body token ended a document


def test_sort_order_is_cramming_unigram_ascending(corpus: Path, tmp_path: Path) -> None:
    plain = prep([str(corpus)], tmp_path / "plain", _cfg(tokenizer="wordpiece"))
    tok_path = tmp_path / "plain" / "tokenizer.json"
    sorted_m = prep([str(corpus)], tmp_path / "sorted", _cfg(order="sort", tokenizer=str(tok_path)))
    assert sorted_m["splits"]["train"]["order"] == "sort" and sorted_m["splits"]["val"]["order"] == "none"
    a = _all_rows(DataDir(tmp_path / "plain"))
    sorted_data = DataDir(tmp_path / "sorted")
    b = _all_rows(sorted_data)
    assert sorted(map(tuple, a)) == sorted(map(tuple, b))  # same sequences, reordered
    np.testing.assert_array_equal(b, a[unigram_sort_order(a[:, 1:-1], sorted_data.vocab_size)])
    counts = np.bincount(a[:, 1:-1].ravel(), minlength=sorted_data.vocab_size)
    logp = np.log2((counts + 1) / (counts.sum() + sorted_data.vocab_size))
    scores = logp[b[:, 1:-1]].mean(axis=1)
    assert (np.diff(scores) >= 0).all() and scores[0] < scores[-1]
    split = sorted_data.split("train")
    assert split.ordered
    loader = BatchLoader(split, 4, seed=0)
    np.testing.assert_array_equal(next(loader).numpy(), b[:4])  # epoch 0 in stored order
    loader.close()
    assert plain["order"] == "none"


def test_workers_give_identical_output(corpus: Path, bpe_path: Path, tmp_path: Path) -> None:
    one = prep([str(corpus)], tmp_path / "w1", _cfg(objective="clm", tokenizer=str(bpe_path)))
    two = prep([str(corpus)], tmp_path / "w2",
               _cfg(objective="clm", tokenizer=str(bpe_path), workers=2))
    assert _shards(tmp_path / "w1") == _shards(tmp_path / "w2")
    assert len(one["splits"]["train"]["shards"]) > 3
    assert one["documents"] == two["documents"] and one["fingerprint"] == two["fingerprint"]
    assert one["tokenizer"]["sha256"] == two["tokenizer"]["sha256"]


def _killed_prep(corpus: Path, out: Path, fault: str, cfg_args: list[str],
                 encode_batch: int = 1024) -> subprocess.CompletedProcess:
    """A real prep process that dies like `kill -9` at the fault point."""
    code = (
        "import sys; import shoestring.prep.prep as p; from shoestring.config import load_config;"
        "import shoestring.prep.local as L, shoestring.prep.stages as S;"  # batch, checkpoint
        f"S.ENCODE_BATCH = {encode_batch}; L.CHECKPOINT_CHARS = 1;"
        f"p.prep([{str(corpus)!r}], {str(out)!r}, load_config(None, sys.argv[1:]).data)"
    )
    env = {**os.environ, "SHOESTRING_PREP_FAULT": fault}
    return subprocess.run([sys.executable, "-c", code, *cfg_args], env=env, timeout=300, check=False,
                          capture_output=True, text=True)


def _args(bpe_path: Path) -> list[str]:
    return ["data.objective=clm", f"data.tokenizer={bpe_path}", "data.seq_len=32",
            "data.shard_tokens=1024", "data.val_fraction=0.1", "data.vocab_size=700"]


@pytest.fixture(scope="module")
def reference(corpus: Path, bpe_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "d"
    prep([str(corpus)], out, _cfg(objective="clm", tokenizer=str(bpe_path)))
    return out


def test_resume_after_a_kill_while_packing_keeps_verified_shards(
    corpus: Path, bpe_path: Path, reference: Path, tmp_path: Path
) -> None:
    out = tmp_path / "d"
    proc = _killed_prep(corpus, out, "pack.train:3", _args(bpe_path))
    assert proc.returncode == 137, proc.stderr
    partial = tmp_path / ".d.partial"
    assert not out.exists() and (partial / "journal.json").is_file()
    kept = sorted((partial / "train").glob("*.bin"))
    assert len(kept) == 3
    mtimes = [p.stat().st_mtime_ns for p in kept]
    # damage one finished shard: resume must notice (sha256) and rewrite only that one
    damaged = bytearray(kept[1].read_bytes())
    damaged[0] ^= 1
    kept[1].write_bytes(bytes(damaged))

    m = prep([str(corpus)], out, _cfg(objective="clm", tokenizer=str(bpe_path)))
    assert m["resumed"] == {"stages": ["read", "tokenizer", "encode.train"], "kept_shards": 2}
    assert _shards(out) == _shards(reference)
    assert (out / "train" / "00000.bin").stat().st_mtime_ns == mtimes[0]  # not rewritten
    assert (out / "train" / "00002.bin").stat().st_mtime_ns == mtimes[2]
    assert not partial.exists() and not (out / "journal.json").exists()
    assert not list(out.glob("stream-*")) and not list(out.glob("spool-*"))


def test_resume_after_a_kill_while_tokenizing(
    corpus: Path, bpe_path: Path, reference: Path, tmp_path: Path
) -> None:
    out = tmp_path / "d"
    proc = _killed_prep(corpus, out, "encode.train:2", _args(bpe_path), encode_batch=40)
    assert proc.returncode == 137, proc.stderr
    journal = json.loads((tmp_path / ".d.partial" / "journal.json").read_text())
    assert journal["stages"]["encode.train"]["documents"] == 80
    m = prep([str(corpus)], out, _cfg(objective="clm", tokenizer=str(bpe_path)))
    assert "encode.train" in m["resumed"]["stages"]
    assert _shards(out) == _shards(reference)


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid``, from /proc (zombies count as gone)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("moment", ["tokenizer.child:1:wait", "encode.train:1:wait"])
def test_prep_processes_exit_when_prep_is_killed(moment: str, corpus: Path, bpe_path: Path,
                                                 tmp_path: Path) -> None:
    """Issue 62: `kill -9` of prep left a 142 MB process and multiprocessing's resource
    tracker running for as long as anyone let them. A real prep with 2 workers is held (the
    fault hook waits) while its tokenizer trains in its child (the process that stayed) or
    after its first encoded batch, killed with SIGKILL, and every process it had started
    must go on its own."""
    import signal
    import time

    trains = moment.startswith("tokenizer")  # no tokenizer given: prep trains one
    code = (
        "import sys; import shoestring.prep.prep as p; from shoestring.config import load_config;"
        "import shoestring.prep.local as L, shoestring.prep.stages as S;"
        "S.ENCODE_BATCH = 20; L.CHECKPOINT_CHARS = 1;"
        f"p.prep([{str(corpus)!r}], {str(tmp_path / 'd')!r}, load_config(None, sys.argv[1:]).data)"
    )
    args = [a for a in _args(bpe_path) if not (trains and a.startswith("data.tokenizer="))]
    proc = subprocess.Popen([sys.executable, "-c", code, *args, "data.workers=2"],
                            env={**os.environ, "SHOESTRING_PREP_FAULT": moment},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    journal = tmp_path / ".d.partial" / "journal.json"

    def held() -> bool:  # the tokenizer's child started / the first batch journaled
        if trains:
            return any("spawn_main" in _cmdline(c) for c in _children(proc.pid))
        return journal.is_file() and "encode.train" in journal.read_text()

    started: list[int] = []
    try:
        deadline = time.monotonic() + 240  # generous: a loaded machine; not a speed check
        while not held():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"prep never reached {moment}"
            time.sleep(0.1)
        started = _children(proc.pid)
        assert len(started) >= 2 + trains, started  # the pool's workers (+ the child)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(_alive(c) for c in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {c: _cmdline(c)[:80] for c in started if _alive(c)}
        assert not left, f"prep's processes outlived it: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in started:  # a failed run must not leave them behind either
            if _alive(c):
                os.kill(c, signal.SIGKILL)


def test_other_settings_discard_an_interrupted_build(
    corpus: Path, bpe_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "d"
    assert _killed_prep(corpus, out, "pack.train:1", _args(bpe_path)).returncode == 137
    m = prep([str(corpus)], out, _cfg(objective="clm", tokenizer=str(bpe_path), seq_len=48))
    assert m["resumed"] == {"stages": [], "kept_shards": 0}
    assert DataDir(out).seq_len == 48


def test_bad_input_discards_the_build_and_skip_counts(tmp_path: Path, corpus: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(corpus.read_text().splitlines()[0] + "\n{oops\n", encoding="utf-8")
    with pytest.raises(ShoestringError) as info:
        prep([str(corpus), str(bad)], tmp_path / "d", _cfg())
    assert info.value.where == f"{bad}:2"
    assert not (tmp_path / ".d.partial").exists()
    m = prep([str(corpus), str(bad)], tmp_path / "d", _cfg(on_error="skip"))
    assert m["documents"]["skipped_bad_input"] == 1
    assert m["skipped_examples"][0].startswith(f"{bad}:2: malformed JSON")
    assert m["blocks"][0] == {
        "block": "read", "documents_out": N_DOCS + 1, "dropped": {"bad_input": 1},
        "skipped": {"inputs": 1, "records": 1, "files": 0, "bytes": len("{oops\n")},
        "long_documents": {"max_chars": 1_000_000, "cut": 0, "pieces": 0}}


def test_cli_skip_drops_only_the_bad_paragraph_and_says_so(tmp_path: Path) -> None:
    """Issue 37: one bad byte in a .txt dropped every paragraph after it."""
    paragraphs = [f"Paragraph number {i} has a few words of plain text in it." for i in range(300)]
    raw = "\n\n".join(paragraphs).encode()
    at = raw.index(b"Paragraph number 100 ")
    path = tmp_path / "a.txt"
    path.write_bytes(raw[:at] + b"\xff" + raw[at:])
    out = tmp_path / "d"
    proc = run_cli("prep", str(path), "-o", str(out), "--on-error", "skip",
                   "--set", "data.seq_len=32", "--set", "data.vocab_size=300")
    assert proc.returncode == 0, proc.stderr
    m = DataDir(out).manifest
    assert m["documents"]["read"] == 299
    assert m["documents"]["skipped_records"] == 1
    assert m["documents"]["skipped_bytes"] == len(paragraphs[100]) + 2  # the bad byte, "\n"
    assert "1 records, 0 files (59 bytes)" in proc.stdout


def _peak_rss_mb(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    """Peak resident memory of a real ``shoestring`` process (its only child's, measured by a
    fresh parent, so no other test's processes count)."""
    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], "
            "capture_output=True, text=True); print(p.returncode); print(p.stderr[-2000:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "shoestring", *args],
                          capture_output=True, text=True, timeout=600, check=True)
    lines = proc.stdout.strip().splitlines()
    return int(lines[-1]) / 1024, proc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB: Linux")
def test_one_huge_document_does_not_grow_memory(tmp_path: Path) -> None:
    """Issue 37: a 20 MB file with no blank lines (one document) peaked at 3.1 GB, ~100x the
    document. Now it is cut into data.max_document_chars pieces while it is read, so the peak
    stays within a bounded amount of a small corpus's (before the fix: +1.3 GB here)."""
    import random

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    huge, small = tmp_path / "huge.txt", tmp_path / "small.txt"
    with huge.open("w", encoding="utf-8") as f:
        for _ in range(12_000_000 // 100):
            f.write(" ".join(rng.choice(words) for _ in range(16)) + ".\n")
    small.write_bytes(huge.read_bytes()[:200_000])
    settings = ["--set", "data.vocab_size=2000"]
    base, _ = _peak_rss_mb("prep", str(small), "-o", str(tmp_path / "s"), *settings)
    peak, proc = _peak_rss_mb("prep", str(huge), "-o", str(tmp_path / "h"), *settings)
    assert proc.stdout.splitlines()[0] == "0", proc.stdout
    read = DataDir(tmp_path / "h").manifest["blocks"][0]
    assert read["long_documents"]["cut"] == 1 and read["long_documents"]["pieces"] >= 12
    assert peak - base < 600, f"peak {peak:.0f} MB vs {base:.0f} MB for a 200 KB corpus"


def test_corpus_that_filters_to_nothing_names_the_block(tmp_path: Path) -> None:
    path = tmp_path / "tiny.jsonl"
    path.write_text('{"text": "hi"}\n{"text": "   "}\n', encoding="utf-8")
    with pytest.raises(ShoestringError, match=r"clean dropped 2 too_short"):
        prep([str(path)], tmp_path / "d", _cfg())


def test_missing_tokenizer_file_fails_before_reading(tmp_path: Path, corpus: Path) -> None:
    with pytest.raises(ShoestringError, match="neither a kind nor an existing file"):
        prep([str(corpus)], tmp_path / "d", _cfg(tokenizer=str(tmp_path / "nope.json")))


def test_cli_prep_clm_with_workers(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "d"
    proc = run_cli("prep", str(corpus), "-o", str(out), "--objective", "clm", "--workers", "2",
                   "--set", "data.seq_len=32", "--set", "data.vocab_size=700")
    assert proc.returncode == 0, proc.stderr
    assert "bpe (clm)" in proc.stdout and "documents read" in proc.stdout
    assert "clean (documents)" in proc.stdout
    assert DataDir(out).manifest["config"]["workers"] == 2


def test_two_preps_with_the_default_tokenizer_give_identical_bytes(tmp_path: Path) -> None:
    """Issue 37: the WordPiece trainer broke ties by a per-process hash order, so two preps
    of the same text gave different tokenizers and shards. Two real processes now agree on
    every file (the manifest up to its timestamps)."""
    corpus = write_tie_corpus(tmp_path / "ties.jsonl")
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        proc = run_cli("prep", str(corpus), "-o", str(out), "--set", "data.vocab_size=128",
                       "--set", "data.seq_len=32")
        assert proc.returncode == 0, proc.stderr
    a, b = (data_dir_digests(out) for out in outs)
    assert "tokenizer.json" in a and any(name.startswith("train/") for name in a)
    assert a == b
    vocab = json.loads((outs[0] / "tokenizer.json").read_text())
    assert [t["content"] for t in vocab["added_tokens"]] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                             "[MASK]"]


def test_explain_reports_the_long_document_setting(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    from shoestring.data.builtin import iter_pydocs

    text = "\n".join(line for _, d in zip(range(40), iter_pydocs())
                     for line in d.text.splitlines() if line.strip())
    path.write_text(text[:30000], encoding="utf-8")  # one paragraph: no blank line
    proc = run_cli("prep", str(path), "-o", str(tmp_path / "d"), "--filters", "gopher",
                   "--explain", "1", "--set", "data.max_document_chars=2000",
                   "--set", "data.vocab_size=300", "--set", "data.seq_len=32")
    assert proc.returncode == 0, proc.stderr
    read = DataDir(tmp_path / "d").manifest["blocks"][0]
    pieces = read["long_documents"]["pieces"]
    assert read["long_documents"] == {"max_chars": 2000, "cut": 1, "pieces": pieces} and pieces > 5
    assert f"long documents (data.max_document_chars=2,000): 1 document cut into {pieces} pieces" \
        in proc.stderr
    assert f"1 over 2,000 characters cut into {pieces} pieces" in proc.stdout


def test_tokenizer_trains_on_a_capped_uniform_sample(corpus: Path, tmp_path: Path) -> None:
    """Issue 33: the local path caps the tokenizer's text (data.tokenizer_sample_chars, the
    cap the Ray path shares). Its vocabulary is the one trained on exactly the drawn sample
    (not on all the text), the manifest says how much of what, and a re-run draws the same."""
    from shoestring.prep.tokenizer_training import tokenizer_sample

    texts = _train_texts(corpus)
    total = sum(len(t) for t in texts)
    cap = total // 3
    manifests = [prep([str(corpus)], tmp_path / name, _cfg(objective="clm", tokenizer_sample_chars=cap))
                 for name in ("a", "b")]
    sample = manifests[0]["tokenizer"]["sample"]
    drawn = list(tokenizer_sample(texts, cap, total))
    assert sample == {"documents": len(drawn), "characters": sum(len(t) for t in drawn),
                      "max_characters": cap, "of_characters": total}
    assert cap * 0.7 < sample["characters"] <= cap and 0 < len(drawn) < len(texts)
    # drawn across the corpus, not its first third
    positions = [texts.index(t) for t in drawn]
    assert min(positions) < len(texts) // 3 and max(positions) > 2 * len(texts) // 3
    vocab = json.loads((tmp_path / "a" / "tokenizer.json").read_text())["model"]["vocab"]
    on_sample = train_tokenizer(drawn, "bpe", CLM, vocab_size=700, lowercase=False)
    on_all = train_tokenizer(texts, "bpe", CLM, vocab_size=700, lowercase=False)
    assert vocab == on_sample.get_vocab() != on_all.get_vocab()
    assert manifests[1]["tokenizer"]["sample"] == sample
    assert manifests[1]["tokenizer"]["sha256"] == manifests[0]["tokenizer"]["sha256"]
    full = prep([str(corpus)], tmp_path / "c", _cfg(objective="clm"))  # under the cap: all
    assert full["tokenizer"]["sample"]["documents"] == len(texts)


def test_stream_rows_read_what_a_map_of_the_stream_holds(tmp_path: Path) -> None:
    """Issue 33: the packer reads the token stream in slices and row by row (not through a
    map whose pages stay resident): the rows are those of the mapped stream, the final
    partial row left out, for any slice and any gather."""
    from shoestring.prep.packing import StreamRows

    body, n_tokens = 7, 7 * 50 + 3
    stream = np.random.default_rng(0).integers(0, 60000, n_tokens, dtype=np.uint16)
    path = tmp_path / "stream.bin"
    stream.tofile(path)
    mapped = np.memmap(path, dtype=np.uint16, mode="r")[: 50 * body].reshape(50, body)
    rows = StreamRows(path, np.uint16, body)
    assert len(rows) == 50 and rows.shape == (50, body)
    for lo, hi in ((0, 50), (3, 17), (49, 50), (10, 10), (40, 99)):
        assert np.array_equal(rows[lo:hi], mapped[lo:hi])
    order = np.random.default_rng(1).permutation(50)
    assert np.array_equal(rows.take(order), mapped[order])
    with pytest.raises(IndexError):
        rows.take(np.array([50]))
    assert rows.take(np.zeros(0, np.int64)).shape == (0, body)
    assert np.array_equal(unigram_sort_order(rows, 60000, chunk=8),
                          unigram_sort_order(mapped, 60000, chunk=8))
    (tmp_path / "empty.bin").write_bytes(b"")
    empty = StreamRows(tmp_path / "empty.bin", np.uint16, body)
    assert len(empty) == 0 and empty[0:0].shape == (0, body)


def test_a_vocabulary_smaller_than_asked_is_warned_and_recorded(tmp_path: Path) -> None:
    """Issue 52: a tiny corpus trained a vocabulary of a few hundred tokens when 8,192 were
    asked for, without a word. prep now warns on stderr with both sizes and why, records
    both in the manifest's tokenizer entry, and the summary's vocabulary row says so."""
    from conftest import write_jsonl_corpus

    corpus = write_jsonl_corpus(tmp_path / "tiny.jsonl", n_docs=6)
    out = tmp_path / "d"
    proc = run_cli("prep", str(corpus), "-o", str(out), "--set", "data.seq_len=32")
    assert proc.returncode == 0, proc.stderr
    tok = DataDir(out).manifest["tokenizer"]
    got = tok["vocab_size"]
    assert got < 8192 and tok["requested_vocab_size"] == 8192
    said = " ".join(proc.stderr.split())  # rich wraps long lines
    assert (f"warning: the wordpiece tokenizer learned {got:,} tokens, not the 8,192 asked "
            "for (data.vocab_size): too little training text") in said
    assert "add text, or lower data.vocab_size" in said
    assert tok["warning"].startswith(f"the wordpiece tokenizer learned {got:,} tokens")
    assert f"{got:,} wordpiece (mlm; 8,192 asked for: too little text)" in proc.stdout
    # a vocabulary the text fills: no warning
    full = run_cli("prep", str(corpus), "-o", str(tmp_path / "e"), "--set", "data.seq_len=32",
                   "--set", f"data.vocab_size={got}")
    assert full.returncode == 0, full.stderr
    assert "warning:" not in full.stderr
    assert "warning" not in DataDir(tmp_path / "e").manifest["tokenizer"]
