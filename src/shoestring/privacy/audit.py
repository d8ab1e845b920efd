"""`shoestring audit RUN --data DATA`: what a trained model gives away about its training data.

Three measurements, each beside its chance level (docs/privacy.md explains them):

- **canary exposure** (``exposure.py``) of the secrets ``prep --canaries`` planted, next to
  the same test on reference canaries that were never inserted;
- **membership inference**: the per-sequence loss on training rows vs held-out rows, as an
  ROC AUC of "lower loss ⇒ member" (0.5 = the loss says nothing about membership);
- **extraction** (decoders): greedy continuations of training-row prefixes that reproduce the
  next ``match_tokens`` tokens verbatim, against the same on held-out rows.

Every family difference goes through the family spec: ``loss_sum`` / ``validation_batch`` for
the per-sequence loss, ``causal`` for the exposure score and whether extraction applies.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from shoestring.errors import Interrupted, ShoestringError
from shoestring.train.objectives import Objective, objective_for

FILE = "audit.json"


@dataclass(frozen=True)
class AuditSettings:
    """How much of each test to run. The canary exposure dominates the cost (it is stated
    up front): 1,000 candidates resolve exposures up to 10 bits."""

    candidates: int = 1000  # random secrets each canary is ranked against
    sequences: int = 256  # rows per split for membership inference
    extract: int = 64  # prefixes per split for extraction (decoders)
    prefix_tokens: int = 32
    match_tokens: int = 50
    seed: int = 0


def sequence_losses(model: torch.nn.Module, objective: Objective, rows: np.ndarray,
                    eval_cfg: Any) -> np.ndarray:
    """Mean loss of each row, as the family scores validation (fixed masks for encoders)."""
    out = np.empty(len(rows))
    with torch.no_grad():
        for i, row in enumerate(rows):
            batch = objective.validation_batch(torch.from_numpy(row[None]), i, eval_cfg)
            total, n = objective.loss_sum(model, batch)
            out[i] = float(total) / max(1, n)
    return out


def membership_auc(member_losses: np.ndarray, other_losses: np.ndarray) -> float:
    """ROC AUC of the attack "lower loss ⇒ training member"."""
    from sklearn.metrics import roc_auc_score

    labels = np.r_[np.ones(len(member_losses)), np.zeros(len(other_losses))]
    return float(roc_auc_score(labels, -np.r_[member_losses, other_losses]))


@torch.no_grad()
def verbatim_fraction(model: torch.nn.Module, rows: np.ndarray, prefix: int, match: int) -> dict:
    """Greedy-continue each row's first ``prefix`` tokens; the fraction whose next ``match``
    tokens equal the row's, and the mean length of the matching start."""
    x = torch.from_numpy(rows[:, :prefix])
    want = torch.from_numpy(rows[:, prefix : prefix + match])
    got = model.generate(x, match, temperature=0.0)[:, prefix : prefix + match]
    same = got == want
    run = torch.cumprod(same.long(), 1).sum(1)
    return {"verbatim_fraction": float((run == match).float().mean()),
            "mean_matched_tokens": float(run.float().mean()), "prompts": len(rows)}


def _by_copies(scored: list[dict]) -> dict[str, dict[str, float]]:
    """Mean exposure of the canaries grouped by copies inserted (and surviving curation)."""
    groups: dict[int, list[dict]] = {}
    for r in scored:
        groups.setdefault(r["inserted"], []).append(r)
    return {str(k): {"canaries": len(v), "mean_exposure": float(np.mean([r["exposure"] for r in v])),
                     "mean_copies_in_train": float(np.mean([r["in_train"] for r in v]))}
            for k, v in sorted(groups.items())}


