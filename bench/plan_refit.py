"""The planner's fit on a finished calibration's points: the law, approach 2's exponent with
its interval, the IsoFLOP minima, and the plan for the budget the calibration left.

The points are a JSON file (default: bench/data/wiki-books-calibration.json, the 15 held-out
losses `bench/planner_check.py` printed on wiki-books-en; tests/test_plan_fit.py reads the
same file): each shape's non-embedding parameters and FLOPs per token, the held-out loss of
each shape at each FLOP level, and the prepared data's facts (sequence length, vocabulary,
train tokens). Tokens of a point are its level over the shape's FLOPs per token. Nothing is
trained; the figures docs/planning.md quotes ("How the law is fitted") are this script's.

Printed: the tied law (approach 2's a fixes β/(α+β)), which constants ended on a bound, the
RMSE of log-loss; the backtest (the fit without its top level predicting it); a with its 90%
bootstrap interval and each level's minimum (clamped and named at an edge); for the
remaining budget (``--budget`` less ``--share`` spent on the calibration), N_opt with its
interval, the pick (among shapes of the hidden units per layer the calibration swept) with
tokens and predicted loss [90%]; and, for comparison, the pick of the tied law alone and of
the untied five-constant fit (inside the same bounds).

    python bench/plan_refit.py [--points FILE] [--budget 3.6e14] [--share 0.15]
"""

from __future__ import annotations

import json
from pathlib import Path

from common import ROOT, Bench, parser
from shoestring.plan import fit as F
from shoestring.plan.calibrate import biased
from shoestring.plan.planner import size_for_flops

DEFAULT_POINTS = ROOT / "bench" / "data" / "wiki-books-calibration.json"


def load_points(path: Path) -> tuple[list[float], ...]:
    """(N, D, loss, level, hidden units per layer) of every point in a calibration file (see
    the module docstring; a shape's label is LAYERSxHIDDEN)."""
    tree = json.loads(path.read_text(encoding="utf-8"))
    n, d, loss, c, w = [], [], [], [], []
    for level, losses in tree["losses"].items():
        for shape, value in zip(tree["shapes"], losses):
            layers, hidden = (int(x) for x in shape["label"].replace("×", "x").split("x"))
            n.append(float(shape["params"]))
            d.append(float(level) / shape["flops_per_token"])
            loss.append(float(value))
            c.append(float(level))
            w.append(hidden / layers)
    return n, d, loss, c, w


def _law(law) -> str:
    return f"L = {law.E:.3g} + {law.A:.4g}/N^{law.alpha:.4f} + {law.B:.4g}/D^{law.beta:.4f}"


def _pick(sizing) -> str:
    p = sizing.pick
    return f"{p.label} ({p.params_non_embedding:,} non-embedding, {sizing.tokens / 1e6:.1f}M tokens)"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--points", type=Path, default=DEFAULT_POINTS)
    ap.add_argument("--budget", type=float, default=None,
                    help="the whole budget in FLOPs (default: the file's budget_flops)")
    ap.add_argument("--share", type=float, default=0.15, help="the calibration's share of it")
    args = ap.parse_args()
    tree = json.loads(args.points.read_text(encoding="utf-8"))
    data = tree["data"]
    rest = (args.budget or tree["budget_flops"]) * (1 - args.share)
    bench = Bench("plan_refit", args)
    n, d, loss, c, w = load_points(args.points)
    boot = F.bootstrap_fit(n, d, loss, budgets=c, widths=w)
    fit, front = boot.fit, boot.frontier
    print(f"points: {len(n)} from {args.points}")
    print(f"tied law: {_law(fit.law)}; on a bound: {', '.join(fit.at_bounds) or 'none'}; "
          f"RMSE of log-loss {fit.rmse_log:.3f}")
    rows = []
    bt = boot.backtest
    if bt is not None:
        print(f"backtest (the fit without its top level, {bt['held_out_flops']:.3g} FLOPs, "
              f"predicting its {bt['points']} points): ln(predicted/achieved) mean "
              f"{bt['mean_log_error']:+.3f}, worst {bt['max_abs_log_error']:.3f} at "
              f"{bt['decades']:.2f} decades past the rest: {bt['log_error_per_decade']:.3f} "
              "per decade")
        if (warning := biased(boot)) is not None:
            print(f"  the plan's note: {warning}")
    if front is not None:
        lo, hi = front.exponent_interval()
        how = ("the published exponent, anchored at the one minimum inside the sizes"
               if front.source == "prior" else "fitted through the minima inside the sizes")
        print(f"approach 2: a = {front.a:.3f} (90% interval {lo:.3f}-{hi:.3f}; {how})")
        for m in front.minima:
            print(f"  {m.describe()}")
    sizing = size_for_flops(rest, "mlm", fit.law, data, floor=False, frontier=front)
    rule = sizing.size_rule or {}
    pred = boot.predict(sizing.pick.params_non_embedding, sizing.tokens)
    print(f"remaining budget {rest:.3g} FLOPs: size from approach {rule.get('approach')}")
    if rule.get("frontier_interval"):
        lo, hi = rule["frontier_interval"]
        print(f"  N_opt = {rule['target_params']:,.0f} ({lo:,.0f}-{hi:,.0f})")
    if rule.get("widths"):
        print(f"  among shapes of {rule['widths'][0]:.3g}-{rule['widths'][1]:.3g} hidden units "
              "per layer (the widths the calibration swept)")
    print(f"  pick {_pick(sizing)}; predicted loss {pred.loss:.3f} "
          f"[{pred.low:.3f}, {pred.high:.3f}]" + (" (extrapolated)" if pred.extrapolated else ""))
    tied = size_for_flops(rest, "mlm", fit.law, data, floor=False)
    free = F.fit_law(n, d, loss)
    loose = size_for_flops(rest, "mlm", free.law, data, floor=False)
    print(f"  the tied law alone picks {_pick(tied)}")
    print(f"  the untied fit ({_law(free.law)}) picks {_pick(loose)}")
    rows.append({"points": len(n), "a": front.a if front else None,
                 "E": fit.law.E, "A": fit.law.A, "B": fit.law.B, "alpha": fit.law.alpha,
                 "beta": fit.law.beta, "rmse_log": fit.rmse_log, "budget_flops": rest,
                 "pick": sizing.pick.label, "loss": pred.loss, "low": pred.low,
                 "high": pred.high, "tied_pick": tied.pick.label, "free_pick": loose.pick.label})
    bench.table(rows, notes=[f"points: {args.points.name}"])
    bench.end()


if __name__ == "__main__":
    main()
