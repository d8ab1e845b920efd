"""The parallel layout: what `--parallel`, `--zero`, `--ac`, `--pp-schedule` ... ask for, checked.

Everything is validated here, from numbers alone, before any process group exists: a wrong
layout found after ``init_process_group`` shows up as a hang on some ranks and an error on
others. Every rank runs the same checks on the same inputs, so every rank fails with the same
`ShoestringError` and exits before the first collective.

Degrees: ``pp`` (pipeline stages, outermost), ``dp_replicate`` × ``dp_shard`` (data parallel;
``dp`` is their product) and ``tp`` (tensor parallel, innermost: contiguous ranks of a node).
``dp=D`` alone means replicas for ZeRO 0/1 and shards for ZeRO 2/3; giving ``dp_replicate``
and ``dp_shard`` together with ZeRO 2/3 is hybrid sharding (HSDP: shard inside a group,
replicate across groups).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from shoestring.config import ParallelConfig
from shoestring.errors import ShoestringError

AC = Literal["none", "selective", "full"]
PPSchedule = Literal["gpipe", "1f1b", "interleaved"]
_KEYS = ("dp", "dp_replicate", "dp_shard", "tp", "pp")
_AC = ("none", "selective", "full")
_SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class Layout:
    """A validated parallel layout (see module docstring). ``world_size`` is their product."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    offload: bool = False
    ac: AC = "none"
    pp_schedule: PPSchedule = "1f1b"
    microbatches: int | None = None  # None = pp (or 1 without pipeline)
    stages_per_rank: int = 1  # >1 only for the interleaved schedule (virtual stages)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def n_microbatches(self) -> int:
        if self.microbatches is not None:
            return self.microbatches
        return self.num_stages if self.pp > 1 else 1

    @property
    def fsdp(self) -> bool:
        """Parameters are managed by FSDP2 (``fully_shard``) rather than DDP: ZeRO 2/3, and
        ZeRO-0 data parallelism beside tensor or pipeline parallelism (FSDP2 on a replicate
        mesh: DDP takes no DTensor parameters, and its reducer fails when a pipeline schedule
        runs several times before one optimizer step, as gradient accumulation does)."""
        return self.zero >= 2 or (self.zero == 0 and (self.tp > 1 or self.pp > 1)
                                  and self.dp > 1)

    def describe(self) -> str:
        dp = (f"dp={self.dp}" if self.dp_replicate == 1 or self.dp_shard == 1
              else f"dp_replicate={self.dp_replicate},dp_shard={self.dp_shard}")
        parts = [f"{dp},tp={self.tp},pp={self.pp}", f"zero={self.zero}", f"ac={self.ac}"]
        if self.pp > 1:
            parts.append(f"{self.pp_schedule}×{self.n_microbatches} microbatches")
        if self.offload:
            parts.append("offload=cpu")
        return f"{' '.join(parts)} ({self.world_size} ranks)"

    def to_dict(self) -> dict:
        return asdict(self)


def parse_parallel(text: str) -> dict[str, int]:
    """``"dp=2,tp=2,pp=2"`` → {"dp": 2, "tp": 2, "pp": 2}; unknown keys and bad numbers are
    errors that name the offending item."""
    degrees: dict[str, int] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise ShoestringError(
                f"cannot read '{item}' in --parallel {text!r}",
                where="--parallel",
                fix=f"write key=value pairs with keys {', '.join(_KEYS)}, e.g. dp=4,tp=2,pp=2",
            )
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise ShoestringError(
                f"{key} must be a whole number ≥ 1 (got {value.strip()!r})", where="--parallel"
            )
        if key in degrees:
            raise ShoestringError(f"{key} is given twice in {text!r}", where="--parallel")
        degrees[key] = n
    return degrees


