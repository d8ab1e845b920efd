"""Scaling laws L(N, D) = E + A/N^α + B/D^β and the compute-optimal split of C ≈ 6·N·D.

Minimizing the law on the line C = 6·N·D has a closed form (Hoffmann et al. 2022, eq. 4):

    N_opt = G · (C/6)^(β/(α+β)),  D_opt = G⁻¹ · (C/6)^(α/(α+β)),  G = (αA / βB)^(1/(α+β)).

Two published laws ship: Hoffmann et al.'s own fit ("chinchilla"), and Epoch AI's 2024 refit
of the same data ("epoch", the default) — Besiroglu et al. found the original constants
inconsistent with the paper's own compute-optimal models; the refit reproduces Chinchilla's
70B parameters / 1.4T tokens at 5.76e23 FLOPs, the original predicts ~32B. Both were fitted on
decoder LMs on MassiveText with the SentencePiece tokenizer: the *loss values* belong to that
setup (an MLM loss on your tokenizer is on another scale), the *exponents* (the N:D split)
are what transfers best. A law fitted on your own data (`shoestring sweep` + `plan --fit`)
is a YAML file with the same five constants that ``--law FILE`` accepts.

**Which N.** A law's constants hold for the parameter count it was fitted on. Hoffmann et al.
count all parameters, embeddings included (Pearce & Song 2024, "Reconciling Kaplan and
Chinchilla Scaling Laws", arXiv:2406.12907, trace most of the Kaplan/Chinchilla disagreement to
Kaplan et al. 2020 counting non-embedding parameters instead); Epoch's refit reuses their data
points, so the same. A law fitted by `plan --fit` is fitted on the sweep's non-embedding counts
and says so. `Law.params` records which, and `Law.count` picks it from a model's two counts.

**Repeated data.** `Law.repeated_loss` is the data-constrained form of Muennighoff et al. 2023
(`shoestring.data.repetition`): the law evaluated at the effective data D' and effective
parameters N' instead of D and N.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from shoestring.data.repetition import effective_params, effective_tokens
from shoestring.errors import ShoestringError
from shoestring.fsutil import read_yaml

from shoestring.units import PF_DAY  # noqa: E402  (FLOPs in one petaFLOP/s-day)


def pf_days(flops: float) -> float:
    """FLOPs → petaFLOP/s-days."""
    return flops / PF_DAY


def training_flops(params: float, tokens: float) -> float:
    """C ≈ 6·N·D: forward (2 FLOPs per parameter per token) plus backward (4)."""
    return 6.0 * params * tokens


@dataclass(frozen=True)
class Law:
    """L(N, D) = E + A/N^α + B/D^β; N parameters, D training tokens, L in nats per token."""

    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str = ""
    objective: str = "clm"  # the objective the loss values were measured on
    params: str = "non_embedding"  # which parameter count N means: see PARAM_COUNTS

    def loss(self, params: float, tokens: float) -> float:
        return self.E + self.A / params**self.alpha + self.B / tokens**self.beta

    def count(self, total: float, non_embedding: float) -> float:
        """The model's N as this law counts it."""
        return total if self.params == "total" else non_embedding

    def params_for_tokens(self, tokens: float) -> float:
        """The N for which ``tokens`` is the compute-optimal D (inverse of `optimal`'s split):
        N = G · (D·G)^(β/α), Muennighoff et al.'s ``D_to_N``."""
        a, b = self.alpha, self.beta
        g = (a * self.A / (b * self.B)) ** (1.0 / (a + b))
        return g * (tokens * g) ** (b / a)

    def repeated_loss(self, params: float, tokens: float, unique: float) -> float:
        """The loss when the ``tokens`` seen are passes over ``unique`` distinct tokens:
        Muennighoff et al. 2023's data-constrained law, L(N', D') with D' the effective tokens
        (repeats decay, R*_D ≈ 15.4) and N' the effective parameters (parameters beyond the
        compute-optimal size for the unique data decay, R*_N ≈ 5.3). Equal to `loss` when
        nothing repeats (``tokens`` ≤ ``unique``): the planner applies the rule to repeated
        data only, so a plan with a corpus agrees with one without until the data repeats."""
        if tokens <= unique:
            return self.loss(params, tokens)
        d_eff = effective_tokens(unique, tokens / unique)
        n_eff = effective_params(params, self.params_for_tokens(unique))
        return self.loss(n_eff, d_eff)

    def optimal(self, flops: float) -> tuple[float, float]:
        """(N_opt, D_opt) minimizing the loss on C = 6·N·D."""
        if flops <= 0:
            raise ValueError("compute budget must be positive")
        a, b = self.alpha, self.beta
        g = (a * self.A / (b * self.B)) ** (1.0 / (a + b))
        n = g * (flops / 6.0) ** (b / (a + b))
        return n, flops / (6.0 * n)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


