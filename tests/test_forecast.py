"""The run's own forecast: the law recovered from curves it generated, under every schedule;
the held-out gap; runs too short to forecast; the binned history; resume; summary.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_config
from shoestring.config import TrainConfig
from shoestring.rundir import RunDir
from shoestring.train import forecast as F
from shoestring.train.checkpoint import latest_checkpoint
from shoestring.train.loop import train
from shoestring.train.schedule import lr_factor

SCHEDULES = [dict(schedule="one-cycle", lr_peak_at=0.3), dict(schedule="wsd", decay=0.2),
             dict(schedule="cosine", warmup=0.05), dict(schedule="linear", warmup=0.05),
             dict(schedule="constant", warmup=0.05)]
LAW = F.Law(l0=3.0, a=4.0, alpha=0.45, c=0.0006)


def _factors(cfg: TrainConfig, steps: int) -> np.ndarray:
    return np.array([lr_factor(cfg, (i + 0.5) / steps) for i in range(steps)])


def _generated(factors: np.ndarray, law: F.Law, noise: float, seed: int = 0) -> np.ndarray:
    """The loss of each step under ``law``, plus Gaussian noise: what a run would log."""
    areas, out = F.Areas(), []
    for f in factors:
        areas.step(float(f))
        out.append(float(law(areas.s1, areas.s2)))
    return np.array(out) + np.random.default_rng(seed).normal(0, noise, len(out))


@pytest.mark.parametrize("shape", SCHEDULES, ids=lambda s: s["schedule"])
def test_the_law_is_recovered_from_a_curve_it_generated(shape: dict) -> None:
    cfg = TrainConfig(budget=None, steps=2000, **shape)
    factors = _factors(cfg, 2000)
    losses = _generated(factors, LAW, noise=0.005)
    truth = float(_generated(factors, LAW, noise=0.0)[-1])
    curve = F.Curve()
    for i, (f, y) in enumerate(zip(factors, losses)):
        curve.add(float(f), float(y))
        if (i + 1) in (500, 1000):  # the targets: 2% at 25% of the run, 1% at 50%
            made = F.forecast(curve, factors[i + 1:], (i + 1) / 2000)
            assert isinstance(made, F.Forecast), made
            assert made.low < made.loss < made.high
            assert not made.held_out  # no validation given: the train loss's forecast
            # the LR has yet to fall: one-cycle before its peak (30%), wsd before its decay
            ahead = {"one-cycle": i < 599, "wsd": True}.get(shape["schedule"], False)
            assert made.cooldown_ahead == ahead
            if made.cooldown_ahead:  # the law without the cool-down's gain: above the truth
                assert made.loss > truth and "cool-down is still ahead" in made.describe()
            else:
                assert made.loss == pytest.approx(truth, rel=0.02 if i < 999 else 0.01), made
    assert len(curve.bins) <= F.MAX_BINS


def test_the_held_out_forecast_adds_the_validations_gap() -> None:
    cfg = TrainConfig(budget=None, steps=400, schedule="wsd")
    factors = _factors(cfg, 400)
    losses = _generated(factors, LAW, noise=0.01)
    plain, gapped = F.Curve(), F.Curve()
    for i, (f, y) in enumerate(zip(factors, losses)):
        for c in (plain, gapped):
            c.add(float(f), float(y))
        if (i + 1) % 40 == 0:  # the validation split sits 0.3 above the train loss
            gapped.validated(i + 1, float(_generated(factors[:i + 1], LAW, 0.0)[-1]) + 0.3)
    a = F.forecast(plain, factors[200:], 0.5)
    b = F.forecast(gapped, factors[200:], 0.5)
    assert isinstance(a, F.Forecast) and isinstance(b, F.Forecast)
    assert b.held_out and b.loss - a.loss == pytest.approx(0.3, abs=0.02)
    assert "held-out" in b.describe() and "no validation yet" in a.describe()
    # the record's "now" is the train loss now, gap or not: what a finished run's ratio
    # (`COLLAPSE`, the bench's references) is of; the held-out gap is no part of it
    assert a.now == b.now == pytest.approx(F.loss_now(gapped)) == F.loss_now(plain)


def test_a_curve_too_short_or_not_falling_gets_a_sentence_not_a_number() -> None:
    curve = F.Curve()
    for _ in range(F.MIN_STEPS - 1):
        curve.add(1.0, 5.0)
    assert "too short to forecast" in F.forecast(curve, np.ones(100), 0.1)
    for _ in range(200):  # a flat curve: nothing falls, so there is no law
        curve.add(1.0, 5.0)
    made = F.forecast(curve, np.ones(100), 0.5)
    assert isinstance(made, str) and "not falling" in made


def test_bins_merge_but_keep_every_step_and_the_mean_loss() -> None:
    curve = F.Curve()
    rng = np.random.default_rng(1)
    ys = rng.normal(4.0, 0.5, 5000)
    for y in ys:
        curve.add(0.5, float(y))
    b = np.array(curve.bins)
    assert len(b) <= F.MAX_BINS and curve.width > 1
    assert b[:, 0].sum() == 5000 == curve.steps
    assert b[:, 1].sum() == pytest.approx(ys.sum())
    back = F.Curve.from_dict(json.loads(json.dumps(curve.to_dict())), step=5000)
    assert back == curve


def test_future_factors_are_the_schedules_steps_to_come() -> None:
    cfg = TrainConfig(budget=None, steps=100, schedule="cosine", warmup=0.1)
    curve = F.Curve()
    for k in range(1, 26):
        curve.add(1.0, 5.0)
        curve.progressed(k / 100)
    got = F.future_factors(cfg, curve, 0.25)
    assert len(got) == 75
    assert got == pytest.approx(_factors(cfg, 100)[25:])
    assert len(F.future_factors(cfg, curve, 1.0)) == 0


def test_the_steps_to_come_are_counted_at_the_recent_pace() -> None:
    """A wall-clock budget whose first step compiled for 10% of it: the steps after it run
    at 0.2% each, and the 50% still to come is 250 of them, not the 25 the average says."""
    cfg = TrainConfig(budget="8m", schedule="cosine")
    curve = F.Curve()
    curve.add(0.0, 9.0)
    curve.progressed(0.10)
    for k in range(1, 201):
        curve.add(1.0, 5.0)
        curve.progressed(0.10 + 0.002 * k)
    assert curve.progress == pytest.approx(0.5)
    assert len(F.future_factors(cfg, curve, curve.progress)) == 250
    assert len(curve.paces) == F.PACE_STEPS


def test_a_run_records_its_forecasts_and_a_resume_continues_them(pydocs_dir: Path,
                                                                 tmp_path: Path) -> None:
    kw = dict(steps=40, log_every=5, checkpoint_every="16steps", keep_checkpoints=5,
              val_every=0.1, val_sequences=8)
    whole = train(tiny_config(**kw), pydocs_dir, tmp_path / "whole")
    found = whole["forecast"]
    whole_curve = {"validations": [[r["step"], r["val_loss"]] for r in map(
        json.loads, (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines())
        if "val_loss" in r]}
    assert [p["at"] for p in found["points"]] == list(F.POINTS)
    assert "too short" in found["points"][0]["note"]  # 4 steps seen at 10%
    made = [p for p in found["points"] if "loss" in p]
    assert made, found  # 20 steps at 50%: a forecast
    # the passes over the train split by the end: 40 steps of the whole batch, known ahead
    cfg = tiny_config(**kw)
    split = json.loads((pydocs_dir / "manifest.json").read_text())["splits"]["train"]
    for p in found["points"]:
        assert p["passes"] == pytest.approx(40 * cfg.train.batch_size / split["sequences"],
                                            abs=1e-3)
    assert found["achieved"] == whole["val_loss_subset"]
    for p in made:
        assert p["low"] <= p["loss"] <= p["high"]
        # the default one-cycle's cool-down is ahead at 50%: the masked LM's references
        # speak for it if its loss has come as far as theirs had, else the law does
        refs = F.references("mlm", TrainConfig(), p["at"], p["passes"])
        reached = (F.in_regime(p["now"], whole["first_loss"], refs, F.FAR_MARGIN["mlm"])
                   and p["step"] >= F.MIN_COLLAPSE_STEPS)
        assert p["method"] == ("collapse" if reached else "law")
        if reached:  # it validates every tenth of its budget, as the references did:
            # the collapse is from its last validation by then
            last = [v for st, v in whole_curve["validations"] if st <= p["step"]][-1]
            assert p["validated"] == pytest.approx(last, rel=1e-4)
            assert p["loss"] == pytest.approx(last * np.mean([r[2] for r in refs]), rel=1e-4)
        assert p["error"] == pytest.approx(p["loss"] / found["achieved"] - 1, abs=1e-4)
        assert p["covered"] == (p["low"] <= found["achieved"] <= p["high"])
    # cut back to step 16 (before the 50% point): the resumed run must forecast the same
    train(tiny_config(**kw), pydocs_dir, tmp_path / "cut")
    cut = tmp_path / "cut"
    while latest_checkpoint(cut).step > 16:
        shutil.rmtree(RunDir(cut).checkpoints()[-1])
    shutil.rmtree(cut / "final")
    again = train(tiny_config(**kw), pydocs_dir, cut, resume=True)

    def strip(points: list[dict]) -> list[dict]:
        return [{k: v for k, v in p.items() if k != "seconds"} for p in points]

    assert strip(again["forecast"]["points"]) == strip(found["points"])


def test_a_run_that_validates_as_the_references_did_collapses_from_its_last_validation(
        pydocs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop hands the forecast its last validation when it validates every tenth of its
    budget, as the references did. The shipped references are of runs far longer than a
    test's, so this one gets a table whose regime holds it (its numbers are not a claim)."""
    table = {0.5: ((0.80, 0.50, 0.85), (0.82, 0.70, 0.88), (0.84, 0.95, 0.90))}
    monkeypatch.setitem(F.COLLAPSE, ("mlm", "one-cycle"), table)
    out = train(tiny_config(steps=120, log_every=5, val_every=0.1, val_sequences=8),
                pydocs_dir, tmp_path / "run")
    half = next(p for p in out["forecast"]["points"] if p["at"] == 0.5)
    assert half["method"] == "collapse", half
    vals = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text()
                           .splitlines()) if "val_loss" in r and r["step"] <= half["step"]]
    assert half["validated"] == pytest.approx(vals[-1]["val_loss"], rel=1e-4)
    assert half["loss"] == pytest.approx(half["validated"] * np.mean([0.85, 0.88, 0.90]),
                                         rel=1e-4)