def make_layout(
    parallel: str | dict[str, int] | None = None,
    *,
    zero: int = 0,
    offload: str | None = None,
    ac: str = "none",
    pp_schedule: str = "1f1b",
    microbatches: int | None = None,
    stages_per_rank: int | None = None,
) -> Layout:
    """Build a `Layout` from CLI-shaped values; checks that need no model or world size."""
    degrees = parse_parallel(parallel) if isinstance(parallel, str) else dict(parallel or {})
    if zero not in (0, 1, 2, 3):
        raise ShoestringError(f"--zero must be 0, 1, 2 or 3 (got {zero})", where="--zero")
    if ac not in _AC:
        raise ShoestringError(f"--ac must be one of {', '.join(_AC)} (got {ac!r})", where="--ac")
    if pp_schedule not in _SCHEDULES:
        raise ShoestringError(
            f"--pp-schedule must be one of {', '.join(_SCHEDULES)} (got {pp_schedule!r})",
            where="--pp-schedule",
        )
    if offload not in (None, "none", "cpu"):
        raise ShoestringError(f"--offload takes 'cpu' (got {offload!r})", where="--offload")
    if microbatches is not None and microbatches < 1:
        raise ShoestringError(f"--microbatches must be ≥ 1 (got {microbatches})",
                              where="--microbatches")
    dp = degrees.get("dp")
    rep, shard = degrees.get("dp_replicate"), degrees.get("dp_shard")
    if rep is None and shard is None:
        dp = dp or 1
        rep, shard = (dp, 1) if zero <= 1 else (1, dp)
    elif dp is not None:  # dp with one or both of its factors: they must agree
        given = rep if rep is not None else shard
        assert given is not None
        if (rep is not None and shard is not None and rep * shard != dp) or dp % given:
            raise ShoestringError(
                f"dp={dp} disagrees with dp_replicate={rep} × dp_shard={shard}",
                where="--parallel",
                fix="give dp alone, or dp_replicate and dp_shard (dp is their product)",
            )
        rep, shard = (rep, dp // rep) if rep is not None else (dp // given, shard)
    else:
        rep, shard = rep or 1, shard or 1
    if shard > 1 and zero <= 1:
        raise ShoestringError(
            f"dp_shard={shard} shards parameters, which needs --zero 2 or 3 (got --zero {zero})",
            where="--parallel",
            fix="use dp_replicate (or dp) with ZeRO 0/1, or pass --zero 2 / --zero 3",
        )
    sched = pp_schedule
    spr = stages_per_rank if stages_per_rank is not None else (2 if sched == "interleaved" else 1)
    if spr < 1 or (spr > 1 and sched != "interleaved"):
        raise ShoestringError(
            f"{spr} stages per rank needs --pp-schedule interleaved (got {sched})",
            where="--pp-schedule",
        )
    return Layout(
        dp_replicate=rep, dp_shard=shard, tp=degrees.get("tp", 1), pp=degrees.get("pp", 1),
        zero=zero, offload=offload == "cpu", ac=ac, pp_schedule=sched,  # type: ignore[arg-type]
        microbatches=microbatches, stages_per_rank=spr,
    )


def layout_from_config(pc: ParallelConfig, world_size: int) -> Layout:
    """The layout a config's ``parallel:`` section describes on ``world_size`` ranks: the
    degrees it sets, with data parallelism over the ranks left when it sets none."""
    degrees = pc.degrees()
    if not {"dp", "dp_replicate", "dp_shard"} & set(degrees):
        rest = degrees.get("tp", 1) * degrees.get("pp", 1)
        degrees["dp"] = max(1, world_size // rest) if world_size % rest == 0 else 1
    return make_layout(degrees, zero=pc.zero, offload=pc.offload, ac=pc.ac,
                       pp_schedule=pc.pp_schedule, microbatches=pc.microbatches)


def config_of(layout: Layout) -> ParallelConfig:
    """The ``parallel:`` section that describes ``layout`` (what config.yaml records)."""
    hybrid = layout.dp_replicate > 1 and layout.dp_shard > 1
    return ParallelConfig(
        dp=None if hybrid else layout.dp,
        dp_replicate=layout.dp_replicate if hybrid else None,
        dp_shard=layout.dp_shard if hybrid else None,
        tp=layout.tp, pp=layout.pp, zero=layout.zero,
        offload="cpu" if layout.offload else "none", ac=layout.ac,
        pp_schedule=layout.pp_schedule, microbatches=layout.microbatches)


def _fail(what: str, fix: str | None = None) -> None:
    raise ShoestringError(what, where="parallel layout", fix=fix)


def validate(
    layout: Layout,
    world_size: int,
    *,
    num_layers: int,
    num_heads: int,
    hidden_size: int,
    intermediate_size: int,
    vocab_size: int,
    batch_size: int,
    num_kv_heads: int | None = None,
    device_type: str = "cpu",
    micro_batch: int | None = None,
) -> Layout:
    """Every check that can be made before a process group exists (see the module docstring).

    ``micro_batch``: sequences per data-parallel rank per forward/backward (gradients
    accumulate over ``batch_size / (dp × micro_batch)`` of them); default: the rank's whole
    share of the batch. Returns the layout unchanged so it can be used inline; raises
    `ShoestringError` naming the degree, the number it must divide or match, and what to change.
    """
    L = layout
    if L.world_size != world_size:
        _fail(
            f"the layout needs pp×dp×tp = {L.pp}×{L.dp}×{L.tp} = {L.world_size} ranks, "
            f"but the job has {world_size} (WORLD_SIZE)",
            fix=f"launch {L.world_size} processes (torchrun --nproc-per-node ...) or change "
            "--parallel so the degrees multiply to the number of processes",
        )
    kv = num_kv_heads or num_heads
    for name, value in (("num_heads", num_heads), ("num_kv_heads", kv),
                        ("hidden_size", hidden_size), ("intermediate_size", intermediate_size),
                        ("vocab_size", vocab_size)):
        if value % L.tp:
            _fail(f"tp={L.tp} must divide model {name} ({value}): tensor parallelism splits "
                  f"it evenly across the {L.tp} ranks of a group",
                  fix=f"choose tp among the divisors of {value}"
                  + (" or prep with a data.vocab_size divisible by tp" if name == "vocab_size"
                     else ""))
    if L.fsdp and hidden_size % (L.dp_shard * L.tp):
        _fail(f"hidden_size ({hidden_size}) must be divisible by dp_shard×tp = "
              f"{L.dp_shard * L.tp}: fused projections are sharded along their input width",
              fix="change dp_shard/tp or the model width")
    stages = L.num_stages
    if L.pp > 1:
        if num_layers % stages:
            _fail(f"{num_layers} layers do not divide into {stages} pipeline stages "
                  f"(pp={L.pp} × {L.stages_per_rank} stages per rank)",
                  fix=f"use a pp whose stage count divides {num_layers}, or change num_layers")
        if L.n_microbatches < stages:
            _fail(f"--microbatches {L.n_microbatches} is fewer than the {stages} pipeline "
                  "stages: the pipeline could never fill",
                  fix=f"pass --microbatches {stages} or more")
        if L.pp_schedule == "interleaved" and L.n_microbatches % L.pp:
            _fail(f"the interleaved schedule needs microbatches ({L.n_microbatches}) divisible "
                  f"by pp ({L.pp})", fix=f"pass --microbatches {L.pp * 2}")
        if L.zero == 3:
            _fail("ZeRO-3 reshards parameters after every forward, i.e. once per microbatch "
                  "under pipeline parallelism: an all-gather per microbatch per stage",
                  fix="use --zero 2 with pp > 1 (gradients and optimizer state stay sharded)")
    elif L.microbatches not in (None, 1):
        _fail(f"--microbatches {L.microbatches} only applies with pipeline parallelism (pp > 1)",
              fix="drop --microbatches, or use train.micro_batch_size for accumulation")
    elif L.pp_schedule == "interleaved":
        _fail("--pp-schedule interleaved needs pp > 1")
    if batch_size % L.dp:
        _fail(f"batch_size ({batch_size}) must be divisible by dp ({L.dp}): each data-parallel "
              "rank takes an equal slice of every global batch",
              fix=f"use a batch_size that is a multiple of {L.dp}")
    micro = micro_batch or batch_size // L.dp
    if batch_size % (L.dp * micro):
        _fail(f"batch_size ({batch_size}) is not a whole number of micro-steps of dp × "
              f"micro_batch_size = {L.dp} × {micro} sequences",
              fix=f"use a batch_size that is a multiple of {L.dp * micro}, or a "
              "train.micro_batch_size that divides batch_size / dp")
    if L.pp > 1 and micro % L.n_microbatches:
        _fail(f"the per-rank micro-batch ({micro} sequences) does not split into "
              f"{L.n_microbatches} equal microbatches for the pipeline",
              fix=f"use a train.micro_batch_size (or batch_size / dp) that is a multiple of "
              f"{L.n_microbatches}, or change --microbatches")
    if L.zero == 1 and L.pp > 1 and L.dp > 1:
        _fail("ZeRO-1 (DDP + ZeroRedundancyOptimizer) beside pipeline parallelism is not "
              "supported: DDP's reducer fails when the schedule runs several times per step",
              fix="use --zero 2 (gradients and optimizer state sharded) or --zero 0")
    if L.zero == 1 and L.tp > 1:
        _fail("ZeRO-1 (ZeroRedundancyOptimizer) shards plain tensors; with tp > 1 the "
              "parameters are DTensors",
              fix="use --zero 2 (FSDP2 without resharding: gradients and optimizer state "
              "sharded), or --zero 0")
    if L.offload:
        if L.zero < 2:
            _fail("--offload cpu needs --zero 2 or 3 (FSDP2's CPUOffloadPolicy)",
                  fix="add --zero 3 (or 2)")
        if device_type != "cuda":
            _fail("--offload cpu moves parameters from accelerator memory to host memory; "
                  "on a CPU-only machine they already live there",
                  fix="drop --offload (it needs CUDA)")
    return layout
