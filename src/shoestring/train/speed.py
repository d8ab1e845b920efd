"""The speed choices a run makes before its clock starts: the attention kernel and whether to
torch.compile. Both are settings of `train` with an ``auto`` that decides from this machine
and this budget rather than from a rule of thumb (docs/training.md has the measurements).

* **attention** — ``sdpa`` (``F.scaled_dot_product_attention``: FlashAttention on a GPU, a
  fused flash kernel on a CPU) or ``eager`` (two batched matmuls around an fp32 softmax,
  `model.layers.eager_attention`). ``auto`` takes ``sdpa`` on CUDA and, on a CPU, times both
  (forward + backward, at this run's micro-batch, local heads, sequence length and autocast
  dtype) and takes the faster, ``eager`` only when its stored scores fit in memory.
* **compile** — ``auto`` compiles when the run, compile included, is expected to end at least
  `MIN_GAIN` sooner than uncompiled: from the compile's cost and speed-up measured on this
  device for this step shape (`train.compile_costs`, which every run feeds), or assumed for
  the device type until measured. Compilation happens inside the budget, on the first step,
  and is charged to it. ``auto`` decides the same for one process and for DDP, FSDP2 and TP
  (whose blocks are compiled before they are wrapped, `dist.parallelize.apply_compile`);
  pipeline stages are never compiled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shoestring.device import ASSUMED_MFU
from shoestring.model.layers import eager_attention
from shoestring.train.budget import Budget
from shoestring.train.compile_costs import ASSUMED, CompileCost
from shoestring.units import format_duration

MIN_GAIN = 0.10
"""``auto`` compiles when the whole run is expected to end this much sooner (10%): the compile
must pay for itself with a margin for the error in its measured cost and speed-up. With the
costs assumed before any measurement, that is runs of ~2 minutes and up on a GPU (30 s,
1.55x) and ~5.5 minutes on a CPU (40 s, 1.25x): the default 3-minute CPU `cram` stays eager."""
# Eager attention keeps B·heads·T·keys scores per layer; past this length the fused kernels win
# on memory traffic anyway, so auto does not time it.
EAGER_MAX_SEQ = 512


@dataclass(frozen=True)
class SpeedChoices:
    attention: str
    compile: bool
    why: str  # one line for the log: what was measured or assumed

    def describe(self) -> str:
        return f"attention {self.attention}, compile {'on' if self.compile else 'off'} ({self.why})"


def _best_times(fns: dict[str, Callable[[], None]], seconds: float) -> dict[str, float]:
    """Best wall time of each function, called in turn (after a warm-up call each) until
    ``seconds`` have passed: interleaving makes a burst of load hit every candidate alike."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or any(b == float("inf") for b in best.values()):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def time_attention(rows: int, heads: int, kv_heads: int, seq_len: int, head_dim: int,
                   dtype: torch.dtype, causal: bool, seconds: float = 0.5) -> dict[str, float]:
    """Seconds of one forward + backward of each kernel at these shapes (CPU, ``dtype``)."""
    gen = torch.Generator().manual_seed(0)  # its own stream: the run's RNG is untouched

    def leaf(h: int) -> torch.Tensor:
        return torch.randn(rows, h, seq_len, head_dim, generator=gen, dtype=dtype,
                           requires_grad=True)

    q, k, v = leaf(heads), leaf(kv_heads), leaf(kv_heads)
    grad = torch.ones(rows, heads, seq_len, head_dim, dtype=dtype)
    gqa = kv_heads != heads
    kernels = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                       enable_gqa=gqa),
        "eager": lambda: eager_attention(q, k, v, causal=causal),
    }
    return _best_times({name: lambda f=f: f().backward(grad) for name, f in kernels.items()},
                       seconds)


