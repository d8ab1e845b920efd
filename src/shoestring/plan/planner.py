"""`shoestring plan`: a compute budget → model size, token count, batch, memory, layout.

The budget is FLOPs = device peak × devices × seconds × MFU (or given in FLOPs directly). The
scaling law gives the textbook compute-optimal split of C = 6·N·D in closed form; the concrete
model is then the shape (from `shoestring.plan.shapes`) that minimizes the law's predicted
loss when the budget is spent with *exact* FLOP accounting — D = C / (FLOPs per token of that
model), attention and the output head included — which is what `train` will actually spend.
At large scale the two agree; at CPU scale the head and attention are a large share of the
FLOPs and the exact accounting moves the pick.

N in the law is the parameter count the law was fitted on (`Law.params`): all parameters for
the published laws (Hoffmann et al. count embeddings), non-embedding for a `plan --fit` law.
With a data dir, a candidate that would repeat the corpus is scored by the data-constrained
form of the law (Muennighoff et al. 2023, `Law.repeated_loss`), so a budget beyond the corpus
buys a smaller model and more epochs instead of assuming fresh data. With a law calibrated
on your IsoFLOP sweep (`plan --calibrate`, or its law file) the size is the sweep's own:
N_opt ∝ C^a through the minima inside its sizes (Chinchilla's approach 2, `fit.Frontier`),
moved by the data-constrained rule when the corpus repeats; the law predicts the loss. Batch
and peak LR come from `shoestring.plan.hyper` (DeepSeek LLM's exponents, anchored at the
recipe).

The output is a YAML file with `model:`, `train:` and `data:` sections that
`shoestring train --plan plan.yaml` uses as its base config, plus a `plan:` section that
records how they were chosen (train ignores it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from shoestring import families
from shoestring.config import DataConfig, TrainConfig
from shoestring.errors import ShoestringError
from shoestring.data.repetition import REPEAT_WARN_EPOCHS, SOURCE as REPETITION_SOURCE
from shoestring.data.repetition import effective_tokens, repetition_cost
from shoestring.device import ASSUMED_MFU
from shoestring.datasheets import Hardware
from shoestring.plan import prediction
from shoestring.plan.fit import BootstrapFit, Frontier
from shoestring.plan.hardware import get_hardware
from shoestring.plan.hyper import Hyper, plan_hyper
from shoestring.plan.laws import LAWS, PARAM_COUNTS, Law, load_law, pf_days, training_flops
from shoestring.plan.placement import PlannedLayout, layout_for
from shoestring.plan.shapes import Shape, candidates
from shoestring.units import BudgetSpec, parse_budget


@dataclass
class PlanRequest:
    """What the user asked for (the CLI's options, as data)."""

    hardware: str = "auto"
    devices: int = 1
    budget: BudgetSpec | str = "1h"  # text is parsed where it enters, in __post_init__
    mfu: float | None = None
    measure: bool = False
    objective: str | None = None  # None: the data dir's, else mlm
    law: str = "epoch"
    data: str | None = None
    devices_per_node: int | None = None
    precision: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.budget, BudgetSpec):
            self.budget = parse_budget(self.budget, where="--budget")


