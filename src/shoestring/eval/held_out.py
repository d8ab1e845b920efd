"""Held-out loss of a finished run, by family: this floor's part of a model family.

The planner's sweeps compare these numbers across model sizes (plan/sweep.py), so each
family's evaluator is registered here by family name (families/spec.py holds the constants).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from shoestring.errors import ShoestringError
from shoestring.families import FamilySpec
from shoestring.units import with_article


def _mlm(run_dir: Path, max_sequences: int, seq_len: int, console: Console | None) -> float:
    from shoestring.eval.mlm_loss import evaluate_run

    result = evaluate_run(run_dir, overrides=[f"eval.max_sequences={max_sequences}"],
                          console=console)
    return float(result["mlm_loss"])


def _clm(run_dir: Path, max_sequences: int, seq_len: int, console: Console | None) -> float:
    from shoestring.eval.causal_lm import evaluate_decoder

    result = evaluate_decoder(run_dir, samples=0, max_tokens=max_sequences * seq_len,
                              console=console)
    return float(result["perplexity"]["loss"])


HELD_OUT: dict[str, Callable[[Path, int, int, Console | None], float]] = {
    "mlm": _mlm, "clm": _clm}


def held_out_loss(family: FamilySpec, run_dir: Path, max_sequences: int, seq_len: int,
                  console: Console | None = None) -> float:
    """The family's held-out loss on a finished run (at most ``max_sequences`` validation
    rows of ``seq_len``); a family with no pretraining loss (contrastive) says so."""
    if family.name not in HELD_OUT:
        raise ShoestringError("planner sweeps compare pretraining losses; "
                              f"{with_article(family.name)} "
                              "run has none", where=str(run_dir),
                              fix="sweep with model.objective=mlm or clm")
    return HELD_OUT[family.name](run_dir, max_sequences, seq_len, console)