def test_a_checkpoint_without_a_curve_resumes_and_says_why_there_is_no_forecast() -> None:
    for saved in (None, {"areas": "damaged"}, {**F.Curve().to_dict(), "steps": 3}):
        curve = F.Curve.from_dict(saved, step=40)
        assert curve.lost and curve.steps == 40
        for _ in range(100):
            curve.add(1.0, 4.0)
        assert curve.steps == 140
        assert "kept no loss curve" in F.forecast(curve, np.ones(10), 0.5)
    assert not F.Curve.from_dict(None, step=0).lost  # a run's start: nothing to lose


def test_a_law_that_extrapolates_to_nonsense_is_not_a_forecast() -> None:
    """A curve that falls fast and then jumps about: whatever the law makes of it, a forecast
    below zero or with an interval wider than the loss itself is not printed as one."""
    curve = F.Curve()
    rng = np.random.default_rng(3)
    for k in range(60):
        curve.add(min(1.0, (k + 1) / 60), float(9.0 - 0.08 * k + rng.normal(0, 1.5)))
    made = F.forecast(curve, np.linspace(1.0, 0.0, 5000), 0.01)
    if isinstance(made, F.Forecast):
        assert made.low > 0 and made.high - made.low < 2 * made.loss
    else:
        assert "does not follow the law" in made or "not falling" in made