def _choose(shapes: list[Shape], law: Law, flops: float, unique: float | None = None,
            frontier: Frontier | None = None
            ) -> tuple[Shape, float, float, dict[str, Any] | None]:
    """The shape with the lowest predicted loss when the budget buys C / FLOPs-per-token tokens;
    with ``unique`` (the corpus' train tokens) the loss of a shape that would repeat them is
    the data-constrained law's (`Law.repeated_loss`).

    With a ``frontier`` (approach 2 fitted on your IsoFLOP sweep) the size is the frontier's
    instead: the shape nearest N_opt(C) = k·C^a in log N, moved by as much as the
    data-constrained rule moves the law's own pick (the law's pick on repeated data over its
    pick on fresh data: 1 when nothing repeats). Returns the shape, its tokens, its predicted
    loss and, with a frontier, the record of how the size was chosen (``size_rule``)."""
    def score(s: Shape, repeated: bool) -> tuple[float, float]:
        tokens = flops / s.flops_per_token
        n = law.count(s.params, s.params_non_embedding)
        return (law.repeated_loss(n, tokens, unique) if repeated and unique
                else law.loss(n, tokens)), tokens

    law_pick = min(shapes, key=lambda s: score(s, True)[0])
    if frontier is None or not frontier.usable:
        loss, tokens = score(law_pick, True)
        return law_pick, tokens, loss, None
    fresh_pick = min(shapes, key=lambda s: score(s, False)[0])
    n_of = lambda s: law.count(s.params, s.params_non_embedding)  # noqa: E731
    shift = n_of(law_pick) / n_of(fresh_pick)
    target = frontier.params(flops) * shift
    pick = min(shapes, key=lambda s: abs(math.log(n_of(s) / target)))
    loss, tokens = score(pick, True)
    lo, hi = frontier.params_interval(flops)
    a_lo, a_hi = frontier.exponent_interval()
    rule = {
        "approach": 2,
        "basis": "Chinchilla approach 2: a parabola in ln N per calibration level, its vertex "
                 "N*(C), and N_opt = k·C^a through the vertices inside the sizes swept (one: "
                 "anchored there with the published a); the law (approach 3, its "
                 "exponents tied to a) predicts the loss",
        "exponent": frontier.a, "exponent_interval": [a_lo, a_hi], "level": frontier.level,
        "exponent_source": frontier.source,
        "widths": list(frontier.widths) if frontier.widths is not None else None,
        "k": frontier.k, "target_params": target, "frontier_params": frontier.params(flops),
        "frontier_interval": [lo * shift, hi * shift], "repetition_shift": shift,
        "law_pick": law_pick.label,
        "minima": [{"flops": m.flops, "params": m.params, "loss": m.loss, "edge": m.edge}
                   for m in frontier.minima],
        "edges": frontier.edges(),
        "top_flops": frontier.top,
        "extrapolation_decades": math.log10(flops / frontier.top),
    }
    return pick, tokens, loss, rule


def size_note(rule: dict[str, Any], pick: str) -> list[str]:
    """What the plan says about how its size was chosen (approach 2), for people."""
    a_lo, a_hi = rule["exponent_interval"]
    lo, hi = rule["frontier_interval"]
    if rule.get("exponent_source") == "prior":
        how = ("size from the calibration's one IsoFLOP minimum inside the sizes swept, with "
               "the published laws' exponent (the others lie at an edge: bounds, not "
               "measurements): ")
    else:
        how = "size from the calibration's IsoFLOP minima (approach 2): "
    notes = [
        how + f"N_opt ∝ C^{rule['exponent']:.3f} "
        f"({rule['level']:.0%} interval {a_lo:.3f}–{a_hi:.3f}) gives "
        f"{rule['target_params']:,.0f} non-embedding parameters "
        f"({lo:,.0f}–{hi:,.0f}) here, so {pick}; this budget is "
        f"{rule['extrapolation_decades']:.2f} decades past the largest calibration level "
        f"({rule['top_flops']:.3g} FLOPs)"]
    if rule.get("widths"):
        w_lo, w_hi = rule["widths"]
        notes.append(f"chosen among shapes of {w_lo:.3g}–{w_hi:.3g} hidden units per layer, "
                     "the proportions the calibration swept (N_opt was measured on them)")
    if abs(rule["repetition_shift"] - 1) > 1e-9:
        notes.append(f"the data-constrained rule moves the size ×{rule['repetition_shift']:.3g} "
                     "(the fitted law's pick on repeated data over its pick on fresh data)")
    if rule["law_pick"] != pick:
        notes.append(f"the fitted law alone (approach 3) would pick {rule['law_pick']}; the "
                     "IsoFLOP minima are measured where the law is a fit, so their size is "
                     "planned")
    for edge in rule["edges"]:
        notes.append(f"IsoFLOP minimum at the edge of the sizes swept: {edge}; a bound, left "
                     "out of the exponent's fit")
    return notes


def data_info(path: str) -> dict[str, Any]:
    from shoestring.data.datadir import DataDir
    from shoestring.data.mixture import manifest_sources

    d = DataDir(path)
    splits = d.manifest.get("splits", {})
    sources = manifest_sources(d.manifest)
    return {
        "dir": str(Path(path).resolve()),
        "seq_len": d.seq_len,
        "vocab_size": d.vocab_size,
        "objective": d.manifest.get("objective", "mlm"),
        "train_tokens": int(splits.get("train", {}).get("tokens", 0)),
        **({"sources": {n: {"weight": s["weight"], "train_tokens": s["train_tokens"]}
                        for n, s in sources.items()}} if sources else {}),
        "train_sequences": int(splits.get("train", {}).get("sequences", 0)) or None,
    }


