"""The plan's predicted held-out loss, and the check of it after the run.

A plan states ``prediction: {loss, low, high, level, law, units, comparable, extrapolated,
outside, basis}``:

- with a law fitted on your data (`plan --calibrate`, `plan --history`, or a law file that
  `plan --fit` / calibration wrote with its bootstrap), the loss is in the units of the
  held-out loss `shoestring eval RUN` reports (eval.json's ``mlm_loss``; decoders: the
  next-token loss of decoder_eval.json on the validation split), with a 90% bootstrap interval
  (`shoestring.plan.fit.bootstrap_fit`) and the extrapolation flags of the fitted span;
- with a published law (Chinchilla, Epoch), the loss is on that law's own data scale (decoder
  LMs on MassiveText, their tokenizer): it is not a prediction of your eval loss, so no
  interval is given (``low``/``high`` null, ``comparable`` false) and the plan says so.

`train --plan` copies the plan's prediction into the run's summary.json (``record``); `eval`
and `report` set it beside the achieved held-out loss (``check``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from shoestring.errors import ShoestringError
from shoestring.plan.fit import BootstrapFit, FitResult, Frontier, Span
from shoestring.plan.laws import LAWS, Law
from shoestring.rundir import RunDir, read_json_object

UNITS = {
    "mlm": "held-out MLM loss, nats per masked token (eval.json mlm_loss: `shoestring eval RUN` "
           "on the validation split)",
    "clm": "held-out next-token loss, nats per token (decoder_eval.json perplexity.loss: "
           "`shoestring eval RUN` on the validation split)",
}

# What Hoffmann et al. (2022) trained to fit their law (and Epoch's refit of the same data):
# 70M to 16B parameters, 5B to 500B tokens (§3.3). A plan outside it extrapolates the law.
PUBLISHED_SPAN = Span((7e7, 1.6e10), (5e9, 5e11), (6 * 7e7 * 5e9, 6 * 1.6e10 * 5e11))


# Below this much training compute an objective's loss is not yet on a power law in C, so a
# law fitted there cannot give a precise point: masked-LM loss follows one only from ~2.2e15
# FLOPs (Deshpande et al. 2023, "Honey, I Shrunk the Language", BERT-style models from 1M
# parameters). No boundary is claimed for decoders: none was measured at these scales.
LAW_REGIME_FLOPS = {"mlm": 2.2e15}

# What one calibration point was measured to move by, in nats of held-out MLM loss, at the top
# level of the wiki-books check (~9e12 FLOPs, 600–2,750 steps a point; docs/planning.md and
# docs/benchmarks/plan.md): retrained with two more seeds, 0.017 at the median and 0.047 at
# most (`bench/calibration_noise.py`); with its warmup ending at step 22.85 instead of 23,
# 0.19 (`bench/calibration_schedules.py`). Said before a calibration below the regime trains.
POINT_NOISE = {"flops": 9e12, "seed_median": 0.017, "seed_max": 0.047, "warmup_step": 0.19}


def top_level(boot: BootstrapFit) -> float:
    """The largest compute the fit saw: its top IsoFLOP level, else its frontier's largest
    minimum (a law file), else 6·N·D of its largest point."""
    if boot.envelope:
        return boot.envelope[-1][0]
    if boot.frontier is not None and boot.frontier.minima:
        return max(m.flops for m in boot.frontier.minima)
    return boot.span.c[1]


def envelope_slopes(boot: BootstrapFit) -> list[tuple[float, float]]:
    """(level, d ln L*/d ln C from the level below) along the lowest loss measured at each
    IsoFLOP level: in a power law's regime the slope flattens as C grows; below it, where the
    loss is leaving the unigram plateau, it steepens. This is where the regime starts *on
    your data*, measured."""
    env = boot.envelope
    return [(c2, float(np.log(l2 / l1) / np.log(c2 / c1)))
            for (c1, l1), (c2, l2) in zip(env, env[1:])]


def regime(boot: BootstrapFit, objective: str) -> dict[str, Any] | None:
    """Whether the calibration's top level is below where ``objective``'s loss follows a law;
    None when it is not (or no boundary is known)."""
    boundary = LAW_REGIME_FLOPS.get(objective)
    top = top_level(boot)
    if boundary is None or top >= boundary:
        return None
    slopes = envelope_slopes(boot)
    steepening = len(slopes) >= 2 and slopes[-1][1] < slopes[-2][1]
    return {"boundary_flops": boundary, "top_flops": float(top),
            "slopes": [[float(c), s] for c, s in slopes],
            "steepening": steepening}


def regime_note(found: dict[str, Any]) -> str:
    """The plan's note for a calibration below the law's regime, with the measured slopes."""
    slopes = ", ".join(f"{s:+.3f} at {c:.3g}" for c, s in found["slopes"])
    measured = (f"; here the lowest loss per level falls as d ln L*/d ln C = {slopes} FLOPs, "
                + ("still steepening at the top level: on this data the regime starts above "
                   "it" if found["steepening"] else "no longer steepening at the top level")
                if slopes else "")
    return (f"the calibration's top level ({found['top_flops']:.3g} FLOPs) is below "
            f"~{found['boundary_flops']:.2g} FLOPs, where this objective's loss starts to follow "
            f"a power law (Deshpande et al. 2023){measured}. The point prediction is indicative, "
            "not precise: read the interval, and expect the loss to fall faster than the law "
            "says until the regime starts; a larger budget or --calibrate-share lifts the top "
            "level")


def units(objective: str) -> str:
    """What a fitted law's loss means, for this objective."""
    return UNITS.get(objective, f"held-out {objective} loss as `shoestring eval RUN` reports it")