def test_before_the_cool_down_the_forecast_is_the_loss_now_times_the_references_ratio() -> None:
    """One-cycle peaks at 75%: at 25% the law cannot see the cool-down, so with references
    whose loss had come as far (now / first) the forecast is the mean train loss of the last
    tenth of the steps times their mean ratio, with Student's t prediction interval; once
    the LR falls, without references, or for a run in another regime, it is the law's."""
    from scipy.stats import t

    cfg = TrainConfig(budget=None, steps=400)
    factors = _factors(cfg, 400)
    losses = _generated(factors, LAW, noise=0.01)
    curve = F.Curve()
    for f, y in zip(factors[:100], losses[:100]):
        curve.add(float(f), float(y))
    now = losses[90:100].mean()
    assert F.loss_now(curve) == pytest.approx(now)
    first = now / 0.7  # the run has come to 0.7 of its first loss, as the references had
    refs = ((0.70, 0.69), (0.72, 0.70), (0.75, 0.71))
    made = F.forecast(curve, factors[100:], 0.25, refs=refs, first=first)
    assert isinstance(made, F.Forecast) and made.method == "collapse" and made.held_out
    assert made.now == pytest.approx(now) and made.loss == pytest.approx(now * 0.72333333)
    half = now * t.ppf(0.95, 2) * np.std([0.70, 0.72, 0.75], ddof=1) * np.sqrt(1 + 1 / 3)
    assert made.high - made.loss == pytest.approx(half) == made.loss - made.low
    assert "3 reference runs" in made.describe()
    assert F.forecast(curve, factors[100:], 0.25).method == "law"
    # with its last validation and references that hold their ratio to theirs, the collapse
    # is from the held-out loss: the gap between held-out and train is the run's own
    triples = ((0.70, 0.69, 0.80), (0.72, 0.70, 0.82), (0.75, 0.71, 0.87))
    held = F.forecast(curve, factors[100:], 0.25, refs=triples, first=first, validated=5.0)
    assert held.method == "collapse" and held.validated == 5.0
    assert held.loss == pytest.approx(5.0 * np.mean([0.80, 0.82, 0.87]))
    assert held.high - held.loss == pytest.approx(
        5.0 * t.ppf(0.95, 2) * np.std([0.80, 0.82, 0.87], ddof=1) * np.sqrt(1 + 1 / 3))
    assert "last validation (5.000)" in held.describe()
    # references without that ratio: from the train loss, whatever the run validated
    assert F.forecast(curve, factors[100:], 0.25, refs=refs, first=first,
                      validated=5.0).loss == pytest.approx(made.loss)
    assert F.held_out_base(TrainConfig(), curve) is None  # no validation yet
    curve.validated(100, 5.0)
    assert F.held_out_base(TrainConfig(), curve) == 5.0
    assert F.held_out_base(TrainConfig(val_every=0.05), curve) is None  # not where they did
    curve.validations.clear()
    # a run still near its first loss (0.9 of it) has not come as far as the references;
    # one at 0.6 of it came much further: where the objective bounds that side (MLM), the
    # references do not speak for it either
    assert F.forecast(curve, factors[100:], 0.25, refs=refs, first=now / 0.9).method == "law"
    far = F.FAR_MARGIN["mlm"]
    assert F.forecast(curve, factors[100:], 0.25, refs=refs, first=now / 0.6,
                      far=far).method == "law"
    assert F.forecast(curve, factors[100:], 0.25, refs=refs, first=now / 0.6).method == "collapse"
    low, high = 0.69 - far, 0.71 + F.REGIME_MARGIN
    for q, inside in ((low + 1e-3, True), (low - 1e-3, False),
                      (high - 1e-3, True), (high + 1e-3, False)):
        assert F.in_regime(q, 1.0, refs, far) == inside, q
    assert F.in_regime(0.2, 1.0, refs) and not F.in_regime(high + 1e-3, 1.0, refs)
    assert F.forecast(curve, factors[100:], 0.25, refs=refs).method == "law"  # first unknown
    short = F.Curve()  # too few steps: the loss still falls as a start's does
    for f, y in zip(factors[:F.MIN_COLLAPSE_STEPS - 1], losses[:F.MIN_COLLAPSE_STEPS - 1]):
        short.add(float(f), float(y))
    assert F.forecast(short, factors[F.MIN_COLLAPSE_STEPS - 1:], 0.1, refs=refs,
                      first=F.loss_now(short) / 0.7).method == "law"
    for f, y in zip(factors[100:340], losses[100:340]):  # past the peak: C is measured
        curve.add(float(f), float(y))
    assert F.forecast(curve, factors[340:], 0.85, refs=refs, first=first).method == "law"