@dataclass
class Sizing:
    """The law's answer for one FLOP budget: closed-form optimum, the chosen shape, batch."""

    flops: float
    n_opt: float
    d_opt: float
    seq_len: int
    vocab: int
    shapes: list[Shape]
    pick: Shape
    tokens: float
    loss: float
    batch: int
    steps: int
    lr: float
    hyper: Hyper
    size_rule: dict[str, Any] | None = None  # how approach 2 chose the size (with a frontier)


def size_for_flops(
    total_flops: float,
    family: families.FamilySpec,
    law: Law,
    data: dict[str, Any] | None = None,
    devices: int = 1,
    mask_rate: float = families.DEFAULT_MASK_RATE,
    flops_per_second: float | None = None,
    floor: bool = True,
    frontier: Frontier | None = None,
) -> Sizing:
    """Model shape, tokens, batch and steps for a FLOP budget (what `plan` and `sweep` share);
    ``floor=False`` (calibration sweeps) sizes budgets below the smallest model's floor too;
    ``frontier``: the size from your IsoFLOP minima (approach 2, see `_choose`)."""
    n_opt, d_opt = law.optimal(total_flops)
    seq_len = data["seq_len"] if data else family.default_seq_len(n_opt)
    vocab = data["vocab_size"] if data else (DataConfig().vocab_size if n_opt < 1e8 else 32768)
    shapes = candidates(family, vocab, seq_len, mask_rate, max_params=max(64 * n_opt, 2e6))
    smallest = shapes[0]
    min_tokens = smallest.params_non_embedding  # one token per parameter
    if floor and total_flops < min_tokens * smallest.flops_per_token:
        need = min_tokens * smallest.flops_per_token
        raise ShoestringError(
            f"budget too small: {total_flops:.3g} FLOPs trains even the smallest model "
            f"({smallest.label}, {smallest.params_non_embedding:,} non-embedding parameters) "
            f"on fewer tokens than it has parameters",
            where="--budget",
            fix=f"give at least {need:.2g} FLOPs"
            + (f" (≈{need / flops_per_second:.0f} s of this hardware at the planned MFU)"
               if flops_per_second else ""),
        )
    if frontier is not None and frontier.usable:
        # N_opt was measured on shapes of the widths the sweep trained; at one N a 2-layer
        # shape 128 wide trained 0.09 nats worse than a 4-layer one 48 wide in the planner's
        # check (BENCHMARKS.md): choose among (and sweep around) shapes of those widths
        shapes = [s for s in shapes
                  if frontier.fits_width(s.model.hidden_size, s.model.num_layers)] or shapes
    unique = float(data["train_tokens"]) if data and data.get("train_tokens") else None
    pick, tokens, loss, rule = _choose(shapes, law, total_flops, unique, frontier)
    hyper = plan_hyper(total_flops, seq_len, devices,
                       data.get("train_sequences") if data else None,
                       TrainConfig(**family.train_recipe).lr)
    steps = max(1, int(round(tokens / (hyper.batch_sequences * seq_len))))
    return Sizing(total_flops, n_opt, d_opt, seq_len, vocab, shapes, pick, tokens, loss,
                  hyper.batch_sequences, steps, hyper.lr, hyper, rule)


def flops_buying(kind: str, amount: float, family: families.FamilySpec, law: Law,
                 data: dict[str, Any] | None, devices: int, mask_rate: float) -> float:
    """The smallest FLOP budget whose plan trains at least ``amount`` tokens or steps
    (``kind``), so that `plan` reads token and step budgets as `train` does: bisection on
    log C over `size_for_flops` (tokens and steps grow with C)."""
    def reached(flops: float) -> bool:
        try:
            core = size_for_flops(flops, family, law, data, devices, mask_rate)
        except ShoestringError:  # below the smallest model: buys nothing
            return False
        return (core.tokens if kind == "tokens" else core.steps) >= amount

    low, high = 9.0, 30.0
    if not reached(10 ** high):
        raise ShoestringError(f"a budget of {amount:g} {kind} is beyond what any plan trains",
                              where="--budget", fix="give a time or a FLOP count")
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (low, mid) if reached(10 ** mid) else (mid, high)
    return 10 ** high


