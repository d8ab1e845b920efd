"""`shoestring report`: plots and one HTML page that say what one or several runs did.

A run dir already holds everything (``metrics.jsonl``, ``summary.json``, ``config.yaml``,
``eval.json``); the report only reads it, so it can be made at any time, even of a run that
is still going or was interrupted (its summary is then missing and the table says so).

Several runs are overlaid on the same axes, one colour per run, so recipes compare at a
glance: loss against wall clock (what a budget buys), against tokens (data efficiency) and
against FLOPs (compute efficiency), plus the schedules (learning rate, batch size) against
the fraction of the budget used, which is what shoestring's schedules are keyed to.

Plots are drawn with matplotlib's Agg canvas (no display, no global pyplot state). The
output folder is built beside its target and swapped in, so it is complete or absent.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from shoestring.errors import ShoestringError
from shoestring.fsutil import (building_dir, check_output_dir, json_object_or_none, unique_paths,
                               write_bytes_atomic, write_json_atomic, write_text_atomic)
from shoestring.rundir import RunDir, parse_metrics, read_json_object
from shoestring.train.forecast import outcome_line

FORMAT = "shoestring-report/1"
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]


@dataclass
class RunData:
    """What the report needs from one run dir (``summary``/``config``/``eval`` may be absent)."""

    path: Path
    name: str
    train: list[dict[str, Any]]  # records with "loss"
    val: list[dict[str, Any]]  # records with "val_loss"
    summary: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_metrics(path: Path) -> tuple[list[dict], list[dict], list[str]]:
    """``metrics.jsonl`` as (train records, validation records, notes), read and checked by
    the run dir's one reader; a step a resumed run logged again keeps its later record."""
    records, notes = parse_metrics(path) if path.is_file() else ([], [])
    train: list[dict] = []
    val: list[dict] = []
    for r in records:
        target = train if _number(r.get("loss")) else val
        while target and target[-1]["step"] >= r["step"]:  # a resumed run re-logs steps
            target.pop()
        target.append(r)
    return train, val, notes


def load_run(path: str | Path, name: str | None = None) -> RunData:
    """Read one run dir; a folder without ``metrics.jsonl`` is not a run dir."""
    rd = RunDir(path)
    path = rd.path
    if not path.is_dir():
        raise ShoestringError("run dir not found", where=str(path),
                              fix="pass folders written by `shoestring train`")
    if not rd.metrics_path.is_file() and not rd.config_path.is_file():
        raise ShoestringError("not a shoestring run dir (no metrics.jsonl or config.yaml)",
                              where=str(path), fix="pass folders written by `shoestring train`")
    train, val, notes = read_metrics(rd.metrics_path)
    if not train and not val:
        notes.append("no metrics yet: the run is still starting, or was interrupted before "
                     "its first log step")
    run = RunData(path=path, name=name or path.resolve().name, train=train, val=val, notes=notes,
                  summary=read_json_object(rd.summary_path),
                  config=rd.read_config_dict(),
                  eval=read_json_object(rd.eval_path) or read_json_object(rd.decoder_eval_path))
    if run.summary is None:
        run.notes.append("no summary.json: the run is still going or was interrupted")
    return run


def _names(paths: list[Path]) -> list[str]:
    """Folder names, or longer path tails where two runs share a name."""
    parts = [p.resolve().parts for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]


# ---------------------------------------------------------------------------------- series


def _interp(x: float, xs: list[float], ys: list[float]) -> float | None:
    """Linear interpolation (extrapolating from the origin before the first record)."""
    if not xs:
        return None
    if x <= xs[0]:
        return ys[0] * x / xs[0] if xs[0] else ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1
    return ys[-1]


def _flops(run: RunData, r: dict) -> float | None:
    """Cumulative training FLOPs at a record: its own ``flops``, else tokens × FLOPs/token."""
    if _number(r.get("flops")):
        return float(r["flops"])
    per_token = (run.summary or {}).get("flops_per_token")
    if _number(per_token) and _number(r.get("tokens")):
        return float(r["tokens"]) * per_token
    return None


