"""The planner that checks itself: bootstrap intervals, `plan --calibrate`, the prediction a
plan states, `train --plan` recording it, `eval`/`report` checking it, `plan --history`."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import TINY_MODEL, fails_cleanly, interrupt_cli, run_cli
from shoestring.config import Config, DataConfig, TrainConfig
from shoestring.errors import ShoestringError
from shoestring.plan import fit as F
from shoestring.plan import prediction as P
from shoestring.plan.calibrate import CalibrationSpec, calibrated_plan, calibration_points
from shoestring.plan.laws import Law
from shoestring.plan.planner import PlanRequest, make_plan
from shoestring.plan.sweep import cost
from shoestring.units import parse_budget

TRUTH = Law("truth", E=1.9, A=400.0, B=1500.0, alpha=0.33, beta=0.37)


def _points(noise: float, seed: int = 0) -> tuple[list[float], list[float], list[float]]:
    """5 sizes at 3 budgets over 1.5 decades, losses from TRUTH with log-normal noise."""
    rng = np.random.default_rng(seed)
    n, d, loss = [], [], []
    for c in np.geomspace(1e17, 1e17 * 10**1.5, 3):
        n0, _ = TRUTH.optimal(c)
        for f in (1 / 4, 1 / 2, 1, 2, 4):
            n.append(n0 * f)
            d.append(c / (6 * n0 * f))
            loss.append(TRUTH.loss(n[-1], d[-1]) * math.exp(rng.normal(0, noise)))
    return n, d, loss


def test_bootstrap_interval_covers_the_truth_and_widens_past_the_fitted_range() -> None:
    n, d, loss = _points(noise=0.01)
    boot = F.bootstrap_fit(n, d, loss, resamples=100, seed=3)
    assert boot.thetas.shape == (100, 5)
    inside = boot.predict(*TRUTH.optimal(1e18))
    assert not inside.extrapolated and inside.outside == () and inside.widened_by == 1
    assert inside.low < TRUTH.loss(*TRUTH.optimal(1e18)) < inside.high
    assert (inside.high - inside.low) / inside.loss < 0.1  # 1% noise: a few percent wide
    far = boot.predict(*TRUTH.optimal(1e21))  # 1.5 decades past the largest budget
    assert far.extrapolated and any(w.startswith("C = ") for w in far.outside)
    assert far.widened_by > 2
    assert (far.high - far.low) / far.loss > (inside.high - inside.low) / inside.loss
    # seeded: the same points and seed give the same interval
    again = F.bootstrap_fit(n, d, loss, resamples=100, seed=3).predict(*TRUTH.optimal(1e18))
    assert (again.low, again.high) == (inside.low, inside.high)


# (N, D, held-out loss) of a real default calibration (builtin:pydocs, vocabulary 512,
# sequences of 32; docs/planning.md): one term's weight vanishes in some resamples, which once
# made the batched refit's linear system singular.
REAL_POINTS = [
    (45312, 89088, 5.3043), (86400, 50688, 5.3821), (344832, 13824, 5.4778),
    (508928, 9216, 5.6232), (673024, 7680, 5.7071), (45312, 500736, 4.8314),
    (86400, 284160, 5.04), (344832, 78336, 5.1928), (508928, 53760, 5.2769),
    (673024, 41472, 5.3439), (45312, 2816000, 4.1332), (86400, 1594880, 4.1065),
    (344832, 442880, 4.7058), (508928, 302080, 4.7863), (673024, 230400, 4.8982)]


def test_bootstrap_of_a_real_calibration_is_finite_and_brackets_its_points() -> None:
    n, d, loss = zip(*REAL_POINTS)
    boot = F.bootstrap_fit(n, d, loss)
    assert np.isfinite(boot.thetas).all()
    inside = 0
    for ni, di, li in REAL_POINTS:  # inside the span; a 90% interval holds ~90% of them
        p = boot.predict(ni, di)
        assert not p.extrapolated and p.low < p.loss < p.high
        inside += p.low <= li <= p.high
    assert inside >= 12  # 14 of 15 when this was written


def test_noisier_points_give_a_wider_interval() -> None:
    c = TRUTH.optimal(3e17)
    quiet = F.bootstrap_fit(*_points(noise=0.002), resamples=60).predict(*c)
    noisy = F.bootstrap_fit(*_points(noise=0.03), resamples=60).predict(*c)
    assert noisy.high - noisy.low > 3 * (quiet.high - quiet.low)


def test_a_published_law_plan_predicts_on_its_own_scale_without_an_interval() -> None:
    tree = make_plan(PlanRequest(hardware="t4", budget="1e12flops"))
    pred = tree["plan"]["prediction"]
    assert pred["low"] is None and pred["high"] is None and pred["comparable"] is False
    assert pred["law"] == "epoch" and "not your eval loss" in pred["units"]
    assert pred["extrapolated"] and any("below the smallest fitted" in w for w in pred["outside"])
    # and the check refuses to call it right or wrong
    c = P.check(pred, 5.0)
    assert c["inside"] is None and "not comparable" in P.describe(c)


def test_a_law_file_without_a_bootstrap_predicts_your_loss_without_an_interval(
        tmp_path: Path) -> None:
    from shoestring.plan.laws import law_to_yaml

    path = tmp_path / "law.yaml"
    path.write_text(law_to_yaml(Law("fit:mine", E=3.5, A=30.0, B=60.0, alpha=0.3, beta=0.35,
                                    objective="mlm")))
    pred = make_plan(PlanRequest(hardware="t4", budget="1e12flops", law=str(path)))["plan"][
        "prediction"]
    assert pred["comparable"] and pred["low"] is None and "eval.json" in pred["units"]
    assert "without a bootstrap" in P.line(pred) and "no interval" in P.describe(
        P.check(pred, 5.0))


def test_the_regime_is_read_from_the_minima_and_known_only_for_mlm() -> None:
    """Minima whose slope steepens are below the law's regime; a decoder has no boundary."""
    boot = F.BootstrapFit(None, None, None, F.Span((1, 2), (1, 2), (1, 1e14)), 0.9, 0,
                          envelope=((1e12, 6.8), (1e13, 6.0), (1e14, 4.0)))
    found = P.regime(boot, "mlm")
    assert found["top_flops"] == 1e14 and found["steepening"]
    assert [c for c, _ in found["slopes"]] == [1e13, 1e14]
    assert found["slopes"][1][1] == pytest.approx(math.log(4.0 / 6.0) / math.log(10.0))
    assert "regime starts above it" in P.regime_note(found)
    boot = replace(boot, envelope=((1e12, 6.0), (1e13, 4.0), (1e14, 3.5)))
    assert not P.regime(boot, "mlm")["steepening"]
    assert P.regime(boot, "clm") is None  # no boundary claimed for decoders
    boot = replace(boot, envelope=((1e15, 6.0), (1e16, 4.0)))
    assert P.regime(boot, "mlm") is None  # the top level is past the boundary
    # a law file keeps no envelope: its frontier's minima, then its span, say how far it went
    minima = (F.IsoFlopMinimum(3e14, 1e6, 4.0, (0.0, 0.0, 4.0)),)
    boot = replace(boot, envelope=(), frontier=F.Frontier(1.0, 0.5, minima, None))
    assert P.regime(boot, "mlm")["top_flops"] == 3e14 and not P.regime(boot, "mlm")["slopes"]


