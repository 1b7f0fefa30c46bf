"""Report figures as PNG files, and as PDF/SVG beside them when asked (`figure_formats`).

Figures are built with matplotlib's object API (`Figure`, rendered by Agg on
save) rather than pyplot, so the report never touches the process-wide backend
or leaks figures when it runs inside a notebook or a long-lived process.

Every figure goes through `_save`, the one place that names its files: a stem made safe for every file
system and shell (letters, digits, `.`, `_`, `-`; a method key's `@`, `=`, `,`, spaces or brackets become `_`,
with a short digest of the original name so that two names never meet), and one file per format: PNG
always (the page inlines it, trackers log it), PDF and SVG (vector, for papers) when `figure_formats` says.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shiftlab import writes
from shiftlab.report.html import REPORT_ADVICE
from shiftlab.results import metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
FIGURE_FORMATS = ("png", "pdf", "svg")
_EXTRA_FORMATS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("figure_formats", default=())


@contextlib.contextmanager
def figure_formats(formats: Sequence[str]) -> Iterator[None]:
    """Within: every figure is also written as each of `formats` (pdf, svg; png is always written)."""
    unknown = [f for f in formats if f not in FIGURE_FORMATS]
    if unknown:
        raise ValueError(f"figure format {', '.join(unknown)}: choose from {', '.join(FIGURE_FORMATS)}")
    # always drawn in one order (png first): drawing a figure again may move its layout by a hair, so the same
    # formats in another order would give other bytes
    token = _EXTRA_FORMATS.set(tuple(f for f in FIGURE_FORMATS[1:] if f in formats))
    try:
        yield
    finally:
        _EXTRA_FORMATS.reset(token)


def safe_stem(stem: str) -> str:
    """A file-name stem of letters, digits, `.`, `_` and `-` only; a changed name gets 6 hex digits of the
    original's SHA-256, so that `tda@a=1` and `tda_a_1` stay two files."""
    safe = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9._-]", "_", stem)).strip("_.") or "figure"
    return safe if safe == stem else f"{safe}-{hashlib.sha256(stem.encode()).hexdigest()[:6]}"


def _new_figure(**kwargs) -> Figure:
    # matplotlib is imported when a figure is drawn, not with the report package (~0.7 s that every
    # `import shiftlab.report`, the CLI's report checks and the test collection would pay)
    from matplotlib.figure import Figure
    return Figure(**kwargs)


def _save(fig: Figure, path: Path) -> Path:
    """Write `fig` under `path`'s folder with a safe stem (module docstring): the PNG (returned) and each extra
    format of `figure_formats`."""
    path = Path(path)
    stem = safe_stem(path.stem)
    written = None
    for fmt in ("png", *_EXTRA_FORMATS.get()):
        buffer = io.BytesIO()
        # svg.hashsalt: the SVG's element ids are seeded, so the same figure gives the same file
        with _svg_salt(stem) if fmt == "svg" else contextlib.nullcontext():
            fig.savefig(buffer, format=fmt, dpi=DPI, bbox_inches="tight", metadata=_metadata(fmt))
        target = writes.write_file(path.with_name(f"{stem}.{fmt}"), buffer.getbuffer(), REPORT_ADVICE)
        written = written or target
    assert written is not None
    return written


def _metadata(fmt: str) -> dict:
    # no creation date in PDF/SVG: the same records give the same files
    return {"CreationDate": None} if fmt == "pdf" else {"Date": None} if fmt == "svg" else {}


@contextlib.contextmanager
def _svg_salt(stem: str) -> Iterator[None]:
    import matplotlib
    with matplotlib.rc_context({"svg.hashsalt": stem}):
        yield


# WCAG's relative luminance above which black text reads better than white (the two contrasts are equal)
LUMINANCE_SPLIT = 0.179


