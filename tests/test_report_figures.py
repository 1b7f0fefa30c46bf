"""Report figures (issue 40 case 10): PDF and SVG beside every PNG (`--figure-format`), file names safe for any
file system and shell, heatmap numbers readable on every cell colour."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from shiftlab.report import plots
from shiftlab.report.build import build_report
from test_report import PATTERNS, write_run

SAFE = re.compile(r"^[A-Za-z0-9._-]+$")


@pytest.mark.parametrize(("rgba", "expected"), [
    ((0.40, 0.0, 0.12, 1.0), "white"),    # RdBu's dark red end
    ((0.02, 0.19, 0.38, 1.0), "white"),   # RdBu's dark blue end
    ((0.97, 0.97, 0.97, 1.0), "black"),   # its white centre
    ((0.27, 0.0, 0.33, 1.0), "white"),    # viridis at 0
    ((0.99, 0.91, 0.14, 1.0), "black"),   # viridis at 100
])
def test_text_colour_contrasts_with_the_cell(rgba, expected):
    assert plots.text_color(rgba) == expected


def test_heatmap_numbers_are_white_on_dark_cells_and_black_on_light_ones():
    """Issue 40 case 10: a diverging heatmap wrote every number in black, unreadable on dark red and blue."""
    values = np.array([[-12.0, 0.0, 12.0]])
    fig = plots.heatmap_figure(["tda"], ["a", "b", "c"], values, "delta", diverging=True)
    colours = [t.get_color() for t in fig.axes[0].texts]
    assert colours == ["white", "black", "white"]
    fig = plots.heatmap_figure(["tda"], ["a", "b"], np.array([[2.0, 98.0]]), "top-1")
    assert [t.get_color() for t in fig.axes[0].texts] == ["white", "black"]


def test_figure_names_are_safe_and_stay_apart(tmp_path):
    lines = [("tda", np.arange(1, 4), np.array([100.0, 50.0, 66.7]))]
    a = plots.stream_accuracy(lines, tmp_path / "stream_my run [1]_tda@pos_alpha=2.0,neg_alpha=0.2_clean.png", "t")
    b = plots.stream_accuracy(lines, tmp_path / "stream_my_run_1_tda_pos_alpha_2.0_neg_alpha_0.2_clean.png", "t")
    assert SAFE.match(a.name) and SAFE.match(b.name) and a != b and a.suffix == ".png"
    assert b.name == "stream_my_run_1_tda_pos_alpha_2.0_neg_alpha_0.2_clean.png"   # a safe name stays as it is
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.name, b.name])


@pytest.mark.slow
def test_report_writes_pdf_and_svg_beside_every_png_with_safe_names(tmp_path):
    patterns = {"zeroshot": PATTERNS["zeroshot"], "tda@pos_alpha=2.0": PATTERNS["tpt"]}
    run = write_run(tmp_path / "my run (1)", patterns=patterns, attack=False)
    (run / "stream.json").write_text(json.dumps({"ids": list(range(50)), "online": ["tda@pos_alpha=2.0"],
                                                 "order": "shuffled"}))
    out = tmp_path / "report"
    build_report([run], out, n_resamples=20, figure_formats=["pdf", "svg"])
    pngs = sorted(out.glob("*.png"))
    assert any(p.name.startswith("stream_") for p in pngs)     # the figure named after the run and method key
    assert all(SAFE.match(p.name) for p in out.iterdir())
    for png in pngs:
        assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
        assert "<svg" in png.with_suffix(".svg").read_text()
    assert len(list(out.glob("*.pdf"))) == len(list(out.glob("*.svg"))) == len(pngs)
    build_report([run], out, n_resamples=20)                      # png only: the earlier pdf/svg go
    assert not list(out.glob("*.pdf")) and not list(out.glob("*.svg"))
    assert sorted(out.glob("*.png")) == pngs


def test_the_same_figure_gives_the_same_files_whatever_the_order_of_formats(tmp_path):
    values = np.array([[0.5, 0.2], [0.9, 0.6]])
    for folder, formats in (("a", ["pdf", "svg"]), ("b", ["svg", "pdf", "png"])):
        (tmp_path / folder).mkdir()
        with plots.figure_formats(formats):
            fig = plots.reliability_figure([("tda", values[0], values[1] > 0.4, 3.0)])
            plots._save(fig, tmp_path / folder / "rel.png")
    for name in ("rel.png", "rel.pdf", "rel.svg"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow
def test_figure_format_flag(tmp_path, capsys):
    from shiftlab.cli import main as cli_main
    run = write_run(tmp_path / "run", attack=False)
    assert cli_main(["report", str(run), "--out", str(tmp_path / "r"), "--bootstrap", "20",
                     "--figure-format", "svg"]) == 0
    assert {p.stem for p in (tmp_path / "r").glob("*.svg")} == {p.stem for p in (tmp_path / "r").glob("*.png")}
    with pytest.raises(SystemExit):
        cli_main(["report", str(run), "--out", str(tmp_path / "r2"), "--figure-format", "eps"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "unknown figure format eps; choose from png, pdf, svg" in err[-1]
