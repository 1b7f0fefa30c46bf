"""Report figures as PNG files.

Figures are built with matplotlib's object API (`Figure`, rendered by Agg on
save) rather than pyplot, so the report never touches the process-wide backend
or leaks figures when it runs inside a notebook or a long-lived process.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from shiftlab import metrics

DPI = 110


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def _short(label: str, width: int = 28) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def reliability_grid(panels: list[tuple[str, np.ndarray, np.ndarray, float]], path: Path) -> Path | None:
    """One reliability diagram per (title, confidences, correct, ece %) panel."""
    panels = [p for p in panels if len(p[1]) and not np.isnan(p[1]).any()]
    if not panels:
        return None
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(3.3 * ncols, 3.4 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, conf, corr, ece) in zip(axes.flat, panels):
        bins = metrics.reliability_bins(conf, corr)
        lo = np.array([b[0] for b in bins])
        width = lo[1] - lo[0]
        acc = np.array([b[3] for b in bins])
        mean_conf = np.array([b[4] for b in bins])
        filled = ~np.isnan(acc)
        ax.bar(lo[filled], acc[filled], width=width, align="edge", color="#4878d0",
               edgecolor="white", label="accuracy")
        # The gap between confidence and accuracy is what ECE averages: outline it,
        # above the bar (over-confident) or inside it (under-confident).
        ax.bar(lo[filled], np.abs(mean_conf[filled] - acc[filled]),
               bottom=np.minimum(acc[filled], mean_conf[filled]), width=width, align="edge",
               facecolor="none", edgecolor="#c62828", hatch="///", linewidth=0.8, label="gap to confidence")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
        ax.set_title(f"{_short(title)}\nECE {ece:.2f}%", fontsize=9)
    axes.flat[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return _save(fig, path)


def accuracy_vs_time(points: list[tuple[str, float, float, str]], path: Path) -> Path | None:
    """Top-1 against seconds per image (log x): one labelled point per (name, seconds, top1, run);
    one marker shape per run, so methods of different backbones stay apart."""
    points = [p for p in points if p[1] and p[1] > 0 and not math.isnan(p[1]) and not math.isnan(p[2])]
    if not points:
        return None
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    runs = list(dict.fromkeys(p[3] for p in points))
    for name, sec, acc, run in points:
        ax.scatter(sec, acc, s=40, marker="osD^vP*X"[runs.index(run) % 8])
        ax.annotate(_short(name, 36), (sec, acc), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    ax.set(xlabel="seconds per image (log scale)", ylabel="top-1 accuracy (%)",
           title="Accuracy vs. cost (clean images)")
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def heatmap(row_names: list[str], col_names: list[str], values: np.ndarray, path: Path, title: str,
            diverging: bool = False, value_fmt: str = "{:.1f}") -> Path | None:
    """Annotated heatmap; diverging maps are centred on 0 (blue: positive, red: negative)."""
    if not row_names or not col_names:
        return None
    fig = Figure(figsize=(max(6.0, 0.62 * len(col_names) + 2.5), 0.45 * len(row_names) + 1.8))
    ax = fig.subplots()
    masked = np.ma.masked_invalid(values)
    if diverging:
        # At least +-1 point, so that all-zero differences do not stretch the colour scale.
        bound = max(float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.0, 1.0)
        im = ax.imshow(masked, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
    else:
        im = ax.imshow(masked, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if np.isfinite(values[i, j]):
                ax.text(j, i, value_fmt.format(values[i, j]), ha="center", va="center", fontsize=7,
                        color="black" if diverging else "white")
    ax.set_xticks(range(len(col_names)), col_names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(row_names)), [_short(r, 36) for r in row_names], fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02)
    return _save(fig, path)


def grouped_bars(group_names: list[str], series: dict[str, list[float]], path: Path, title: str,
                 ylabel: str = "top-1 accuracy (%)") -> Path | None:
    """Bars per group (e.g. method), one colour per series (e.g. clean, pgd); nan = no bar."""
    if not group_names or not series:
        return None
    fig = Figure(figsize=(max(6.0, 0.9 * len(group_names) * max(1, len(series)) / 2 + 3), 4.5))
    ax = fig.subplots()
    width = 0.8 / len(series)
    x = np.arange(len(group_names))
    for k, (name, values) in enumerate(series.items()):
        vals = np.array(values, dtype=float)
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, np.nan_to_num(vals), width, label=name)
        for rect, v in zip(bars, vals):
            if np.isfinite(v):
                ax.annotate(f"{v:.1f}", (rect.get_x() + rect.get_width() / 2, v), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
            else:
                rect.set_visible(False)
    ax.set_xticks(x, [_short(g, 24) for g in group_names], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)