def test_check_says_inside_or_outside() -> None:
    pred = {"loss": 5.0, "low": 4.8, "high": 5.3, "comparable": True, "law": "calibrated"}
    assert P.check(pred, 5.2)["inside"] is True
    out = P.check(pred, 5.4)
    assert out["inside"] is False and "OUTSIDE" in P.describe(out)
    assert out["error_pct"] == pytest.approx(100 * (5.0 - 5.4) / 5.4)
    assert P.check(pred, None) is None


def test_the_achieved_loss_is_evals_on_the_validation_split() -> None:
    assert P.held_out({"mlm_loss": 5.5, "unigram_loss": 6.0}) == 5.5
    decoder = {"perplexity": {"source": "run validation split", "loss": 4.25}}
    assert P.held_out(decoder) == 4.25
    # a decoder scored on another text is not the loss the plan predicted
    assert P.held_out({"perplexity": {"source": "other.txt", "loss": 3.0}}) is None
    assert P.held_out(None) is None


def test_calibration_points_meet_the_constraints_within_the_share(pydocs_dir: Path) -> None:
    """The default calibration: ≥ 5 sizes at ≥ 3 levels over ≥ 1.5 decades, each ≥ 10
    steps, all of it within 15% of the budget; a smaller budget is refused with its minimum."""
    spec = CalibrationSpec()
    budget = 1e14
    points = calibration_points(str(pydocs_dir), budget, spec)
    levels = sorted({p["budget_flops"] for p in points})
    assert len(levels) == 3 and math.log10(levels[-1] / levels[0]) >= 1.5 - 1e-3
    for c in levels:
        shapes = {p["shape"] for p in points if p["budget_flops"] == c}
        assert len(shapes) >= 5
    assert all(p["steps"] >= 10 for p in points)
    assert sum(map(cost, points)) == sum(p["flops"] for p in points)  # separate runs
    assert sum(map(cost, points)) <= 0.15 * budget
    assert sum(map(cost, points)) > 0.05 * budget  # the share is used, not wasted
    with pytest.raises(ShoestringError, match="too small to calibrate") as e:
        calibration_points(str(pydocs_dir), 1e10, spec)
    need = float(e.value.fix.split("at least ")[1].split(" FLOPs")[0])
    for more in (1.001, 1.02, 1.05):  # the stated minimum is enough, and so is any more
        points = calibration_points(str(pydocs_dir), need * more, spec)
        assert sum(map(cost, points)) <= 0.15 * need * more


