"""shoestring.dist without launching processes: layout parsing and validation, the mesh
arithmetic and a fake-process-group dry run at MT-NLG scale, and the memory model."""

from __future__ import annotations

import pytest

from shoestring.config import ModelConfig
from shoestring.dist.layout import Layout, make_layout, validate
from shoestring.dist.memory import memory_per_rank, param_counts
from shoestring.dist.mesh import DIM_ORDER, dry_run, mesh_dims, rank_coords
from shoestring.errors import ShoestringError

MODEL = dict(num_layers=4, num_heads=4, hidden_size=64, intermediate_size=128, vocab_size=2000,
             batch_size=8)


def check(layout: Layout, world: int, **over: int) -> Layout:
    return validate(layout, world, **{**MODEL, **over})


# --------------------------------------------------------------------------- parsing


def test_parse_degrees_and_dp_meaning_per_zero_stage() -> None:
    assert make_layout("dp=2,tp=2,pp=2", zero=2).world_size == 8
    assert make_layout("dp=4").dp_replicate == 4  # ZeRO 0/1: replicas
    z3 = make_layout("dp=4", zero=3)
    assert (z3.dp_replicate, z3.dp_shard, z3.fsdp) == (1, 4, True)  # ZeRO 2/3: shards
    hsdp = make_layout("dp_replicate=2,dp_shard=4", zero=3)
    assert (hsdp.dp, hsdp.dp_replicate, hsdp.dp_shard) == (8, 2, 4)
    assert make_layout("dp=8,dp_shard=4", zero=2).dp_replicate == 2
    il = make_layout("pp=2", pp_schedule="interleaved", microbatches=4)
    assert il.num_stages == 4 and il.n_microbatches == 4


@pytest.mark.parametrize("text, needle", [
    ("dp=2,xp=2", "cannot read 'xp=2'"),
    ("dp=two", "dp must be a whole number"),
    ("dp=0", "dp must be a whole number"),
    ("tp=2,tp=4", "tp is given twice"),
    ("dp=4,dp_replicate=3", "disagrees"),
])
def test_parse_errors_name_the_item(text: str, needle: str) -> None:
    with pytest.raises(ShoestringError, match=needle) as e:
        make_layout(text)
    assert e.value.where == "--parallel"


def test_flag_errors() -> None:
    with pytest.raises(ShoestringError, match="--zero must be"):
        make_layout("dp=2", zero=4)
    with pytest.raises(ShoestringError, match="--ac must be one of"):
        make_layout("dp=2", ac="some")
    with pytest.raises(ShoestringError, match="--pp-schedule must be one of"):
        make_layout("pp=2", pp_schedule="zb")
    with pytest.raises(ShoestringError, match="dp_shard=2 shards parameters, which needs --zero 2"):
        make_layout("dp_shard=2", zero=1)


# --------------------------------------------------------------------------- validation


def test_valid_layouts_pass() -> None:
    check(make_layout("dp=2,tp=2,pp=2", zero=2), 8)
    check(make_layout("dp=8"), 8)
    check(make_layout("pp=2", pp_schedule="interleaved", microbatches=4), 2)


@pytest.mark.parametrize("layout, world, over, needle", [
    (("dp=2,tp=2",), 2, {}, "needs pp×dp×tp = 1×2×2 = 4 ranks, but the job has 2"),
    (("tp=3",), 3, {}, "tp=3 must divide model num_heads (4)"),
    (("tp=2",), 2, {"vocab_size": 2001}, "tp=2 must divide model vocab_size (2001)"),
    (("pp=3",), 3, {}, "4 layers do not divide into 3 pipeline stages"),
    (("pp=2",), 2, {"num_layers": 2, "microbatches": 1}, "microbatches 1 is fewer than the 2"),
    (("pp=2",), 2, {"microbatches": 3}, "does not split into 3 equal microbatches"),
    (("dp=3",), 3, {}, "batch_size (8) must be divisible by dp (3)"),
    (("pp=2", 3), 2, {}, "ZeRO-3 reshards parameters after every forward"),
    (("tp=2", 1), 2, {}, "ZeRO-1 (ZeroRedundancyOptimizer) shards plain tensors"),
    (("dp=2,pp=2", 1), 4, {}, "ZeroRedundancyOptimizer) beside pipeline parallelism is not"),
    (("dp=2",), 2, {"microbatches": 2}, "only applies with pipeline parallelism"),
])
def test_invalid_layouts_rejected_before_any_process_group(layout, world, over, needle) -> None:
    over = dict(over)
    mb = over.pop("microbatches", None)
    lay = make_layout(layout[0], zero=layout[1] if len(layout) > 1 else 0, microbatches=mb)
    with pytest.raises(ShoestringError, match=needle.replace("(", r"\(").replace(")", r"\)")) as e:
        check(lay, world, **over)
    assert e.value.fix or "needs" in e.value.what
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_offload_needs_zero_and_cuda() -> None:
    with pytest.raises(ShoestringError, match="needs --zero 2 or 3"):
        check(make_layout("dp=2", offload="cpu"), 2)
    with pytest.raises(ShoestringError, match="already live there"):
        check(make_layout("dp=2", zero=3, offload="cpu"), 2)
    check(make_layout("dp=2", zero=3, offload="cpu"), 2, device_type="cuda")  # type: ignore


