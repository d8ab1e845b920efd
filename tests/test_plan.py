"""The planner's math and decisions: laws, compute-optimal sizes, the fit, hardware, memory."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from shoestring.config import Config, ModelConfig
from shoestring.errors import ShoestringError
from shoestring.families import CLM, MLM
from shoestring.plan import fit as F
from shoestring.datasheets import HARDWARE, lookup
from shoestring.plan.hardware import get_hardware
from shoestring.plan.laws import (
    CHINCHILLA_2022,
    EPOCH_2024,
    PF_DAY,
    Law,
    law_to_yaml,
    load_law,
    pf_days,
    training_flops,
)
from shoestring.plan.placement import layout_for
from shoestring.plan.planner import PlanRequest, make_plan, plan_to_yaml
from shoestring.plan.shapes import candidates, count_params, flops_per_token, make_config


def test_six_n_d_and_pf_days() -> None:
    assert training_flops(70e9, 1.4e12) == pytest.approx(5.88e23)
    assert PF_DAY == 8.64e19
    assert pf_days(8.64e19) == pytest.approx(1.0)
    assert pf_days(5.76e23) == pytest.approx(5.76e23 / 8.64e19)


def test_default_law_reproduces_chinchilla_70b() -> None:
    """Chinchilla: 70B parameters on 1.4T tokens at 5.76e23 FLOPs."""
    n, d = EPOCH_2024.optimal(5.76e23)
    assert n == pytest.approx(70e9, rel=0.10)
    assert d == pytest.approx(1.4e12, rel=0.10)
    assert training_flops(n, d) == pytest.approx(5.76e23)
    # the closed form is the minimum of the law along C = 6ND
    for f in (0.8, 1.25):
        assert EPOCH_2024.loss(n * f, 5.76e23 / (6 * n * f)) > EPOCH_2024.loss(n, d)
    # the original constants famously do not (they give roughly half the size)
    n_c, _ = CHINCHILLA_2022.optimal(5.76e23)
    assert n_c < 0.6 * 70e9


def test_law_file_round_trip(tmp_path) -> None:
    path = tmp_path / "law.yaml"
    path.write_text(law_to_yaml(EPOCH_2024, {"fit": {"points": 3}}))
    law = load_law(str(path))
    assert (law.E, law.A, law.B, law.alpha, law.beta) == (
        EPOCH_2024.E, EPOCH_2024.A, EPOCH_2024.B, EPOCH_2024.alpha, EPOCH_2024.beta)
    assert load_law("chinchilla") is CHINCHILLA_2022
    with pytest.raises(ShoestringError, match="unknown law"):
        load_law(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("law: {E: 1.0, A: 2.0, B: x, alpha: 0.3, beta: 0.3}\n")
    with pytest.raises(ShoestringError, match="law.B"):
        load_law(str(bad))


def _synthetic(law: Law, noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    n, d, loss = [], [], []
    for c in np.geomspace(1e17, 3e19, 6):
        n0, _ = law.optimal(c)
        for f in (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8):
            n.append(n0 * f)
            d.append(c / (6 * n0 * f))
            loss.append(law.loss(n[-1], d[-1]) * math.exp(rng.normal(0, noise)))
    return n, d, loss


def test_fit_recovers_known_constants_from_noisy_losses() -> None:
    truth = Law("truth", E=1.9, A=400.0, B=1500.0, alpha=0.33, beta=0.37)
    n, d, loss = _synthetic(truth, noise=0.005)
    got = F.fit_law(n, d, loss).law
    assert got.alpha == pytest.approx(truth.alpha, abs=0.03)
    assert got.beta == pytest.approx(truth.beta, abs=0.03)
    assert got.E == pytest.approx(truth.E, rel=0.05)
    # what matters for planning: the compute-optimal size over the fitted range, and losses
    for c in (1e17, 1e18, 1e19):
        assert got.optimal(c)[0] == pytest.approx(truth.optimal(c)[0], rel=0.25)
    for ni, di in zip(n, d):
        assert got.loss(ni, di) == pytest.approx(truth.loss(ni, di), rel=0.01)


def test_fit_needs_enough_points() -> None:
    with pytest.raises(ShoestringError, match="5 constants"):
        F.fit_law([1e6, 2e6], [1e7, 2e7], [3.0, 2.9])


def test_isoflop_parabola_minimum() -> None:
    # exact parabola in ln N with its minimum at N = 1e6 on each budget
    pts = []
    for c, n_star in ((1e15, 1e6), (1e16, 4e6)):
        for f in (0.25, 0.5, 1, 2, 4):
            x = math.log(n_star * f)
            pts.append({"budget_flops": c, "params_non_embedding": n_star * f,
                        "val_loss": 3.0 + 0.1 * (x - math.log(n_star)) ** 2})
    minima = F.isoflop_minima(pts)
    assert [m.params for m in minima] == pytest.approx([1e6, 4e6], rel=1e-6)
    k, a = F.power_law([m.flops for m in minima], [m.params for m in minima])
    assert a == pytest.approx(math.log(4) / math.log(10))


def test_hardware_table_and_lookup() -> None:
    for name in ("v100", "t4", "rtx2080ti", "rtx3090", "rtx4090", "a100-40gb", "a100", "a6000",
                 "l4", "l40s", "h100", "h100-pcie", "h200", "b200", "mi300x"):
        hw = HARDWARE[name]
        assert hw.source.startswith("https://")
        assert hw.fp32 > 0 and hw.memory_gb > 0
        peak, dtype = hw.peak()
        assert peak >= hw.fp32
    assert lookup("H100_SXM").name == "h100"
    assert lookup("RTX 4090").name == "rtx4090"
    assert HARDWARE["h100"].peak()[0] == pytest.approx(989.4e12)
    assert HARDWARE["v100"].peak() == (125e12, "fp16")  # no bf16 on Volta
    with pytest.raises(ShoestringError, match="unknown hardware") as e:
        get_hardware("tpu-v9000")
    assert "h100" in e.value.message


def test_gpu_names_as_torch_reports_them_find_their_datasheet_row() -> None:
    from shoestring.datasheets import from_device_name
    from shoestring.device import _datasheet

    seen = {
        "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H100 PCIe": "h100-pcie",
        "NVIDIA A100-SXM4-40GB": "a100-40gb", "NVIDIA A100-SXM4-80GB": "a100",
        "NVIDIA A100 80GB PCIe": "a100", "Tesla V100-SXM2-16GB": "v100-16gb",
        "Tesla V100-SXM2-32GB": "v100", "Tesla T4": "t4", "NVIDIA L4": "l4",
        "NVIDIA L40S": "l40s", "NVIDIA RTX A6000": "a6000", "NVIDIA GeForce RTX 4090": "rtx4090",
        "NVIDIA H200": "h200", "AMD Instinct MI300X": "mi300x",
    }
    for device_name, row in seen.items():
        assert from_device_name(device_name).name == row, device_name
    # variants the table has no row for, and CPUs, have no datasheet peak (never a wrong one)
    for device_name in ("NVIDIA H100 NVL", "NVIDIA A10G", "cpu (x86_64, 2 threads)"):
        assert from_device_name(device_name) is None
    assert _datasheet("NVIDIA H100 80GB HBM3", torch.bfloat16) == (989.4e12, "h100")
    assert _datasheet("Tesla V100-SXM2-32GB", torch.bfloat16) == (None, None)  # no bf16 units
    assert _datasheet("Tesla V100-SXM2-32GB", torch.float16) == (125e12, "v100")
    assert _datasheet("cpu (x86_64, 2 threads)", torch.bfloat16) == (None, None)


def test_auto_hardware_is_measured_here() -> None:
    hw = get_hardware("auto")
    assert hw.measured and hw.fp32 > 1e9 and hw.memory_gb > 0


# One budget grammar: every string one command takes, every other takes, meaning the same.
BUDGETS = [("24h", "seconds", 86400.0), ("90s", "seconds", 90.0), ("3e18flops", "flops", 3e18),
           ("30Tflops", "flops", 30e12), ("2 PF-days", "flops", 2 * 8.64e19),
           ("1e15", "flops", 1e15), ("20Mtok", "tokens", 20e6), ("2e6 tokens", "tokens", 2e6),
           ("500steps", "steps", 500.0)]


@pytest.mark.parametrize(("text", "kind", "amount"), BUDGETS)
def test_every_command_reads_every_budget_string(text: str, kind: str, amount: float) -> None:
    """`plan`, `train` (config train.budget and --budget) and the parser they share agree on
    every form; the planner turns tokens and steps into the smallest FLOP budget that buys
    them, so a plan for N tokens trains at least N tokens."""
    from shoestring.units import parse_budget

    spec = parse_budget(text)
    assert (spec.kind, spec.amount) == (kind, pytest.approx(amount))
    assert Config.model_validate({"train": {"budget": text}}).train.budget.text == text
    plan = make_plan(PlanRequest(hardware="h100", devices=1, budget=text, objective="mlm"))
    budget = plan["plan"]["budget"]
    if kind == "flops":
        assert budget["flops"] == pytest.approx(amount)
    elif kind == "tokens":
        assert plan["plan"]["model"]["tokens"] >= amount
    elif kind == "steps":
        assert plan["plan"]["batch"]["steps"] >= amount
    else:
        assert budget["flops"] == pytest.approx(amount * budget["mfu"] * 989e12, rel=0.05)


def test_a_bad_budget_names_the_flag_and_the_grammar() -> None:
    with pytest.raises(ShoestringError, match="not a duration, FLOP, token or step") as e:
        make_plan(PlanRequest(hardware="h100", budget="lots"))
    assert e.value.where == "--budget" and "pf-days" in e.value.fix


def test_shapes_counts_are_the_real_models() -> None:
    import torch

    from shoestring.model import build_model

    for family in (MLM, CLM):
        cfg = make_config(family, 192, 3)
        model = build_model(cfg, 1000)
        assert count_params(cfg, 1000) == (model.num_params(), model.num_params(non_embedding=True))
        assert cfg.hidden_size % 64 == 0 and cfg.hidden_size % cfg.num_heads == 0
    shapes = candidates(CLM, 32768, 2048, max_params=2e10)
    for s in shapes:
        if s.model.hidden_size >= 1024:
            assert s.model.num_heads % 8 == 0, s.label  # tensor parallel 2/4/8 divides heads
    assert torch.get_default_device().type == "cpu"  # meta building leaves no trace


def test_plan_h100_node_day() -> None:
    tree = make_plan(PlanRequest(hardware="h100", devices=8, budget="24h", mfu=0.4,
                                 objective="clm"))
    p = tree["plan"]
    assert p["budget"]["flops"] == pytest.approx(989.4e12 * 8 * 86400 * 0.4)
    assert p["budget"]["pf_days"] == pytest.approx(p["budget"]["flops"] / 8.64e19)
    assert p["budget"]["wall_clock_s"] == pytest.approx(86400)
    n_opt = p["optimum"]["params"]
    assert p["model"]["params_non_embedding"] == pytest.approx(n_opt, rel=0.5)
    assert tree["model"]["hidden_size"] % 64 == 0
    assert tree["model"]["num_heads"] % 8 == 0
    # tokens are what the budget buys for this exact model
    spent = p["model"]["tokens"] * p["model"]["flops_per_token"]
    assert spent == pytest.approx(p["budget"]["flops"])
    assert p["layout"]["fits"] and p["layout"]["memory_gb"] < 80
    assert sum("scale of the law's data" in n for n in p["notes"]) == 1
    # the sections are a valid config as they stand
    cfg = Config.model_validate({k: tree[k] for k in ("model", "train", "data")})
    assert cfg.model.objective == "clm"
    text = plan_to_yaml(tree)
    assert yaml.safe_load(text)["plan"]["hardware"]["name"] == "h100"


def test_bigger_budget_bigger_model_and_layout() -> None:
    small = make_plan(PlanRequest(hardware="rtx4090", devices=1, budget="1h", objective="mlm"))
    big = make_plan(PlanRequest(hardware="a100", devices=512, budget="30d", objective="clm"))
    assert big["plan"]["model"]["params"] > 100 * small["plan"]["model"]["params"]
    assert small["plan"]["layout"]["kind"] == "one device"
    assert big["plan"]["layout"]["zero"] == 3 or big["plan"]["layout"]["tp"] > 1


def test_layout_escalates_when_memory_runs_out() -> None:
    def plan(cfg: ModelConfig, **over: int) -> object:
        kw = dict(vocab=32768, seq_len=2048, global_batch=512, devices=64, devices_per_node=8,
                  memory_gb=80)
        return layout_for(cfg, **{**kw, **over})

    small = ModelConfig(objective="clm", hidden_size=768, num_layers=12, num_heads=12,
                        intermediate_size=2048)  # ~100M parameters
    llama70 = ModelConfig(objective="clm", hidden_size=8192, num_layers=80, num_heads=64,
                          num_kv_heads=8, intermediate_size=28672)  # ~70B parameters
    first = plan(small)
    assert first.zero == 0 and first.fits  # DDP: fits replicated
    assert first.model == "shoestring.dist.memory (per-rank model)"  # the one memory model
    big = plan(llama70)
    assert big.fits and (big.zero == 3 or big.tp > 1)
    assert big.micro_batch * big.grad_accum * big.dp == 512
    assert not plan(llama70, devices=1, devices_per_node=1).fits


def test_the_planned_layout_reaches_the_memory_model_as_a_layout() -> None:
    """The planner prices each candidate as the `Layout` the trainer would run: its figure is
    the memory model's for that object."""
    from shoestring.dist.layout import make_layout
    from shoestring.dist.memory import memory_per_rank
    from shoestring.plan.placement import GB

    cfg = ModelConfig(objective="clm", hidden_size=8192, num_layers=80, num_heads=64,
                      num_kv_heads=8, intermediate_size=28672)
    got = layout_for(cfg, vocab=32768, seq_len=2048, global_batch=512, devices=64,
                     devices_per_node=8, memory_gb=80)
    layout = make_layout({"dp": got.dp, "tp": got.tp, "pp": got.pp}, zero=got.zero,
                         ac="full" if got.checkpointing else "none")
    est = memory_per_rank(cfg, 32768, 2048, got.micro_batch, layout)
    parts = ("params", "params_transient", "grads", "optimizer", "activations")
    assert got.memory_gb == pytest.approx(sum(est[k] for k in parts) / GB, abs=1e-3)