def test_a_curves_calibration_counts_its_cool_downs_within_the_share(pydocs_dir: Path
                                                                     ) -> None:
    """`--curves`: each size's levels are branches of one trunk, so the share pays the trunk
    once and each lower level's cool-down — more levels, and a top level at least as high as
    separate runs reach with fewer."""
    budget = 1e14
    runs = calibration_points(str(pydocs_dir), budget, CalibrationSpec())
    spec = CalibrationSpec(branched=True, levels=5)
    points = calibration_points(str(pydocs_dir), budget, spec)
    levels = sorted({p["budget_flops"] for p in points})
    assert len(levels) == 5 and math.log10(levels[-1] / levels[0]) >= 1.5 - 1e-3
    assert levels[-1] >= max(p["budget_flops"] for p in runs)
    assert 0.05 * budget < sum(map(cost, points)) <= 0.15 * budget
    assert sum(map(cost, points)) < 0.8 * sum(p["flops"] for p in points)
    for shape in {p["shape"] for p in points}:  # one trunk, its branches in order
        curve = sorted((p for p in points if p["shape"] == shape), key=lambda p: p["steps"])
        assert {p["trunk"] for p in curve} == {f"trunk-{shape}"}
        assert len({(p["batch_size"], p["lr"], p["warmup_steps"]) for p in curve}) == 1
        starts = [p["branch_step"] for p in curve]
        assert starts == sorted(set(starts)) and curve[0]["warmup_steps"] < starts[0]
    assert CalibrationSpec().key(str(pydocs_dir)) != spec.key(str(pydocs_dir))  # not mixed


def test_a_budget_short_of_the_full_span_calibrates_over_fewer_decades(pydocs_dir: Path
                                                                       ) -> None:
    """Between what 1 decade and what 1.5 decades cost, the calibration narrows (by quarter
    decades, never under ``min_decades``) instead of refusing; under 1 decade it refuses."""
    spec = CalibrationSpec()
    with pytest.raises(ShoestringError) as e:
        calibration_points(str(pydocs_dir), 1e10, spec)
    least = float(e.value.fix.split("at least ")[1].split(" FLOPs")[0])
    with pytest.raises(ShoestringError) as e:
        calibration_points(str(pydocs_dir), 1e10, replace(spec, min_decades=spec.decades))
    full = float(e.value.fix.split("at least ")[1].split(" FLOPs")[0])
    assert least < full / 2  # a narrower span is far cheaper
    points = calibration_points(str(pydocs_dir), least * 1.05, spec)
    levels = sorted({p["budget_flops"] for p in points})
    assert len(levels) == 3
    assert 1.0 - 1e-3 <= math.log10(levels[-1] / levels[0]) < 1.5 - 1e-3
    assert sum(map(cost, points)) <= spec.share * least * 1.05


def test_a_wall_clock_budget_too_small_is_refused_in_minutes_of_this_machine(
        pydocs_dir: Path) -> None:
    """A wall-clock budget is refused in the user's unit, at the plan's rate, naming how the
    caller's command does without calibrating — not in FLOPs with `plan`'s flag."""
    with pytest.raises(ShoestringError) as e:
        calibrated_plan(PlanRequest(hardware="t4", budget="200s", mfu=1e-5,
                                    data=str(pydocs_dir)),
                        CalibrationSpec(), without="cram without --auto")
    assert e.value.where == "--budget" and "200s" not in e.value.fix
    minutes = int(e.value.fix.split("give --budget ")[1].split("m or more")[0])
    need = float(e.value.fix.split("(")[1].split(" FLOPs")[0])
    rate = float(e.value.fix.split("the plan's ")[1].split(" FLOP/s")[0])  # T4 × 0.001%
    assert rate == pytest.approx(make_plan(PlanRequest(hardware="t4", budget="200s", mfu=1e-5)
                                           )["plan"]["budget"]["flops"] / 200, rel=1e-2)
    # (the message rounds the FLOPs to 3 figures, so compare within that rounding)
    assert minutes * 60 * rate >= need * 0.995 and (minutes - 1) * 60 * rate < need + 60 * rate
    assert e.value.fix.endswith("or cram without --auto") and "plan without" not in e.value.fix
    calibration_points(str(pydocs_dir), minutes * 60 * rate, CalibrationSpec())  # enough


def test_plan_calibrate_refuses_a_budget_too_small(pydocs_dir: Path) -> None:
    r = run_cli("plan", "--calibrate", "--hardware", "t4", "--budget", "1e10flops",
                "--data", str(pydocs_dir))
    fails_cleanly(r, "budget too small to calibrate", "give at least")
    r = run_cli("plan", "--calibrate", "--hardware", "t4", "--budget", "1e13flops")
    fails_cleanly(r, "--data")
    r = run_cli("plan", "--calibrate", "--calibrate-share", "1.5", "--hardware", "t4",
                "--budget", "1e13flops", "--data", str(pydocs_dir))
    fails_cleanly(r, "--calibrate-share")


