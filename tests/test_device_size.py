"""`train` and `cram` on a GPU with no size given (plan/device_size.py): the model, batch and LR
are the planner's for the budget at the device's rate, what the user set wins field by field,
and the CPU keeps its demo. Without a GPU the choice is computed for an H100 from its
datasheet row and a given rate: the same numbers a GPU run gets from its measurement."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoestring.config import load_config
from shoestring.plan.device_size import applies, for_this_device, size_for_device
from shoestring.plan.hyper import plan_hyper
from shoestring.plan.planner import PlanRequest, make_plan

H100_BF16 = 989e12  # shoestring.datasheets's datasheet row, dense bf16


def test_only_a_gpu_run_with_something_unset_is_sized() -> None:
    default = load_config(None, [])
    assert applies(default, "cuda", 1)
    assert not applies(default, "cpu", 1)  # the CPU demo keeps its model and its minutes
    assert not applies(default, "cuda", 2)  # a torchrun job takes its size from a plan
    assert applies(load_config(None, ["model.preset=base"]), "cuda", 1)  # batch, LR left
    everything = load_config(None, ["model.preset=base", "train.batch_size=64",
                                    "train.micro_batch_size=32", "train.lr=1e-3"])
    assert not applies(everything, "cuda", 1)


def test_an_h100_with_no_size_trains_the_plan_for_its_budget(pydocs_dir: Path) -> None:
    cfg = load_config(None, ["train.budget=1h"])
    s = size_for_device(cfg, pydocs_dir, hardware="h100", mfu=0.35)
    plan = make_plan(PlanRequest(hardware="h100", budget="1h", data=str(pydocs_dir), mfu=0.35))
    for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        assert s.chosen[f"model.{key}"] == plan["model"][key]
    assert s.chosen["train.batch_size"] == plan["train"]["batch_size"]
    assert s.chosen["train.lr"] == plan["train"]["lr"]
    assert "NVIDIA H100" in s.why and "35% MFU (given)" in s.why and "batch" in s.why
    sized = s.apply(cfg)
    assert sized.model.hidden_size == plan["model"]["hidden_size"] and sized.model.preset is None
    assert sized.train.budget.text == "1h"  # the user's wall clock stays; only sizes change
    # a slower measured rate buys less compute: a batch no larger, a peak LR no lower
    slow = size_for_device(cfg, pydocs_dir, hardware="h100", mfu=0.05)
    assert slow.chosen["train.batch_size"] < s.chosen["train.batch_size"]
    assert slow.chosen["train.lr"] > s.chosen["train.lr"]
    # on the GPU the CPU demo's batch of 32 and LR 2e-3 would be far off the plan
    assert s.chosen["train.batch_size"] > 8 * default_batch()


def default_batch() -> int:
    return load_config(None, []).train.batch_size


def test_a_given_model_gets_its_batch_and_lr_for_the_budget(pydocs_dir: Path) -> None:
    from shoestring.data.datadir import DataDir

    cfg = load_config(None, ["model.preset=base", "train.budget=1h"])
    s = size_for_device(cfg, pydocs_dir, hardware="h100", mfu=0.35)
    data = DataDir(pydocs_dir)
    want = plan_hyper(H100_BF16 * 3600 * 0.35, data.seq_len, 1,
                      data.manifest["splits"]["train"]["sequences"])
    assert not any(k.startswith("model.") for k in s.chosen)  # the size the user gave wins
    assert s.chosen["train.batch_size"] == want.batch_sequences
    assert s.chosen["train.lr"] == want.lr
    assert f"{H100_BF16 * 3600 * 0.35:.3g} FLOPs" in s.why
    # what the user set is kept, field by field
    lr_given = load_config(None, ["model.preset=base", "train.budget=1h", "train.lr=3e-4"])
    kept = size_for_device(lr_given, pydocs_dir, hardware="h100", mfu=0.35)
    assert "train.lr" not in kept.chosen and kept.apply(lr_given).train.lr == 3e-4
    batch_given = load_config(None, ["model.preset=base", "train.budget=1h",
                                     "train.batch_size=64"])
    kept = size_for_device(batch_given, pydocs_dir, hardware="h100", mfu=0.35)
    assert set(kept.chosen) == {"train.lr"}  # no micro-batch chosen against a given batch
    # with no rate given, the trainer's own step is timed here (on a GPU: the GPU's rate)
    small = load_config(None, ["model.hidden_size=64", "model.num_layers=2",
                               "model.num_heads=2", "model.intermediate_size=128",
                               "train.budget=1m"])
    measured = size_for_device(small, pydocs_dir)
    assert "MFU (measured)" in measured.why and "train.batch_size" in measured.chosen
    # a step budget's compute depends on the batch: nothing is chosen for a given model
    steps = load_config(None, ["model.preset=base", "train.budget=null", "train.steps=100"])
    assert size_for_device(steps, pydocs_dir, hardware="h100", mfu=0.35).chosen == {}


def test_rtd_lr_is_sized_by_the_law_anchored_at_its_own_recipe(pydocs_dir: Path) -> None:
    """RTD's recipe fills train.lr (families/rtd.py) but that is not the user's choice: on a
    device it is sized like MLM's, by the same law anchored at RTD's recipe LR; an LR the user
    sets is still kept."""
    from shoestring.config import TrainConfig
    from shoestring.data.datadir import DataDir
    from shoestring.families import RTD

    ratio = TrainConfig(**RTD.train_recipe).lr / TrainConfig().lr
    data = DataDir(pydocs_dir)
    flops = H100_BF16 * 3600 * 0.35
    given = load_config(None, ["model.objective=rtd", "model.preset=base", "train.budget=1h"])
    assert applies(given, "cuda", 1)
    s = size_for_device(given, pydocs_dir, hardware="h100", mfu=0.35)
    want = plan_hyper(flops, data.seq_len, 1, data.manifest["splits"]["train"]["sequences"],
                      TrainConfig(**RTD.train_recipe).lr)
    assert s.chosen["train.lr"] == want.lr
    mlm = size_for_device(load_config(None, ["model.preset=base", "train.budget=1h"]),
                          pydocs_dir, hardware="h100", mfu=0.35)
    assert s.chosen["train.lr"] == pytest.approx(mlm.chosen["train.lr"] * ratio, rel=1e-2)
    unsized = load_config(None, ["model.objective=rtd", "train.budget=1h"])
    planned = size_for_device(unsized, pydocs_dir, hardware="h100", mfu=0.35)
    plain = size_for_device(load_config(None, ["train.budget=1h"]), pydocs_dir,
                            hardware="h100", mfu=0.35)
    assert planned.chosen["train.lr"] == pytest.approx(plain.chosen["train.lr"] * ratio,
                                                       rel=1e-2)
    # RTD is planned as itself on the masked LM's data: its step also pays the generator, so
    # the same compute buys a model no larger, of the masked LM presets' proportions
    shape = ("model.hidden_size", "model.num_layers", "model.intermediate_size")
    r, m = ([c[k] for k in shape] for c in (planned.chosen, plain.chosen))
    assert r[0] * r[1] <= m[0] * m[1] and r[2] / r[0] == m[2] / m[0] and r != m
    mine = load_config(None, ["model.objective=rtd", "model.preset=base", "train.budget=1h",
                              "train.lr=3e-4"])
    assert "train.lr" not in size_for_device(mine, pydocs_dir, hardware="h100",
                                             mfu=0.35).chosen


def test_on_this_cpu_nothing_is_sized(pydocs_dir: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CPU path is not what runs here")
    cfg = load_config(None, [])
    same, sizing = for_this_device(cfg, pydocs_dir)
    assert sizing is None and same is cfg