def test_impossible_requests() -> None:
    with pytest.raises(ShoestringError, match="devices"):
        make_plan(PlanRequest(hardware="h100", devices=0, budget="1h"))
    with pytest.raises(ShoestringError, match="unknown hardware"):
        make_plan(PlanRequest(hardware="quantum-9", budget="1h"))
    with pytest.raises(ShoestringError, match="budget too small"):
        make_plan(PlanRequest(hardware="t4", budget="1e9flops"))
    with pytest.raises(ShoestringError, match="--mfu"):
        make_plan(PlanRequest(hardware="t4", budget="1h", mfu=1.5))
    with pytest.raises(ShoestringError, match="--measure"):
        make_plan(PlanRequest(hardware="t4", budget="1h", measure=True))


def test_data_dir_gives_epochs_and_repeat_warning(pydocs_dir) -> None:
    from shoestring.data.datadir import DataDir

    d = DataDir(pydocs_dir)
    train_tokens = d.manifest["splits"]["train"]["tokens"]
    few = make_plan(PlanRequest(hardware="t4", budget="3e12flops", data=str(pydocs_dir)))
    many = make_plan(PlanRequest(hardware="t4", budget="1e15flops", data=str(pydocs_dir)))
    assert few["data"]["seq_len"] == d.seq_len and few["data"]["vocab_size"] == d.vocab_size
    assert few["plan"]["data"]["epochs"] == pytest.approx(
        few["plan"]["model"]["tokens"] / train_tokens, rel=1e-3)
    assert "warning" not in few["plan"]["data"] or few["plan"]["data"]["epochs"] > 4
    assert many["plan"]["data"]["epochs"] > 4
    assert "repeats the data" in many["plan"]["data"]["warning"]