def series(run: RunData, x: str, y: str,
           records: list[dict] | None = None) -> tuple[list[float], list[float]]:
    """(xs, ys) of ``y`` against ``x`` ("elapsed_s", "tokens", "flops", "progress", "step").

    Validation records that lack the x value get it interpolated by step from the training
    records, so validation points land on the training curve's axis whatever they carry.
    """
    records = run.train if records is None else records
    known_x = [(r["step"], _flops(run, r) if x == "flops" else r.get(x)) for r in run.train]
    known = [(s, v) for s, v in known_x if _number(v)]
    xs_out: list[float] = []
    ys_out: list[float] = []
    for r in records:
        value = r.get(y)
        if not _number(value):
            continue
        xv = _flops(run, r) if x == "flops" else r.get(x)
        if not _number(xv):
            xv = _interp(r["step"], [s for s, _ in known], [v for _, v in known])
        if xv is None:
            continue
        xs_out.append(float(xv))
        ys_out.append(float(value))
    return xs_out, ys_out


# ---------------------------------------------------------------------------------- plots


def _figure(width: float = 7.5, height: float = 4.5):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig, ax, **labels: Any) -> bytes:
    """The plot with its labels (``ax.set``), a grid and a legend, as PNG bytes."""
    ax.set(**labels)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _loss_plot(runs: list[RunData], x: str, xlabel: str, title: str,
               logx: bool = False) -> bytes | None:
    fig, ax = _figure()
    drawn = False
    for i, run in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        xs, ys = series(run, x, "loss")
        if xs:
            ax.plot(xs, ys, color=color, lw=1.4, label=f"{run.name} (train)")
            drawn = True
        vx, vy = series(run, x, "val_loss", run.val)
        if vx:
            ax.plot(vx, vy, color=color, ls="--", marker="o", ms=4, lw=1, label=f"{run.name} (val)")
            drawn = True
        loss = eval_loss(run)
        if _number(loss) and xs:
            ax.plot([xs[-1]], [loss], color=color, marker="*", ms=12, ls="none",
                    label=f"{run.name} (eval {loss:.3f})")
    if not drawn:
        return None
    if logx:
        ax.set_xscale("log")
    return _png(fig, ax, xlabel=xlabel, ylabel="loss (nats per predicted token)", title=title)


def _schedule_plot(runs: list[RunData], y: str, ylabel: str, title: str,
                   default: Any = None) -> bytes | None:
    fig, ax = _figure(7.5, 3.6)
    drawn = False
    for i, run in enumerate(runs):
        x = "progress" if all(_number(r.get("progress")) for r in run.train) else "step"
        xs, ys = series(run, x, y)
        if not xs and default is not None:  # an older run without the field: the constant
            constant = default(run)
            if _number(constant):
                xs, _ = series(run, x, "loss")
                ys = [float(constant)] * len(xs)
        if xs:
            ax.plot(xs, ys, color=COLORS[i % len(COLORS)], lw=1.4, label=run.name,
                    drawstyle="steps-post" if y == "batch_size" else "default")
            drawn = True
    if not drawn:
        return None
    return _png(fig, ax, xlabel="fraction of the budget used", ylabel=ylabel, title=title)


def eval_loss(run: RunData) -> float | None:
    """Held-out loss from ``eval.json`` (MLM) or ``decoder_eval.json`` (CLM perplexity run)."""
    e = run.eval or {}
    if _number(e.get("mlm_loss")):
        return float(e["mlm_loss"])
    ppl = e.get("perplexity")
    return float(ppl["loss"]) if isinstance(ppl, dict) and _number(ppl.get("loss")) else None


