"""Plain-HTML building blocks for the report: tables, embedded images, the page.

The page must open from a file on a machine without network, so images are
inlined as base64 data URIs and the only script is a few lines of inline JS
that make tables sortable (no framework, nothing fetched).
"""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1300px;
 padding:0 1.5em 3em;color:#222;line-height:1.4}
h1{margin-bottom:.2em} h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
nav a{margin-right:1em} .meta{color:#666;font-size:.9em}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right}
td.t,th.t{text-align:left} thead th{background:#f3f3f3;position:sticky;top:0}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable th[aria-sort=descending]::after{content:" \\25BC"}
tbody tr:nth-child(even){background:#fafafa}
.good{color:#1a7f37;font-weight:600} td.pub{color:#666} .bad{color:#c62828;font-weight:600}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:.4em .8em;margin:.4em 0}
.caveat{font-size:1.05em;border-left-width:6px;border-left-color:#c62828}
img{max-width:100%;height:auto;border:1px solid #eee;margin:.5em 0}
.scroll{max-height:34em;overflow:auto;display:inline-block}
details{margin:.3em 0} summary{cursor:pointer}
.grid{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
"""

# Click a header to sort by it (again to reverse). Cells may carry the value to
# sort by in data-v ("" = missing, always last); otherwise their text is used.
# The data-sortable="ready" attribute shows the script ran (tests check it).
SORT_JS = """
(function () {
  function key(td) {
    var v = td.getAttribute("data-v");
    if (v === "") return null;
    if (v !== null) return parseFloat(v);
    return td.textContent.trim().toLowerCase();
  }
  function sortBy(table, col, th) {
    var asc = th.getAttribute("aria-sort") !== "ascending";
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a.cells[col]), y = key(b.cells[col]);
      if (x === null || y === null) return (x === null) - (y === null);
      var c = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  function init() {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
        th.addEventListener("click", function () { sortBy(table, col, th); });
      });
      table.setAttribute("data-sortable", "ready");
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
"""

REPORT_ADVICE = "then run shiftlab report again"   # what a failed write of a report file says to do


class Cell:
    """A table cell: the text shown, the value sorted by, an optional CSS class."""

    def __init__(self, text: object, sort: str | float | None = None, cls: str = ""):
        self.text, self.sort, self.cls = str(text), sort, cls


def esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def fmt(x: float | None, digits: int = 2) -> str:
    """Fixed decimals as printed everywhere in the report; '–' for missing values."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def num(x: float | None, digits: int = 2, cls: str = "") -> Cell:
    missing = x is None or (isinstance(x, float) and math.isnan(x))
    return Cell(fmt(x, digits), "" if missing else repr(float(x)), cls)


def fmt_p(p: float) -> str:
    if math.isnan(p):
        return "–"
    return "<1e-6" if p < 1e-6 else (f"{p:.2e}" if p < 1e-3 else f"{p:.4f}")


def signed(x: float, digits: int = 2) -> Cell:
    """A difference in points, coloured by sign."""
    if x is None or math.isnan(x):
        return num(x)
    return Cell(f"{x:+.{digits}f}", repr(float(x)), "good" if x > 0 else ("bad" if x < 0 else ""))


def table(headers: list[str], rows: list[list], sortable: bool = True, text_cols: int = 1,
          id_: str | None = None) -> str:
    """HTML table; the first `text_cols` columns are left-aligned text, cells are str or Cell."""
    def td(c, j):
        c = c if isinstance(c, Cell) else Cell(c)
        cls = " ".join(x for x in (c.cls, "t" if j < text_cols else "") if x)
        attrs = (f' class="{cls}"' if cls else "") + (f' data-v="{esc(c.sort)}"' if c.sort is not None else "")
        return f"<td{attrs}>{esc(c.text)}</td>"

    head = "".join(f'<th{" class=t" if j < text_cols else ""}>{esc(h)}</th>' for j, h in enumerate(headers))
    body = "\n".join("<tr>" + "".join(td(c, j) for j, c in enumerate(r)) + "</tr>" for r in rows)
    attrs = (f' id="{esc(id_)}"' if id_ else "") + (' class="sortable"' if sortable else "")
    return f"<table{attrs}><thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>"


def image(path: Path | None, alt: str) -> str:
    if path is None:
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def warnings_box(messages: list[str]) -> str:
    return "".join(f'<div class="warn">{esc(m)}</div>' for m in messages)


def caveats_box(notes: list[str]) -> str:
    """The page's caveats, above everything else: one prominent note each (role=alert)."""
    if not notes:
        return ""
    return ('<div id="caveats" role="alert">'
            + "".join(f'<div class="warn caveat"><b>Caveat:</b> {esc(n)}</div>' for n in notes) + "</div>")


def page(title: str, meta: str, sections: list[tuple[str, str, str]], notes: list[str] = ()) -> str:
    """The whole document; sections are (anchor id, heading, inner HTML); notes: the caveats shown first."""
    nav = " ".join(f'<a href="#{esc(i)}">{esc(h)}</a>' for i, h, _ in sections)
    body = "\n".join(f'<section id="{esc(i)}"><h2>{esc(h)}</h2>\n{b}\n</section>' for i, h, b in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>\n"
            f'<h1>{esc(title)}</h1>{caveats_box(list(notes))}<p class="meta">{meta}</p><nav>{nav}</nav>\n{body}\n'
            f"<script>{SORT_JS}</script>\n</body></html>\n")
