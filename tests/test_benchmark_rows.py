"""docs/BENCHMARKS.md's per-method cost rows are the rows the methods' cards hold (`cost`, docs/METHOD_CARDS.md):
tools/benchmark_rows.py writes them there, and this test fails when the two differ."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "benchmark_rows.py"


@pytest.fixture(scope="module")
def tool():
    loaded = importlib.util.spec_from_file_location("benchmark_rows", TOOL)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def test_the_benchmarks_rows_are_the_cards_rows(tool):
    text = tool.BENCHMARKS.read_text(encoding="utf-8")
    entries = tool.cost_entries()
    assert {m for m, _ in entries} >= {"ttl", "rlcf", "tps", "dynaprompt", "oga", "stata", "otpt", "ttc"}
    assert tool.render(text, entries) == text, "run `python tools/benchmark_rows.py` (or fix the card's rows)"


def test_a_card_row_rewrites_its_line_and_a_new_one_is_appended(tool):
    text = tool.BENCHMARKS.read_text(encoding="utf-8")
    entries = copy.deepcopy([e for e in tool.cost_entries() if e[0] == "ttl"])
    old = entries[0][1]["rows"][0]
    entries[0][1]["rows"][0] = old.replace("| ttl | ", "| ttl | 1234.5 (remeasured) ", 1)
    entries[0][1]["rows"].append("| ttl-variant | 1.0 | | | | | | | |")
    new = tool.render(text, entries).split("\n")
    lines = text.split("\n")
    at = lines.index(old)
    assert new[at] == entries[0][1]["rows"][0] and new[:at] == lines[:at]
    end = next(i for i in range(at, len(lines)) if not lines[i].startswith("|"))
    assert new[end] == "| ttl-variant | 1.0 | | | | | | | |" and new[end + 1:] == lines[end:]


def test_a_section_or_table_that_is_not_there_is_said(tool):
    text = tool.BENCHMARKS.read_text(encoding="utf-8")
    entry = {"section": "Nowhere (1 view)", "header": "| model |", "rows": ["| RN50 | 1 |"]}
    with pytest.raises(ValueError, match="cost section 'Nowhere .1 view.' is 0 headings"):
        tool.render(text, [("scratch", entry)])
    entry["section"] = tool.cost_entries()[0][1]["section"]
    with pytest.raises(ValueError, match="has 0 tables headed"):
        tool.render(text, [("scratch", entry)])