def make_plots(runs: list[RunData]) -> dict[str, tuple[str, bytes]]:
    """File name → (caption, PNG bytes); plots with nothing to draw are left out."""
    plots = {
        "loss_vs_time.png": ("Training loss against wall clock (the budgeted loop only)",
                             _loss_plot(runs, "elapsed_s", "wall clock (s)", "loss vs wall clock")),
        "loss_vs_tokens.png": ("Training loss against tokens seen",
                               _loss_plot(runs, "tokens", "tokens", "loss vs tokens")),
        "loss_vs_flops.png": ("Training loss against training FLOPs (log scale)",
                              _loss_plot(runs, "flops", "training FLOPs", "loss vs FLOPs",
                                         logx=True)),
        "lr.png": ("Learning-rate schedule",
                   _schedule_plot(runs, "lr", "learning rate", "learning rate")),
        "batch_size.png": ("Batch-size schedule (sequences per optimizer step)",
                           _schedule_plot(runs, "batch_size", "sequences / step", "batch size",
                                          default=lambda run: ((run.config or {}).get("train")
                                                               or {}).get("batch_size"))),
        "throughput.png": ("Throughput (tokens/s) over the run",
                           _schedule_plot(runs, "tokens_per_s", "tokens / s", "throughput")),
        "grad_norm.png": ("Gradient norm (before clipping)",
                          _schedule_plot(runs, "grad_norm", "global grad norm", "gradient norm")),
        "data_wait.png": ("Time waiting for data, as logged",
                          _schedule_plot(runs, "data_wait", "data wait", "data wait")),
    }
    return {name: (caption, png) for name, (caption, png) in plots.items() if png is not None}


# ---------------------------------------------------------------------------------- summary


_FORMATS: dict[str, Callable[[Any], str]] = {
    "int": lambda v: f"{int(v):,}", "M": lambda v: f"{v / 1e6:.2f}M",
    "pct": lambda v: f"{v:.1%}", "loss": lambda v: f"{v:.3f}", "flops": lambda v: f"{v:.3g}",
    "s": lambda v: f"{v:,.1f} s"}


