"""The laws the planner encodes besides L(N, D): batch and LR against compute (DeepSeek LLM,
anchored at the recipe), data-constrained scaling (Muennighoff et al.), which N each law
counts, and `plan --measure` timing the real trainer's step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shoestring.config import DataConfig, TrainConfig
from shoestring.data.repetition import R_STAR_N, effective_params, effective_tokens
from shoestring.errors import ShoestringError
from shoestring.families import MLM, RTD
from shoestring.plan import hyper
from shoestring.plan.laws import CHINCHILLA_2022, EPOCH_2024, load_law
from shoestring.plan.planner import PlanRequest, make_plan, size_for_flops


# ---------------------------------------------------------------- batch and LR (DeepSeek)

def test_the_anchor_is_the_recipe_as_configured() -> None:
    """The laws are anchored at the batch and LR the recipe trains with: if the defaults
    change, the anchor's measurement no longer describes them and this fails."""
    assert hyper.RECIPE_BATCH_TOKENS == TrainConfig().batch_size * DataConfig().seq_len
    assert hyper.RECIPE_LR == TrainConfig().lr
    assert hyper.batch_tokens(hyper.RECIPE_FLOPS) == pytest.approx(hyper.RECIPE_BATCH_TOKENS)
    assert hyper.peak_lr(hyper.RECIPE_FLOPS) == pytest.approx(hyper.RECIPE_LR)
    h = hyper.plan_hyper(hyper.RECIPE_FLOPS, 128)
    assert (h.batch_sequences, h.lr) == (32, 2e-3) and h.batch_clamp is h.lr_clamp is None


def test_deepseeks_exponents_and_the_constant_ratio_to_their_constants() -> None:
    # DeepSeek LLM eq. 1 as published (their C): B = 0.292 C^0.3271, η = 0.3118 C^-0.125
    def published_batch(c: float) -> float:
        return 0.292 * c**0.3271

    def published_lr(c: float) -> float:
        return 0.3118 * c**-0.125

    for c in (1e11, 1e14, 1e17, 1e20):
        assert hyper.batch_tokens(10 * c) / hyper.batch_tokens(c) == pytest.approx(10 ** 0.3271)
        assert hyper.peak_lr(10 * c) / hyper.peak_lr(c) == pytest.approx(10 ** -0.125)
        # the published law is the anchored one times a constant: 2.5× and 2.8× (the docstring)
        assert published_batch(c) / hyper.batch_tokens(c) == pytest.approx(2.5, abs=0.05)
        assert published_lr(c) / hyper.peak_lr(c) == pytest.approx(2.83, abs=0.05)
    # DeepSeek's own numbers at 1e20 FLOPs: ~1M-token batches and LR ~1e-3
    assert published_batch(1e20) == pytest.approx(1.0e6, rel=0.1)
    assert published_lr(1e20) == pytest.approx(9.9e-4, rel=0.05)