def _law_sweep(path: Path, law: Law) -> Path:
    """A sweep dir whose 15 points (5 sizes × 3 budgets) lie on ``law``."""
    path.mkdir()
    (path / "sweep.json").write_text(json.dumps({"format": "shoestring-sweep/1",
                                                 "objective": "mlm"}))
    with open(path / "points.jsonl", "w") as f:
        for c in (1e10, 4e10, 1.6e11):
            for n in (4.5e4, 9e4, 1.8e5, 3.6e5, 7.2e5):
                d = c / (6 * n)
                f.write(json.dumps({"id": f"C{c:g}-{n:g}", "budget_flops": c, "model":
                                    {"objective": "mlm"}, "params_non_embedding": n,
                                    "tokens": d, "val_loss": law.loss(n, d)}) + "\n")
    return path


# ------------------------------------------------------------- real runs, one calibration

# The issue's constraints (3 levels over 1.5 decades, 10 steps a point) cost ~2e12 FLOPs at
# the least, minutes on a busy 2-core CPU; these tests relax them to 2 levels over 0.3
# decades and 2 steps (10 real runs of seconds each), which exercises the same code.
TEST_SPEC = CalibrationSpec(levels=2, decades=0.3, min_steps=2, eval_sequences=32, resamples=50,
                            overrides=("train.val_every=0", "train.tensorboard=false",
                                       "train.attention=sdpa"))
BUDGET = "2e11flops"