def test_references_apply_to_their_objective_and_the_default_shape_only() -> None:
    one_cycle = TrainConfig()
    assert len(F.references("mlm", one_cycle, 0.25)) >= F.MIN_REFERENCES
    assert F.references("mlm", TrainConfig(lr_peak_at=0.5), 0.25) == ()
    assert F.references("rtd", one_cycle, 0.25) == ()  # its loss is another quantity
    # a run that reads its data more often than they did: its train loss parts from the
    # held-out loss, and the references' ends do not apply
    assert F.references("mlm", one_cycle, 0.25, passes=F.MAX_PASSES) == \
        F.references("mlm", one_cycle, 0.25)
    assert F.references("clm", one_cycle, 0.5, passes=F.MAX_PASSES + 0.1) == ()
    for objective in ("mlm", "clm"):
        for schedule in ("one-cycle", "wsd", "cosine"):
            for at in F.POINTS:
                n = len(F.references(objective, TrainConfig(schedule=schedule), at))
                assert n == 0 or n >= F.MIN_REFERENCES


def test_the_check_keeps_a_finished_run_and_reads_the_same_references_back(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """bench/forecast_check.py --references keeps each run dir it reads as a small record in
    its ledger (run dirs do not outlive a checkout; the record is committed), and the record
    alone gives the same references as the run dir did. The record is the run's curve: the
    hybrid's law ratio refits the law on the curve rebuilt from it, and for a run logged every
    step that is the run's own curve, so the law forecasts it makes are the ones the run
    printed (this run is too short for the collapse: the law spoke)."""
    import subprocess
    import sys

    run = tmp_path / "tiny-mlm-run"
    train(tiny_config(steps=80, log_every=1, val_every=0.125, val_sequences=8), pydocs_dir, run)
    bench = Path(__file__).resolve().parents[1] / "bench" / "forecast_check.py"
    ledger = tmp_path / "ledger"

    def references(*args: str, line: str = '{"run"') -> dict:
        r = subprocess.run([sys.executable, str(bench), "--references", *args, "--no-record"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return next(json.loads(x) for x in r.stdout.splitlines() if x.startswith(line))

    from_dir = references(str(run), "--ledger", str(ledger))
    kept = json.loads((ledger / "tiny-mlm-run.json").read_text())
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s for s, _, _ in kept["logged"]] == [x["step"] for x in logged if "loss" in x]
    assert len(kept["validations"]) == sum("val_loss" in x for x in logged) >= 2
    assert kept["steps"] == 80 and kept["objective"] == "mlm"
    summary = json.loads((run / "summary.json").read_text())
    split = json.loads((pydocs_dir / "manifest.json").read_text())["splits"]["train"]
    assert kept["passes"] == pytest.approx(summary["tokens"] / split["tokens"])
    assert from_dir["ratio 50%"] == pytest.approx(summary["val_loss_subset"]
                                                  / from_dir["now 50%"])
    # the held-out curve's own collapse: the final over the last validation by the point
    at_half = next(st for st, q, _ in kept["logged"] if q >= 0.5)
    last = [v for st, v in kept["validations"] if st <= at_half][-1]
    assert from_dir["held-out ratio 50%"] == pytest.approx(kept["achieved"] / last)
    # --check tables what the kept run printed, as a check's own runs are tabled
    r = subprocess.run([sys.executable, str(bench), "--check", str(ledger / "tiny-mlm-run.json"),
                        "--no-record"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    row = next(x for x in lines if x.get("run") == "tiny-mlm-run")
    printed = [p for p in summary["forecast"]["points"] if "error" in p]
    assert printed and row["steps"] == 80
    for p in printed:
        assert row[f"at {p['at']:.0%}"].startswith(f"{p['error']:+.2%}"), (row, p)
        both = next(x for x in lines if x.get("objective") == "all"
                    and x.get("point") == f"{p['at']:.0%}")
        assert both["runs"] == 1 and both["within 2%"] == (abs(p["error"]) <= 0.02)
        assert both["covered"] == f"{int(p['covered'])} of 1"
    assert row["share of run"] == f"{row['forecast s'] / summary['train_seconds']:.2%}"
    sys.path.insert(0, str(bench.parent))
    from forecast_check import law_ratios

    made = {p["at"]: p for p in kept["points"] if p.get("method") == "law"}
    assert len(made) >= 2, kept["points"]
    ratios = law_ratios(kept)
    for at, p in made.items():
        assert ratios[at] == pytest.approx(kept["achieved"] / p["loss"], rel=2e-3), at
    # a shape the references never ran has no known LR fractions to rebuild with
    assert law_ratios({**kept, "default shape": False}) == {}
    # the same run kept again replaces its own record; another run of that name gets its own
    references(str(run), "--ledger", str(ledger))
    assert sorted(p.name for p in ledger.iterdir()) == ["tiny-mlm-run.json"]
    other = tmp_path / "elsewhere" / "tiny-mlm-run"
    train(tiny_config(steps=30, log_every=5), pydocs_dir, other)
    references(str(other), "--ledger", str(ledger))
    assert sorted(p.name for p in ledger.iterdir()) == ["tiny-mlm-run-2.json", "tiny-mlm-run.json"]
    # how far the two runs' ratios lie apart, as the docs quote it
    spread = references(*(str(p) for p in sorted(ledger.iterdir())), "--no-ledger",
                        line='{"ratios of"')
    other_ratio = references(str(ledger / "tiny-mlm-run-2.json"), "--no-ledger")["ratio 50%"]
    pair = (from_dir["ratio 50%"], other_ratio)
    assert spread["runs"] == 2 and spread["50%"].startswith(
        f"range {abs(pair[0] - pair[1]) / (sum(pair) / 2):.1%}, ")
    shutil.rmtree(run)
    assert references(str(ledger / "tiny-mlm-run.json"), "--no-ledger") == from_dir



def test_the_check_holds_out_a_configuration_not_one_seed_of_it() -> None:
    """bench/forecast_check.py's leave-one-out forecasts each run from the runs of *other*
    configurations: seeds of one (``-p0``, ``-p1``) would agree with each other and flatter
    the check. Its tables carry the name they are given."""
    import argparse
    import io
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from common import Bench
    from forecast_check import leave_one_out

    runs = [("a-p0", {0.5: (0.80, 0.55)}), ("a-p1", {0.5: (0.81, 0.55)}),
            ("b", {0.5: (0.82, 0.56)}), ("c", {0.5: (0.84, 0.56)})]
    bench = Bench("forecast_check", argparse.Namespace(record=None), file=io.StringIO())
    leave_one_out(bench, {("mlm", "one-cycle"): runs}, {}, "check")
    assert [t["table"] for t in bench.tables] == ["check", "check points"]
    rows = {r["run"]: r["at 50%"] for r in bench.tables[0]["rows"]}
    for run, ratio in (("a-p0", 0.80), ("a-p1", 0.81)):  # from b and c only
        assert rows[run].startswith(f"{0.83 / ratio - 1:+.1%} ") and rows[run].endswith("(2)")
    assert rows["b"].startswith(f"{np.mean([0.80, 0.81, 0.84]) / 0.82 - 1:+.1%} ")
    assert rows["b"].endswith("(3)")


def test_the_check_names_a_bad_override_before_it_trains(tmp_path: Path) -> None:
    """`--set` takes KEY=VALUE for every run (another shape than the references'); anything
    else is refused up front, naming it, with nothing prepared or trained."""
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[1] / "bench" / "forecast_check.py"
    r = subprocess.run([sys.executable, str(bench), "--set", "model.preset", "--no-ledger",
                        "--no-record", "--out", str(tmp_path / "out"), "--corpus", "x.txt"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--set 'model.preset': want KEY=VALUE" in r.stderr
    assert not (tmp_path / "out").exists()
