"""Training-data privacy: what substring dedup and DP-SGD buy, and what substring dedup costs.

Three parts (``python bench/privacy.py PART``; ``all`` runs them in order):

``memorization``
    The shared corpus (first ``--docs`` documents of ``../shared/data/corpora/mixed-en.jsonl``)
    with ``--canaries`` canaries at several repeat counts (``--repeats``, cycled over the
    canaries), prepared three ways — no dedup, document dedup (exact), substring dedup — then
    the same small decoder trained for the same number of steps on each and audited
    (`shoestring audit`'s library call): exposure per repeat count beside never-inserted
    canaries, membership-inference AUC, verbatim extraction.
``dp``
    A small encoder pretrained briefly on the same corpus, then fine-tuned on SST-2
    (``../shared/data/glue/SST-2``; the first ``--sst2-train`` training examples, the full dev
    set) with the sane protocol at ε ∈ {1, 3, 8} (DP-SGD, Opacus, δ = 1e-5) and without DP
    (ε = ∞), one seed each: dev accuracy and fine-tuning seconds, and the ratio to non-private.
``dedup-speed``
    Substring dedup on the first 1/8, 1/4, 1/2 and all of the shared corpus, each in a fresh
    process: MB/s and peak RSS of the shipped block (pydivsufsort's ``longest_previous_factor``,
    the library's C LPF array), beside the alternative we wrote first (pydivsufsort's suffix
    array and LCP, then numpy grouping) — both must cut exactly the same words.

Prints the CPU, the load average (the machine is shared: compare figures within one run) and
how each side was configured.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import SHARED, Bench, parser

CORPUS = SHARED / "corpora" / "mixed-en.jsonl"
SST2 = SHARED / "glue" / "SST-2"


def _texts(limit: int | None = None, max_bytes: int | None = None) -> list[str]:
    out, size = [], 0
    with CORPUS.open(encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)["text"]
            if max_bytes is not None and size + len(t.encode()) > max_bytes:
                break
            out.append(t)
            size += len(t.encode())
            if limit is not None and len(out) == limit:
                break
    return out


def _header(part: str, a: argparse.Namespace) -> Bench:
    print(f"== {part} | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    return Bench("privacy", a, precision="fp32")


# --- memorization --------------------------------------------------------------------------


def memorization(a: argparse.Namespace, work: Path) -> None:
    from rich.console import Console

    from shoestring.config import Config, CurateConfig, DataConfig, ModelConfig, TrainConfig
    from shoestring.prep.prep import prep
    from shoestring.privacy.audit import AuditSettings, audit
    from shoestring.train.loop import train

    bench = _header("memorization", a)
    quiet = Console(stderr=True, quiet=True)
    corpus = work / "corpus.jsonl"
    texts = [t[: a.max_chars] for t in _texts(a.docs)]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    repeats = [int(r) for r in a.repeats.split(",")]
    data_cfg = DataConfig(objective="clm", vocab_size=a.vocab, seq_len=128, val_fraction=0.1)
    model = ModelConfig(objective="clm", hidden_size=a.hidden, num_layers=2, num_heads=2,
                        intermediate_size=2 * a.hidden)
    print(f"corpus: first {len(texts):,} documents, each cut to {a.max_chars:,} characters "
          f"({sum(len(t.encode()) for t in texts) / 1e6:.2f} MB); {a.canaries} canaries, copies "
          f"cycled over {repeats}; decoder {a.hidden}×2 (vocab {a.vocab}, seq 128), {a.steps} "
          f"steps × batch 16, lr 3e-3, fp32; audit: {a.candidates} candidates, 256 rows per "
          "split, 64 extraction prompts (32-token prefix, 50 tokens)", flush=True)
    rows = []
    for dedup in ("none", "exact", "substring"):
        data = work / f"data-{dedup}"
        t = time.perf_counter()
        manifest = prep([str(corpus)], data, data_cfg, console=quiet, overwrite=True,
                        curate=CurateConfig(dedup=dedup, canaries=a.canaries,
                                            canary_repeats=repeats, canary_seed=1))
        prep_s = time.perf_counter() - t
        cfg = Config(data=data_cfg, model=model, train=TrainConfig(
            budget=None, steps=a.steps, batch_size=16, lr=3e-3, precision="fp32",
            checkpoint_every=None))
        t = time.perf_counter()
        train(cfg, data, work / f"run-{dedup}", overwrite=True, console=quiet)
        train_s = time.perf_counter() - t
        r = audit(work / f"run-{dedup}", data, AuditSettings(candidates=a.candidates),
                  console=quiet)
        blocks = {b["block"]: b for b in manifest["blocks"]}
        cut = blocks.get("substring_dedup", {}).get("bytes_removed", 0)
        dropped = sum(blocks.get("exact_dedup", {}).get("dropped", {}).values())
        print(f"\n[{dedup}] prep {prep_s:.0f}s (exact-dup documents dropped {dropped}, "
              f"substring bytes cut {cut:,}), train {train_s:.0f}s, train tokens "
              f"{manifest['splits']['train']['tokens']:,}; audit {r['seconds']:.0f}s", flush=True)
        c = r["canaries"]
        rows.append({"dedup": dedup, "prep s": prep_s, "documents dropped": dropped,
                     "bytes cut": cut, "train s": train_s,
                     "train tokens": manifest["splits"]["train"]["tokens"],
                     **{f"exposure, {k} copies": g["mean_exposure"]
                        for k, g in c["by_copies"].items()},
                     "exposure, never inserted": c["mean_exposure_references"],
                     "membership AUC": r["membership"]["auc"],
                     "verbatim train": r["extraction"]["train"]["verbatim_fraction"],
                     "verbatim held-out": r["extraction"]["held_out"]["verbatim_fraction"]})
        for copies, g in c["by_copies"].items():
            print(f"  exposure, {copies:>3} copies inserted ({g['mean_copies_in_train']:g} in "
                  f"train): {g['mean_exposure']:.2f} bits (max {c['max_exposure']:.2f})")
        print(f"  exposure, never inserted: {c['mean_exposure_references']:.2f} bits")
        m, e = r["membership"], r["extraction"]
        print(f"  membership AUC {m['auc']:.3f} (loss train {m['train_mean_loss']:.3f} vs "
              f"held-out {m['held_out_mean_loss']:.3f}); extraction verbatim "
              f"{e['train']['verbatim_fraction']:.1%} train vs "
              f"{e['held_out']['verbatim_fraction']:.1%} held-out (mean matched "
              f"{e['train']['mean_matched_tokens']:.1f} vs {e['held_out']['mean_matched_tokens']:.1f}"
              " tokens)", flush=True)
    bench.table(rows, "memorization", formats={
        "prep s": ".0f", "train s": ".0f", "membership AUC": ".3f", "verbatim train": ".1%",
        "verbatim held-out": ".1%", **{k: ".2f" for k in rows[0] if k.startswith("exposure")}})
    print()
    bench.end()


# --- DP fine-tuning ------------------------------------------------------------------------


def dp(a: argparse.Namespace, work: Path) -> None:
    from rich.console import Console

    from shoestring.config import Config, DataConfig, ModelConfig, TrainConfig
    from shoestring.prep.prep import prep
    from shoestring.eval.downstream import evaluate_downstream
    from shoestring.privacy.dp_sgd import PrivateTraining
    from shoestring.train.loop import train

    bench = _header("dp", a)
    quiet = Console(stderr=True, quiet=True)
    corpus = work / "corpus-dp.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(a.dp_docs)))
    data_cfg = DataConfig(objective="mlm", vocab_size=4096, seq_len=128)
    data = work / "data-dp"
    run = work / "run-dp"
    t = time.perf_counter()
    if not (a.reuse_pretrain and (run / "final" / "model.safetensors").is_file()):
        prep([str(corpus)], data, data_cfg, console=quiet, overwrite=True)
        cfg = Config(data=data_cfg, model=ModelConfig(hidden_size=128, num_layers=2, num_heads=2,
                                                      intermediate_size=256),
                     train=TrainConfig(budget=None, steps=a.pretrain_steps, batch_size=32,
                                       precision="fp32", checkpoint_every=None))
        train(cfg, data, run, overwrite=True, console=quiet)
    print(f"encoder 128×2 (vocab 4096) pretrained {a.pretrain_steps} steps × 32 × 128 tokens on "
          f"{a.dp_docs} documents ({time.perf_counter() - t:.0f}s; 0 = reused); SST-2: first "
          f"{a.sst2_train:,} train examples, full dev; sane protocol but lr {a.lr:g} (batch 16, "
          f"{a.epochs:g} epochs), 1 seed, fp32; DP: Opacus {_opacus()}, RDP accountant, "
          "δ=1e-5, clip 1.0, Poisson sampling, per-sample gradients by hooks", flush=True)
    base, rows = None, []
    for eps in (math.inf, 8.0, 3.0, 1.0):
        privacy = None if math.isinf(eps) else PrivateTraining(eps, 1e-5, 1.0)
        t = time.perf_counter()
        res = evaluate_downstream(run, glue=str(SST2.parent), tasks="sst2", seeds=1,
                                  out=work / f"dp-{eps}", max_train=a.sst2_train,
                                  precision="fp32", console=quiet, privacy=privacy,
                                  overrides={"epochs": a.epochs, "lr": a.lr})
        wall = time.perf_counter() - t
        seed = res["tasks"]["sst2"]["seeds"][0]
        acc = seed["splits"]["dev"]["accuracy"]
        base = base or seed["train_seconds"]
        spent = seed.get("privacy", {}).get("epsilon_spent", math.inf)
        noise = seed.get("privacy", {}).get("noise_multiplier", 0.0)
        print(f"  ε target {eps:>4}: dev accuracy {100 * acc:.1f}%, ε spent {spent:.2f}, noise σ "
              f"{noise:.2f}, {seed['steps']} steps in {seed['train_seconds']:.0f}s "
              f"(×{seed['train_seconds'] / base:.1f} of non-private), wall {wall:.0f}s",
              flush=True)
        rows.append({"ε target": eps, "dev accuracy": acc, "ε spent": spent, "noise σ": noise,
                     "steps": seed["steps"], "train s": seed["train_seconds"],
                     "× non-private": seed["train_seconds"] / base, "wall s": wall})
    bench.table(rows, "dp", formats={"ε target": "g", "dev accuracy": ".1%", "ε spent": ".2f",
                                     "noise σ": ".2f", "train s": ".0f", "× non-private": ".1f",
                                     "wall s": ".0f"})
    bench.end()


def _opacus() -> str:
    import opacus

    return opacus.__version__


# --- substring dedup throughput ------------------------------------------------------------


def _measure(max_bytes: int, method: str, min_span: int) -> dict:
    """In this (fresh) process: load, dedup, report seconds and peak RSS."""
    texts = _texts(max_bytes=max_bytes)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    if method == "shipped":
        from shoestring.prep.curate.substring import find_repeats

        cut = find_repeats(texts, min_span)
        words = sum(hi - lo for c in cut for lo, hi in c)
    else:
        words = _grouping_cut_words(texts, min_span)
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n_words = sum(len(t.split()) for t in texts)
    return {"mb": mb, "docs": len(texts), "words": n_words, "seconds": seconds,
            "peak_mb": peak, "texts_mb": base_rss, "cut_words": words}


def _grouping_cut_words(texts: list[str], min_span: int) -> int:
    """The alternative we wrote first and did not ship: pydivsufsort's suffix array and Kasai
    LCP, then numpy — suffixes sharing ≥ min_span words form one run of the suffix array, and
    every member of a run but its earliest text position starts a repeat."""
    from pydivsufsort import divsufsort, kasai

    from shoestring.prep.curate.substring import word_ids

    stream, lengths = word_ids(texts)
    starts = np.cumsum(lengths + 1) - (lengths + 1)
    pos = np.arange(len(stream))
    to_sep = np.repeat(starts + lengths, lengths + 1) - pos
    sa = np.asarray(divsufsort(stream), dtype=np.int64)
    lcp = np.concatenate([[0], np.asarray(kasai(stream, sa), dtype=np.int64)[:-1]])
    share = np.minimum(lcp, np.minimum(to_sep[sa], np.concatenate([[0], to_sep[sa[:-1]]])))
    run_id = np.cumsum(share < min_span)
    first = np.full(run_id[-1] + 1, np.iinfo(np.int64).max)
    np.minimum.at(first, run_id, sa)
    rep = np.sort(sa[sa != first[run_id]])
    delta = np.zeros(len(stream) + 1, dtype=np.int64)
    np.add.at(delta, rep, 1)
    np.add.at(delta, rep + min_span, -1)
    return int((np.cumsum(delta[:-1]) > 0).sum())


def dedup_speed(a: argparse.Namespace, work: Path) -> None:
    bench = _header("dedup-speed", a)
    total = CORPUS.stat().st_size
    print(f"substring dedup, min span {a.min_span} words, the block's find_repeats (words → ids "
          f"with pandas.factorize, then pydivsufsort.longest_previous_factor: the library's C "
          f"LPF) vs our own alternative (pydivsufsort suffix array + Kasai LCP, then numpy run "
          f"grouping); each row a fresh process, one run (shared machine); +MB = peak RSS "
          f"minus the RSS after loading the texts")
    print(f"{'corpus MB':>9} {'docs':>6} {'words':>10} | {'LPF s':>7} {'MB/s':>6} {'peak MB':>8} "
          f"{'+MB':>6} | {'grouping s':>10} {'MB/s':>6} {'+MB':>6} | {'cut words':>9} same")
    rows = []
    for frac in (8, 4, 2, 1):
        res = {}
        for method in ("shipped", "grouping"):
            out = subprocess.run(
                [sys.executable, __file__, "_measure", "--bytes", str(total // frac),
                 "--method", method, "--min-span", str(a.min_span)],
                capture_output=True, text=True, check=True)
            res[method] = json.loads(out.stdout.strip().splitlines()[-1])
        o, p = res["shipped"], res["grouping"]
        print(f"{o['mb']:9.1f} {o['docs']:6,} {o['words']:10,} | {o['seconds']:7.2f} "
              f"{o['mb'] / o['seconds']:6.2f} {o['peak_mb']:8.0f} {o['peak_mb'] - o['texts_mb']:6.0f} | "
              f"{p['seconds']:10.2f} {p['mb'] / p['seconds']:6.2f} {p['peak_mb'] - p['texts_mb']:6.0f} | "
              f"{o['cut_words']:9,} {o['cut_words'] == p['cut_words']}", flush=True)
        rows.append({"corpus MB": o["mb"], "docs": o["docs"], "words": o["words"],
                     "LPF s": o["seconds"], "LPF MB/s": o["mb"] / o["seconds"],
                     "LPF peak MB": o["peak_mb"], "LPF +MB": o["peak_mb"] - o["texts_mb"],
                     "grouping s": p["seconds"], "grouping MB/s": p["mb"] / p["seconds"],
                     "grouping +MB": p["peak_mb"] - p["texts_mb"], "cut words": o["cut_words"],
                     "same": o["cut_words"] == p["cut_words"]})
    bench.table(rows, "dedup-speed", formats={
        "corpus MB": ".1f", "LPF s": ".2f", "LPF MB/s": ".2f", "LPF peak MB": ".0f",
        "LPF +MB": ".0f", "grouping s": ".2f", "grouping MB/s": ".2f", "grouping +MB": ".0f"})
    bench.end()


def main() -> None:
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("part", choices=["memorization", "dp", "dedup-speed", "all", "_measure"])
    ap.add_argument("--work", type=Path, default=Path("build/bench-privacy"))
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--max-chars", type=int, default=2000)
    ap.add_argument("--canaries", type=int, default=8)
    ap.add_argument("--repeats", default="1,4,16,64")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--sst2-train", type=int, default=2000)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--dp-docs", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=1e-3, help="fine-tuning lr (sane: 4e-5; our "
                    "briefly pretrained encoder learns nothing at 4e-5 in a few hundred steps)")
    ap.add_argument("--reuse-pretrain", action="store_true")
    ap.add_argument("--min-span", type=int, default=50)
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--method", default="shipped")
    a = ap.parse_args()
    if a.part == "_measure":
        print(json.dumps(_measure(a.bytes, a.method, a.min_span)))
        return
    if not CORPUS.is_file():
        sys.exit(f"needs the shared corpus at {CORPUS}")
    a.work.mkdir(parents=True, exist_ok=True)
    parts = ["dedup-speed", "memorization", "dp"] if a.part == "all" else [a.part]
    for part in parts:
        {"memorization": memorization, "dp": dp, "dedup-speed": dedup_speed}[part](a, a.work)


if __name__ == "__main__":
    main()
