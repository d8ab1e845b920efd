"""Every recipe option builds, runs, is counted exactly, and bad combinations fail at config time."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from shoestring.config import ModelConfig, load_config
from shoestring.errors import ShoestringError
from shoestring.model import build_model
from shoestring.model.flops import forward_flops_per_token
from shoestring.model.layers import FeedForward
from shoestring.model.presets import PRESET_NAMES, presets

VOCAB = 300
SMALL = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=96)

VARIANTS = [
    dict(norm=n, norm_position=p, bias=b, ffn=f, positions=pos, tie_embeddings=t)
    for n, p, b, f, pos, t in itertools.product(
        ["layernorm", "rmsnorm"], ["pre", "post"], [False, True], ["geglu", "swiglu", "gelu"],
        ["rotary", "learned", "sinusoidal"], [True, False])
][::7]  # a spread of the 144 combinations, each option value appearing several times


@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_variant_runs_and_flops_are_exact(objective: str, variant: dict) -> None:
    cfg = ModelConfig(objective=objective, **SMALL, **variant)
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB).eval()
    names = [n for n, _ in model.named_parameters()]
    assert any(n.endswith("bias") for n in names) == variant["bias"]
    ids = torch.randint(0, VOCAB, (2, 24))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        logits = model(ids)
    assert logits.shape == (2, 24, VOCAB) and torch.isfinite(logits).all()
    assert logits.std() > 0  # the model computes something
    expected = forward_flops_per_token(cfg, VOCAB, 24, 1.0) * 2 * 24
    assert counter.get_total_flops() == pytest.approx(expected, rel=1e-6)


def test_recipe_defaults_follow_the_objective() -> None:
    enc, dec = ModelConfig(), ModelConfig(objective="clm")
    assert (enc.norm, enc.ffn, enc.embedding_norm) == ("layernorm", "geglu", True)
    assert (dec.norm, dec.ffn, dec.embedding_norm) == ("rmsnorm", "swiglu", False)
    assert ModelConfig(objective="clm", ffn="geglu").ffn == "geglu"  # explicit wins


def test_options_change_the_function() -> None:
    """Each option is wired: flipping it changes the logits of the same weights' seed."""
    ids = torch.randint(0, VOCAB, (1, 16))
    base = ModelConfig(**SMALL, init_std=0.3)  # large enough that every branch matters
    torch.manual_seed(0)
    ref = build_model(base, VOCAB).eval()(ids)
    for change in [dict(norm="rmsnorm"), dict(norm_position="post"), dict(ffn="swiglu"),
                   dict(positions="sinusoidal"), dict(embedding_norm=False)]:
        torch.manual_seed(0)
        out = build_model(base.model_copy(update=change), VOCAB).eval()(ids)
        assert (out - ref).abs().max() > 1e-3, change


def test_learned_positions_refuse_sequences_past_max_positions() -> None:
    model = build_model(ModelConfig(**SMALL, positions="learned", max_positions=16), VOCAB)
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.zeros(1, 20, dtype=torch.long))


def test_bad_combinations_fail_at_config_time() -> None:
    with pytest.raises(ShoestringError, match="num_kv_heads.*decoders"):
        load_config(None, ["model.num_kv_heads=2"])
    with pytest.raises(ShoestringError, match="must divide num_heads"):
        load_config(None, ["model.objective=clm", "model.num_heads=4", "model.num_kv_heads=3"])
    with pytest.raises(ShoestringError, match="unknown preset 'huge'.*tiny"):
        load_config(None, ["model.preset=huge"])
    with pytest.raises(ShoestringError, match="model.ffn"):
        load_config(None, ["model.ffn=relu"])


def test_presets_are_tensor_parallel_friendly_and_overridable() -> None:
    table = presets()
    assert set(table) == set(PRESET_NAMES)
    for name, cfg in table.items():
        assert cfg.hidden_size % 64 == 0, name
        assert cfg.num_heads % 2 == 0 and cfg.kv_heads % 2 == 0, name
    assert table["gpt2-small"].objective == "clm" and table["base"].objective == "mlm"
    # Encoders follow Cramming's GLU convention: the first FFN projection is BERT's 4·hidden
    # wide and the gate halves it, so the width after the gate is 2·hidden.
    for name, cfg in table.items():
        if cfg.objective == "mlm":
            assert FeedForward(cfg).Wi.out_features == 4 * cfg.hidden_size, name
    cfg = load_config(None, ["model.preset=mini", "model.num_layers=2"]).model
    assert (cfg.hidden_size, cfg.num_layers) == (512, 2)
    # GPT-2 small with GPT-2's vocabulary and tied embeddings has ~124M parameters.
    n = build_model(table["gpt2-small"], 50257).num_params()
    assert 120e6 < n < 130e6
