"""What repeated data is worth: the data-constrained scaling rule of Muennighoff et al. (2023).

"Scaling Data-Constrained Language Models" (NeurIPS 2023, arXiv:2305.16264) fits how much a
token seen for the (R+1)-th time is worth against a fresh one. With U unique tokens seen
E = 1 + R times, the *effective* data is

    D' = U + U · R*_D · (1 − exp(−R / R*_D)),   R*_D ≈ 15.4 (their fit, eq. 5 / table 2),

so up to ~4 epochs D' is within a few percent of U·E (repetition ≈ fresh data), and D' can
never exceed U·(1 + R*_D) however many epochs are run. The rule lives here, on the data floor,
because the loader's mixture, `train`'s warnings and `plan` all need it.
"""

from __future__ import annotations

import math

R_STAR_D = 15.4
"""Muennighoff et al. 2023's fitted decay constant for repeated data (in repetitions)."""

R_STAR_N = 5.3
"""Their decay constant for excess parameters (in multiples of the compute-optimal size)."""

REPEAT_WARN_EPOCHS = 4.0
"""Past ~4 epochs, repeated tokens are worth clearly less than fresh ones (their Fig. 3)."""

SOURCE = ("Muennighoff et al. 2023, 'Scaling Data-Constrained Language Models' "
          "(arXiv:2305.16264)")


def effective_tokens(unique_tokens: float, epochs: float, r_star: float = R_STAR_D) -> float:
    """Tokens of fresh data that ``epochs`` passes over ``unique_tokens`` are worth.

    ``epochs`` ≤ 1 means no repetition: the tokens seen are all fresh.
    """
    if unique_tokens <= 0 or epochs <= 0:
        return 0.0
    if epochs <= 1:
        return unique_tokens * epochs
    repeats = epochs - 1.0
    return unique_tokens * (1.0 + r_star * (1.0 - math.exp(-repeats / r_star)))


def repetition_cost(unique_tokens: float, epochs: float) -> float:
    """Fraction of the tokens seen that repetition wastes: 1 − D' / (U · epochs)."""
    seen = unique_tokens * epochs
    if seen <= 0:
        return 0.0
    return 1.0 - effective_tokens(unique_tokens, epochs) / seen


def effective_params(params: float, base_params: float, r_star: float = R_STAR_N) -> float:
    """Parameters that ``params`` are worth when ``base_params`` is all the unique data can
    use (their U_N: the compute-optimal size for the unique tokens). The excess decays like
    repeated data, faster (R*_N ≈ 5.3 < R*_D):
    N' = U_N + U_N · R*_N · (1 − exp(−R_N / R*_N)),
    R_N = N / U_N − 1 (their reference code: github.com/huggingface/datablations, README,
    "Parametric Fit")."""
    base = min(params, base_params)
    return effective_tokens(base, params / base, r_star) if base > 0 else 0.0