def published(law: Law, n: float, d: float, loss: float,
              objective: str = "mlm") -> dict[str, Any]:
    """A published law's prediction: its own scale, no interval (see the module). A law
    file without a bootstrap (`plan --fit`) is on your eval's scale but has no interval."""
    if law.name not in LAWS:
        return {"loss": loss, "low": None, "high": None, "level": None, "law": law.name,
                "units": units(objective), "comparable": law.objective == objective,
                "extrapolated": None, "outside": [],
                "basis": "a law file without a bootstrap (`plan --fit`): no interval and no "
                         "fitted span; `plan --calibrate` or `--history` fit one with both"}
    outside = PUBLISHED_SPAN.outside(n, d)
    return {
        "loss": loss, "low": None, "high": None, "level": None, "law": law.name,
        "units": f"the '{law.name}' law's own data ({law.objective.upper()} on MassiveText, "
                 "its tokenizer), not your eval loss",
        "comparable": False, "extrapolated": bool(outside), "outside": [w for w, _ in outside],
        "basis": "a published law: its loss values belong to another objective, corpus and "
                 "tokenizer, so no interval on your data is claimed; `plan --calibrate` fits "
                 "one on your data with a 90% interval",
    }


def fitted(boot: BootstrapFit, n: float, d: float, objective: str,
           ceiling: float | None = None) -> dict[str, Any]:
    """A fitted law's prediction with its bootstrap interval (clamped at ``ceiling``,
    ln(vocabulary): no model is worse than a uniform guess for long)."""
    p = boot.predict(n, d)
    clamp = (lambda x: min(x, ceiling)) if ceiling else (lambda x: x)
    basis = (f"{len(boot.thetas)} bootstrap refits of L(N, D) on {boot.fit.points} points "
             f"(seed {boot.seed}), times the fit's residuals: the {p.level:.0%} interval of a "
             "new run")
    if p.extrapolated:
        basis += (f"; outside the fitted span, so its half-widths are widened ×{p.widened_by:.2f}"
                  " (1 + the decades extrapolated)")
        if p.backtest_margin > 0:
            bt = boot.backtest or {}
            basis += (f", and to at least ±{p.backtest_margin:.3f} in ln-loss: the fit "
                      f"without its top level missed that level by up to "
                      f"{bt.get('max_abs_log_error', 0):.3f} "
                      f"({bt.get('log_error_per_decade', 0):.3f} per decade extrapolated)")
    found = regime(boot, objective)
    if found is not None:
        basis += (f"; calibrated below the {objective.upper()} loss's power-law regime "
                  f"(top level {found['top_flops']:.3g} < ~{found['boundary_flops']:.2g} FLOPs): "
                  "the point is indicative")
    return {
        "loss": clamp(p.loss), "low": clamp(p.low), "high": clamp(p.high), "level": p.level,
        "law": boot.fit.law.name, "units": units(objective), "comparable": True,
        "extrapolated": p.extrapolated, "outside": list(p.outside), "basis": basis,
        "precise": found is None, **({"regime": found} if found is not None else {}),
    }