def test_measured_mfu_is_a_fraction() -> None:
    from shoestring.plan.hardware import measure_this_device
    from shoestring.plan.measure import measure_mfu

    hw = measure_this_device()
    mfu = measure_mfu(ModelConfig(hidden_size=64, num_layers=2, num_heads=1,
                                  intermediate_size=192), 2000, 64, 8, hw, seconds=0.3)
    assert 0.0 < mfu < 1.5  # a loaded machine can beat its own noisy peak measurement a bit
    assert flops_per_token(make_config(MLM, 64, 2), 2000, 64) > 0


def test_processes_on_one_cpu_share_its_measured_peak() -> None:
    # `plan --devices 2` on a CPU starts two processes on this machine: together they have
    # the machine's peak, not twice it (the measurement is cached, so both plans see one peak)
    import torch

    if torch.cuda.is_available():
        pytest.skip("'auto' is a GPU here; the shared-cores rule is for a CPU")
    import os

    cores = len(os.sched_getaffinity(0))
    if torch.get_num_threads() * 2 <= cores:
        pytest.skip("the peak is measured with at most half the cores: two processes fit")
    one = make_plan(PlanRequest(hardware="auto", devices=1, budget="1h", mfu=0.3))["plan"]
    two = make_plan(PlanRequest(hardware="auto", devices=2, budget="1h", mfu=0.3))["plan"]
    share = cores / (2 * torch.get_num_threads())
    assert two["hardware"]["peak_flops"] == pytest.approx(one["hardware"]["peak_flops"] * share)
    assert two["budget"]["flops"] == pytest.approx(one["budget"]["flops"])
    assert any("share its cores" in n for n in two["notes"])
    assert not any("share its cores" in n for n in one["notes"])


