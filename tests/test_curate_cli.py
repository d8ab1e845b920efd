"""`shoestring prep` with curation flags: the printed table, the manifest, errors (real CLI)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli, write_jsonl_corpus

EVAL = (
    "the committee approved the new budget after a long debate that lasted well into the "
    "night on thursday"
)
SMALL = ["--set", "data.vocab_size=2000", "--set", "data.seq_len=64"]


def corpus_with_planted_problems(path: Path) -> Path:
    """120 real documents (pydocs) + 10 exact copies, 5 near copies, one contaminated doc."""
    write_jsonl_corpus(path, 120)
    docs = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    long_docs = [t for t in docs if len(t.split()) > 200]
    with path.open("w", encoding="utf-8") as f:
        for t in docs:
            if t == long_docs[15]:  # contaminated in place (a copy would be a near-duplicate)
                t = t.replace(". ", f". {EVAL}. ", 1)
            f.write(json.dumps({"text": t}) + "\n")
        for t in long_docs[:10]:
            f.write(json.dumps({"text": t.replace(" ", "  ")}) + "\n")  # equal once normalized
        for t in long_docs[10:15]:
            w = t.split()
            w[len(w) // 2] = "CHANGED"
            f.write(json.dumps({"text": " ".join(w)}) + "\n")
    return path


def test_prep_prints_curation_counts_that_match_the_manifest(tmp_path: Path) -> None:
    corpus = corpus_with_planted_problems(tmp_path / "c.jsonl")
    (tmp_path / "dev.tsv").write_text(f"sentence\tlabel\n{EVAL}\t1\n")
    out = tmp_path / "data"
    r = run_cli(
        "prep",
        str(corpus),
        "-o",
        str(out),
        "--dedup",
        "fuzzy",
        "--filters",
        "gopher",
        "--decontam",
        str(tmp_path / "dev.tsv"),
        "--explain",
        "1",
        *SMALL,
    )
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["curate"]["dedup"] == "fuzzy" and manifest["curate"]["filters"] == "gopher"
    blocks = {b["block"]: b for b in manifest["blocks"]}
    for name in ("gopher_quality", "gopher_repetition", "exact_dedup", "fuzzy_dedup", "decontam"):
        b = blocks[name]
        assert f"{name} (documents)" in r.stdout
        assert f"{b['documents_in']:,} → {b['documents_out']:,}" in r.stdout
    assert blocks["exact_dedup"]["dropped"]["duplicate"] >= 10 - 2  # some copies fail filters
    assert blocks["fuzzy_dedup"]["dropped"].get("near_duplicate", 0) >= 1
    assert blocks["decontam"]["docs_cut"] == 1
    order = [b["block"] for b in manifest["blocks"]]
    assert order.index("clean") < order.index("gopher_quality") < order.index("decontam")
    # --explain 1: one example per reason, on stderr.
    assert "== exact_dedup: duplicate ==" in r.stderr


def test_a_corpus_filtered_to_nothing_names_the_block(tmp_path: Path) -> None:
    corpus = tmp_path / "short.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": f"just a short note number {i}"}) + "\n" for i in range(20))
    )
    r = run_cli("prep", str(corpus), "-o", str(tmp_path / "d"), "--filters", "gopher", *SMALL)
    assert r.returncode == 2
    assert "gopher_quality" in r.stderr and "too_few_words" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_decontam_path_fails_before_any_work(tmp_path: Path) -> None:
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 5)
    r = run_cli(
        "prep",
        str(corpus),
        "-o",
        str(tmp_path / "d"),
        "--decontam",
        str(tmp_path / "nope.tsv"),
        *SMALL,
    )
    assert r.returncode == 2
    assert "curate.decontam" in r.stderr and "nope.tsv" in r.stderr
    assert not (tmp_path / "d").exists()


def test_compressibility_filter_drops_documents_by_token_ratio(tmp_path: Path) -> None:
    """Cramming's filter runs on the trained tokenizer's counts and is reported in the manifest."""
    import numpy as np
    from rich.console import Console

    from conftest import SMALL_DATA
    from shoestring.config import CurateConfig
    from shoestring.prep.prep import prep
    from shoestring.data.tokenizer import load_tokenizer

    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 300)
    quiet = Console(stderr=True, quiet=True)
    data = SMALL_DATA.model_copy(update={"vocab_size": 500})
    off = {k: None for k, f in CurateConfig.model_fields.items()
           if k.startswith(("gopher_", "rep_")) and "None" in str(f.annotation)}

    def run(ratio: float, out: str, tokenizer: str = "auto") -> dict:
        cfg = data.model_copy(update={"tokenizer": tokenizer})
        return prep([str(corpus)], tmp_path / out, cfg, console=quiet,
                    curate=CurateConfig(filters="gopher", compress_max_ratio=ratio,
                                        compress_relative=None, **off))

    loose = run(10.0, "loose")
    block = next(b for b in loose["blocks"] if b["block"] == "compressibility")
    assert block["documents_in"] == block["documents_out"] > 0
    tok = load_tokenizer(tmp_path / "loose" / "tokenizer.json")
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    ratios = [len(tok.encode(t, add_special_tokens=False).ids) / max(len(t), 1) for t in texts]
    tight = run(float(np.percentile(ratios, 30)), "tight", str(tmp_path / "loose" / "tokenizer.json"))
    block = next(b for b in tight["blocks"] if b["block"] == "compressibility")
    assert 0 < block["dropped"]["ratio_too_high"] < block["documents_in"]
    assert block["documents_out"] == block["documents_in"] - block["dropped"]["ratio_too_high"]
    assert tight["splits"]["train"]["tokens"] < loose["splits"]["train"]["tokens"]


def _append_blobs(corpus: Path, n: int) -> list[str]:
    """Append ``n`` gopher-clean but incompressible documents (stop words between random
    letters) to ``corpus``; their texts."""
    import random
    import string

    rng = random.Random(0)
    stop = ["the", "and", "of", "to", "that", "with", "is", "for"]
    blobs = [" ".join(f"{rng.choice(stop)} {''.join(rng.choices(string.ascii_lowercase, k=6))}"
                      for _ in range(150)) for _ in range(n)]
    with corpus.open("a", encoding="utf-8") as f:
        for blob in blobs:
            f.write(json.dumps({"text": blob}) + "\n")
    return blobs


def test_compressibility_threshold_follows_the_tokenizer(tmp_path: Path) -> None:
    """Issue 37: the fixed 0.3 was set for Cramming's 32K vocabulary; with a small one, clean
    text compresses less and the filter dropped clean documents (12% of wiki-books with 8K).
    The threshold is now at least 1.35x the median ratio of the corpus's documents: clean
    documents stay, encoded blobs still go."""
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 150)
    blobs = _append_blobs(corpus, 5)
    out = tmp_path / "d"
    r = run_cli("prep", str(corpus), "-o", str(out), "--filters", "gopher", "--set",
                "data.vocab_size=400", "--set", "data.seq_len=64", "--explain", "10")
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    block = next(b for b in m["blocks"] if b["block"] == "compressibility")
    assert block["median_ratio"] == m["tokenizer"]["median_ratio"] > 0.3  # a small vocabulary
    assert block["max_ratio"] == round(1.35 * block["median_ratio"], 4)
    assert block["dropped"]["ratio_too_high"] <= len(blobs) + 0.03 * block["documents_in"]
    blob_drops = r.stderr.split("== compressibility: ratio_too_high ==")[1]
    assert sum(blob[:30] in blob_drops for blob in blobs) == len(blobs)  # --explain shows them


def test_explain_names_compressibility_drops_by_file_line_after_the_bars(tmp_path: Path) -> None:
    """Issue 52: --explain named compressibility drops "tokenized document 107" where every
    other block names file:line, and printed the read stage's examples before the later
    stages' progress bars (and the compressibility ones separately after them). Now: one
    report, after the last bar, each drop named by its file and line."""
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 60)
    blobs = _append_blobs(corpus, 3)  # lines 61-63
    r = run_cli("prep", str(corpus), "-o", str(tmp_path / "d"), "--filters", "gopher",
                "--set", "data.vocab_size=400", "--set", "data.seq_len=64", "--explain", "10")
    assert r.returncode == 0, r.stderr
    assert "tokenized document" not in r.stderr
    drops = r.stderr.split("== compressibility: ratio_too_high ==")[1]
    named = [line for line in drops.splitlines() if line.startswith("-- ")]
    assert all(line.startswith(f"-- {corpus}:") for line in named), named
    assert sum(f"-- {corpus}:{61 + i} " in drops for i in range(len(blobs))) == len(blobs)
    last_bar = r.stderr.rindex("pack val")
    assert r.stderr.index("== ") > last_bar  # every example after the last progress bar
    assert r.stderr.index("long documents (data.max_document_chars") > last_bar
    assert "no dropped documents to explain" not in r.stderr