def bootstrap_to_dict(boot: BootstrapFit) -> dict[str, Any]:
    """What a law file keeps so `--law FILE` gives the same intervals (see ``bootstrap_from``)."""
    s = boot.span
    return {"level": boot.level, "seed": boot.seed, "points": boot.fit.points,
            "huber": boot.fit.huber, "rmse_log_loss": boot.fit.rmse_log,
            "span": {"n": list(s.n), "d": list(s.d), "c": list(s.c)},
            "residuals": [float(r) for r in boot.residuals],
            "thetas": [[float(x) for x in t] for t in boot.thetas],
            "exponent": boot.fit.exponent, "at_bounds": list(boot.fit.at_bounds),
            "frontier": boot.frontier.to_dict() if boot.frontier is not None else None,
            "backtest": boot.backtest}


def bootstrap_from(law: Law, path: str | Path) -> BootstrapFit | None:
    """The bootstrap a law file carries (calibration writes it), or None (published laws,
    `plan --fit` files without one)."""
    if law.name in LAWS or not Path(path).is_file():
        return None
    tree = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    b = tree.get("bootstrap") if isinstance(tree, dict) else None
    if not isinstance(b, dict):
        return None
    try:
        span = Span(*(tuple(float(x) for x in b["span"][k]) for k in ("n", "d", "c")))
        exponent = b.get("exponent")
        fit = FitResult(law, float(b["huber"]), float(b["rmse_log_loss"]), int(b["points"]),
                        exponent=None if exponent is None else float(exponent),
                        at_bounds=tuple(str(x) for x in b.get("at_bounds") or ()))
        front, bt = b.get("frontier"), b.get("backtest")  # no backtest: a file from before them
        return BootstrapFit(fit, np.array(b["thetas"], dtype=np.float64),
                            np.array(b["residuals"], dtype=np.float64), span,
                            float(b["level"]), int(b["seed"]),
                            Frontier.from_dict(front) if isinstance(front, dict) else None,
                            {k: float(v) if k != "points" else int(v) for k, v in bt.items()}
                            if isinstance(bt, dict) else None)
    except (KeyError, TypeError, ValueError):
        raise ShoestringError("the law file's bootstrap section is damaged", where=str(path),
                              fix="calibrate again (`shoestring plan --calibrate`)") from None


# ------------------------------------------------------------------------- after the run


def from_plan(plan_path: str | Path) -> dict[str, Any] | None:
    """The prediction a plan file states (None for plans written before predictions)."""
    tree = yaml.safe_load(Path(plan_path).read_text(encoding="utf-8")) or {}
    pred = (tree.get("plan") or {}).get("prediction") if isinstance(tree, dict) else None
    return dict(pred) if isinstance(pred, dict) else None