def _sample(split: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random rows of ``split`` (all of them if it has fewer), in their order."""
    return split.take(np.sort(rng.choice(len(split), min(n, len(split)), replace=False)))


def audit(run_dir: str | Path, data_dir: str | Path, settings: AuditSettings = AuditSettings(),
          console: Console | None = None) -> dict[str, Any]:
    """Run the three tests on a finished run; writes ``audit.json`` in the run dir."""
    from shoestring.prep import canaries as C
    from shoestring.data.datadir import DataDir
    from shoestring.fsutil import file_sha256
    from shoestring.fsutil import write_json_atomic
    from shoestring.rundir import RunDir

    console = console or Console(stderr=True)
    t0 = time.perf_counter()
    run = RunDir(run_dir)
    model, meta = run.load_final()
    family = run.family()
    data = DataDir(data_dir)
    if file_sha256(run.tokenizer_path) != data.manifest["tokenizer"]["sha256"]:
        raise ShoestringError(
            "this data dir was tokenized with a different tokenizer than the model's",
            where=str(data.path), fix="audit with the data dir the run trained on")
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    tokenizer, special = data.tokenizer(), data.special_ids
    result: dict[str, Any] = {"run": str(Path(run_dir)), "data_dir": str(data.path),
                              "family": family.name, "settings": settings.__dict__}

    stage = "before the canary exposure"
    try:  # Ctrl-C: say how far it got (_exposures counts its canaries), write nothing
        canary_file = data.path / C.FILE
        if canary_file.is_file():
            planted, refs, record = C.read(canary_file)
            ins, ref = _exposures(model, family, tokenizer, planted, refs, settings, special,
                                  console, run_dir)
            result["canaries"] = {
                "repeats": record["repeats"], "inserted": ins, "references": ref,
                "mean_exposure_inserted": float(np.mean([r["exposure"] for r in ins])),
                "mean_exposure_references": float(np.mean([r["exposure"] for r in ref])),
                "max_exposure": float(np.log2(settings.candidates + 1)),
                "by_copies": _by_copies(ins),
            }
        else:
            result["canaries"] = {"note": f"no {C.FILE} in the data dir (prep --canaries K "
                                  "plants them)"}
        stage = "after the canary exposure"
        _membership_and_extraction(result, model, family, data, special, settings, rng, console)
    except KeyboardInterrupt:
        raise Interrupted(f"audit interrupted {stage}; nothing written to "
                          f"{Path(run_dir) / FILE}. Start it again") from None
    result["seconds"] = round(time.perf_counter() - t0, 2)
    write_json_atomic(Path(run_dir) / FILE, result)
    return result


def _membership_and_extraction(result: dict[str, Any], model: torch.nn.Module, family: Any, data: Any,
          special: dict[str, int], settings: AuditSettings, rng: np.random.Generator,
          console: Console) -> None:
    """Membership inference and extraction, into ``result``."""
    from shoestring.config import EvalConfig

    train, val = data.split("train"), data.split("val")
    eval_cfg = EvalConfig()
    objective = objective_for(family, data.seq_len, data.vocab_size, special)
    with console.status("membership inference (per-sequence loss)"):
        tr = sequence_losses(model, objective, _sample(train, settings.sequences, rng), eval_cfg)
        va = sequence_losses(model, objective, _sample(val, settings.sequences, rng), eval_cfg)
    result["membership"] = {"auc": membership_auc(tr, va), "train_sequences": len(tr),
                            "held_out_sequences": len(va), "train_mean_loss": float(tr.mean()),
                            "held_out_mean_loss": float(va.mean())}

    if family.causal:
        prefix, match = settings.prefix_tokens, settings.match_tokens
        if data.seq_len < prefix + match:
            prefix = data.seq_len - match
        if prefix < 4:
            result["extraction"] = {"note": f"rows of {data.seq_len} tokens are too short for "
                                    f"a prefix plus {match} tokens"}
        else:
            with console.status("extraction (greedy continuations)"):
                result["extraction"] = {
                    "prefix_tokens": prefix, "match_tokens": match,
                    "train": verbatim_fraction(model, _sample(train, settings.extract, rng),
                                               prefix, match),
                    "held_out": verbatim_fraction(model, _sample(val, settings.extract, rng),
                                                  prefix, match),
                }
    else:
        result["extraction"] = {"note": f"{family.description}: no generation to extract with"}


PROBE_CANDIDATES = 31  # the probe that times the exposure: one batch of a first canary


def _exposures(model: torch.nn.Module, family: Any, tokenizer: Any, planted: list,
               refs: list, settings: AuditSettings, special: dict[str, int], console: Console,
               run_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """Exposure of the planted and the reference canaries, after saying what it will cost.

    An encoder's pseudo-log-likelihood takes one forward pass per candidate and secret token
    (1,000 candidates × 16 canaries ≈ 100k passes: an hour on a busy 2-core CPU), so the
    cost is timed on a probe and stated up front, a bar (or, in a log, a line every 30 s)
    follows it, and Ctrl-C says how far it got.
    """
    from shoestring.privacy.exposure import canary_exposure, forward_passes
    from shoestring.progress import counting

    canaries = [*planted, *refs]
    scored: list[dict] = []
    try:
        passes = sum(forward_passes(family.causal, tokenizer, c, settings.candidates,
                                    settings.seed) for c in canaries)
        probe = min(settings.candidates, PROBE_CANDIDATES)
        start = time.perf_counter()
        canary_exposure(model, family, tokenizer, canaries[0], probe, special, settings.seed)
        per_pass = (time.perf_counter() - start) / forward_passes(
            family.causal, tokenizer, canaries[0], probe, settings.seed)
        what = "one per candidate" if family.causal else "one per candidate and secret token"
        bits = math.log2(settings.candidates + 1)
        console.print(f"audit: {settings.candidates:,} candidates × {len(canaries)} canaries, "
                      f"{passes:,} forward passes ({what}), estimated "
                      f"~{per_pass * passes / 60:.1f} min on this machine (timed on {probe + 1} "
                      f"candidates); exposure resolves up to log2({settings.candidates:,} + 1) "
                      f"= {bits:.1f} bits, and --candidates sets both", highlight=False,
                      soft_wrap=True)
        with counting(console, "canary exposure", passes, "passes") as advance:
            for c in canaries:
                scored.append(canary_exposure(model, family, tokenizer, c, settings.candidates,
                                              special, settings.seed, advance)
                              | {"in_train": c.in_train, "inserted": c.inserted})
    except KeyboardInterrupt:
        raise Interrupted(f"audit interrupted after {len(scored)} of {len(canaries)} canaries; "
                          f"nothing written to {Path(run_dir) / FILE}. Start it again (a "
                          "smaller --candidates is quicker)") from None
    return scored[: len(planted)], scored[len(planted):]


def print_audit(run_dir: Path, data_dir: Path, settings: AuditSettings) -> None:
    """`shoestring audit`: audit ``run_dir`` (audit.json is written) and print the short table."""
    from rich.table import Table

    from shoestring.consoles import err, out

    result = audit(run_dir, data_dir, settings, console=err)
    t = Table(title=f"audit of {result['run']} ({result['family']})")
    t.add_column("test")
    t.add_column("training data", justify="right")
    t.add_column("never seen (chance)", justify="right")
    c = result["canaries"]
    if "inserted" in c:
        for copies, g in c["by_copies"].items():
            t.add_row(f"canary exposure, bits (max {c['max_exposure']:.1f}; {copies} copies, "
                      f"{g['mean_copies_in_train']:g} in train)",
                      f"{g['mean_exposure']:.2f}", f"{c['mean_exposure_references']:.2f}")
    else:
        t.add_row("canary exposure", c["note"], "")
    m = result["membership"]
    t.add_row("mean loss per sequence", f"{m['train_mean_loss']:.3f}",
              f"{m['held_out_mean_loss']:.3f}")
    t.add_row("membership inference ROC AUC (0.5 = no leak)", f"{m['auc']:.3f}", "0.500")
    e = result["extraction"]
    if "train" in e:
        t.add_row(f"extracted verbatim (≥{e['match_tokens']} tokens after {e['prefix_tokens']})",
                  f"{e['train']['verbatim_fraction']:.1%}", f"{e['held_out']['verbatim_fraction']:.1%}")
    else:
        t.add_row("extraction", e["note"], "")
    out.print(t)
    out.print(f"written: {run_dir / FILE}")