EPOCH_2024 = Law(
    name="epoch",
    E=1.8172,
    A=482.01,
    B=2085.43,
    alpha=0.3478,
    beta=0.3658,
    source="Besiroglu, Erdil, Barnett, You (Epoch AI, 2024), 'Chinchilla Scaling: A replication "
    "attempt', arXiv:2404.10102, refit of Hoffmann et al. 2022 approach 3",
    params="total",  # refit on Hoffmann et al.'s points, which count every parameter
)
CHINCHILLA_2022 = Law(
    name="chinchilla",
    E=1.69,
    A=406.4,
    B=410.7,
    alpha=0.34,
    beta=0.28,
    source="Hoffmann et al. (2022), 'Training Compute-Optimal Large Language Models', "
    "arXiv:2203.15556, approach 3 (eq. 10)",
    params="total",  # embeddings included (Pearce & Song 2024, arXiv:2406.12907)
)
LAWS: dict[str, Law] = {"epoch": EPOCH_2024, "chinchilla": CHINCHILLA_2022}

_FIELDS = ("E", "A", "B", "alpha", "beta")

PARAM_COUNTS = {"total": "all parameters, embeddings included",
                "non_embedding": "parameters outside the embedding tables"}
"""The values of `Law.params`: which parameter count a law's N is."""


def law_to_yaml(law: Law, extra: dict[str, Any] | None = None) -> str:
    """The law file format: the five constants plus provenance; ``--law FILE`` reads it back."""
    tree = {"law": law.to_dict()}
    if extra:
        tree.update(extra)
    return yaml.safe_dump(tree, sort_keys=False)


def load_law(spec: str | Path) -> Law:
    """``epoch``, ``chinchilla``, or a law file written by ``plan --fit``."""
    if str(spec) in LAWS:
        return LAWS[str(spec)]
    path = Path(spec)
    if not path.is_file():
        raise ShoestringError(
            f"unknown law {str(spec)!r}",
            where="--law",
            fix=f"use {' or '.join(LAWS)}, or a law file written by `shoestring plan --fit`",
        )
    tree = read_yaml(path, "law file")
    body = tree.get("law") if isinstance(tree, dict) else None
    if not isinstance(body, dict):
        raise ShoestringError(
            "a law file needs a 'law:' mapping with E, A, B, alpha, beta",
            where=str(path),
            fix="write it with `shoestring plan --fit SWEEP_DIR`",
        )
    values: dict[str, float] = {}
    for key in _FIELDS:
        try:
            values[key] = float(body[key])
        except (KeyError, TypeError, ValueError):
            raise ShoestringError(
                f"law.{key} is missing or not a number (got {body.get(key)!r})", where=str(path)
            ) from None
        if not math.isfinite(values[key]) or (key != "E" and values[key] <= 0):
            raise ShoestringError(f"law.{key} must be a positive number", where=str(path))
    params = str(body.get("params", "non_embedding"))
    if params not in PARAM_COUNTS:
        raise ShoestringError(f"law.params is {params!r}", where=str(path),
                              fix=f"use {' or '.join(PARAM_COUNTS)}: which N the law was fitted on")
    return Law(
        name=str(body.get("name", path.stem)),
        source=str(body.get("source", str(path))),
        objective=str(body.get("objective", "clm")),
        params=params,
        **values,
    )