def record(run_dir: str | Path, plan_path: str | Path | None,
           kept: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Copy the plan's prediction into the run's summary.json as ``prediction`` (with the
    plan's path), atomically; ``kept``: the prediction a resumed run's earlier summary had.
    Returns it (None when there is none)."""
    pred = ({**p, "plan": str(Path(plan_path).resolve())} if plan_path is not None
            and (p := from_plan(plan_path)) is not None else kept)
    if pred is None or not RunDir(run_dir).add_to_summary("prediction", pred):
        return None
    return pred


def held_out(evaluation: dict[str, Any] | None) -> float | None:
    """The held-out loss an eval file states: eval.json's ``mlm_loss``, or decoder_eval.json's
    next-token loss when it was measured on the run's validation split."""
    e = evaluation or {}
    if isinstance(e.get("mlm_loss"), (int, float)):
        return float(e["mlm_loss"])
    ppl = e.get("perplexity")
    if isinstance(ppl, dict) and isinstance(ppl.get("loss"), (int, float)) \
            and ppl.get("source", "run validation split") == "run validation split":
        return float(ppl["loss"])
    return None


def check(prediction: dict[str, Any] | None, achieved: float | None) -> dict[str, Any] | None:
    """Predicted vs achieved: the error, and whether it fell in the interval (None when the
    prediction is on another scale or there is nothing to compare)."""
    if not prediction or achieved is None or prediction.get("loss") is None:
        return None
    low, high = prediction.get("low"), prediction.get("high")
    comparable = bool(prediction.get("comparable"))
    inside = (low <= achieved <= high) if comparable and low is not None and high is not None \
        else None
    return {"predicted": prediction["loss"], "low": low, "high": high, "achieved": achieved,
            "error_pct": 100 * (prediction["loss"] - achieved) / achieved,
            "inside": inside, "comparable": comparable, "law": prediction.get("law")}


def check_run(run_dir: str | Path, evaluation: dict[str, Any] | None) -> dict[str, Any] | None:
    """``check`` of the prediction `train --plan` recorded in the run's summary.json against
    this evaluation (None when the run has no prediction)."""
    try:
        summary = read_json_object(RunDir(run_dir).summary_path)
    except ShoestringError:  # damaged: nothing to check against
        return None
    return check((summary or {}).get("prediction"), held_out(evaluation))


def line(pred: dict[str, Any] | None) -> str:
    """The plan's predicted held-out loss for people: interval, units, extrapolation."""
    if not pred:
        return "—"
    if pred.get("low") is None and not pred.get("comparable"):
        text = f"{pred['loss']:.3f} on the '{pred['law']}' law's own scale, no interval " \
            "(not your eval loss; --calibrate fits one on your data)"
    elif pred.get("low") is None:
        text = f"held-out loss {pred['loss']:.3f} ({pred['law']}), no interval (a law file "\
            "without a bootstrap)"
    else:
        text = (f"held-out loss {pred['loss']:.3f}, {pred['level']:.0%} interval "
                f"[{pred['low']:.3f}, {pred['high']:.3f}] ({pred['law']})")
    if pred.get("extrapolated"):
        text += "; extrapolates: " + "; ".join(pred.get("outside") or [])
    if pred.get("regime"):
        text += (f"; indicative only: calibrated at ≤{pred['regime']['top_flops']:.3g} FLOPs, "
                 "below the loss's power-law regime")
    return text


def describe(c: dict[str, Any]) -> str:
    """One line for people: ``predicted 5.91 [5.80, 6.05], achieved 5.95: inside``."""
    if not c["comparable"]:
        return (f"the plan's law ({c['law']}) predicted {c['predicted']:.3f} on its own data's "
                f"scale; achieved {c['achieved']:.3f} (not comparable: calibrate to predict "
                "this loss)")
    interval = f" [{c['low']:.3f}, {c['high']:.3f}]" if c["low"] is not None else ""
    verdict = {True: "inside the interval", False: "OUTSIDE the interval",
               None: "no interval"}[c["inside"]]
    return (f"predicted {c['predicted']:.3f}{interval}, achieved {c['achieved']:.3f} "
            f"({c['error_pct']:+.1f}%): {verdict}")
