"""`train` and `cram` on a GPU without a size: the model, batch and learning rate chosen for
the budget on this device, instead of the CPU demo's defaults.

The config's defaults (the 4 × 256 encoder, batch 32, LR 2e-3) are the CPU recipe: on an H100
that model reaches 4-7% of the chip, so a user typing ``shoestring cram corpus.jsonl --budget
1h`` on a GPU would get a CPU-sized answer. On a GPU, what the user did not set is chosen by the
planner for this budget at the device's *measured* step rate (the trainer's own step timed
here, as ``plan --measure`` does): with no model size, the planner's whole pick (shape, batch,
micro-batch, LR); with a size given, that model's batch, micro-batch and LR for the FLOPs the
budget buys on it. Whatever the user set (``model.preset``, a size field, ``train.batch_size``,
``train.micro_batch_size``, ``train.lr``, a ``--plan``) wins, field by field. A CPU keeps its
demo (its three minutes were tuned there), and a multi-process job takes its size from a plan
(``plan --devices N`` then ``train --plan``): the timing probe runs in one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from shoestring.config import Config, TrainConfig
from shoestring.plan.hyper import LR_MAX
from shoestring.units import BudgetSpec

if TYPE_CHECKING:
    from shoestring.plan.planner import PlanRequest

SIZE_FIELDS = ("preset", "hidden_size", "num_layers", "num_heads", "intermediate_size",
               "num_kv_heads")
"""Any of these in the config means the user chose the model."""
HYPER_FIELDS = ("batch_size", "micro_batch_size", "lr")


@dataclass(frozen=True)
class DeviceSizing:
    """What was chosen (dotted config keys → values) and the sentence that says why."""

    chosen: dict[str, Any]
    why: str

    def apply(self, cfg: Config) -> Config:
        tree = cfg.model_dump()
        for dotted, value in self.chosen.items():
            section, key = dotted.split(".")
            tree[section][key] = value
        if "model.hidden_size" in self.chosen:
            tree["model"]["preset"] = None
        return Config.model_validate(tree)

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "why": self.why}


def applies(cfg: Config, device_type: str, world: int) -> bool:
    """Whether this run is sized for its device: on a GPU, in one process, with a budget, and
    with something left for the device to choose."""
    if device_type != "cuda" or world != 1:
        return False
    if cfg.train.budget is None and cfg.train.steps is None:
        return False
    return not (_model_given(cfg) and set(HYPER_FIELDS) <= _train_given(cfg))


def _train_given(cfg: Config) -> set[str]:
    """The train fields the user set. One the objective's training recipe filled in (RTD's
    LR) is not: it is sized by the law anchored at that recipe."""
    recipe = cfg.model.family.train_recipe
    return {k for k in cfg.train.model_fields_set
            if not (k in recipe and getattr(cfg.train, k) == recipe[k])}


def _model_given(cfg: Config) -> bool:
    return bool(set(SIZE_FIELDS) & cfg.model.model_fields_set)


def size_for_device(cfg: Config, data_dir: str | Path, *, hardware: str = "auto",
                    mfu: float | None = None, console: Console | None = None) -> DeviceSizing:
    """The sizing of ``cfg``'s unset fields for its budget on ``hardware`` (``auto``: this
    device, its step rate measured; a datasheet row such as ``h100`` with ``mfu`` given: the
    same choice computed from numbers, as the tests do)."""
    from shoestring.plan.planner import PlanRequest, make_plan

    steps = cfg.train.steps
    budget = cfg.train.budget or BudgetSpec("steps", float(steps or 0), f"{steps}steps")
    req = PlanRequest(hardware=hardware, budget=budget, data=str(data_dir), mfu=mfu,
                      measure=mfu is None, precision=cfg.train.precision,
                      objective=cfg.model.objective)
    if _model_given(cfg):
        return _hyper_for_model(cfg, req, console)
    tree = make_plan(req, console)
    meta, train = tree["plan"], tree["train"]
    chosen = {f"model.{k}": v for k, v in tree["model"].items() if k != "objective"}
    lr = min(LR_MAX, meta["batch"]["law_lr"])  # anchored at the objective's recipe LR
    chosen |= _hyper(cfg, train["batch_size"], train.get("micro_batch_size"), float(f"{lr:.3g}"))
    m = meta["model"]
    why = (f"sized for this device ({meta['hardware']['description']}): {m['shape']} "
           f"({m['params_non_embedding']:,} non-embedding parameters) on "
           f"{m['tokens']:,.0f} tokens is the plan for {budget} at "
           f"{meta['budget']['mfu']:.0%} MFU ({meta['budget']['mfu_source']})"
           + _hyper_why(chosen, meta["batch"]))
    return DeviceSizing(chosen, why)


def _hyper(cfg: Config, batch: int, micro: int | None, lr: float) -> dict[str, Any]:
    """The optimizer fields the user left unset. A micro-batch is only chosen with its batch
    (micro must divide the batch the run uses)."""
    given = _train_given(cfg)
    out: dict[str, Any] = {}
    if "batch_size" not in given:
        out["train.batch_size"] = batch
        if "micro_batch_size" not in given:
            out["train.micro_batch_size"] = micro if micro and micro < batch else None
    if "lr" not in given:
        out["train.lr"] = lr
    return out


def _hyper_why(chosen: dict[str, Any], batch_meta: dict[str, Any]) -> str:
    parts = []
    if "train.batch_size" in chosen:
        micro = chosen.get("train.micro_batch_size")
        parts.append(f"batch {chosen['train.batch_size']}"
                     + (f" (micro-batch {micro})" if micro else ""))
    if "train.lr" in chosen:
        parts.append(f"peak LR {chosen['train.lr']:g}")
    if not parts:
        return ""
    return (f"; {' and '.join(parts)} for that compute (plan/hyper.py: DeepSeek's exponents "
            f"anchored at the recipe; law batch {batch_meta['law_batch_tokens']:,.0f} tokens)")


def _hyper_for_model(cfg: Config, req: PlanRequest, console: Console | None) -> DeviceSizing:
    """The user's model: batch, micro-batch and LR for the FLOPs the budget buys on it (a
    step or token budget's compute depends on the batch itself: then nothing is chosen)."""
    from shoestring.data.datadir import DataDir
    from shoestring.plan.hardware import get_hardware
    from shoestring.plan.hyper import plan_hyper
    from shoestring.plan.placement import layout_for

    spec = req.budget
    if spec.kind not in ("seconds", "flops"):
        return DeviceSizing({}, f"the model and a {spec.kind} budget were given: nothing sized")
    data = DataDir(req.data)
    hw = get_hardware(req.hardware, req.precision)
    flops, rate = spec.amount, ""
    if spec.kind == "seconds":
        from shoestring.plan.measure import measure_mfu

        peak, _ = hw.peak(req.precision)
        mfu, source = req.mfu, "given"
        if mfu is None:
            if console:
                console.print("measuring MFU: timing the trainer's step on the given model …")
            mfu = measure_mfu(cfg.model, data.vocab_size, data.seq_len, 64, hw, req.precision)
            source = "measured"
        flops = peak * spec.amount * mfu
        rate = f" at {mfu:.0%} MFU ({source})"
    train_seqs = data.manifest.get("splits", {}).get("train", {}).get("sequences")
    hyper = plan_hyper(flops, data.seq_len, 1, train_seqs,
                       TrainConfig(**cfg.model.family.train_recipe).lr)
    layout = layout_for(cfg.model, data.vocab_size, data.seq_len, hyper.batch_sequences, 1, 1,
                        hw.memory_gb)
    chosen = _hyper(cfg, hyper.batch_sequences, layout.micro_batch, hyper.lr)
    why = (f"the given model's batch and LR sized for {req.budget} on this device "
           f"({hw.description}): {flops:.3g} FLOPs{rate}" + _hyper_why(chosen, hyper.to_dict()))
    return DeviceSizing(chosen, why)


def for_this_device(cfg: Config, data_dir: str | Path,
                    console: Console | None = None) -> tuple[Config, DeviceSizing | None]:
    """`train`'s and `cram`'s entry: ``cfg`` sized for this device when `applies` (the choice
    printed), else unchanged."""
    import torch

    from shoestring.dist.parallelism import world_from_env

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if not applies(cfg, device_type, world_from_env()[1]):
        return cfg, None
    sizing = size_for_device(cfg, data_dir, console=console)
    if console is not None:
        console.print(sizing.why, highlight=False, markup=False)
    return sizing.apply(cfg), sizing


def note_in_summary(run_dir: str | Path, sizing: DeviceSizing | None) -> dict | None:
    """Add the sizing to the run's summary.json (``sized_for_device``); returns what was
    written (None: nothing to add, or no summary)."""
    from shoestring.rundir import RunDir

    if sizing is None or not RunDir(run_dir).add_to_summary("sized_for_device",
                                                            sizing.to_dict()):
        return None
    return sizing.to_dict()