def test_a_multi_device_plan_carries_its_layout_as_the_parallel_section(tmp_path: Path) -> None:
    """The plan's layout is config, not flags: `parallel:` in the plan file, read by
    `train --plan` (load_config), and the layout built from it is the one the plan chose."""
    from shoestring.config import load_config
    from shoestring.dist.layout import config_of, layout_from_config
    from shoestring.plan.planner import launch_line, write_plan

    tree = make_plan(PlanRequest(hardware="a100", devices=64, budget="30d", objective="clm"))
    lay = tree["plan"]["layout"]
    assert tree["parallel"] == {"dp": lay["dp"], "tp": lay["tp"], "pp": lay["pp"],
                                "zero": lay["zero"],
                                "ac": "full" if lay["checkpointing"] else "none"}
    assert "--parallel" not in launch_line(tree) and "torchrun" in launch_line(tree)
    path = write_plan(tree, tmp_path / "plan.yaml")
    cfg = load_config(None, plan=path)
    layout = layout_from_config(cfg.parallel, world_size=64)
    assert (layout.dp, layout.tp, layout.pp, layout.zero) == (
        lay["dp"], lay["tp"], lay["pp"], lay["zero"])
    assert layout_from_config(config_of(layout), world_size=64) == layout  # round trip
    one = make_plan(PlanRequest(hardware="rtx4090", devices=1, budget="1h", objective="mlm"))
    assert "parallel" not in one and "torchrun" not in launch_line(one)