def text_color(rgba: Sequence[float]) -> str:
    """"black" or "white": whichever contrasts more with a cell of colour `rgba` (WCAG 2 relative luminance)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(float(c)) for c in rgba[:3])
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > LUMINANCE_SPLIT else "white"


def _short(label: str, width: int = 28) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def distinct_colors(n: int) -> list[tuple[float, float, float]]:
    """n colours no two of which are equal: matplotlib's tab10 / tab20 while they suffice, else hues
    spaced evenly around the HSV circle at alternating lightness (adjacent entries stay apart)."""
    import matplotlib
    from matplotlib.colors import hsv_to_rgb
    if n <= 10:
        return [tuple(c) for c in matplotlib.colormaps["tab10"].colors[:n]]
    if n <= 20:
        return [tuple(c) for c in matplotlib.colormaps["tab20"].colors[:n]]
    return [tuple(hsv_to_rgb((i / n, 0.75, 0.95 if i % 2 else 0.6))) for i in range(n)]


def reliability_figure(panels: list[tuple[str, np.ndarray, np.ndarray, float]]) -> Figure | None:
    """One reliability diagram per (title, confidences, correct, ece %) panel, each with a strip
    below it giving the number of samples in every confidence bin (a bar over 3 samples and one
    over 3,000 must not look alike)."""
    panels = [p for p in panels if len(p[1]) and not np.isnan(p[1]).any()]
    if not panels:
        return None
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = _new_figure(figsize=(3.3 * ncols, 4.3 * nrows), layout="constrained")
    outer = fig.add_gridspec(nrows, ncols)
    for k, (title, conf, corr, ece) in enumerate(panels):
        cell = outer[divmod(k, ncols)].subgridspec(2, 1, height_ratios=[4, 1.3], hspace=0.02)
        ax = fig.add_subplot(cell[0])
        counts_ax = fig.add_subplot(cell[1], sharex=ax)
        bins = metrics.reliability_bins(conf, corr)
        lo = np.array([b[0] for b in bins])
        width = lo[1] - lo[0]
        n = np.array([b[2] for b in bins])
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
        ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
        ax.tick_params(labelbottom=False)
        ax.set_title(f"{_short(title)}\nECE {ece:.2f}% (n={int(n.sum())})", fontsize=9)
        counts_ax.bar(lo, n, width=width, align="edge", color="#999999", edgecolor="white")
        for x, count in zip(lo[n > 0] + width / 2, n[n > 0]):
            counts_ax.text(x, count, str(int(count)), ha="center", va="bottom", fontsize=6, rotation=90)
        counts_ax.set_ylim(0, n.max() * 1.9)
        counts_ax.set_yticks([])
        counts_ax.set(xlabel="confidence", ylabel="samples")
        if k == 0:
            ax.legend(fontsize=7, loc="upper left")
    return fig


def reliability_grid(panels: list[tuple[str, np.ndarray, np.ndarray, float]], path: Path) -> Path | None:
    fig = reliability_figure(panels)
    return None if fig is None else _save(fig, path)


def log_ticks(lo: float, hi: float, min_ticks: int = 3) -> list[float]:
    """Readable tick values for a log axis spanning [lo, hi]: 1-2-5 steps per decade, finer
    (1, 1.5, 2, 3, 5, 7) when that leaves fewer than `min_ticks`, so a range narrower than a
    decade never shows a single unlabelled tick."""
    first, last = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1
    for steps in ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10.0 ** e for e in range(first, last + 1) for m in steps if lo <= m * 10.0 ** e <= hi]
        if len(ticks) >= min_ticks:
            return ticks
    return ticks


MIN_ACCURACY_SPAN = 10.0   # points: all methods within 0.1 point must not look far apart


def accuracy_limits(accs: list[float]) -> tuple[float, float]:
    """The accuracy axis' limits for these top-1 values (%): inside 0..100 (an accuracy is never
    negative), padded by 8 % of their range, at least MIN_ACCURACY_SPAN points wide, widened away
    from 0 or 100 when the values sit there (all scores 0 -> 0..10, not -1..1)."""
    lo, hi = min(accs), max(accs)
    pad = 0.08 * (hi - lo)
    lo, hi = max(0.0, lo - pad), min(100.0, hi + pad)
    missing = MIN_ACCURACY_SPAN - (hi - lo)
    if missing > 0:
        lo, hi = lo - missing / 2, hi + missing / 2
        if lo < 0:
            lo, hi = 0.0, hi - lo
        if hi > 100:
            lo, hi = lo - (hi - 100.0), 100.0
    return lo, hi


def accuracy_vs_time_figure(points: list[tuple[str, float, float, str]], title: str = "Accuracy vs. cost",
                             colors: dict[str, tuple] | None = None) -> Figure | None:
    """Top-1 against seconds per image (log x), one numbered point per (name, seconds, top1, run).

    Points are labelled by number and named in a legend beside the axes: names written next to
    points overlap into illegible text as soon as two methods cost about the same, and points that
    coincide get one label listing their numbers ("2,5"). One marker shape per run, so methods of
    different backbones stay apart; `colors` (name -> colour) keeps a method's colour the same in
    every figure, else every point gets its own (`distinct_colors`)."""
    # a point needs a positive finite cost (log axis) and a finite accuracy; NaN, inf, 0 are left out
    points = [p for p in points if p[1] is not None and p[2] is not None and math.isfinite(p[1]) and p[1] > 0
              and math.isfinite(p[2])]
    if not points:
        return None
    fig = _new_figure(figsize=(9, 4.8))
    ax = fig.subplots()
    runs = list(dict.fromkeys(p[3] for p in points))
    own = distinct_colors(len(points))
    spots: dict[tuple[float, float], list[int]] = {}
    for i, (name, sec, acc, run) in enumerate(points, start=1):
        color = colors.get(name, own[i - 1]) if colors else own[i - 1]
        # clip_on=False: a point at 0 % or 100 % lies on the axis' edge and must show whole
        ax.scatter(sec, acc, s=45, clip_on=False, marker="osD^vP*X"[runs.index(run) % 8], color=color,
                   label=f"{i}  {_short(name, 40)}")
        spots.setdefault((round(math.log10(sec), 2), round(acc, 1)), []).append(i)
    for numbers in spots.values():
        _, sec, acc, _ = points[numbers[0] - 1]
        ax.annotate(",".join(map(str, numbers)), (sec, acc), textcoords="offset points", xytext=(4, 4), fontsize=7)
    seconds = [p[1] for p in points]
    lo, hi = min(seconds) / 1.5, max(seconds) * 1.5
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xticks(log_ticks(lo, hi))
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    ax.set_ylim(*accuracy_limits([p[2] for p in points]))
    ax.set(xlabel="seconds per image (log scale)", ylabel="top-1 accuracy (%)", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
              ncol=max(1, math.ceil(len(points) / 24)))
    fig.tight_layout()
    return fig


def accuracy_vs_time(points: list[tuple[str, float, float, str]], path: Path, title: str = "Accuracy vs. cost",
                     colors: dict[str, tuple] | None = None) -> Path | None:
    fig = accuracy_vs_time_figure(points, title, colors)
    return None if fig is None else _save(fig, path)


def heatmap(row_names: list[str], col_names: list[str], values: np.ndarray, path: Path, title: str,
            diverging: bool = False, value_fmt: str = "{:.1f}") -> Path | None:
    """Annotated heatmap; diverging maps are centred on 0 (blue: positive, red: negative)."""
    fig = heatmap_figure(row_names, col_names, values, title, diverging, value_fmt)
    return None if fig is None else _save(fig, path)


def heatmap_figure(row_names: list[str], col_names: list[str], values: np.ndarray, title: str,
                   diverging: bool = False, value_fmt: str = "{:.1f}") -> Figure | None:
    """`heatmap`'s figure: each cell's number in black or white by the cell's luminance (`text_color`), so a
    number stays readable on dark red and dark blue alike."""
    if not row_names or not col_names:
        return None
    fig = _new_figure(figsize=(max(6.0, 0.62 * len(col_names) + 2.5), 0.45 * len(row_names) + 1.8))
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
                        color=text_color(im.cmap(im.norm(values[i, j]))))
    ax.set_xticks(range(len(col_names)), col_names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(row_names)), [_short(r, 36) for r in row_names], fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02)
    return fig


def grouped_bars(group_names: list[str], series: dict[str, list[float]], path: Path, title: str,
                 ylabel: str = "top-1 accuracy (%)") -> Path | None:
    """Bars per group (e.g. method), one colour per series (e.g. clean, pgd); nan = no bar."""
    if not group_names or not series:
        return None
    fig = _new_figure(figsize=(max(6.0, 0.9 * len(group_names) * max(1, len(series)) / 2 + 3), 4.5))
    ax = fig.subplots()
    width = 0.8 / len(series)
    x = np.arange(len(group_names))
    palette = distinct_colors(len(series))
    for k, (name, values) in enumerate(series.items()):
        vals = np.array(values, dtype=float)
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, np.nan_to_num(vals), width, label=name,
                      color=palette[k])
        for rect, v in zip(bars, vals):
            if np.isfinite(v):
                ax.annotate(f"{v:.1f}", (rect.get_x() + rect.get_width() / 2, v), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
            else:
                rect.set_visible(False)
    ax.set_xticks(x, [_short(g, 24) for g in group_names], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def stream_accuracy(lines: list[tuple[str, np.ndarray, np.ndarray]], path: Path, title: str,
                    boundaries: list[tuple[int, str]] = ()) -> Path | None:
    """Cumulative accuracy over stream positions, one line per (label, positions, accuracy %); the first solid,
    the rest (references) dashed; `boundaries`: (position where a domain starts, its name), drawn as lines."""
    lines = [ln for ln in lines if ln[1].size]
    if not lines:
        return None
    fig = _new_figure(figsize=(7.0, 3.6))
    ax = fig.subplots()
    for k, (label, x, y) in enumerate(lines):
        ax.plot(x, y, label=_short(label, 40), linestyle="-" if k == 0 else "--", linewidth=1.4 if k == 0 else 1.0,
                color=distinct_colors(max(2, len(lines)))[k])
    lo, hi = accuracy_limits([float(v) for _, _, y in lines for v in y])
    for position, name in boundaries:
        ax.axvline(position, color="0.5", linewidth=0.8, linestyle=":")
        ax.annotate(_short(name, 20), (position, hi), fontsize=7, rotation=90, va="top", ha="right", color="0.35")
    ax.set(xlabel="images seen (stream position)", ylabel="cumulative top-1 (%)", title=title, ylim=(lo, hi))
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def order_boxes(values: dict[str, list[float]], path: Path, title: str) -> Path | None:
    """One box per method over its per-order accuracies (whiskers: min and max, every order drawn as a dot)."""
    values = {k: v for k, v in values.items() if v}
    if not values:
        return None
    fig = _new_figure(figsize=(max(5.0, 0.8 * len(values) + 2), 4.0))
    ax = fig.subplots()
    names = list(values)
    ax.boxplot([values[n] for n in names], whis=(0, 100))
    for i, n in enumerate(names, start=1):
        ax.plot(np.full(len(values[n]), i), values[n], "o", markersize=3, alpha=0.5, color="0.3")
    lo, hi = accuracy_limits([float(v) for n in names for v in values[n]])
    ax.set_xticks(range(1, len(names) + 1), [_short(n, 24) for n in names], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="top-1 accuracy (%)", title=title, ylim=(lo, hi))
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)