def _cram_config() -> Config:
    return Config(data=DataConfig(vocab_size=512, seq_len=32), model=TINY_MODEL,
                  train=TrainConfig(budget="6e10flops", val_every=0, tensorboard=False,
                                    attention="sdpa"))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:pydocs with a 512-token vocabulary and sequences of 32 (the cheapest shapes),
    prepared where `cram` would, so the cram test below reuses it and its calibration."""
    from shoestring.prep.prep import prep

    out = tmp_path_factory.mktemp("cram") / "data"
    cfg = _cram_config()
    prep(["builtin:pydocs"], out, cfg.data, curate=cfg.curate)
    return out


@pytest.fixture(scope="module")
def calibrated(tiny_data: Path) -> dict:
    from rich.console import Console

    root = tiny_data.parent / "calibration"  # where `cram --auto` keeps its calibrations
    root.mkdir()
    log = Console(file=open(root.parent / "log.txt", "w"), width=120)
    req = PlanRequest(hardware="t4", budget=BUDGET, data=str(tiny_data))
    first = calibrated_plan(req, TEST_SPEC, root=root, console=log)
    plan_file = root / "plan.yaml"
    from shoestring.plan.planner import write_plan

    write_plan(first, plan_file)
    return {"tree": first, "plan": plan_file, "root": root, "req": req, "log": log}


@pytest.mark.slow
def test_calibrated_plan_states_its_cost_and_an_interval(calibrated: dict) -> None:
    meta = calibrated["tree"]["plan"]
    cal, pred = meta["calibration"], meta["prediction"]
    assert cal["points"] == 10 and cal["sizes_per_level"] == 5 and cal["reused_points"] == 0
    assert cal["within_share"] and cal["flops"] <= 0.15 * 2e11
    assert cal["flops_trained_now"] == cal["flops"] and cal["wall_s"] > 0
    # the rest of the budget is what the plan trains (to within a step of the trainer's)
    assert meta["budget"]["flops"] == pytest.approx(2e11 - cal["flops"], rel=1e-4)
    assert meta["budget"]["total_flops"] == 2e11
    assert pred["comparable"] and pred["low"] <= pred["loss"] <= pred["high"]
    assert pred["law"] == "calibrated" and "eval.json mlm_loss" in pred["units"]
    assert isinstance(pred["extrapolated"], bool)
    assert "within its 15% share" in meta["notes"][0]
    assert cal["trunks"] == 0 and "branches" not in meta["notes"][0]
    # calibrated far below where masked-LM loss follows a power law: said, not hidden
    assert pred["precise"] is False and pred["regime"]["top_flops"] < 2.2e15
    assert pred["regime"]["top_flops"] == max(cal["levels"])
    assert len(pred["regime"]["slopes"]) == len(cal["levels"]) - 1
    assert "indicative" in P.line(pred) and "indicative" in pred["basis"]
    assert any("power law (Deshpande" in note for note in meta["notes"])
    # the law file keeps the bootstrap: planning with it gives the same interval
    law_file = cal["law_file"]
    again = make_plan(PlanRequest(hardware="t4", budget=f"{meta['budget']['flops']}flops",
                                  data=calibrated["req"].data, law=law_file))
    assert again["plan"]["prediction"]["low"] == pytest.approx(pred["low"])


@pytest.mark.slow
def test_a_second_calibration_on_the_same_data_reuses_every_point(calibrated: dict) -> None:
    cal_dir = Path(calibrated["tree"]["plan"]["calibration"]["dir"])
    stamps = {p: p.stat().st_mtime_ns for p in cal_dir.glob("runs/C*/summary.json")}
    assert len(stamps) == 10
    tree = calibrated_plan(calibrated["req"], TEST_SPEC, root=calibrated["root"],
                           console=calibrated["log"])
    cal = tree["plan"]["calibration"]
    assert cal["reused_points"] == 10 and cal["flops_trained_now"] == 0
    assert {p: p.stat().st_mtime_ns for p in cal_dir.glob("runs/C*/summary.json")} == stamps
    assert tree["plan"]["prediction"]["loss"] == calibrated["tree"]["plan"]["prediction"]["loss"]
    # a wall-clock budget pays for every second spent before the plan's run — the
    # calibration's wall, fitting, and what the caller spent before (cram's prep): at 0.001%
    # of a T4's 65 TFLOP/s, 2e11 FLOPs (the same levels, all reused) are 308 s
    rate = 65e12 * 1e-5
    seconds = 2e11 / rate
    timed = calibrated_plan(PlanRequest(hardware="t4", budget=f"{seconds!r}s", mfu=1e-5,
                                        data=calibrated["req"].data), TEST_SPEC,
                            root=calibrated["root"], console=calibrated["log"],
                            spent_s=20.0)["plan"]
    cal = timed["calibration"]
    spent = cal["spent_before_plan_s"]
    assert cal["reused_points"] == 10 and spent >= 20.0 + cal["wall_s"] and spent < seconds
    assert timed["budget"]["flops"] == pytest.approx((seconds - spent) * rate, rel=1e-3)
    assert f"{spent:.0f} s spent before the plan's run" in timed["notes"][0]
    with pytest.raises(ShoestringError, match="the whole budget"):
        calibrated_plan(PlanRequest(hardware="t4", budget=f"{seconds!r}s", mfu=1e-5,
                                    data=calibrated["req"].data), TEST_SPEC,
                        root=calibrated["root"], console=calibrated["log"], spent_s=seconds)


@pytest.mark.slow
def test_train_records_the_prediction_and_eval_report_history_check_it(
        calibrated: dict, tiny_data: Path, tmp_path: Path) -> None:
    plan_file, run = calibrated["plan"], tmp_path / "run"
    # the plan's own budget is minutes on a busy CPU: 30 steps keep this check of the
    # bookkeeping quick (the loss is then not the planned run's, which is not checked here)
    r = run_cli("train", "--data", str(tiny_data), "--plan", str(plan_file), "-o", str(run),
                "--steps", "30", "--set", "train.val_every=0", "--set",
                "train.tensorboard=false", timeout=600)
    assert r.returncode == 0, r.stderr
    assert "plan's prediction" in r.stdout
    summary = json.loads((run / "summary.json").read_text())
    planned = yaml.safe_load(plan_file.read_text())["plan"]["prediction"]
    assert summary["prediction"]["loss"] == pytest.approx(planned["loss"])
    assert summary["prediction"]["plan"] == str(plan_file.resolve())

    r = run_cli("eval", str(run))
    assert r.returncode == 0, r.stderr
    achieved = json.loads((run / "eval.json").read_text())["mlm_loss"]
    line = next(ln for ln in r.stdout.splitlines() if "plan's prediction" in ln)
    assert f"achieved {achieved:.3f}" in line
    inside = planned["low"] <= achieved <= planned["high"]
    assert ("inside the interval" in line) == inside and ("OUTSIDE" in line) == (not inside)

    r = run_cli("report", str(run), "-o", str(tmp_path / "report"))
    assert r.returncode == 0, r.stderr
    table = json.loads((tmp_path / "report" / "report.json").read_text())["runs"][0]["table"]
    assert f"achieved {achieved:.3f}" in table["plan's prediction"]

    # --history: a sweep dir and this run refit the law. The calibration's own points (2
    # steps each) do not pin a law; the sweep here holds points of a known law at these
    # sizes, as a sweep writes them, so the refit is well posed and this run is one more point
    sweep = _law_sweep(tmp_path / "sweep", Law("known", E=3.5, A=30.0, B=60.0, alpha=0.3,
                                               beta=0.35))
    out = tmp_path / "next.yaml"
    r = run_cli("plan", "--hardware", "t4", "--budget", BUDGET, "--data", str(tiny_data),
                "--history", str(sweep), "--history", str(run), "-o", str(out))
    assert r.returncode == 0, r.stderr
    tree = yaml.safe_load(out.read_text())["plan"]
    assert tree["history"]["points"] == 16 and "calibration" not in tree
    assert tree["prediction"]["law"] == "history" and tree["prediction"]["comparable"]
    assert tree["prediction"]["low"] <= tree["prediction"]["loss"] <= tree["prediction"]["high"]
    # a run's shape comes along, so the refit's frontier knows the widths it was measured on
    from shoestring.plan.calibrate import history_points
    from shoestring.plan.fit import point_width

    model = yaml.safe_load((run / "config.yaml").read_text())["model"]
    mine = history_points([run], "mlm")
    assert point_width(mine[0]) == model["hidden_size"] / model["num_layers"]
    cal_dir = calibrated["tree"]["plan"]["calibration"]["dir"]
    # a run without a held-out eval cannot teach the law anything
    (run / "eval.json").unlink()
    r = run_cli("plan", "--hardware", "t4", "--budget", BUDGET, "--data", str(tiny_data),
                "--history", cal_dir, "--history", str(run))
    fails_cleanly(r, "no held-out loss", "shoestring eval")


@pytest.mark.slow
def test_cram_auto_trains_the_calibrated_plan_and_checks_it(calibrated: dict,
                                                            tiny_data: Path) -> None:
    """`cram --auto`: the same data and settings reuse the calibration (a share of 50% of
    6e10 FLOPs buys the same levels), then the plan for the rest is trained and checked."""
    from dataclasses import replace

    from rich.console import Console

    from shoestring.cram import cram

    result = cram(["builtin:pydocs"], tiny_data.parent, _cram_config(),
                  console=calibrated["log"], auto=replace(TEST_SPEC, share=0.5))
    meta = result.plan["plan"]
    cal = meta["calibration"]
    assert cal["reused_points"] == 10 and cal["within_share"] and cal["flops"] <= 0.5 * 6e10
    # the run trained the plan: the budget left after calibration, to within a step
    step = meta["batch"]["tokens_per_step"] * result.summary["flops_per_token"]
    assert abs(result.summary["total_flops"] - (6e10 - cal["flops"])) <= step
    recorded = json.loads((result.run_dir / "summary.json").read_text())["prediction"]
    assert recorded["loss"] == pytest.approx(meta["prediction"]["loss"])
    console = Console(width=200, record=True)
    console.print(result.table())
    text = console.export_text()
    assert "calibration" in text and "plan's prediction" in text
    assert f"achieved {result.evaluation['mlm_loss']:.3f}" in text
    assert result.wall_s is not None and "wall clock" in text


def test_cram_auto_trains_a_wall_clock_budget_to_its_deadline() -> None:
    """`cram --auto --budget 20m`: the plan's run gets the budget's seconds less what prep and
    calibration spent and less a reserve for validation and evaluation (at the plan's FLOP
    rate), as a wall-clock budget, so a slower machine still ends on time; a FLOP budget is
    trained as planned, and a budget already spent is refused by name."""
    from rich.console import Console

    from shoestring.config import Config
    from shoestring.cram import _to_deadline

    quiet = Console(quiet=True)
    tree = {"plan": {"budget": {"input": "20m", "mfu": 0.3},
                     "hardware": {"peak_flops": 1e11, "devices": 1},
                     "model": {"flops_per_token": 3e6}},
            "data": {"seq_len": 128}}
    cfg = Config().model_copy(update={"train": Config().train.model_copy(
        update={"budget": parse_budget("3e14flops")})})
    timed, left = _to_deadline(cfg, tree, 100.0, quiet)
    assert timed.train.budget.text == f"{left:.3f}s"
    reserve = 1200 - 100 - left
    assert timed.train.steps is None and 0 < reserve < 100
    # the reserve is the forward passes of validation and evaluation at the plan's rate
    more = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"max_sequences": 8192})})
    extra = 1200 - 100 - _to_deadline(more, tree, 100.0, quiet)[1] - reserve
    assert extra == pytest.approx(4096 * 128 * 3e6 / 3 / (1e11 * 0.3), rel=1e-3)
    flops = {**tree, "plan": {**tree["plan"], "budget": {"input": "4e14flops", "mfu": 0.3}}}
    assert _to_deadline(cfg, flops, 100.0, quiet) == (cfg, None)
    with pytest.raises(ShoestringError, match="nothing of the 1200 s budget") as e:
        _to_deadline(cfg, tree, 1190.0, quiet)
    assert e.value.where == "--budget"


def test_a_deadline_already_past_ends_training_after_one_step(pydocs_dir: Path,
                                                              tmp_path: Path) -> None:
    """`train(deadline=...)` cuts a seconds budget to what is left of the deadline when the
    loop starts (what `cram --auto` gives it): one already past leaves the one step every run
    takes; a FLOP budget ignores it."""
    import time

    from rich.console import Console

    from shoestring.train.loop import train

    quiet = Console(quiet=True)
    cfg = _cram_config().model_copy(update={"train": _cram_config().train.model_copy(
        update={"budget": parse_budget("10m")})})
    summary = train(cfg, pydocs_dir, tmp_path / "timed", console=quiet,
                    deadline=time.perf_counter())
    assert summary["steps"] == 1
    flops = train(_cram_config(), pydocs_dir, tmp_path / "flops", console=quiet,
                  deadline=time.perf_counter())
    assert flops["steps"] > 1 and flops["total_flops"] >= 0.99 * 6e10


def test_ctrl_c_in_plan_calibrate_names_the_finished_points_and_the_command(
        tiny_data: Path, tmp_path: Path) -> None:
    """The real CLI with the default calibration, SIGINT once a point is finished: exit 130,
    the points kept and where, that the same command reuses them, and that command, on
    stderr; the estimate of the time left was printed before."""
    import re

    args = ["plan", "--calibrate", "--budget", "4.1e13flops", "--data", str(tiny_data),
            "--calibration-dir", str(tmp_path / "cal")]
    # SIGINT once the first point is finished (its "min left" line)
    code, stderr = interrupt_cli(args, when="min left for")
    assert code == 130, stderr
    assert "points to train" in stderr and "estimated after the first point" in stderr
    m = re.search(r"calibration interrupted: (\d+) of (\d+) points are finished and kept in "
                  r"(\S+)", stderr)
    assert m and 1 <= int(m[1]) < int(m[2]), stderr
    assert len((Path(m[3]) / "points.jsonl").read_text().splitlines()) == int(m[1])
    assert "the same command reuses them" in stderr
    assert "shoestring " + " ".join(args) in stderr and "Traceback" not in stderr


# ------------------------------------------- a calibration that cannot pin its law (issue 61)

# The law issue 61's calibration fitted on a slice of mixed-en (15 points, 7.6e10–2.4e12
# FLOPs): A vanished, so loss does not fall with N, and β sat on its bound.
ISSUE_61 = Law("issue-61", E=0.907, A=2.33e-85, B=10.6, alpha=0.167, beta=0.05)


def _degenerate_points(data: Path, budget: float, spec: CalibrationSpec) -> list[dict]:
    """The points `calibration_points` sizes for ``budget``, their losses from ISSUE_61 (no
    N dependence) with 1% log-normal scatter."""
    rng = np.random.default_rng(0)
    points = calibration_points(str(data), budget, spec)
    for p in points:
        p["val_loss"] = ISSUE_61.loss(p["params_non_embedding"], p["tokens"]) * math.exp(
            rng.normal(0, 0.01))
    return points


def test_an_unpinned_fit_is_named_and_the_prior_scaled_to_its_points_plans_instead(
        pydocs_dir: Path) -> None:
    """Points whose loss does not fall with N leave the real fit's α on its bound with no
    IsoFLOP frontier (`unpinned` names it); the issue's own law has no compute-optimal size;
    the prior scaled to the points keeps its exponents, sets its level from them, and plans
    with a finite interval that holds the points' scatter."""
    from shoestring.plan.calibrate import fit_points, prior_fit, unpinned
    from shoestring.plan.laws import EPOCH_2024

    spec = CalibrationSpec(resamples=50)
    points = _degenerate_points(pydocs_dir, 1e14, spec)
    boot = fit_points(points, "mlm", "calibrated", spec)
    why = unpinned(boot, 8.5e13)
    assert why is not None and "at its bound" in why and "no IsoFLOP frontier" in why
    theta = np.log([[ISSUE_61.A, ISSUE_61.B, ISSUE_61.E, ISSUE_61.alpha, ISSUE_61.beta]])
    issue = F.BootstrapFit(F.FitResult(ISSUE_61, 0.0, 0.01, 15), theta, np.zeros(15),
                           boot.span, 0.9, 0)
    assert "no compute-optimal size" in (unpinned(issue, 8.5e13) or "")
    used = prior_fit(points, "mlm", spec)
    law = used.fit.law
    assert unpinned(used, 8.5e13) is None
    assert (law.alpha, law.beta, law.params) == (EPOCH_2024.alpha, EPOCH_2024.beta, "total")
    scale = law.E / EPOCH_2024.E
    assert law.A / EPOCH_2024.A == pytest.approx(scale) and scale < 1  # points below epoch's
    ratios = [p["val_loss"] / EPOCH_2024.loss(p["params"], p["tokens"]) for p in points]
    assert math.log(scale) == pytest.approx(np.mean(np.log(ratios)))
    # the scatter around the scaled prior is the interval's: far wider than the 1% noise
    assert used.fit.rmse_log > 0.05 and used.backtest is not None
    tree = make_plan(PlanRequest(hardware="t4", budget="8.5e13flops", data=str(pydocs_dir)),
                     fitted=used)
    pred = tree["plan"]["prediction"]
    assert pred["comparable"] and 0 <= pred["low"] <= pred["loss"] <= pred["high"] < math.inf
    assert pred["law"] == "epoch-scaled" and pred["extrapolated"]


