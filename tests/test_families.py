"""The model-family registry: every family builds, trains (finite loss that backpropagates),
counts the FLOPs its model really spends, and names itself in errors; every floor registers
its behaviour for every family; and no code outside ``shoestring/families/`` compares family
name strings."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from shoestring import families
from shoestring.config import ModelConfig
from shoestring.errors import ShoestringError
from shoestring.model.losses import causal_lm_loss, masked_lm_loss
from shoestring.model import build_model
from shoestring.model.flops import forward_flops_per_token
from shoestring.train.objectives import objective_for

SRC = Path(__file__).resolve().parents[1] / "src" / "shoestring"
VOCAB, SEQ = 300, 32
SPECIAL = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}


def _cfg(name: str) -> ModelConfig:
    return ModelConfig(objective=name, hidden_size=64, num_layers=2, num_heads=4,
                       intermediate_size=96)


def test_registry_has_the_families_and_config_accepts_exactly_them() -> None:
    assert families.names() == ["mlm", "clm", "contrastive", "rtd"]
    literal = typing.get_args(ModelConfig.model_fields["objective"].annotation)
    assert set(literal) == set(families.names())
    for family in families.all_families():
        assert families.by_architecture(family.architecture) is family
        # the contrastive retriever is an mlm encoder: its base family's export and presets
        assert families.by_hf_model_type(family.hf_model_type) is families.get(family.base)
        assert ModelConfig(preset=family.default_preset).objective == family.base


def test_unknown_family_names_the_field_and_the_known_ones() -> None:
    with pytest.raises(ShoestringError) as e:
        families.get("gpt", where="model.objective")
    assert e.value.where == "model.objective"
    assert "mlm" in e.value.message and "clm" in e.value.message
    with pytest.raises(ShoestringError, match="shoestring-mlm"):
        families.by_architecture("shoestring-xyz")


@pytest.mark.parametrize("name", families.names())
def test_family_builds_trains_and_counts_its_flops(name: str) -> None:
    cfg = _cfg(name)
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB)
    obj = objective_for(families.get(name), SEQ, VOCAB, SPECIAL, 0.25, cfg.sparse_prediction)
    assert obj.spec is families.get(name) and obj.mask_id == 4
    ids = torch.randint(5, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(1))
    batch = obj.make_batch(ids, torch.Generator().manual_seed(2))
    loss = obj.loss(model, batch)
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)

    # validation: the summed loss over the scored positions averages to the training loss
    model.eval()
    with torch.no_grad():
        total, count = obj.loss_sum(model, obj.validation_batch(
            ids, 0, type("E", (), {"mask_rate": 0.25, "seed": 0})()))
    assert count > 0 and torch.isfinite(total)

    # FLOPs: the forward the loss runs costs what model/flops.py says (SDPA as matmuls)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        obj.loss(model, batch)
    # a contrastive step encodes two sequences per row (query and positive), no vocab head
    passes = batch if name == "contrastive" else (ids,)
    expected = sum(forward_flops_per_token(cfg, VOCAB, t.shape[1], obj.head_fraction) * t.numel()
                   for t in passes)
    if name == "contrastive":  # + the query-by-positive similarity matmul
        expected += 2 * len(ids) * len(ids) * cfg.hidden_size
    assert counter.get_total_flops() == pytest.approx(expected, rel=1e-6)


def test_every_floor_registers_every_family() -> None:
    """A family is constants at the bottom plus one registration per floor: a new family that
    misses one fails here, not in a user's run. The contrastive family has no HF export and no
    pretraining loss for planner sweeps; those entry points refuse it by name."""
    from shoestring.eval.held_out import HELD_OUT, held_out_loss
    from shoestring.export.hub import EXPORTERS, IMPORTERS
    from shoestring.model import BUILDERS
    from shoestring.inference.engine import ENGINES
    from shoestring.train.objectives import OBJECTIVES

    names = set(families.names())
    for registry in (BUILDERS, OBJECTIVES, ENGINES):
        assert set(registry) == names
    hf_families = {f.base for f in families.all_families()}
    assert set(EXPORTERS) == set(IMPORTERS) == set(HELD_OUT) == hf_families
    with pytest.raises(ShoestringError, match="contrastive run has none"):
        held_out_loss(families.CONTRASTIVE, Path("."), 1, 8)


def test_family_specs_are_constants_that_import_nothing_above_errors() -> None:
    import dataclasses
    import subprocess
    import sys

    spec = families.get("mlm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "x"  # type: ignore[misc]
    assert families.get("clm").special_tokens("bpe") == ["<|endoftext|>", "<|pad|>"]
    assert families.get("clm").special_tokens("wordpiece")[-1] == "<|unk|>"
    assert families.get("mlm").special_tokens("bpe")[families.get("mlm").specials.index(
        "[MASK]")] == "[MASK]"
    assert families.get("clm").default_seq_len(5e6) == 256
    assert families.get("clm").default_seq_len(5e9) == 2048
    assert families.get("mlm").head_fraction(True, 130, 0.25) == pytest.approx(32 / 130)
    assert families.get("contrastive").head_matmul_params(8, 100) == 0
    code = ("import json, sys, shoestring.families; print(json.dumps(sorted(m for m in "
            "sys.modules if m.startswith('shoestring'))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {m for m in json.loads(run.stdout) if not m.startswith("shoestring.families")}
    assert loaded <= {"shoestring", "shoestring.errors"}, loaded


def test_the_two_losses_agree_with_plain_cross_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(2, 6, 11, generator=g), torch.randint(0, 11, (2, 6), generator=g)
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
    assert causal_lm_loss(logits, ids) == pytest.approx(ref.item())
    assert causal_lm_loss(logits[:, :-1], ids) == pytest.approx(ref.item())
    positions = torch.tensor([[1, 3], [0, 5]])
    targets = ids.gather(1, positions)
    sparse = masked_lm_loss(logits.gather(1, positions[..., None].expand(-1, -1, 11)), targets)
    assert masked_lm_loss(logits, targets, positions) == pytest.approx(sparse.item())


# `x == "mlm"`, `"clm" != x`, `x in ("mlm", "clm")`, and the architecture / HF names
_COMPARISON = re.compile(
    r"""[=!]=\s*["'](mlm|clm|shoestring-mlm|shoestring-clm|llama|modernbert)["']"""
    r"""|["'](mlm|clm)["']\s*[=!]="""
    r"""|\bin\s*[(\[{]\s*["'](mlm|clm)["']""")


def test_no_family_string_comparisons_outside_families() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("families/"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _COMPARISON.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "family comparisons outside families/:\n" + "\n".join(found)


def test_config_imports_no_stage_and_no_torch() -> None:
    import json
    import subprocess
    import sys

    code = ("import json, sys, shoestring.config; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('shoestring', 'torch'))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(run.stdout)
    assert "torch" not in loaded
    stages = {"plan", "data", "model", "train", "dist", "eval", "serve"}
    assert not [m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in stages], loaded
