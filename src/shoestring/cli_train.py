"""The body of `shoestring train`: the trainer run as its plan and this device say, and its
table. It sits on the command line's floor, like `cli_eval`, because around `train.loop.train`
it asks the planner (a floor above the trainer): whether the plan was made for other hardware,
what size a GPU run with no size given trains (`device_size`), and what the plan predicted
(`prediction`, recorded in summary.json)."""

from __future__ import annotations

import os
from pathlib import Path

from rich.table import Table

from shoestring.config import Config
from shoestring.consoles import err, out
from shoestring.device import load_cost
from shoestring.errors import ShoestringError
from shoestring.plan.prediction import from_plan, line, record
from shoestring.rundir import RunDir, read_json_object
from shoestring.train.forecast import POINTS, outcome_line


def resumed_config(output: Path, config: Path | None, plan: Path | None) -> Path:
    """``--resume``: the run dir's own config.yaml, which ``--config``/``--plan`` may not replace."""
    if config is not None or plan is not None:
        raise ShoestringError("--resume uses the run's own config.yaml", where="--config/--plan",
                              fix="drop --config/--plan; change settings with --set")
    saved = RunDir(output).config_path
    if not saved.is_file():
        raise ShoestringError("nothing to resume: no config.yaml", where=str(output),
                              fix="train without --resume to start a run here")
    return saved


def parallel_overrides(text: str | None) -> list[str]:
    """``--parallel dp=2,tp=2`` as the whole set of ``parallel.*`` degrees (the ones it does
    not name go back to their defaults)."""
    if text is None:
        return []
    from shoestring.dist.layout import parse_parallel

    given = parse_parallel(text)
    defaults = {"dp": "null", "dp_replicate": "null", "dp_shard": "null", "tp": 1, "pp": 1}
    return [f"parallel.{k}={given.get(k, v)}" for k, v in defaults.items()]


def run(cfg: Config, data: Path, output: Path, *, plan: Path | None, resume: bool,
        overwrite: bool) -> None:
    """Train ``cfg`` on ``data`` into ``output``; rank 0 records the device sizing and the
    plan's prediction in the summary and prints the table."""
    from shoestring.data.datadir import check_data_settings
    from shoestring.plan.device_size import for_this_device, note_in_summary
    from shoestring.plan.planner import hardware_mismatch
    from shoestring.train.loop import train

    # data.* as given (not a plan's, nor a resumed run's own config.yaml)
    check_data_settings(cfg, data, cfg.given("data", file=not resume))
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if plan is not None and (warning := hardware_mismatch(plan)) and rank0:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    kept = None  # a resumed run keeps the prediction its plan gave it
    if resume:
        kept = (read_json_object(RunDir(output).summary_path) or {}).get("prediction")
    cfg, sizing = for_this_device(cfg, data, console=err)  # a GPU, no size given: its own
    if rank0 and (pred := from_plan(plan) if plan is not None else kept):
        err.print(f"the plan's prediction: {line(pred)}; the run's own forecast follows at "
                  + ", ".join(f"{p:.0%}" for p in POINTS) + " of the budget", highlight=False)
    summary = train(cfg, data, output, overwrite=overwrite, console=err, resume=resume)
    if rank0:
        summary["sized_for_device"] = note_in_summary(output, sizing)
        if plan is not None or kept:
            summary["prediction"] = record(output, plan, kept)
        _print(summary, output)


def _print(summary: dict, output: Path) -> None:
    t = Table(title=f"trained {output}", show_header=False)
    t.add_row("steps / tokens", f"{summary['steps']:,} / {summary['tokens']:,}")
    t.add_row("time", f"{summary['train_seconds']:.1f}s (+{summary['save_seconds']:.1f}s save, "
              f"+{summary.get('setup_seconds', 0.0):.1f}s setup: outside the budget)")
    t.add_row("tokens/s", f"{summary['tokens_per_s']:,.0f}")
    t.add_row("MFU", f"{summary['mfu']:.1%} of {summary['peak_flops'] / 1e9:,.0f} GFLOP/s measured ({summary['dtype']})")
    if summary.get("mfu_note"):
        t.add_row("", summary["mfu_note"])
    t.add_row("train loss", f"{summary['first_loss']:.3f} → {summary['final_train_loss']:.3f}")
    if summary.get("val_loss_subset") is not None:
        t.add_row("validation loss (subset)", f"{summary['val_loss_subset']:.3f}")
    if summary.get("skipped_steps"):
        t.add_row("skipped (non-finite)", f"{summary['skipped_steps']:,} steps")
    if summary.get("sized_for_device"):
        t.add_row("sized for the device", summary["sized_for_device"]["why"])
    t.add_row("compile", f"{'on' if summary['compiled'] else 'off'}: {summary['speed_choices']}")
    if busy := load_cost(summary.get("cpu_load")):
        t.add_row("machine load", busy)
    if found := outcome_line(summary.get("forecast")):
        t.add_row("forecast (final loss)", found)
    if summary.get("prediction"):
        t.add_row("plan's prediction", line(summary["prediction"])
                  + f"; check it: shoestring eval {output}")
    out.print(t)
