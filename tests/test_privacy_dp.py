"""DP-SGD fine-tuning (Opacus): the hook trains a real classifier privately, the ε it reports
is Opacus' accountant's for the steps taken, and settings DP-SGD cannot honour exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli, tiny_config
from test_finetune import synthetic, tiny  # noqa: F401  (the module fixture)

from shoestring.errors import ShoestringError
from shoestring.classifier import SequenceClassifier
from shoestring.eval.finetune import Pretrained, Protocol, TaskSettings, run_task
from shoestring.privacy.dp_sgd import PrivateTraining
from shoestring.eval.tasks import TaskData, TaskSpec


def _task(n: int) -> TaskData:
    return TaskData(TaskSpec("syn", "classification", False, ["0", "1"], ["accuracy"]),
                    synthetic(n, 0), {"dev": synthetic(200, 1)}, "synthetic")


def test_private_fine_tuning_spends_what_the_accountant_says(tiny) -> None:  # noqa: F811
    from opacus.accountants import RDPAccountant

    base, meta, tok, tok_path = tiny
    proto = Protocol(lr=1e-3, epochs=1, batch_size=16)
    dp = PrivateTraining(epsilon=8.0, delta=1e-3, max_grad_norm=1.0)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    res = run_task(Pretrained(*tiny), _task(160), TaskSettings(proto, [0], precision="fp32",
                                                               privacy=dp))
    rec = res["seeds"][0]["privacy"]
    steps = math.ceil(160 / 16)
    assert rec["planned_steps"] == steps == rec["steps_accounted"] == res["seeds"][0]["steps"]
    assert rec["sample_rate"] == pytest.approx(1 / 10)
    # The same configuration, accounted from scratch by Opacus' RDP accountant.
    acc = RDPAccountant()
    acc.history = [(rec["noise_multiplier"], rec["sample_rate"], steps)]
    assert rec["epsilon_spent"] == pytest.approx(acc.get_epsilon(1e-3), rel=1e-9)
    # The noise was solved for the target: the whole run spends just under it.
    assert 0.9 * 8.0 <= rec["epsilon_spent"] <= 8.0 and rec["noise_multiplier"] > 0.3
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())  # base untouched


def test_per_example_gradients_match_autograd(tiny) -> None:  # noqa: F811
    """Opacus' hooks (with our bias-free LayerNorm sampler) give each example's own gradient."""
    from opacus import GradSampleModule

    from shoestring.privacy.dp_sgd import _register_samplers

    base, _, _, _ = tiny
    torch.manual_seed(0)
    model = SequenceClassifier(copy.deepcopy(base), 2, dropout=0.0).train()
    ids = torch.randint(5, 100, (3, 9))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 6:] = False
    y = torch.tensor([0, 1, 1])
    want = []
    for i in range(3):
        model.zero_grad()
        F.cross_entropy(model(ids[i : i + 1, : 6 if i == 1 else 9], None), y[i : i + 1]).backward()
        want.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    _register_samplers()
    gsm = GradSampleModule(model, loss_reduction="sum")
    model.zero_grad()
    F.cross_entropy(gsm(ids, mask), y, reduction="sum").backward()
    checked = 0
    for name, p in model.named_parameters():
        if name in want[0]:
            for i in range(3):
                torch.testing.assert_close(p.grad_sample[i], want[i][name], atol=1e-5, rtol=1e-4)
            checked += "norm" in name
    gsm._close()
    assert checked >= 2  # the LayerNorm weights were among them


def test_settings_dp_cannot_honour_are_refused() -> None:
    with pytest.raises(ShoestringError, match="not below 1/n"):
        PrivateTraining(8.0, delta=0.01).check(200, 16, 50)
    with pytest.raises(ShoestringError, match="no amplification"):
        PrivateTraining(8.0, delta=1e-5).check(16, 16, 5)
    with pytest.raises(ShoestringError, match="cannot reach ε = 0.01"):
        PrivateTraining(0.01, delta=1e-5).check(1000, 250, 40)
    with pytest.raises(ShoestringError, match="sane protocol only"):
        PrivateTraining(8.0).check_protocol("sweep", [("syn", 1000)], 16, 5)
    assert PrivateTraining(8.0).check(1000, 16, 100) > 0


@pytest.fixture(scope="module")
def tiny_run(pydocs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shoestring.train.loop import train

    run = tmp_path_factory.mktemp("dprun") / "run"
    train(tiny_config(steps=2, batch_size=8), pydocs_dir, run)
    return run


@pytest.mark.slow
def test_cli_fine_tunes_privately_and_exits_2_on_bad_settings(tiny_run: Path,
                                                              tmp_path: Path) -> None:
    rows = synthetic(64, 7)
    (tmp_path / "train.jsonl").write_text("\n".join(
        json.dumps({"text": e.a, "label": e.label}) for e in rows))
    (tmp_path / "dev.jsonl").write_text("\n".join(
        json.dumps({"text": e.a, "label": e.label}) for e in synthetic(30, 8)))
    spec = f"train={tmp_path}/train.jsonl,dev={tmp_path}/dev.jsonl,text=text,label=label"
    out = tmp_path / "out"
    r = run_cli("eval", str(tiny_run), "--task", spec, "--seeds", "1", "-o", str(out),
                "--precision", "fp32", "--dp-epsilon", "3", "--dp-delta", "1e-3", timeout=900)
    assert r.returncode == 0, r.stderr
    assert "DP-SGD: ε spent" in r.stdout
    assert "Full backward hook" not in r.stderr  # PyTorch's warning on Opacus' hooks, silenced
    results = json.loads((out / "results.json").read_text())
    assert results["privacy"]["target_epsilon"] == 3.0
    [seed] = next(iter(results["tasks"].values()))["seeds"]
    assert seed["privacy"]["epsilon_spent"] <= 3.0 and seed["privacy"]["delta"] == 1e-3
    bad = [
        (["--dp-epsilon", "0"], "--dp-epsilon"),
        (["--dp-epsilon", "8", "--dp-delta", "0.05"], "not below 1/n"),
        (["--dp-epsilon", "8", "--protocol", "sweep"], "sane protocol only"),
        (["--dp-delta", "1e-5"], "without --dp-epsilon"),
        (["--dp-epsilon", "0.001"], "cannot reach"),
    ]
    for flags, message in bad:
        r = run_cli("eval", str(tiny_run), "--task", spec, "--seeds", "1", "-o",
                    str(tmp_path / "bad"), *flags)
        assert r.returncode == 2 and message in r.stderr, (flags, r.stderr)
        assert "Traceback" not in r.stderr and not (tmp_path / "bad").exists()
    r = run_cli("eval", str(tiny_run), "--dp-epsilon", "8")
    assert r.returncode == 2 and "applies to fine-tuning" in r.stderr