def _fmt(value: Any, kind: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return _FORMATS.get(kind, str)(value)


def summary_rows(run: RunData) -> dict[str, str]:
    """The table's rows for one run (label → text), "—" where the run does not say."""
    s, c, e = run.summary or {}, run.config or {}, run.eval or {}
    last = run.train[-1] if run.train else {}
    model, train = c.get("model") or {}, c.get("train") or {}
    dims = (f"{model.get('num_layers')} × {model.get('hidden_size')} ({model.get('num_heads')} "
            f"heads, {model.get('intermediate_size')} FF)") if model else None
    params = s.get("params")
    if _number(params) and _number(s.get("params_non_embedding")):
        params_text = f"{_fmt(params, 'M')} ({_fmt(s['params_non_embedding'], 'M')} non-embedding)"
    else:
        params_text = _fmt(params, "M")
    budget = s.get("budget") or train.get("budget") or (
        f"{train['steps']} steps" if train.get("steps") else None)
    dtype = s.get("dtype")
    val = run.val[-1]["val_loss"] if run.val else None
    eval_text = _fmt(eval_loss(run), "loss")
    if _number(e.get("mlm_loss")) and _number(e.get("unigram_loss")):
        eval_text += f" (unigram {e['unigram_loss']:.3f})"
    return {
        "status": ("finished" + (" (resumed)" if s.get("resumed") else "")) if run.summary
        else "no summary (running or interrupted)",
        "objective": _fmt(s.get("objective") or model.get("objective") or "mlm"),
        "model": dims or "—",
        "params": params_text,
        "budget": _fmt(budget),
        "steps": _fmt(s.get("steps", last.get("step")), "int"),
        "tokens": _fmt(s.get("tokens", last.get("tokens")), "int"),
        "training FLOPs": _fmt(s.get("total_flops"), "flops"),
        "train time": _fmt(s.get("train_seconds", last.get("elapsed_s")), "s"),
        "tokens/s": _fmt(s.get("tokens_per_s"), "int"),
        "MFU": _fmt(s.get("mfu"), "pct") + (
            f" of {s['peak_flops'] / 1e9:,.0f} GFLOP/s" if _number(s.get("peak_flops")) else ""),
        "device": _fmt(s.get("device")) + (f", {dtype}" if dtype else ""),
        "recipe": ", ".join(
            f"{label} {train[key]}" for label, key in (
                ("schedule", "schedule"), ("peak lr", "lr"), ("batch", "batch_size"),
                ("ramp", "batch_ramp"), ("micro-batch", "micro_batch_size"))
            if train.get(key) not in (None, 0, 0.0)) or "—",
        "skipped steps (non-finite)": _fmt(s.get("skipped_steps"), "int"),
        "final train loss": _fmt(s.get("final_train_loss", last.get("loss")), "loss"),
        "last validation loss": _fmt(val, "loss"),
        "held-out eval loss": eval_text,
        "plan's prediction": _prediction_text(s.get("prediction"), run.eval),
        "run's forecast": outcome_line(s.get("forecast")) or "—",
    }


def _prediction_text(pred: dict[str, Any] | None, evaluation: dict[str, Any] | None) -> str:
    """Predicted vs achieved held-out loss, and whether it fell in the interval."""
    from shoestring.plan.prediction import check, describe, held_out, line

    if not pred:
        return "—"
    checked = check(pred, held_out(evaluation))
    return describe(checked) if checked else line(pred) + " (not evaluated yet)"


_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
figure { margin: 1.5em 0; }
figcaption { color: #555; }
img { max-width: 100%; }
.note { color: #a15c00; }
pre { background: #f7f7f7; padding: 8px; overflow-x: auto; font-size: 12px; }
"""


def render_html(runs: list[RunData], plots: dict[str, tuple[str, bytes]]) -> str:
    """One self-contained page: the summary table, every plot (embedded), notes, configs."""
    e = html.escape
    rows = [summary_rows(r) for r in runs]
    head = "".join(
        f'<th style="color:{COLORS[i % len(COLORS)]}">{e(r.name)}</th>' for i, r in enumerate(runs))
    body = "".join(
        f"<tr><th>{e(label)}</th>" + "".join(f"<td>{e(row[label])}</td>" for row in rows) + "</tr>"
        for label in rows[0])
    paths = "".join(
        f"<li><b>{e(r.name)}</b>: <code>{e(str(r.path.resolve()))}</code></li>" for r in runs)
    notes = "".join(f'<li class="note">{e(r.name)}: {e(n)}</li>' for r in runs for n in r.notes)
    figures = "".join(
        f'<figure><img alt="{e(caption)}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"><figcaption>{e(caption)} '
        f'(<a href="{e(name)}">{e(name)}</a>)</figcaption></figure>'
        for name, (caption, png) in plots.items())
    configs = "".join(
        f"<details><summary>{e(r.name)}: config.yaml</summary><pre>"
        f"{e(yaml.safe_dump(r.config, sort_keys=False))}</pre></details>"
        for r in runs if r.config)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>shoestring report: {e(', '.join(r.name for r in runs))}</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>shoestring training report</h1><p>{len(runs)} run(s), made {stamp}.</p>"
        f"<ul>{paths}</ul>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + f"<h2>Summary</h2><table><tr><th></th>{head}</tr>{body}</table>"
        "<p>Train loss is the mean over each logging window at the training mask rate; the "
        "held-out eval loss is <code>shoestring eval</code>'s, on fixed masks, comparable "
        "across runs on the same data dir.</p>"
        f"<h2>Plots</h2>{figures}"
        + (f"<h2>Configurations</h2>{configs}" if configs else "")
        + "</body></html>\n"
    )


def write_report(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Read ``run_dirs``, write PNGs, ``index.html`` and ``report.json`` into ``out``.

    ``out`` is replaced whole when it is an earlier report (it holds our ``report.json``);
    any other non-empty folder is refused.
    """
    if not run_dirs:
        raise ShoestringError("no run dirs given", fix="shoestring report RUN_DIR [RUN_DIR ...]")
    paths = [Path(p) for p in unique_paths(run_dirs)]
    runs = [load_run(p, n) for p, n in zip(paths, _names(paths))]
    if not any(r.train or r.val for r in runs):  # one without metrics is listed beside others
        raise ShoestringError("no run has metrics yet", where=", ".join(map(str, paths)),
                              fix="train for at least train.log_every steps before making a "
                                  "report")
    out = Path(out)
    owned = (json_object_or_none(out / "report.json") or {}).get("format") == FORMAT
    check_output_dir(out, "report", owned=owned, overwrite=True)
    plots = make_plots(runs)
    with building_dir(out) as tmp:
        for name, (_, png) in plots.items():
            write_bytes_atomic(tmp / name, png)
        write_text_atomic(tmp / "index.html", render_html(runs, plots))
        write_json_atomic(tmp / "report.json", {
            "format": FORMAT,
            "runs": [{"name": r.name, "path": str(r.path.resolve()), "table": summary_rows(r),
                      "summary": r.summary, "eval": r.eval, "notes": r.notes} for r in runs],
            "plots": sorted(plots),
        })
    return out