# --------------------------------------------------------------------------- mesh


def group_ranks(layout: Layout, rank: int, dim: str) -> list[int]:
    """Ranks in ``rank``'s group along ``dim`` ("tp", "pp", "dp", ...), by arithmetic alone: the
    oracle the fake-process-group mesh is checked against."""
    strides, stride = {}, 1
    for name in reversed(DIM_ORDER):
        strides[name] = stride
        stride *= getattr(layout, name)
    c = rank_coords(layout, rank)
    dims = ("dp_replicate", "dp_shard") if dim == "dp" else (dim,)
    base = rank - sum(c[d] * strides[d] for d in dims)
    out = [base]
    for d in dims[::-1]:
        out = [r + i * strides[d] for i in range(getattr(layout, d)) for r in out]
    return sorted(out)


MTNLG = make_layout("dp=16,tp=8,pp=35")  # 4,480 GPUs: TP 8 in a node × PP 35 × DP 16


def test_rank_arithmetic_tp_innermost_pp_outermost() -> None:
    assert MTNLG.world_size == 4480
    assert rank_coords(MTNLG, 0) == {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 0, "dp": 0}
    assert rank_coords(MTNLG, 4479)["pp"] == 34 and rank_coords(MTNLG, 4479)["tp"] == 7
    assert group_ranks(MTNLG, 13, "tp") == list(range(8, 16))  # one node
    assert group_ranks(MTNLG, 13, "dp") == [5 + 8 * i for i in range(16)]
    assert group_ranks(MTNLG, 13, "pp") == [13 + 128 * i for i in range(35)]
    # every rank in exactly one group per dim; groups partition the world
    for dim, size in (("tp", 8), ("dp", 16), ("pp", 35)):
        seen = set()
        for r in range(0, 4480, 97):
            g = group_ranks(MTNLG, r, dim)
            assert len(g) == size and r in g
            seen.add(tuple(g))
        assert all(len(set(a) & set(b)) == 0 for a in seen for b in seen if a != b)