@dataclass
class _Fit:
    """The sizing for the budget, the layout that fits it, and the MFU it assumed."""

    core: Sizing
    layout: PlannedLayout
    total_flops: float
    mfu: float
    mfu_source: str


def _fit_budget(req: PlanRequest, hw: Hardware, peak: float, seconds: float | None,
                flops: float | None, family: families.FamilySpec, law: Law,
                data: dict[str, Any] | None, devices_per_node: int, mask_rate: float,
                console: Console | None, frontier: Frontier | None = None) -> _Fit:
    """Size the model for the budget and lay it out; with --measure, re-size at the measured
    MFU until it settles (a wall-clock budget buys FLOPs in proportion to the MFU)."""
    mfu = req.mfu if req.mfu is not None else ASSUMED_MFU
    mfu_source = "given" if req.mfu is not None else "assumed (pass --mfu or --measure)"
    timed: tuple[str, int] | None = None  # the model and micro-batch last measured
    for attempt in range(3 if req.measure else 1):
        total_flops = flops if flops is not None else peak * req.devices * seconds * mfu
        core = size_for_flops(total_flops, family, law, data, req.devices, mask_rate,
                              flops_per_second=peak * req.devices * mfu, frontier=frontier)
        pick = core.pick
        layout = layout_for(pick.model, core.vocab, core.seq_len, core.batch, req.devices,
                            devices_per_node, hw.memory_gb,
                            is_cpu=hw.measured and "cpu" in hw.description)
        if not req.measure or attempt == 2 or timed == (pick.label, layout.micro_batch):
            break  # (the re-sized pick is the model just timed: its measurement stands)
        from shoestring.plan.measure import measure_mfu

        if console:
            console.print(f"measuring MFU: timing the trainer's step on the {pick.label} model …")
        measured = measure_mfu(pick.model, core.vocab, core.seq_len, layout.micro_batch, hw,
                               req.precision)
        mfu_source = f"measured ({pick.label} model, micro-batch {layout.micro_batch})"
        timed = (pick.label, layout.micro_batch)
        settled = flops is not None or abs(measured - mfu) < 0.02 * mfu
        mfu = measured
        if settled:
            break
    return _Fit(core, layout, total_flops, mfu, mfu_source)


def _notes(fit: _Fit, law: Law, objective: str, hw: Hardware, data: dict[str, Any] | None,
           share: float, devices_per_node: int
           ) -> tuple[list[str], float, dict[str, Any] | None]:
    """What a reader of the plan must know (the law's scale, clamps, CPU cores shared by the
    ranks (``share``: each rank's part of the peak), fit, repeats), the
    predicted loss (clamped at ln(vocabulary)) and the data section with its epochs."""
    core, layout = fit.core, fit.layout
    loss, smallest = core.loss, core.shapes[0]
    notes: list[str] = []
    if core.pick is smallest and core.n_opt < law.count(smallest.params,
                                                        smallest.params_non_embedding):
        notes.append(
            f"the compute-optimal size ({core.n_opt:,.0f} parameters, {PARAM_COUNTS[law.params]}) "
            "is below "
            f"the smallest shape; the plan trains {smallest.label} on fewer tokens per "
            "parameter than optimal"
        )
    ceiling = math.log(core.vocab)  # the loss of a uniform guess over the vocabulary
    about_loss = _loss_note(law, objective, loss, ceiling)
    if about_loss:
        notes.append(about_loss)
    loss = min(loss, ceiling)
    if share < 1:
        notes.append(f"the {devices_per_node} processes on this CPU share its cores: each "
                     f"counts at {share:.2g} of the peak measured with "
                     f"{_threads()} threads, so more processes add no compute on one machine")
    if not layout.fits:
        notes.append(
            f"does not fit: the estimate is {layout.memory_gb:.1f} GB per device against "
            f"{hw.memory_gb:.0f} GB even at micro-batch 1 with checkpointing; add devices or "
            "plan a smaller model"
        )
    data_out = _data_section(core, law, data, notes) if data else None
    if data_out and data.get("sources"):
        # each source's epochs at the plan's tokens, and the warnings for those repeated
        # past `REPEAT_WARN_EPOCHS`
        from shoestring.data.mixture import budget_report, epochs_at

        epochs = epochs_at(core.tokens, data["sources"])
        data_out["sources"] = {n: {**s, "epochs": round(epochs[n], 3)}
                               for n, s in data["sources"].items()}
        notes.extend(budget_report(core.tokens, data["sources"])[1])
    return notes, loss, data_out


