"""Reports of a downstream evaluation: results.json, a markdown table and a PNG chart.

Measured rows and literature rows never share a table. The literature rows are labelled
external references with their source, split and protocol, because the numbers are not
comparable by default: our runs are small CPU models; BERT's paper reports the GLUE *test*
server; Cramming reports dev medians under the same ``sane`` protocol we run.

GLUE average conventions differ between papers, so the one used is always stated:

- ``glue9``: the mean of the 9 numbers MNLI-m, MNLI-mm, QQP, QNLI, SST-2, CoLA, STS-B, MRPC,
  RTE — WNLI excluded (BERT, Devlin et al. 2019, Table 1; Cramming, Geiping & Goldstein 2023).
- ``glue8``: the mean over the 8 tasks, MNLI counted once as the mean of m and mm.

Both need every one of those tasks; with fewer, a *partial* mean over the columns run is
shown, labelled as such, and never put beside a published average.
A task's number is the mean of its metrics (GLUE leaderboard convention: MRPC and QQP =
mean of F1 and accuracy, STS-B = mean of Pearson and Spearman), × 100.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from shoestring.eval.glue import SCORE_COLUMNS

__all__ = ["REFERENCES", "fmt_difference", "glue_averages", "render_chart", "render_markdown",
           "score_columns", "sweep_choice"]

GLUE9 = ["MNLI-m", "MNLI-mm", "QQP", "QNLI", "SST-2", "CoLA", "STS-B", "MRPC", "RTE"]

# How the Cramming rows were checked: the PDF is not in this workspace, so their 20 numbers (9
# scores and the average, per row) were compared with an independent transcription of the same
# table (the blog post "Why pretrain your own language model?", 2023-01-19): all agree.
_CHECKED = ("numbers agree with an independent transcription of that table; not re-read from "
            "the PDF")


def _cramming(name: str, source: str, scores: dict[str, float], average: float) -> dict[str, Any]:
    """A row of Cramming's final GLUE-dev table (both rows share split, protocol, check)."""
    return {"name": name, "source": source + ", final GLUE-dev table; " + _CHECKED,
            "split": "dev",
            "protocol": "GLUE-sane (lr 4e-5, batch 16, 5 epochs), median of 5 trials",
            "scores": scores, "average": average, "average_convention": "glue9"}


# Published numbers, copied with their source; never measured here.
REFERENCES: list[dict[str, Any]] = [
    _cramming("BERT-base (fully trained), Cramming's re-evaluation",
              "Geiping & Goldstein, Cramming: Training a Language Model on a Single GPU in One "
              "Day (arXiv:2212.14034, ICML 2023)",
              {"MNLI-m": 83.2, "MNLI-mm": 83.4, "QQP": 87.7, "QNLI": 90.6, "SST-2": 91.9,
               "CoLA": 56.5, "STS-B": 86.7, "MRPC": 89.3, "RTE": 59.2}, 80.9),
    _cramming("crammed BERT (1 day, one A6000 GPU)",
              "Geiping & Goldstein, Cramming (arXiv:2212.14034)",
              {"MNLI-m": 83.9, "MNLI-mm": 84.1, "QQP": 87.3, "QNLI": 89.5, "SST-2": 92.2,
               "CoLA": 44.5, "STS-B": 84.6, "MRPC": 87.5, "RTE": 53.8}, 78.6),
    {
        "name": "BERT-base (original paper)",
        "source": "Devlin et al., BERT (NAACL 2019), Table 1",
        "split": "test (GLUE server)",
        "protocol": "best of lr {5,4,3,2}e-5 on dev, batch 32, 3 epochs; QQP/MRPC F1, "
        "STS-B Spearman",
        "scores": {"MNLI-m": 84.6, "MNLI-mm": 83.4, "QQP": 71.2, "QNLI": 90.5, "SST-2": 93.5,
                   "CoLA": 52.1, "STS-B": 85.8, "MRPC": 88.9, "RTE": 66.4},
        "average": 79.6,
        "average_convention": "glue9",
    },
]

