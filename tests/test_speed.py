"""The speed choices (train/speed.py): the eager attention kernel computes what SDPA computes
(every mask kind, grouped-query heads, gradients), and ``auto`` resolves attention and compile
from the device, the memory left and the budget, the same on every rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config
from shoestring.config import ModelConfig, load_config
from shoestring.model.decoder import CausalLM
from shoestring.model.encoder import MaskedLM
from shoestring.model.layers import eager_attention, set_attention_kernel
from shoestring.train import speed
from shoestring.train.budget import Budget
from shoestring.train.loop import train


def _qkv(heads: int = 4, kv_heads: int = 4, T: int = 16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, h, T, 8, generator=g, dtype=dtype, requires_grad=True)
            for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("case", ["plain", "causal", "key-mask", "gqa-causal"])
def test_eager_attention_matches_sdpa_values_and_gradients(case: str) -> None:
    q, k, v = _qkv(kv_heads=2 if case.startswith("gqa") else 4)
    mask = None
    if case == "key-mask":  # padding: the last 5 keys of the second row are not real
        keep = torch.ones(2, 16, dtype=torch.bool)
        keep[1, -5:] = False
        mask = keep[:, None, None, :]
    causal = "causal" in case
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                         enable_gqa=k.shape[1] != q.shape[1])
    out = eager_attention(q, k, v, mask, causal)
    assert torch.allclose(out, ref, atol=1e-5)
    g_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    g_out = torch.autograd.grad(out.square().sum(), (q, k, v))
    for a, b in zip(g_out, g_ref):
        assert torch.allclose(a, b, atol=1e-4)


def test_eager_causal_attention_ignores_the_future() -> None:
    q, k, v = _qkv()
    out = eager_attention(q, k, v, causal=True)
    v2 = v.detach().clone()
    v2[:, :, 8:] = 100.0  # only positions >= 8 change: outputs before them must not
    out2 = eager_attention(q, k, v2, causal=True)
    assert torch.equal(out[:, :, :8], out2[:, :, :8])
    assert not torch.allclose(out[:, :, 8:], out2[:, :, 8:])


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_models_give_the_same_logits_with_either_kernel(objective: str) -> None:
    cfg = ModelConfig(objective=objective, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, num_kv_heads=2 if objective == "clm" else None)
    torch.manual_seed(0)
    model = (MaskedLM if objective == "mlm" else CausalLM)(cfg, 50)
    ids = torch.randint(5, 50, (2, 12))
    ref = model(ids)
    set_attention_kernel(model, "eager")
    assert all(m.kernel == "eager" for m in model.modules() if hasattr(m, "kernel"))
    assert torch.allclose(model(ids), ref, atol=1e-5)
    if objective == "clm":  # padded batches and cached generation go through it too
        mask = torch.ones(2, 12, dtype=torch.bool)
        mask[0, :3] = False
        set_attention_kernel(model, "sdpa")
        ref_pad = model(ids, attention_mask=mask)
        ref_gen = model.generate(ids[:, :5], max_new_tokens=4, temperature=0.0)
        set_attention_kernel(model, "eager")
        assert torch.allclose(model(ids, attention_mask=mask), ref_pad, atol=1e-5)
        assert torch.equal(model.generate(ids[:, :5], max_new_tokens=4, temperature=0.0), ref_gen)
    with pytest.raises(ValueError, match="not one of"):
        set_attention_kernel(model, "flash")


def _choose(**kw):
    args = dict(device_type="cpu", dtype=torch.float32, rows=4, heads=2, kv_heads=2, seq_len=32,
                head_dim=8, layers=2, causal=False, spare_bytes=None, seconds=60.0,
                pipeline=False)
    return speed.choose(kw.pop("attention", "auto"), kw.pop("compile", "auto"), **{**args, **kw})


def test_auto_attention_measures_on_cpu_and_respects_device_length_and_memory() -> None:
    measured = _choose()
    assert measured.attention in ("sdpa", "eager") and "measured fwd+bwd" in measured.why
    assert _choose(device_type="cuda").attention == "sdpa"
    long = _choose(seq_len=speed.EAGER_MAX_SEQ + 1)
    assert long.attention == "sdpa" and "sequences over" in long.why
    tight = _choose(spare_bytes=speed.eager_scores_bytes(4, 2, 32, 2, torch.float32) - 1)
    assert tight.attention == "sdpa" and "would not fit" in tight.why
    assert _choose(attention="eager", device_type="cuda").attention == "eager"  # as configured


def test_time_attention_reports_both_kernels_and_keeps_the_rng() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    t = speed.time_attention(2, 4, 2, 16, 8, torch.float32, causal=True, seconds=0.05)
    assert set(t) == {"sdpa", "eager"} and all(0 < s < 1 for s in t.values())
    assert torch.equal(torch.rand(1), before)  # the probe draws from its own generator


def _threshold(cost) -> float:
    """The shortest run (seconds) a compile of ``cost`` gains MIN_GAIN on: gain(T) is
    T / (c + T/k) − 1, so T = c·k·(1+g) / (k − 1 − g)."""
    g = speed.MIN_GAIN
    return cost.seconds * cost.speedup * (1 + g) / (cost.speedup - 1 - g)


def test_auto_compile_pays_back_the_compile_on_this_device_kind() -> None:
    from shoestring.train.compile_costs import ASSUMED, CompileCost

    gpu, cpu = _threshold(ASSUMED["cuda"]), _threshold(ASSUMED["cpu"])
    # before anything is measured: a GPU compiles runs of a couple of minutes, a CPU waits
    # longer, and the CPU demo's 3 minutes stays eager
    assert 100 < gpu < 120 < 180 < 300 < cpu < 400
    assert _choose(device_type="cuda", seconds=gpu + 1).compile
    assert not _choose(device_type="cuda", seconds=gpu - 1).compile
    assert _choose(seconds=cpu + 1).compile and not _choose(seconds=180.0).compile
    # the 4-minute BERT-base run of issue 48 on an H100 compiles, and says why
    four = _choose(device_type="cuda", seconds=240.0)
    assert four.compile and "compile on" in four.why and "30 s compile" in four.why
    assert "assumed for a GPU" in four.why
    # measured numbers decide instead: a warm cache (3 s) compiles a one-minute run; a
    # compile that buys nothing is never worth it
    warm = CompileCost(3.0, 1.6, "measured")
    assert _choose(device_type="cuda", seconds=60.0, compile_cost=lambda kernel: warm).compile
    useless = CompileCost(1.0, 1.05, "measured")
    assert not _choose(seconds=1e6, compile_cost=lambda kernel: useless).compile
    # the cost is asked for with the attention kernel chosen
    asked = []
    _choose(attention="eager", compile_cost=lambda k: asked.append(k) or warm)
    assert asked == ["eager"]
    assert not _choose(seconds=1e6, pipeline=True).compile
    assert "pipeline" in _choose(seconds=1e6, pipeline=True).why
    assert _choose(compile=True, seconds=1.0).compile
    assert not _choose(compile=False, seconds=1e6).compile
    # a step budget is converted to seconds at the assumed MFU of the measured peak
    b = Budget(steps=1000)
    secs = speed.expected_seconds(b, tokens_per_step=4096, flops_per_token=2e7, peak_flops=4e11)
    assert secs == pytest.approx(1000 * 4096 * 2e7 / (0.3 * 4e11))
    assert speed.expected_seconds(Budget(seconds=90.0, steps=5), 1, 1.0, 1.0) == 90.0


def test_compile_costs_are_measured_per_shape_and_borrowed_per_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoestring.train import compile_costs as cc

    monkeypatch.setenv("SHOESTRING_HOME", str(tmp_path))
    dev = "NVIDIA H100 80GB HBM3"
    assumed = cc.lookup("cuda", dev, "bfloat16", "A")
    gpu = cc.ASSUMED["cuda"]
    assert (assumed.seconds, assumed.speedup) == (gpu.seconds, gpu.speedup)
    assert "assumed" in assumed.source
    # an eager run of shape A: 10 steps of 1,000 tokens, the first taking 2 s, then 1 s each
    entry = cc.record(dev, "bfloat16", "A", False, 10_000, 11.0, 1_000, 2.0)
    assert entry["eager_tokens_per_s"] == pytest.approx(1_000.0)
    # a compiled run of A: first step 31 s (30 s of compiling), then 0.5 s a step
    entry = cc.record(dev, "bfloat16", "A", True, 10_000, 35.5, 1_000, 31.0)
    assert entry["compiled_tokens_per_s"] == pytest.approx(2_000.0)
    assert entry["compile_s"] == pytest.approx(30.5)
    got = cc.lookup("cuda", dev, "bfloat16", "A")
    assert (got.seconds, got.speedup) == (pytest.approx(30.5), pytest.approx(2.0))
    assert "measured for this shape" in got.source
    # a warm cache: the latest compile cost counts
    cc.record(dev, "bfloat16", "A", True, 10_000, 7.5, 1_000, 3.0)
    assert cc.lookup("cuda", dev, "bfloat16", "A").seconds == pytest.approx(2.5)
    # another shape on the same device borrows A's figures; another device does not
    other = cc.lookup("cuda", dev, "bfloat16", "B")
    assert other.speedup == pytest.approx(2.0) and "other shape" in other.source
    assert cc.lookup("cuda", "NVIDIA H200", "bfloat16", "A").speedup == cc.ASSUMED["cuda"].speedup
    # too short to say anything: nothing recorded
    assert cc.record(dev, "bfloat16", "C", False, 2_000, 1.2, 1_000, 1.0) is None
    # an unreadable file is a cache miss, not an error
    cc.records_path().write_text("{not json")
    assert cc.lookup("cuda", dev, "bfloat16", "A").speedup == cc.ASSUMED["cuda"].speedup


def test_a_finished_run_records_its_rate_for_the_next_decision(
        pydocs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoestring.train import compile_costs as cc

    monkeypatch.setenv("SHOESTRING_HOME", str(tmp_path / "home"))
    # a wall-clock budget: a record needs a second of steady steps, which 40 steps of this
    # model did not reach on a quiet machine
    s = train(tiny_config(budget="4s", precision="fp32", attention="sdpa"), pydocs_dir,
              tmp_path / "run")
    records = json.loads(cc.records_path().read_text())
    (key, entry), = records.items()
    assert key.startswith(f"{s['device']} | float32 | mlm 2x64") and "sdpa attention" in key
    assert entry["eager_tokens_per_s"] > 0 and "compiled_tokens_per_s" not in entry
    assert "compile off" in s["speed_choices"] and s["compiled"] is False
    # a damaged or hand-edited cache costs the next run its records, never the run (issue
    # 62): its own key holding a list, NaN elsewhere (json.loads takes it, json.dumps of a
    # finished run's records would not), a boolean and an absurd figure beside them
    path = cc.records_path()
    path.write_text(path.read_text().replace("{", '{"nan": NaN, "bool": {"eager_tokens_per_s": '
                                              'true}, "huge": {"compile_s": 1e300}, ', 1))
    damaged = json.loads(path.read_text())
    damaged[key] = [1, 2]
    path.write_text(json.dumps(damaged))
    train(tiny_config(budget="4s", precision="fp32", attention="sdpa"), pydocs_dir,
          tmp_path / "run2")
    after = json.loads(path.read_text())  # strict JSON again
    assert after[key]["eager_tokens_per_s"] > 0 and after["nan"] is None


def test_damaged_compile_figures_are_ignored_not_trusted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoestring.train import compile_costs as cc

    monkeypatch.setenv("SHOESTRING_HOME", str(tmp_path))
    dev, cpu = "cpu-x", cc.ASSUMED["cpu"]
    key = cc.shape_key(dev, "float32", "A")
    for entry in ({"eager_tokens_per_s": 1e-300, "compiled_tokens_per_s": 1e300},  # ratio inf
                  {"eager_tokens_per_s": 1e300, "compiled_tokens_per_s": 1e-300},  # ratio 0
                  {"eager_tokens_per_s": True, "compiled_tokens_per_s": 5.0, "compile_s": 1e300},
                  {"eager_tokens_per_s": "1", "compile_s": -3}, [1], "x", None):
        cc.records_path().write_text(json.dumps({key: entry}))
        got = cc.lookup("cpu", dev, "float32", "A")
        assert (got.seconds, got.speedup) == (cpu.seconds, cpu.speedup), entry
        assert got.gain(60.0) == cpu.gain(60.0)  # no ZeroDivisionError, no overflow


def _record_many(home: str, worker: int, count: int) -> None:
    os.environ["SHOESTRING_HOME"] = home
    from shoestring.train import compile_costs as cc

    for i in range(count):
        cc.record("dev", "float32", f"w{worker} s{i}", False, 2_000, 3.0, 1_000, 1.0)


def test_concurrent_recorders_keep_every_record(tmp_path: Path) -> None:
    """Three processes recording at once: every record is kept, and no reader ever finds
    the file unreadable (each writer has its own temporary file, and they take turns)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), w, 60)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    records = json.loads((tmp_path / "compile.json").read_text())
    assert len(records) == 180
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_agreed_takes_rank_zeros_choice() -> None:
    mine = speed.SpeedChoices("sdpa", False, "x")
    theirs = speed.agreed(mine, lambda values: [1.0, 1.0])  # what rank 0 broadcast
    assert (theirs.attention, theirs.compile) == ("eager", True)