def test_the_statement_before_training_follows_from_the_sizing(pydocs_dir: Path) -> None:
    """Before a point trains: the top level's decades below the MLM regime and the smallest
    budget whose calibration reaches it, found by the same sizing — so a 10× budget states a
    decade less and the same budget, which sizes a top level in the regime while 2% less
    does not."""
    from shoestring.plan.calibrate import regime_preview

    spec = CalibrationSpec()

    def top(budget: float) -> float:
        return max(p["budget_flops"] for p in calibration_points(str(pydocs_dir), budget, spec))

    small, large = (regime_preview(str(pydocs_dir), spec, sorted(
        {p["budget_flops"] for p in calibration_points(str(pydocs_dir), b, spec)}))
        for b in (1e14, 1e15))
    assert small is not None and large is not None
    assert small["decades_below"] == pytest.approx(math.log10(2.2e15 / top(1e14)))
    assert small["decades_below"] - large["decades_below"] == pytest.approx(1.0, abs=0.02)
    need = small["budget_for_top_flops"]
    assert need == large["budget_for_top_flops"]
    # the least to two figures: it and 3% more reach it (the sizing shrinks an overshooting
    # top level in 3% steps, so the level is not monotone in the budget), 10% less does not
    assert top(need) >= 2.2e15 and top(need * 1.03) >= 2.2e15 > top(need * 0.9)
    assert small["budget_for_all_levels_flops"] > need * 10  # the lowest level: 1.5 decades on
    assert f"{small['decades_below']:.2f} decades under" in small["said"]
    assert f"a budget of {need:.2g} FLOPs" in small["said"] and "falls back" in small["said"]