def _loss_note(law: Law, objective: str, loss: float, ceiling: float) -> str | None:
    """What the predicted loss is worth, in one note (issue 62: three notes explained a
    number that meant little): a published law's loss is on its own data's scale, and below
    the range it was fitted on it is not a loss at all but is shown clamped at ln(vocabulary)
    (a uniform guess); a law of another objective says so in the same breath."""
    published = law.name in LAWS
    other = law.objective != objective
    where = (f"the '{law.name}' law was fitted on {law.objective.upper()} losses of its own "
             f"data and tokenizer{'' if not other else f', not {objective.upper()}'}"
             if published else
             f"this law was fitted on {law.objective.upper()} losses; you plan "
             f"{objective.upper()}" if other else "")
    fix = ("`shoestring plan --calibrate` fits a law on your own objective and data (or "
           "`shoestring sweep` + `shoestring plan --fit`, then --law FILE)")
    if loss > ceiling:
        return (f"the predicted loss means nothing here: this budget is below the range the "
                f"law was fitted on, where it predicts {loss:.2f}, worse than a uniform guess "
                f"(ln(vocabulary) = {ceiling:.2f}), so {ceiling:.2f} is shown"
                + (f"; and {where}" if where else "")
                + f". The size is still the law's pick; {fix}")
    if published:
        return (f"the predicted loss is on the scale of the law's data, not yours: {where}. "
                f"The N:D split transfers better than the loss value; {fix}")
    return where or None


def _data_section(core: Sizing, law: Law, data: dict[str, Any], notes: list[str]
                  ) -> dict[str, Any]:
    """The plan's data section: epochs over the corpus and, when they exceed one, what the
    repetition costs by the data-constrained rule (tokens wasted, loss against fresh data)."""
    unique = data["train_tokens"]
    epochs = core.tokens / unique if unique else float("inf")
    out = {**data, "epochs": round(epochs, 3)}
    if not unique or epochs <= 1:
        return out
    n = law.count(core.pick.params, core.pick.params_non_embedding)
    fresh = law.loss(n, core.tokens)
    out["repetition"] = {
        "effective_tokens": effective_tokens(unique, epochs),
        "tokens_wasted": repetition_cost(unique, epochs),
        "loss_vs_fresh": law.repeated_loss(n, core.tokens, unique) - fresh,
        "source": REPETITION_SOURCE,
    }
    r = out["repetition"]
    note = (f"the plan repeats the corpus {epochs:.1f} times: {r['tokens_wasted']:.0%} of the "
            f"tokens seen are worth nothing new, and the predicted loss is "
            f"{r['loss_vs_fresh']:+.3f} against the same run on fresh data; the size was chosen "
            f"for repeated data ({REPETITION_SOURCE})")
    if epochs > REPEAT_WARN_EPOCHS:
        out["warning"] = (
            f"the plan repeats the data {epochs:.1f} times; past ~4 epochs repeated tokens "
            "are worth much less than fresh ones: add data, or plan a smaller budget")
        note += ". Past ~4 epochs repeated tokens are worth much less than fresh ones: add " \
                "data, or plan a smaller budget"
    notes.append(note)
    return out