def test_config_takes_auto_true_false_and_rejects_others() -> None:
    assert load_config().train.compile == "auto" and load_config().train.attention == "auto"
    assert load_config(overrides=["train.compile=true"]).train.compile is True
    assert load_config(overrides=["train.compile=false"]).train.compile is False
    from shoestring.errors import ShoestringError

    with pytest.raises(ShoestringError, match="attention"):
        load_config(overrides=["train.attention=flash"])


def test_training_records_the_choices_and_both_kernels_train_alike(pydocs_dir: Path,
                                                                   tmp_path: Path) -> None:
    kw = dict(steps=3, precision="fp32", log_every=1)
    a = train(tiny_config(**kw, attention="sdpa"), pydocs_dir, tmp_path / "sdpa")
    b = train(tiny_config(**kw, attention="eager"), pydocs_dir, tmp_path / "eager")
    assert (a["attention"], b["attention"]) == ("sdpa", "eager")
    assert a["compiled"] is False and b["compiled"] is False  # auto: 3 steps is too short
    assert a["first_step_s"] > 0
    la = [json.loads(x)["loss"] for x in (tmp_path / "sdpa/metrics.jsonl").read_text().splitlines()
          if '"loss"' in x]
    lb = [json.loads(x)["loss"] for x in (tmp_path / "eager/metrics.jsonl").read_text().splitlines()
          if '"loss"' in x]
    assert len(la) == 3 and la == pytest.approx(lb, abs=1e-4)