@pytest.mark.slow
def test_a_calibration_that_cannot_pin_the_law_plans_with_the_prior_and_says_why(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """`plan --calibrate` end to end on a calibration dir whose points (the ones the sizing
    asks for, already finished: nothing trains) cannot pin the law: exit 0 with a plan on the
    prior scaled to them, the line saying so, the points kept, and the plan file and the law
    file recording which law and why; `plan --law` on that file plans the same."""
    from shoestring.plan.calibrate import calibration_dir
    from shoestring.plan.sweep import FORMAT
    from shoestring.plan.planner import data_info

    spec = CalibrationSpec()
    budget = 1e14
    cal = calibration_dir(str(pydocs_dir.resolve()), spec, tmp_path / "cal")
    cal.mkdir(parents=True)
    (cal / "sweep.json").write_text(json.dumps({
        "format": FORMAT, "data_dir": data_info(str(pydocs_dir))["dir"], "objective": "mlm",
        "law": "epoch", "overrides": [], "config": None}))
    points = _degenerate_points(pydocs_dir.resolve(), budget, spec)
    (cal / "points.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    plan_file = tmp_path / "plan.yaml"
    r = run_cli("plan", "--calibrate", "--hardware", "t4", "--budget", f"{budget:g}flops",
                "--data", str(pydocs_dir), "--calibration-dir", str(tmp_path / "cal"),
                "-o", str(plan_file))
    assert r.returncode == 0, r.stderr
    err = " ".join(r.stderr.split())
    assert "below the regime: the top level" in err and "puts the top level in the regime" in err
    assert err.index("below the regime") < err.index("points to train") \
        if "points to train" in err else True
    assert "15 reused" in err
    assert "the calibration could not pin the law" in err and f"kept in {cal}" in err
    assert "the plan below uses the prior 'epoch' law" in err
    meta = yaml.safe_load(plan_file.read_text())["plan"]
    assert meta["calibration"]["law_used"] == "prior"
    assert meta["law_source"]["from"] == "prior" and "no IsoFLOP frontier" in \
        meta["law_source"]["reason"]
    assert meta["law"]["name"] == "epoch-scaled" and meta["prediction"]["law"] == "epoch-scaled"
    assert meta["notes"][0].startswith("the calibration could not pin the law")
    assert "within its 15% share" in meta["notes"][1]
    assert meta["calibration"]["regime"]["budget_for_top_flops"] > budget
    law_file = yaml.safe_load((cal / "law.yaml").read_text())
    assert law_file["law"]["name"] == "epoch-scaled"
    assert law_file["fallback"]["prior"] == "epoch" and law_file["fallback"]["reason"]
    assert law_file["fallback"]["fitted_law"]["at_bounds"]  # the fit it replaced, kept
    again = make_plan(PlanRequest(hardware="t4", budget=f"{meta['budget']['flops']}flops",
                                  data=str(pydocs_dir), law=str(cal / "law.yaml")))
    assert again["plan"]["prediction"]["loss"] == pytest.approx(meta["prediction"]["loss"])
    assert again["plan"]["model"]["shape"] == meta["model"]["shape"]
