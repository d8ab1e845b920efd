"""PNG plots of a sweep and its fit: IsoFLOP curves, the compute-optimal frontier, and
predicted-vs-observed loss (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shoestring.plan.fit import IsoFlopMinimum
from shoestring.plan.laws import Law


def _figure(size: tuple[float, float]):  # noqa: ANN202
    """pyplot (headless) and a new figure of ``size`` inches with its axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=size)


def _save(plt, fig, ax, path: Path, xlabel: str, ylabel: str, title: str,  # noqa: ANN001
          legend: bool = True) -> Path:
    """Label and grid the axes, write the figure to ``path`` atomically and close it."""
    import io

    from shoestring.fsutil import write_bytes_atomic

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
    return path


def plot_isoflops(points: list[dict[str, Any]], minima: list[IsoFlopMinimum], law: Law | None,
                  path: Path) -> Path:
    """Validation loss against N, one curve per FLOP budget, with the parabola and its minimum."""
    plt, fig, ax = _figure((6.5, 4.5))
    budgets = sorted({float(p["budget_flops"]) for p in points})
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(budgets))))
    by_c = {m.flops: m for m in minima}
    for color, c in zip(colors, budgets):
        pts = sorted((p for p in points if float(p["budget_flops"]) == c),
                     key=lambda p: p["params_non_embedding"])
        n = np.array([p["params_non_embedding"] for p in pts], dtype=float)
        loss = np.array([p["val_loss"] for p in pts], dtype=float)
        ax.plot(n, loss, "o", color=color, label=f"C = {c:.2g} FLOPs")
        if c in by_c:
            m = by_c[c]
            xs = np.linspace(np.log(n.min()), np.log(n.max()), 100)
            ax.plot(np.exp(xs), np.polyval(m.coeffs, xs), "-", color=color, alpha=0.7)
            ax.plot([m.params], [m.loss], "*", color=color, markersize=14, markeredgecolor="k")
        if law is not None:
            ns = np.geomspace(n.min(), n.max(), 100)
            ds = np.array([
                np.interp(np.log(x), np.log(n), np.log([p["tokens"] for p in pts])) for x in ns
            ])
            ax.plot(ns, [law.loss(x, np.exp(d)) for x, d in zip(ns, ds)], ":", color=color,
                    alpha=0.7)
    ax.set_xscale("log")
    return _save(plt, fig, ax, path, "non-embedding parameters N", "validation loss",
                 "IsoFLOP curves (points; parabola in log N; ★ minimum; dotted: fitted law)")


def plot_frontier(minima: list[IsoFlopMinimum], law: Law, reference: list[Law],
                  flops_range: tuple[float, float], path: Path) -> Path:
    """Compute-optimal N against C: the fitted law, published laws, the IsoFLOP minima."""
    plt, fig, ax = _figure((6.5, 4.5))
    cs = np.geomspace(flops_range[0] / 3, flops_range[1] * 3, 60)
    ax.plot(cs, [law.optimal(c)[0] for c in cs], "-", lw=2, label=f"{law.name} (fitted)")
    for ref in reference:
        ax.plot(cs, [ref.optimal(c)[0] for c in cs], "--", label=ref.name)
    if minima:
        ax.plot([m.flops for m in minima], [m.params for m in minima], "*", markersize=14,
                color="k", label="IsoFLOP minima")
    ax.set_xscale("log")
    ax.set_yscale("log")
    return _save(plt, fig, ax, path, "training FLOPs C",
                 "compute-optimal non-embedding parameters", "Compute-optimal frontier")


def plot_predicted(points: list[dict[str, Any]], law: Law, path: Path) -> Path:
    """Fitted-law prediction against observed validation loss, with y = x."""
    plt, fig, ax = _figure((4.8, 4.5))
    obs = np.array([p["val_loss"] for p in points], dtype=float)
    pred = np.array([law.loss(p["params_non_embedding"], p["tokens"]) for p in points])
    ax.scatter(obs, pred, c=np.log10([p["budget_flops"] for p in points]), cmap="viridis")
    lo, hi = min(obs.min(), pred.min()), max(obs.max(), pred.max())
    pad = 0.03 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=1)
    return _save(plt, fig, ax, path, "observed validation loss", "predicted by the fitted law",
                 "Predicted vs observed", legend=False)