def eager_scores_bytes(rows: int, heads: int, seq_len: int, layers: int, dtype: torch.dtype) -> int:
    """Memory eager attention adds over sdpa: per layer, the fp32 probabilities and their
    compute-dtype copy of (rows, heads, T, T), kept for backward."""
    return rows * heads * seq_len * seq_len * layers * (4 + torch.finfo(dtype).bits // 8)


def expected_seconds(budget: Budget, tokens_per_step: int, flops_per_token: float,
                     peak_flops: float) -> float:
    """The budget's wall clock if it has one, else its length estimated at `ASSUMED_MFU` of
    the measured peak (steps, tokens or FLOPs, whichever ends first)."""
    if budget.seconds is not None:
        return budget.seconds
    return expected_tokens(budget, tokens_per_step, flops_per_token, peak_flops) / _rate(
        flops_per_token, peak_flops)


def expected_tokens(budget: Budget, tokens_per_step: int, flops_per_token: float,
                    peak_flops: float) -> float:
    """Tokens the budget trains on: exact for steps, tokens and FLOPs (whichever ends first),
    estimated at `ASSUMED_MFU` of the measured peak for a wall-clock budget."""
    limits = [budget.steps * tokens_per_step if budget.steps is not None else None,
              budget.tokens,
              budget.flops / flops_per_token if budget.flops and flops_per_token else None,
              budget.seconds * _rate(flops_per_token, peak_flops)
              if budget.seconds is not None else None]
    return min(t for t in limits if t is not None)


def _rate(flops_per_token: float, peak_flops: float) -> float:
    """Tokens per second at `ASSUMED_MFU` of ``peak_flops``."""
    return max(peak_flops * ASSUMED_MFU / max(flops_per_token, 1.0), 1e-9)


FEW_STEPS = 50  # below this many steps a model learns next to nothing: say so


def expected_steps(budget: Budget, tokens_per_step: int, flops_per_token: float, *,
                   done: int = 0, elapsed: float = 0.0, step_seconds: float | None = None
                   ) -> float | None:
    """Steps the budget buys: exact for a step, token or FLOP budget (whichever ends first);
    a wall-clock one at ``step_seconds`` a step from ``done`` steps at ``elapsed`` seconds
    (None: not measured yet, and no other limit)."""
    limits = [budget.steps,
              budget.tokens / tokens_per_step if budget.tokens is not None else None,
              budget.flops / (flops_per_token * tokens_per_step)
              if budget.flops is not None and flops_per_token else None]
    if budget.seconds is not None and step_seconds:
        limits.append(done + max(budget.seconds - elapsed, 0.0) / step_seconds)
    known = [x for x in limits if x is not None]
    return min(known) if known else None


def few_steps_note(steps: float | None, params: int) -> str | None:
    """A plain sentence when the budget buys fewer than `FEW_STEPS` steps (issue 62: two
    steps of a 78M model on a CPU, and nothing said they buy nothing). None otherwise."""
    if steps is None or steps >= FEW_STEPS:
        return None
    n = max(1, round(steps))
    return (f"this budget buys about {n} step{'s' if n != 1 else ''} of this "
            f"{params / 1e6:.1f}M-parameter model here: too few for it to learn much (give it "
            f"{FEW_STEPS} or more): train a smaller model (--set model.preset=tiny; "
            "`shoestring presets` lists them) or give a longer budget")


LONG_BUDGET_SECONDS = 3600.0  # past this, a budget that is not wall clock gets a warning


def long_budget_warning(budget: Budget, tokens_per_step: int, flops_per_token: float,
                        peak_flops: float) -> str | None:
    """A sentence for a FLOP, token or step budget expected to run past an hour here (at the
    assumed MFU of the measured peak): a user who typed ``3e15flops`` on a laptop should
    learn it means many hours before the run, not from the progress bar. None otherwise."""
    if budget.seconds is not None:
        return None
    seconds = expected_seconds(budget, tokens_per_step, flops_per_token, peak_flops)
    if seconds <= LONG_BUDGET_SECONDS:
        return None
    return (f"this budget ({budget.describe()}) is expected to take about "
            f"{format_duration(seconds)} on this hardware (at {ASSUMED_MFU:.0%} of its "
            "measured peak); give a wall-clock budget (--budget 10m) to bound it")


def choose(attention: str, compile_setting: bool | str, *, device_type: str, dtype: torch.dtype,
           rows: int, heads: int, kv_heads: int, seq_len: int, head_dim: int, layers: int,
           causal: bool, spare_bytes: int | None, seconds: float, pipeline: bool,
           compile_cost: Callable[[str], CompileCost] | None = None) -> SpeedChoices:
    """Resolve ``train.attention`` and ``train.compile`` for this run (see the module doc).

    ``spare_bytes``: memory left after the run's estimate (None: unknown); ``seconds``: the
    expected training time (`expected_seconds`); ``compile_cost``: what compiling costs and
    buys here with the chosen attention kernel (`compile_costs.lookup`; None: assumed for the
    device type)."""
    why = []
    if attention == "auto":
        if device_type == "cuda":
            attention = "sdpa"
        elif seq_len > EAGER_MAX_SEQ:
            attention = "sdpa"
            why.append(f"sequences over {EAGER_MAX_SEQ}")
        elif spare_bytes is not None and eager_scores_bytes(
                rows, heads, seq_len, layers, dtype) > spare_bytes:
            attention = "sdpa"
            why.append("eager scores would not fit")
        else:
            t = time_attention(rows, heads, kv_heads, seq_len, head_dim, dtype, causal)
            attention = min(t, key=t.get)
            why.append(f"measured fwd+bwd sdpa {t['sdpa'] * 1e3:.1f} ms, "
                       f"eager {t['eager'] * 1e3:.1f} ms")
    if compile_setting == "auto":
        cost = (compile_cost(attention) if compile_cost is not None
                else ASSUMED["cuda" if device_type == "cuda" else "cpu"])
        compiled, reason = compile_pays(seconds, cost, pipeline)
        why.append(reason)
    else:
        compiled = bool(compile_setting)
    return SpeedChoices(attention, compiled, "; ".join(why) or "as configured")


def compile_pays(seconds: float, cost: CompileCost, pipeline: bool = False) -> tuple[bool, str]:
    """``train.compile=auto``: whether a run expected to train ``seconds`` uncompiled ends
    `MIN_GAIN` sooner compiled, and the sentence that says why."""
    if pipeline:
        return False, "pipeline stages are not compiled"
    gain = cost.gain(seconds)
    pays = gain >= MIN_GAIN
    return pays, (
        f"compile {'on' if pays else 'off'}: ~{format_duration(seconds)} of training would take "
        f"~{format_duration(cost.seconds + seconds / cost.speedup)} compiled ({cost.seconds:.0f} "
        f"s compile, steps {cost.speedup:.2f}x faster: {gain:+.0%} overall"
        f"{'' if pays else f', under the {MIN_GAIN:.0%} it must gain'}; {cost.source})")


def agreed(choices: SpeedChoices, broadcast: Callable[[list[float]], list[float]]) -> SpeedChoices:
    """Rank 0's choices on every rank (timings differ between processes; layouts must not)."""
    att, comp = broadcast([float(choices.attention == "eager"), float(choices.compile)])
    return SpeedChoices("eager" if att == 1.0 else "sdpa", comp == 1.0, choices.why)