def test_unset_degrees_mean_data_parallel_over_the_ranks_left() -> None:
    from shoestring.config import ParallelConfig
    from shoestring.dist.layout import layout_from_config

    assert layout_from_config(ParallelConfig(), 4).dp == 4
    tp2 = layout_from_config(ParallelConfig(tp=2, zero=3), 8)
    assert (tp2.dp, tp2.tp, tp2.dp_shard) == (4, 2, 4)  # ZeRO-3: dp shards
    assert layout_from_config(ParallelConfig(dp=2), 4).world_size == 2  # given: kept (and
    # refused by validate against a world of 4, as before)


def test_a_tiny_budgets_meaningless_loss_is_explained_once_plainly() -> None:
    """Below the law's range its loss is no loss (above a uniform guess, shown clamped), on
    another objective's scale too: one plain note says all of it (issue 62: three notes)."""
    tree = make_plan(PlanRequest(hardware="t4", budget="30s", mfu=0.001, objective="mlm"))
    p = tree["plan"]
    about = [n for n in p["notes"]
             if "loss" in n and ("scale" in n or "uniform" in n or "fitted on" in n)]
    assert len(about) == 1, p["notes"]
    ceiling = math.log(tree["data"]["vocab_size"])
    assert about[0].startswith("the predicted loss means nothing here")
    assert f"{ceiling:.2f} is shown" in about[0] and "CLM" in about[0] and "MLM" in about[0]
    assert p["model"]["predicted_loss"] == pytest.approx(ceiling)
    big = make_plan(PlanRequest(hardware="h100", budget="1h", objective="clm"))["plan"]
    assert sum("loss" in n and "scale" in n for n in big["notes"]) == 1
    assert not any("means nothing" in n for n in big["notes"])


def test_a_family_plans_on_the_data_of_the_family_it_builds_from(pydocs_dir: Path) -> None:
    """RTD trains on masked-LM data dirs, so `plan --objective rtd --data <mlm dir>` plans RTD
    there; an objective whose data differs (clm) is refused, naming both."""
    tree = make_plan(PlanRequest(hardware="h100", budget="1h", data=str(pydocs_dir),
                                 objective="rtd", mfu=0.35))
    assert tree["model"]["objective"] == "rtd" and tree["plan"]["model"]["tokens"] > 0
    with pytest.raises(ShoestringError, match="prepared for clm, and the data dir was "
                                              "prepared for mlm"):
        make_plan(PlanRequest(hardware="h100", budget="1h", data=str(pydocs_dir),
                              objective="clm", mfu=0.35))