def make_plan(req: PlanRequest, console: Console | None = None,
              fitted: BootstrapFit | None = None) -> dict[str, Any]:
    """The whole plan as a YAML-ready tree (model/train/data sections + plan metadata);
    ``fitted``: plan with this law fitted on your data (calibration, history) instead of
    ``req.law``, and predict with its interval."""
    if req.devices < 1:
        raise ShoestringError(
            f"--devices must be at least 1 (got {req.devices})", where="--devices",
            fix="pass the number of accelerators (or 1 for this machine)",
        )
    if req.mfu is not None and not 0 < req.mfu <= 1:
        raise ShoestringError(
            f"--mfu must be in (0, 1] (got {req.mfu})", where="--mfu",
            fix="a fraction of the peak, e.g. 0.4 (typical for a well-tuned GPU run)",
        )
    spec = req.budget
    hw = get_hardware(req.hardware, req.precision)
    if req.measure and not hw.measured:
        raise ShoestringError(
            "--measure times a training burst on this machine, so it needs --hardware auto",
            where="--measure", fix="drop --measure and pass --mfu, or use --hardware auto",
        )
    peak, dtype = hw.peak(req.precision)
    law = fitted.fit.law if fitted is not None else load_law(req.law)
    boot = fitted if fitted is not None else prediction.bootstrap_from(law, req.law)
    data = data_info(req.data) if req.data else None
    objective = req.objective or (data["objective"] if data else "mlm")
    family = families.get(objective, where="--objective")  # unknown: names the known ones
    if data and req.objective and family.base != data["objective"]:
        raise ShoestringError(
            f"--objective {req.objective} trains on data prepared for {family.base}, and the "
            f"data dir was prepared for {data['objective']}",
            where=str(req.data), fix="drop --objective, or prep the data for that objective",
        )
    devices_per_node = req.devices_per_node or _devices_per_node(hw.name, req.devices)
    mask_rate = TrainConfig(**family.train_recipe).mask_rate  # what a run of it masks
    seconds = spec.amount if spec.kind == "seconds" else None
    flops = (spec.amount if spec.kind == "flops" else None if spec.kind == "seconds" else
             flops_buying(spec.kind, spec.amount, family, law, data, req.devices, mask_rate))
    share = _cpu_share(devices_per_node) if hw.measured and "cpu" in hw.description else 1.0
    peak *= share  # the ranks of one CPU machine split its cores
    fit = _fit_budget(req, hw, peak, seconds, flops, family, law, data, devices_per_node,
                      mask_rate, console, boot.frontier if boot is not None else None)
    core, layout, total_flops, mfu = fit.core, fit.layout, fit.total_flops, fit.mfu
    pick, tokens, seq_len, batch = core.pick, core.tokens, core.seq_len, core.batch
    notes, loss, data_out = _notes(fit, law, objective, hw, data, share, devices_per_node)
    if core.size_rule is not None:
        notes[:0] = size_note(core.size_rule, pick.label)
    ceiling = math.log(core.vocab)
    n_law = law.count(pick.params, pick.params_non_embedding)  # N as the law counts it
    meta = {
        "version": 1,
        "objective": objective,
        "hardware": {
            "name": hw.name, "description": hw.description, "dtype": dtype,
            "peak_flops": peak, "memory_gb": hw.memory_gb, "source": hw.source,
            "devices": req.devices, "devices_per_node": devices_per_node,
        },
        "budget": {
            "input": str(req.budget), "flops": total_flops, "pf_days": pf_days(total_flops),
            "mfu": round(mfu, 4), "mfu_source": fit.mfu_source,
            "wall_clock_s": round(total_flops / (peak * req.devices * mfu), 1),
        },
        "law": {**law.to_dict(), "params_counted": PARAM_COUNTS[law.params]},
        "optimum": {  # the closed form on C = 6ND
            "params": core.n_opt, "tokens": core.d_opt,
            "tokens_per_param": core.d_opt / core.n_opt,
            "loss": min(law.loss(core.n_opt, core.d_opt), ceiling),
        },
        "model": {
            "shape": pick.label, "params": pick.params,
            "params_non_embedding": pick.params_non_embedding,
            "law_params": n_law, "flops_per_token": pick.flops_per_token, "tokens": tokens,
            "tokens_per_param": tokens / n_law, "predicted_loss": loss,
            "six_n_d_flops": training_flops(n_law, tokens),
        },
        "batch": {"global_sequences": batch, "seq_len": seq_len,
                  "tokens_per_step": batch * seq_len, "steps": core.steps,
                  **core.hyper.to_dict()},
        "layout": layout.to_dict(),
        "size_rule": core.size_rule or {"approach": 3, "basis": (
            "the shape with the lowest loss under the law" + (
                " fitted on your points (no IsoFLOP frontier to size by)"
                if boot is not None else ""))},
        "prediction": (prediction.fitted(boot, boot.fit.law.count(
                           pick.params, pick.params_non_embedding), tokens, objective, ceiling)
                       if boot is not None else
                       prediction.published(law, n_law, tokens, loss, objective)),
        "data": data_out,
        "notes": notes,
    }
    micro = layout.micro_batch
    tree = {
        "plan": meta,
        "model": pick.model_section(objective),
        # a FLOP budget, so a changed batch size keeps the compute
        "train": {"budget": f"{total_flops:.4g}flops", "steps": None, "batch_size": batch,
                  "lr": core.lr, **({"micro_batch_size": micro} if micro < batch else {})},
        "data": {"seq_len": seq_len, "vocab_size": core.vocab},
    }
    if (section := layout.parallel_section()) is not None:
        tree["parallel"] = section
    return tree


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _cpu_share(ranks: int) -> float:
    """The fraction of the measured CPU peak (taken with this process's threads) one of
    ``ranks`` processes on this machine gets: they split its cores between them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(1.0, (cores or 1) / (ranks * _threads()))


def _devices_per_node(hardware: str, devices: int) -> int:
    """Devices one node holds: this machine's GPUs for ``auto`` (on a CPU-only machine, one
    process per device on this machine), else up to 8 (a DGX-style node)."""
    if hardware == "auto":
        import torch

        return min(devices, torch.cuda.device_count() or devices)
    return min(devices, 8)


def launch_line(tree: dict[str, Any], plan: str = "PLAN") -> str:
    """The command that trains this plan as written: `shoestring train` on one device; on
    more, the torchrun line (the layout travels in the plan's ``parallel:`` section)."""
    hw = tree["plan"]["hardware"]
    args = f"train --data DATA_DIR --plan {plan} -o RUN_DIR"
    if not tree.get("parallel"):
        return f"shoestring {args}"
    per_node = min(hw["devices"], hw["devices_per_node"])
    nodes = max(1, hw["devices"] // per_node)
    where = (f"--nnodes {nodes} --rdzv-backend c10d --rdzv-endpoint HEAD_NODE:29400"
             if nodes > 1 else "--standalone")
    return f"torchrun {where} --nproc-per-node {per_node} -m shoestring {args}"


def hardware_mismatch(plan_path: str | Path) -> str | None:
    """A warning when the plan was made for other hardware than this machine's (its model,
    batch and budget fit that hardware, not this one); None when they agree or the plan was
    made by measuring a machine (``--hardware auto``)."""
    tree = yaml.safe_load(Path(plan_path).read_text(encoding="utf-8")) or {}
    hw = (tree.get("plan") or {}).get("hardware") or {}
    if hw.get("name") in (None, "auto"):
        return None
    import torch

    from shoestring.datasheets import from_device_name

    here = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    known = from_device_name(here) if here else None
    if known is not None and known.name == hw["name"]:
        return None
    return (f"the plan was made for {hw.get('devices', 1)} × {hw['name']}; this machine has "
            f"{here or 'no GPU (it trains on the CPU)'}, so the plan's model size, batch and "
            "budget were chosen for other hardware (plan for this one with --hardware auto)")


def plan_to_yaml(tree: dict[str, Any]) -> str:
    head = (
        "# shoestring plan: train it with\n"
        f"#   {launch_line(tree, 'THIS_FILE')}\n"
        "# model/train/data (and parallel: on several devices) are config sections; plan:\n"
        "# records how they were chosen.\n"
    )
    ordered = {k: tree[k] for k in ("model", "train", "parallel", "data", "plan") if k in tree}
    return head + yaml.safe_dump(_plain(ordered), sort_keys=False, width=100, allow_unicode=True)


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float):
        return float(f"{x:.6g}")
    return x


def _si(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def plan_table(tree: dict[str, Any]) -> Table:
    """The plan for people."""
    p = tree["plan"]
    hw, b, m, o, lay = p["hardware"], p["budget"], p["model"], p["optimum"], p["layout"]
    t = Table(title="shoestring plan", show_header=False)
    t.add_row("hardware", f"{p['hardware']['devices']} × {hw['description']}, "
              f"{hw['peak_flops'] / 1e12:,.3g} TFLOP/s {hw['dtype']} peak each")
    t.add_row("compute", f"{b['flops']:.3g} FLOPs = {b['pf_days']:.3g} PF/s-days "
              f"(MFU {b['mfu']:.1%}, {b['mfu_source']})")
    t.add_row("wall clock", _duration(b["wall_clock_s"]))
    t.add_row("law", f"{p['law']['name']}: L = {p['law']['E']:.4g} + {p['law']['A']:.4g}/N^"
              f"{p['law']['alpha']:.4g} + {p['law']['B']:.4g}/D^{p['law']['beta']:.4g}")
    t.add_row("compute-optimal (6ND)", f"N {_si(o['params'])} params "
              f"({p['law']['params_counted']}), D {_si(o['tokens'])} "
              f"tokens ({o['tokens_per_param']:.1f} tokens/param), loss {o['loss']:.3f}")
    mc = tree["model"]
    t.add_row("model", f"{mc['objective']}: {mc['num_layers']} layers × {mc['hidden_size']} "
              f"hidden, {mc['num_heads']} heads, {mc['intermediate_size']} FFN")
    t.add_row("parameters", f"{_si(m['params_non_embedding'])} non-embedding "
              f"({_si(m['params'])} with embeddings); the law's N is "
              f"{p['law']['params_counted']}: {_si(m['law_params'])}")
    t.add_row("tokens", f"{_si(m['tokens'])} ({m['tokens_per_param']:.1f} per parameter), "
              f"{m['flops_per_token'] / 1e6:,.3g} MFLOP/token; predicted loss "
              f"{m['predicted_loss']:.3f}")
    t.add_row("prediction", prediction.line(p.get("prediction")))
    rule = p.get("size_rule") or {}
    if rule.get("approach") == 2:
        a_lo, a_hi = rule["exponent_interval"]
        src = ("one IsoFLOP minimum, published exponent"
               if rule.get("exponent_source") == "prior" else "IsoFLOP minima (approach 2)")
        t.add_row("size from", f"{src}: N_opt ∝ C^{rule['exponent']:.3f} "
                  f"[{a_lo:.3f}, {a_hi:.3f}] → {_si(rule['target_params'])} params, "
                  f"{rule['extrapolation_decades']:.2f} decades past the calibration; the law "
                  f"alone picks {rule['law_pick']}")
    bt = p["batch"]
    t.add_row("batch", f"{bt['global_sequences']} × {bt['seq_len']} tokens, {bt['steps']:,} "
              f"steps, peak lr {tree['train']['lr']:g}")
    clamps = "; ".join(c for c in (bt["batch_clamp"], bt["lr_clamp"]) if c)
    t.add_row("batch, lr from", bt["source"] + (f"; {clamps}" if clamps else ""))
    ckpt = ", checkpointing" if lay["checkpointing"] else ""
    t.add_row("layout", f"{lay['kind']}; micro-batch {lay['micro_batch']} × "
              f"{lay['grad_accum']} accumulation{ckpt}")
    if tree.get("parallel"):
        t.add_row("launch", launch_line(tree))
    t.add_row("memory / device", f"{lay['memory_gb']:.2f} GB of {hw['memory_gb']:g} GB "
              f"({'fits' if lay['fits'] else 'DOES NOT FIT'}; {lay['model']})")
    if p["data"]:
        rep = p["data"].get("repetition")
        t.add_row("data", f"{_si(p['data']['train_tokens'])} train tokens → "
                  f"{p['data']['epochs']:.2f} epochs" + (
                      f" (worth {_si(rep['effective_tokens'])} fresh tokens: "
                      f"{rep['tokens_wasted']:.0%} wasted, loss {rep['loss_vs_fresh']:+.3f} "
                      "against fresh data)" if rep else ""))
        for name, src in (p["data"].get("sources") or {}).items():
            t.add_row(f"  source {name}", f"{src['weight']:.1%} of training, "
                      f"{_si(src['train_tokens'])} train tokens → {src['epochs']:.2f} epochs")
    for note in p["notes"]:
        t.add_row("note", note)
    return t


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def write_plan(tree: dict[str, Any], path: str | Path) -> Path:
    from shoestring.fsutil import write_text_atomic

    path = Path(path)
    write_text_atomic(path, plan_to_yaml(tree))
    return path


