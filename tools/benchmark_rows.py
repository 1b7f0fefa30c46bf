"""Write each method's cost rows from its card into docs/BENCHMARKS.md (docs/METHOD_CARDS.md, `cost`).

    python tools/benchmark_rows.py           # rewrite the rows the cards hold; the rest of the file stays as is
    python tools/benchmark_rows.py --check   # exit 1 and say which rows differ (tests/test_benchmark_rows.py)

A card's `[[name.cost]]` entry names a section of docs/BENCHMARKS.md (its heading without the #s), the header
row of a table in it and the rows that are the method's: each row replaces the table's row with the same
first cell, or is appended to the table where it has none. A row several methods share (one column each) is
held by one of them. Reads the cards as files (tomllib): no shiftlab import, no torch.
"""
from __future__ import annotations

import argparse
import difflib
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"
METHODS = ROOT / "src" / "shiftlab" / "methods"


def cost_entries(methods: Path = METHODS) -> list[tuple[str, dict[str, Any]]]:
    """(method, cost entry) for every card's `cost`, by folder and then table order."""
    out = []
    for card in sorted(methods.glob("*/card.toml")):
        for name, table in tomllib.loads(card.read_text(encoding="utf-8")).items():
            out += [(name, entry) for entry in table.get("cost", [])]
    return out


def first_cell(row: str) -> str:
    return row.strip().strip("|").split("|")[0].strip()


def _table_rows(lines: list[str], method: str, entry: dict[str, Any]) -> tuple[int, int]:
    """The [first, end) line indices of the rows (after the header and its |---| line) of the entry's table."""
    headings = [i for i, line in enumerate(lines) if line.lstrip("#").strip() == entry["section"]
                and line.startswith("#")]
    if len(headings) != 1:
        raise ValueError(f"{method}: cost section {entry['section']!r} is {len(headings)} headings of "
                         f"{BENCHMARKS.name}, not one")
    end = next((i for i in range(headings[0] + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    header = [i for i in range(headings[0], end) if lines[i].strip() == entry["header"].strip()]
    if len(header) != 1:
        raise ValueError(f"{method}: section {entry['section']!r} has {len(header)} tables headed "
                         f"{entry['header']!r}, not one")
    first = header[0] + 2
    last = first
    while last < len(lines) and lines[last].startswith("|"):
        last += 1
    return first, last


def render(text: str, entries: list[tuple[str, dict[str, Any]]]) -> str:
    """`text` (docs/BENCHMARKS.md) with every entry's rows written into its table."""
    lines = text.split("\n")
    for method, entry in entries:
        for row in entry["rows"]:
            first, last = _table_rows(lines, method, entry)
            same = [i for i in range(first, last) if first_cell(lines[i]) == first_cell(row)]
            if len(same) > 1:
                raise ValueError(f"{method}: {len(same)} rows of table {entry['header']!r} start {first_cell(row)!r}")
            if same:
                lines[same[0]] = row
            else:
                lines.insert(last, row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where the rows differ")
    args = parser.parse_args(argv)
    text = BENCHMARKS.read_text(encoding="utf-8")
    try:
        new = render(text, cost_entries())
    except ValueError as exc:
        print(f"benchmark_rows: {exc}", file=sys.stderr)
        return 2
    if new == text:
        print(f"{BENCHMARKS.relative_to(ROOT)}: every card's cost rows are there")
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                   "docs/BENCHMARKS.md", "from the cards"))
        return 1
    BENCHMARKS.write_text(new, encoding="utf-8")
    print(f"{BENCHMARKS.relative_to(ROOT)}: the cards' cost rows written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