def test_clamps_say_why() -> None:
    tiny = hyper.plan_hyper(1e10, 128)  # the law: ~400 tokens, LR 6.1e-3
    assert tiny.batch_sequences == hyper.MIN_BATCH_SEQUENCES and "minimum" in tiny.batch_clamp
    assert tiny.law_lr > hyper.LR_MAX and tiny.lr == hyper.LR_MAX and "0.004" in tiny.lr_clamp
    small_corpus = hyper.plan_hyper(1e16, 128, train_sequences=40)
    assert small_corpus.batch_sequences == 40
    assert "40 training sequences" in small_corpus.batch_clamp
    split = hyper.plan_hyper(1e16, 128, devices=8)
    assert split.batch_sequences % 8 == 0 and (split.batch_sequences // 8) % 8 == 0


def test_the_plan_shows_batch_and_lr_with_their_source() -> None:
    small = make_plan(PlanRequest(hardware="t4", budget="1e14flops", objective="mlm"))
    big = make_plan(PlanRequest(hardware="t4", budget="1e16flops", objective="mlm"))
    for tree in (small, big):
        b = tree["plan"]["batch"]
        assert "arXiv:2401.02954" in b["source"] and "anchored at the recipe" in b["source"]
        assert tree["train"]["lr"] == b["lr"] == pytest.approx(min(hyper.LR_MAX, b["law_lr"]),
                                                                rel=1e-2)
        assert tree["train"]["batch_size"] == b["global_sequences"] == b["batch_sequences"]
    # more compute: a larger batch and a lower LR
    assert big["train"]["batch_size"] > small["train"]["batch_size"]
    assert big["train"]["lr"] < small["train"]["lr"]


def test_a_familys_training_recipe_anchors_its_lr() -> None:
    """RTD trains at its own recipe's LR (families/rtd.py): its plan's LR is the same law
    anchored there, so at one budget it is the MLM plan's times the recipes' ratio, and the
    source says which anchor."""
    ratio = TrainConfig(**RTD.train_recipe).lr / TrainConfig().lr
    assert ratio < 1
    mlm = make_plan(PlanRequest(hardware="t4", budget="1e16flops", objective="mlm"))
    rtd = make_plan(PlanRequest(hardware="t4", budget="1e16flops", objective="rtd"))
    assert rtd["train"]["lr"] == pytest.approx(mlm["plan"]["batch"]["law_lr"] * ratio, rel=1e-2)
    assert f"peak LR {TrainConfig(**RTD.train_recipe).lr:g}" in rtd["plan"]["batch"]["source"]


# ---------------------------------------------------------------- data-constrained scaling

def _data(train_tokens: float, seq_len: int = 128) -> dict:
    return {"seq_len": seq_len, "vocab_size": 8192, "objective": "mlm",
            "train_tokens": int(train_tokens), "train_sequences": int(train_tokens // seq_len)}


def test_repeated_loss_is_the_law_on_fresh_data_and_worse_on_repeats() -> None:
    law = EPOCH_2024
    n, u = 5e6, 1e8
    assert law.repeated_loss(n, 0.5 * u, u) == law.loss(n, 0.5 * u)
    assert law.repeated_loss(n, u, u) == law.loss(n, u)
    assert law.repeated_loss(n, 2 * u, u) > law.loss(n, 2 * u)  # repeats are worth less
    # bounded: beyond ~R*_D + 1 epochs more passes buy (almost) nothing
    assert law.repeated_loss(n, 1000 * u, u) == pytest.approx(law.repeated_loss(n, 1e4 * u, u),
                                                              rel=1e-3)
    # excess parameters decay too: N' of a model 100× the data's optimum is ≤ (1 + R*_N) × it
    base = law.params_for_tokens(u)
    assert law.optimal(6 * base * u)[0] == pytest.approx(base, rel=1e-6)  # inverse of the split
    assert effective_params(100 * base, base) <= base * (1 + R_STAR_N)
    assert effective_params(0.5 * base, base) == 0.5 * base


def test_a_budget_beyond_the_corpus_plans_a_smaller_model_and_more_epochs() -> None:
    """5M unique tokens and 1e16 FLOPs: fresh data would buy a larger model on ~50 epochs'
    worth of tokens; the data-constrained law picks fewer parameters and more epochs."""
    law, c = EPOCH_2024, 1e16
    fresh = size_for_flops(c, MLM, law, {**_data(5e6), "train_tokens": 0})
    limited = size_for_flops(c, MLM, law, _data(5e6))
    assert limited.pick.params < fresh.pick.params
    assert limited.tokens / 5e6 > fresh.tokens / 5e6 > 1
    # a corpus larger than the budget's tokens changes nothing
    plenty = size_for_flops(c, MLM, law, _data(1e12))
    assert plenty.pick == fresh.pick and plenty.loss == fresh.loss


def test_the_plan_states_epochs_and_what_repetition_costs(pydocs_dir: Path) -> None:
    """A real (small) corpus and a budget far beyond it: a smaller model than on unlimited
    data of the same kind, more than four epochs, and the cost stated with its source."""
    from shoestring.plan.planner import data_info

    info = data_info(str(pydocs_dir))
    unique = info["train_tokens"]
    unlimited = size_for_flops(1e15, MLM, EPOCH_2024, {**info, "train_tokens": 0})
    big = make_plan(PlanRequest(hardware="t4", budget="1e15flops", data=str(pydocs_dir)))
    assert big["plan"]["model"]["params"] < unlimited.pick.params
    d = big["plan"]["data"]
    assert d["epochs"] > 4
    rep = d["repetition"]
    assert rep["effective_tokens"] == pytest.approx(effective_tokens(unique, d["epochs"]),
                                                    rel=1e-3)
    assert rep["tokens_wasted"] == pytest.approx(
        1 - rep["effective_tokens"] / (unique * d["epochs"]), rel=1e-3)
    assert rep["loss_vs_fresh"] > 0 and "arXiv:2305.16264" in rep["source"]
    assert any("repeats the corpus" in n and "Muennighoff" in n for n in big["plan"]["notes"])
    shown = _rendered(big)  # what a person reads: epochs, the cost, the rule, the count
    assert "wasted" in shown and "against fresh data" in shown and "Muennighoff" in shown
    assert "embeddings included" in shown and "arXiv:2401.02954" in shown
    few = make_plan(PlanRequest(hardware="t4", budget="3e10flops", data=str(pydocs_dir)))
    assert few["plan"]["data"]["epochs"] < 1 and "repetition" not in few["plan"]["data"]


def _rendered(tree: dict) -> str:
    import io

    from rich.console import Console

    from shoestring.plan.planner import plan_table

    console = Console(width=400, record=True, file=io.StringIO())
    console.print(plan_table(tree))
    return " ".join(console.export_text().split())


# ---------------------------------------------------------------- which N

def test_each_law_counts_the_parameters_it_was_fitted_on(tmp_path: Path) -> None:
    # Hoffmann et al. (and Epoch's refit of their points) count embeddings
    assert EPOCH_2024.params == CHINCHILLA_2022.params == "total"
    assert EPOCH_2024.count(10, 7) == 10
    fitted = tmp_path / "law.yaml"
    fitted.write_text("law: {E: 2.0, A: 300.0, B: 900.0, alpha: 0.35, beta: 0.33}\n")
    assert load_law(str(fitted)).params == "non_embedding"  # plan --fit's sweep counts
    assert load_law(str(fitted)).count(10, 7) == 7
    bad = tmp_path / "bad.yaml"
    bad.write_text("law: {E: 2.0, A: 300.0, B: 900.0, alpha: 0.35, beta: 0.33, params: all}\n")
    with pytest.raises(ShoestringError, match="law.params"):
        load_law(str(bad))


def test_the_plan_states_and_uses_the_laws_count() -> None:
    tree = make_plan(PlanRequest(hardware="t4", budget="1e13flops", objective="mlm"))
    p = tree["plan"]
    assert p["law"]["params"] == "total" and "embeddings included" in p["law"]["params_counted"]
    m = p["model"]
    assert m["law_params"] == m["params"] > m["params_non_embedding"]
    assert m["tokens_per_param"] == pytest.approx(m["tokens"] / m["params"])
    # the predicted loss is the law at the total count (before the ln(vocab) clamp)
    law_loss = EPOCH_2024.loss(m["params"], m["tokens"])
    assert m["predicted_loss"] == pytest.approx(min(law_loss, math.log(tree["data"]["vocab_size"])))


# ---------------------------------------------------------------- the real step, timed

def test_time_steps_runs_the_trainers_step() -> None:
    """`time_steps` builds the run as `train` does and times `train_step`: tokens per second
    over the real FLOPs per token, the trainer's speed choices, one micro-batch per rank."""
    from shoestring.config import Config, ModelConfig
    from shoestring.plan.shapes import flops_per_token
    from shoestring.train.timing import time_steps

    model = ModelConfig(hidden_size=64, num_layers=2, num_heads=1, intermediate_size=192)
    cfg = Config(model=model, data=DataConfig(vocab_size=2000, seq_len=64),
                 train=TrainConfig(budget=None, steps=1, batch_size=16, micro_batch_size=8,
                                   compile=False))
    t = time_steps(cfg, 2000, 64, seconds=0.2, warmup=1, min_steps=2)
    assert t.steps >= 2 and t.seconds > 0 and t.micro_batch == 8
    assert t.flops_per_token == pytest.approx(
        flops_per_token(model, 2000, 64, TrainConfig().mask_rate))
    assert t.tokens_per_s > 0 and t.mfu == pytest.approx(
        t.tokens_per_s * t.flops_per_token / t.peak_flops)
    assert "attention" in t.speed and "compile off" in t.speed