CONVENTIONS = {
    "glue9": "mean of the 9 numbers MNLI-m, MNLI-mm, QQP, QNLI, SST-2, CoLA, STS-B, MRPC, RTE "
    "(WNLI excluded), as BERT and Cramming report it",
    "glue8": "mean over the 8 tasks without WNLI, MNLI counted once (mean of m and mm)",
}


def score_columns(tasks: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One column per reported number: GLUE columns in the usual order, then custom tasks.
    Values × 100: the median over seeds, its min/max/std, and the seed count."""
    cols, seen = [], set()
    for column, task, split in SCORE_COLUMNS:
        if task in tasks and split in tasks[task]["summary"]:
            cols.append(_column(column, task, split, tasks[task]))
            seen.add(task)
    for name, res in tasks.items():
        if name in seen:
            continue
        for split in res["summary"]:
            label = name if len(res["summary"]) == 1 else f"{name} ({split})"
            cols.append(_column(label, name, split, res))
    return cols


def _column(column: str, task: str, split: str, res: dict[str, Any]) -> dict[str, Any]:
    def scaled(score: dict[str, float]) -> dict[str, float]:
        return {k: 100 * score[k] for k in ("median", "min", "max", "std")}

    col = {"column": column, "task": task, "split": split, "metric": "+".join(res["metrics"]),
           **scaled(res["summary"][split]["score"]), "seeds": len(res["seeds"])}
    if "control" in res:
        col["scratch"] = scaled(res["control"]["summary"][split]["score"])
        col["comparison"] = res["comparison"][split]
    return col


def glue_averages(columns: list[dict[str, Any]]) -> dict[str, Any]:
    """The GLUE averages, or a labelled partial mean when tasks are missing."""
    by = {c["column"]: c["median"] for c in columns if c["column"] in GLUE9 or c["column"] == "WNLI"}
    present = [c for c in GLUE9 if c in by]
    out: dict[str, Any] = {"conventions": CONVENTIONS, "columns_present": present}
    if len(present) == len(GLUE9):
        out["glue9"] = float(np.mean([by[c] for c in GLUE9]))
        mnli = (by["MNLI-m"] + by["MNLI-mm"]) / 2
        rest = [by[c] for c in GLUE9 if not c.startswith("MNLI")]
        out["glue8"] = float(np.mean([mnli, *rest]))
        out["complete"] = True
    else:
        out["complete"] = False
        out["missing"] = [c for c in GLUE9 if c not in by]
        if present:
            out["partial_mean"] = float(np.mean([by[c] for c in present]))
            out["partial_note"] = (
                f"mean over the {len(present)} of 9 GLUE columns run ({', '.join(present)}); "
                "not a GLUE score and not comparable to published averages"
            )
    return out


def _fmt(c: dict[str, Any], seeds: int) -> str:
    if seeds > 1:
        return f"{c['median']:.1f} [{c['min']:.1f}–{c['max']:.1f}]"
    return f"{c['median']:.1f}"


def fmt_difference(cmp: dict[str, Any]) -> str:
    """``+3.2 [0.8, 5.6]`` (mean paired difference and its 95% CI), ``~`` when within noise."""
    text = f"{cmp['difference_mean']:+.1f}"
    if cmp.get("ci95"):
        lo, hi = cmp["ci95"]
        text += f" [{lo:+.1f}, {hi:+.1f}]"
    return text + (" ~" if cmp["within_noise"] else "")


def sweep_choice(arm: dict[str, Any]) -> str:
    """The setting a sweep kept for one arm, and the median dev score of every grid point (so a
    choice at the grid's edge shows)."""
    p = arm["protocol"]
    grid = ", ".join(f"{g['lr']:g}/{g['batch_size']} {100 * g['median_dev_score']:.1f}"
                     for g in arm.get("sweep", []))
    return f"lr {p['lr']:g}, batch {p['batch_size']}" + (f" (grid lr/batch median dev: {grid})"
                                                          if grid else "")


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render_markdown(results: dict[str, Any]) -> str:
    """The report as markdown: measured table, then the external references, then details."""
    cols = results["columns"]
    proto = results["protocol"]
    seeds = results["seeds"]
    seed_text = (f"Seeds: {results.get('seed_rule')}." if seeds == "auto"
                 else f"Seeds: {', '.join(map(str, seeds))}.")
    lines = [f"# Downstream evaluation of `{results['run']}`", "",
             f"Protocol **{proto['name']}**: lr {proto['lr']:g}, batch {proto['batch_size']}, "
             f"{proto['epochs']:g} epochs, {proto['warmup']:.0%} warmup then cosine decay, "
             f"max length {proto['max_length']}, AdamW β=({proto['beta1']}, {proto['beta2']}), "
             f"weight decay {proto['weight_decay']:g}; final model scored (no early stopping). "
             + seed_text]
    if proto["name"] == "sweep":
        lines += ["", "Sweep: each task keeps the (lr, batch) with the best median dev score, "
                  "so these scores are selected on dev and optimistic."]
        for name, task in results["tasks"].items():
            lines.append(f"- {name}: {sweep_choice(task)}"
                         + (f"; scratch control: {sweep_choice(task['control'])}"
                            if "control" in task else "") + ".")
    if results.get("max_train"):
        lines += ["", f"**Not the full protocol:** training sets cut to the first "
                  f"{results['max_train']:,} examples (--max-train)."]
    many = any(c["seeds"] > 1 for c in cols)
    lines += ["", "Cells: the task's score × 100 (mean of its metrics), median over seeds "
              "[min–max]." if many else "Cells: the task's score × 100 (mean of its "
              "metrics), one seed.", ""]
    avg = results.get("glue_average") or {}
    avg_head, avg_cell = [], []
    if avg.get("complete"):
        avg_head, avg_cell = ["GLUE avg (glue9)"], [f"{avg['glue9']:.1f}"]
    elif avg.get("partial_mean") is not None:
        avg_head, avg_cell = ["partial mean"], [f"{avg['partial_mean']:.1f}*"]
    head = ["model", *[c["column"] for c in cols], *avg_head]
    lines += [_md_row(head), "|" + "---|" * len(head),
              _md_row([f"measured: {results['run_name']}", *[_fmt(c, c["seeds"]) for c in cols],
                       *avg_cell])]
    controlled = [c for c in cols if "scratch" in c]
    if controlled:
        pad = ["–"] * len(avg_head)
        scratch = [_fmt(c["scratch"], c["seeds"]) if "scratch" in c else "–" for c in cols]
        diffs = [fmt_difference(c["comparison"]) if "comparison" in c else "–" for c in cols]
        lines += [_md_row(["control: same architecture from scratch", *scratch, *pad]),
                  _md_row(["pretrained − scratch (paired mean [95% CI])", *diffs, *pad])]
    lines.append("")
    if controlled:
        lines.append("The control fine-tunes the same architecture from random initialization "
                     "with the same protocol, seeds and code; seed s of both arms sees the same "
                     "batches and head initialization, so differences are paired by seed. "
                     "`~` marks a difference within noise (its 95% CI contains 0).")
        for c in controlled:
            cmp = c["comparison"]
            lines.append(f"- {c['column']}: {cmp['verdict']} ({c['seeds']} seeds).")
        lines.append("")
    if avg.get("complete"):
        lines.append(f"GLUE average: glue9 = {avg['glue9']:.1f} ({CONVENTIONS['glue9']}); "
                     f"glue8 = {avg['glue8']:.1f} ({CONVENTIONS['glue8']}).")
    elif avg.get("partial_mean") is not None:
        lines.append(f"\\* {avg['partial_note']}. Missing for a GLUE average: "
                     f"{', '.join(avg['missing'])}.")
    glue_cols = [c["column"] for c in cols if c["column"] in GLUE9]
    if glue_cols:
        lines += ["", "## External references (published numbers, not measured here)", ""]
        head = ["reference", "split", *GLUE9, "avg"]
        lines += [_md_row(head), "|" + "---|" * len(head)]
        for ref in REFERENCES:
            vals = [f"{ref['scores'][c]:.1f}" if c in ref["scores"] else "–" for c in GLUE9]
            lines.append(_md_row([ref["name"], ref["split"], *vals, f"{ref['average']:.1f}"]))
        lines.append("")
        for ref in REFERENCES:
            lines.append(f"- *{ref['name']}*: {ref['source']}; {ref['protocol']}; "
                         f"average = {ref['average_convention']}.")
        lines.append("- References are full-size models pretrained for days on GPUs/TPUs; "
                     "compare them with care (and test-server numbers are not dev numbers).")
    lines += ["", "## Details", ""]
    lines.append("| task | split | metrics (median) | std of score | train examples | "
                 "fine-tune s/seed | classifier |")
    lines.append("|---|---|---|---|---|---|---|")
    for name, res in results["tasks"].items():
        secs = np.median([s["train_seconds"] + s["eval_seconds"] for s in res["seeds"]])
        for split, summ in res["summary"].items():
            metrics = ", ".join(f"{m} {100 * summ[m]['median']:.1f}" for m in res["metrics"])
            lines.append(f"| {name} | {split} | {metrics} | {100 * summ['score']['std']:.1f} | "
                         f"{res['train_examples']:,} | {secs:.0f} | {res.get('classifier', '–')} |")
    m = results.get("machine", {})
    lines += ["", (f"Wall time {results['wall_seconds']:.0f}s on {m.get('device', '?')} "
                   f"({m.get('dtype', '?')}); load average at start "
                   f"{m.get('load_average_start', '?')}, at end {m.get('load_average_end', '?')}."),
              ""]
    return "\n".join(lines)


def render_chart(results: dict[str, Any]) -> bytes:
    """PNG bar chart: measured medians with min–max whiskers; references as hollow markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = results["columns"]
    names = [c["column"] for c in cols]
    x = np.arange(len(cols))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(cols) + 2), 4.2), dpi=120)
    controlled = all("scratch" in c for c in cols)
    width, shift = (0.38, 0.2) if controlled else (0.55, 0.0)
    arms = [(-shift, cols, "#4c72b0", f"measured: {results['run_name']} (median over seeds)")]
    if controlled:
        arms.append((shift, [c["scratch"] for c in cols], "#bbbbbb",
                     "control: same architecture from scratch"))
    lowest = []
    for offset, stats, color, label in arms:
        med = np.array([s["median"] for s in stats])
        lo = med - np.array([s["min"] for s in stats])
        hi = np.array([s["max"] for s in stats]) - med
        ax.bar(x + offset, med, width=width, color=color, label=label)
        ax.errorbar(x + offset, med, yerr=[lo, hi], fmt="none", ecolor="black", capsize=4, lw=1)
        lowest.append(med.min())
    markers = ["D", "o", "s", "^"]
    for k, ref in enumerate(REFERENCES):
        pts = [(i, ref["scores"][n]) for i, n in enumerate(names) if n in ref["scores"]]
        if pts:
            xi, yi = zip(*pts)
            ax.scatter(xi, yi, marker=markers[k % len(markers)], facecolors="none",
                       edgecolors=f"C{k + 1}", s=45, zorder=3,
                       label=f"reference: {ref['name']} ({ref['split']})")
    ax.set_xticks(x, names, rotation=30 if len(names) > 6 else 0)
    ax.set_ylabel("score × 100 (task's metric mean)")
    ax.set_ylim(min(0.0, float(min(lowest)) - 5), 100)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_title(f"{results['protocol']['name']} fine-tuning of {results['run_name']}", fontsize=10)
    ax.legend(fontsize=7, loc="lower left", framealpha=0.9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
