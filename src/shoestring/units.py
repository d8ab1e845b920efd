"""Budget and duration strings, parsed: pure text → numbers, shared by config validation,
the planner and the trainer (so config.py need not import a stage).

``parse_budget`` is the one budget grammar: every command that takes a budget (`plan`,
`train`, `cram`, the config's ``train.budget``) reads it here — wall clock, FLOPs (with SI
prefixes, or PF-days), tokens or steps; ``parse_interval`` reads a checkpoint interval in
it, and ``format_duration`` writes seconds back ("2.0h"). ``counted`` and ``with_article``
are the one way a message puts a count before a noun ("1 document", "2,000 documents") or
an article before a word ("an encoder").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from shoestring.errors import ShoestringError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")


def format_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}
_AMOUNT = re.compile(
    r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*([kmbgtpe]?)\s*(flops?|tok|tokens|steps?)?\s*$",
    re.I)
BUDGET_FORMS = ("90s / 10m / 24h (wall clock), 3e15flops or 2pf-days (compute), 20Mtok "
                "(tokens) or 1000steps")  # what the grammar takes, for help texts and errors
PF_DAY = 8.64e19  # FLOPs of one petaFLOP/s sustained for a day (the scaling-law papers' unit)
_PF_DAYS = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*pfs?-?\s*days?\s*$", re.I)


@dataclass(frozen=True)
class BudgetSpec:
    """What a budget string asks for: one of seconds, FLOPs, tokens or steps (or, as a
    checkpoint interval, a fraction of the budget). ``text`` is what the user wrote: what a
    config or plan file records, and how the budget is shown."""

    kind: str  # "seconds" | "flops" | "tokens" | "steps" | "fraction" (intervals only)
    amount: float
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.text


# The valid range of each kind of budget, (low, high, whole): a value outside it is a typo
# or a unit mix-up (1e400 is infinite: a run that never ends at a learning rate of 0; 0.1steps
# is no step at all). The bounds are far beyond any real run.
BUDGET_RANGES: dict[str, tuple[float, float, bool]] = {
    "seconds": (0.0, 366 * 86400.0, False),  # above 0; at most a year
    "flops": (1e9, 1e30, False),  # one step of the smallest model costs more than 1e9
    "tokens": (1.0, 1e16, True),
    "steps": (1.0, 1e12, True),
}


def parse_budget(text: str, where: str = "budget") -> BudgetSpec:
    """``'90s'``/``'5m'``/``'24h'`` wall clock; ``'3e15'``/``'3e15flops'``/``'30Tflops'`` or
    ``'2pf-days'`` FLOPs; ``'20Mtok'``/``'2e7 tokens'`` tokens; ``'500steps'`` steps.

    A bare number is FLOPs (the planner's unit) when it is at least 1e9; smaller bare numbers
    are refused, since "100" is far more likely a missing unit than a 100-FLOP budget. Every
    amount must lie in its kind's `BUDGET_RANGES` (a whole number of steps and tokens).
    ``where``: the field or option an error names.
    """
    text = str(text)
    value = text.strip()
    if m := _DURATION.match(value):
        return _in_range(BudgetSpec("seconds", float(m.group(1)) * _UNITS[m.group(2)], text),
                         where)
    if m := _PF_DAYS.match(value):
        return _in_range(BudgetSpec("flops", float(m.group(1)) * PF_DAY, text), where)
    m = _AMOUNT.match(value)
    if m:
        amount = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
        unit = (m.group(3) or "").lower()
        kind = ("flops" if unit.startswith("flop") or not unit else
                "tokens" if unit.startswith("tok") else "steps")
        if unit or amount >= 1e9:
            return _in_range(BudgetSpec(kind, amount, text), where)
    raise ShoestringError(
        f"budget '{text}' is not a duration, FLOP, token or step count",
        where=where,
        fix=f"use {BUDGET_FORMS}",
    )


def parse_interval(text: str, where: str = "train.checkpoint_every") -> BudgetSpec:
    """A checkpoint interval: ``'10%'`` of the budget (kind "fraction", amount 0.1), wall
    clock (``'30m'``) or steps (``'500steps'``) in the budget grammar."""
    value = str(text).strip()
    if value.endswith("%"):
        try:
            amount = float(value[:-1]) / 100
        except ValueError:
            amount = 0.0
        if 0 < amount <= 1:
            return BudgetSpec("fraction", amount, value)
        raise ShoestringError(f"'{text}' is not a fraction of the budget", where=where,
                              fix="use e.g. 10%")
    try:
        spec = parse_budget(text, where)
    except ShoestringError:
        spec = BudgetSpec("", 0.0)
    if spec.kind not in ("seconds", "steps"):
        raise ShoestringError(f"'{text}' is not an interval", where=where,
                              fix="use 10%, 30m, 2h or 500steps")
    return spec


def _in_range(spec: BudgetSpec, where: str) -> BudgetSpec:
    """``spec`` when its amount is valid for its kind, else the error that states the range."""
    low, high, whole = BUDGET_RANGES[spec.kind]
    a, text = spec.amount, spec.text
    above = a > low if spec.kind == "seconds" else a >= low
    if math.isfinite(a) and above and a <= high and (not whole or a == int(a)):
        return spec
    unit = {"seconds": "", "flops": " FLOPs", "tokens": " tokens", "steps": " steps"}[spec.kind]
    valid = ("more than 0s and at most 366d" if spec.kind == "seconds" else
             f"{'a whole number ' if whole else ''}from {low:g} to {high:g}{unit}")
    raise ShoestringError(
        f"budget '{text}' is out of range: a {spec.kind} budget must be {valid}",
        where=where,
        fix="use e.g. 90s / 10m / 24h, 3e15flops, 20Mtok or 1000steps",
    )


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun`` in the number it needs: "1 document",
    "0 documents", "2,000 documents" (``plural``: for nouns that do not just add "s"). Why:
    messages built as ``f"{n} documents"`` said "1 documents" (issue 52)."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def with_article(word: str) -> str:
    """``word`` after "a" or "an" by how it is said: "an encoder", "a decoder", and for a name
    without vowels, read letter by letter, "an mlm", "a clm" (why: an engine's or family's
    name filled into "a {kind}" read "a encoder")."""
    spelled = not any(c in "aeiouy" for c in word.lower())
    vowel_sound = word[:1].lower() in ("fhlmnrsx" if spelled else "aeiou")
    return f"{'an' if vowel_sound else 'a'} {word}"