def test_dry_run_builds_the_mtnlg_mesh_with_a_fake_process_group() -> None:
    """torch's fake backend: a 4,480-rank DeviceMesh in one process, no GPU, no peers."""
    # ZeRO-0 with TP runs data parallel as FSDP2 in replicate mode: a size-1 shard dim
    assert mesh_dims(MTNLG) == (("pp", "dp_replicate", "dp_shard", "tp"), (35, 16, 1, 8))
    for rank in (0, 2245, 4479):
        report = dry_run(MTNLG, rank)
        assert report["world_size"] == 4480
        for dim in ("tp", "pp", "dp"):
            assert report["groups"][dim] == group_ranks(MTNLG, rank, dim), (rank, dim)
        assert all(r // 8 == rank // 8 for r in report["groups"]["tp"])  # TP inside a node


def test_dry_run_cli_prints_the_layout() -> None:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "shoestring.dist.mesh", "dp=16,tp=8,pp=35", "0",
                        "4479"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "4480 ranks = pp 35 × dp_replicate 16 × tp 8" in p.stdout
    assert "4472,4473,…,4479" in p.stdout


# --------------------------------------------------------------------------- memory model


@pytest.mark.parametrize("over", [
    {},
    {"objective": "clm", "num_kv_heads": 2, "bias": True, "tie_embeddings": False},
    {"norm_position": "post", "ffn": "gelu", "norm": "rmsnorm"},
    {"objective": "rtd"},
    {"objective": "rtd", "rtd_sharing": "plain", "bias": True, "generator_width": 0.5},
])
def test_param_count_matches_the_real_model(over: dict) -> None:
    from shoestring.model import build_model

    cfg = ModelConfig(hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128, **over)
    real = sum(p.numel() for p in build_model(cfg, 2000).parameters())
    assert memory_per_rank(cfg, 2000, 64, 8)["params_per_rank"] == real
    assert param_counts(cfg, 2000)["embedding"] == 2000 * 64


def test_memory_falls_with_zero_stage_tp_and_checkpointing() -> None:
    cfg = ModelConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=2816)
    m = {z: memory_per_rank(cfg, 32768, 512, 8, make_layout("dp=8", zero=z)) for z in (0, 1, 2, 3)}
    assert m[0]["optimizer"] == 8 * m[0]["params_per_rank"]
    assert m[1]["optimizer"] == m[0]["optimizer"] // 8 and m[1]["grads"] == m[0]["grads"]
    assert m[2]["grads"] == m[0]["grads"] // 8 and m[3]["params"] == m[0]["params"] // 8
    assert m[3]["params_transient"] < m[2]["params_transient"]
    totals = [m[z]["total"] for z in (0, 1, 2, 3)]
    assert totals == sorted(totals, reverse=True)
    acts = [memory_per_rank(cfg, 32768, 512, 8, make_layout(ac=a))["activations"]
            for a in ("none", "selective", "full")]
    assert acts == sorted(acts, reverse=True)
    tp = memory_per_rank(cfg, 32768, 512, 8, make_layout("tp=4"))
    assert tp["activations"] < acts[0] / 3.5
    gpipe = memory_per_rank(cfg, 32768, 512, 1, make_layout("pp=4", pp_schedule="gpipe",
                                                            microbatches=16))
    f1b = memory_per_rank(cfg, 32768, 512, 1, make_layout("pp=4", microbatches=16))
    assert gpipe["activations"] > 3 * f1b["activations"]


@pytest.mark.parametrize("layout, sets, needle", [
    ("dp=1,tp=2", ["model.bias=true"], "model.bias=true with tp > 1 is not supported"),
    ("pp=2", ["train.compile=true"], "train.compile with pp > 1 is not supported"),
    ("dp=2", ["train.micro_batch_size=4", "train.batch_size=12"],
     "batch_size \\(12\\) is not a whole number of micro-steps of dp × micro_batch_size = 2 × 4"),
    ("pp=2", ["train.micro_batch_size=3", "train.batch_size=12"],
     "micro-batch \\(3 sequences\\) does not split into 2 equal microbatches"),
])
def test_layout_and_trainer_settings_that_cannot_work_are_refused_up_front(layout, sets,
                                                                          needle) -> None:
    """Checked from numbers alone, before any process group (batch ramp and accumulation
    themselves work under every layout: tests/test_dist_parity.py)."""
    from shoestring.config import load_config
    from shoestring.dist.parallelism import check_layout

    cfg = load_config(None, ["train.steps=2", "train.batch_size=8", *sets])
    with pytest.raises(ShoestringError, match=needle):
        check_layout(cfg, make_layout(layout), 512, 2, "cpu")


# --------------------------------------------------------------------------- compile


def test_blocks_compile_in_place_and_keep_their_names() -> None:
    """`apply_compile` (after activation checkpointing, as `parallelize` orders them) marks
    each block compiled without a wrapper: block names, parameter names and state dict keys
    (what FSDP units, checkpoints and export see) are the uncompiled model's; nothing is
    compiled until a block runs (tests/test_dist_parity.py runs them under DDP/FSDP2/TP)."""
    from shoestring.dist.parallelize import apply_ac, apply_compile, block_names, clean_fqn
    from shoestring.model import build_model

    model = build_model(ModelConfig(hidden_size=64, num_layers=4, num_heads=4,
                                    intermediate_size=128), 2000)
    keys, names = list(model.state_dict()), [n for n, _ in model.named_parameters()]
    apply_ac(model, "full")
    apply_compile(model)
    assert block_names(model) == [f"layers.{i}" for i in range(4)]
    assert all(model.get_submodule(b)._compiled_call_impl is not None
               for b in block_names(model))
    assert [clean_fqn(n) for n, _ in model.named_parameters()] == names
    assert [clean_fqn(k) for k in model.state_dict()] == keys
    assert not any("_orig_mod" in k for k in model.state_dict())
