"""The data-constrained rule: repetition is nearly free up to ~4 epochs and bounded after."""

import math

from shoestring.data.repetition import (
    R_STAR_D,
    REPEAT_WARN_EPOCHS,
    effective_tokens,
    repetition_cost,
)


def test_one_pass_or_less_is_all_fresh() -> None:
    assert effective_tokens(1e9, 1.0) == 1e9
    assert effective_tokens(1e9, 0.5) == 5e8
    assert repetition_cost(1e9, 1.0) == 0.0


def test_four_epochs_are_worth_nearly_four_fresh_passes() -> None:
    worth = effective_tokens(1e9, REPEAT_WARN_EPOCHS) / 1e9
    assert 3.6 < worth < 4.0
    assert repetition_cost(1e9, REPEAT_WARN_EPOCHS) < 0.1


def test_many_epochs_are_worth_much_less_and_bounded() -> None:
    assert repetition_cost(1e9, 40.0) > 0.5
    assert effective_tokens(1e9, 1e6) <= 1e9 * (1 + R_STAR_D) + 1
    assert math.isclose(effective_tokens(1e9, 1e6), 1e9 * (1 + R_STAR_D), rel_tol=1e-6)


def test_worth_grows_with_epochs() -> None:
    values = [effective_tokens(1e6, e) for e in (1, 2, 4, 8, 16, 64)]
    assert values == sorted(values) and len(set(values)) == len(values)