def test_a_resumed_auto_run_keeps_its_checkpoints_kernel(pydocs_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(steps=2, attention="eager"), pydocs_dir, run)
    resumed = train(tiny_config(steps=3, attention="auto"), pydocs_dir, run, resume=True)
    assert resumed["attention"] == "eager" and resumed["steps"] == 3
    forced = train(tiny_config(steps=4, attention="sdpa"), pydocs_dir, run, resume=True)
    assert forced["attention"] == "sdpa"  # a kernel given explicitly wins


def test_a_budget_of_many_hours_is_announced_before_the_run() -> None:
    """`--budget 3e15flops` with the mini preset on a laptop meant ~17 h and said so only in
    the bar's ETA: a FLOP, token or step budget past an hour gets a warning up front, a
    wall-clock one never (it bounds itself)."""
    from shoestring.train.budget import Budget

    peak = 4e11  # FLOP/s
    long = speed.long_budget_warning(Budget(flops=3e15), 4096, 2e7, peak)
    hours = 3e15 / (0.3 * peak) / 3600  # the assumed MFU of the measured peak
    assert long is not None and "(3e+15 FLOPs)" in long and f"about {hours:.1f}h" in long
    assert "--budget 10m" in long
    assert speed.long_budget_warning(Budget(flops=1e13), 4096, 2e7, peak) is None  # minutes
    assert speed.long_budget_warning(Budget(seconds=86400.0), 4096, 2e7, peak) is None
    assert speed.long_budget_warning(Budget(steps=10**6), 4096, 2e7, peak) is not None


def test_a_busy_cpu_is_named_beside_the_run() -> None:
    from shoestring.device import busy_note

    assert busy_note(1.5, 2) is None
    note = busy_note(8.0, 2)
    assert note is not None and "load average 8.0 on 2 cores" in note


def test_a_busy_cpu_is_in_the_results_with_what_it_cost() -> None:
    """The results table names the load a run trained under (summary.json's ``cpu_load``)
    and the rough share of a quiet machine's steps it got; nothing on a quiet CPU or a GPU."""
    from shoestring.device import load_cost

    assert load_cost(None) is None
    assert load_cost({"start": 0.5, "end": 1.9, "cores": 2}) is None
    assert load_cost({"start": 0.8, "end": 2.05, "cores": 2}) is None  # the run itself
    row = load_cost({"start": 3.0, "end": 4.0, "cores": 2})
    assert row is not None and "3.0 → 4.0 on 2 cores" in row and "roughly 50%" in row
