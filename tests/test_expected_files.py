"""The files people look for (issue 34, finding 9): LICENSE as pyproject says, a valid CITATION.cff (CFF
1.2.0), a CHANGELOG from this version on."""
from __future__ import annotations

import datetime as dt
import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# the top-level keys of the CFF 1.2.0 schema (citation-file-format.github.io, schema.json "properties")
CFF_KEYS = {"abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers",
            "keywords", "license", "license-url", "message", "preferred-citation", "references", "repository",
            "repository-artifact", "repository-code", "title", "type", "url", "version"}
CFF_REQUIRED = {"authors", "cff-version", "message", "title"}


def test_license_is_the_mit_text_pyproject_declares():
    assert PYPROJECT["license"] == "MIT"
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) ")
    assert "Permission is hereby granted, free of charge" in text and 'THE SOFTWARE IS PROVIDED "AS IS"' in text


def test_citation_cff_is_valid_cff_1_2_and_agrees_with_pyproject():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert CFF_REQUIRED <= set(cff) <= CFF_KEYS, set(cff) ^ CFF_KEYS
    assert cff["cff-version"] == "1.2.0" and cff["type"] in ("software", "dataset")
    assert isinstance(cff["message"], str) and "--bibtex" in cff["message"]
    assert cff["authors"] and all(isinstance(a, dict) and ("name" in a or "family-names" in a) for a in cff["authors"])
    assert str(cff["version"]) == PYPROJECT["version"] and cff["license"] == PYPROJECT["license"]
    assert isinstance(dt.date.fromisoformat(str(cff["date-released"])), dt.date)
    assert all(isinstance(k, str) for k in cff["keywords"])


def test_changelog_starts_at_this_version():
    text = (REPO / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\S+)", text, re.M)
    assert versions[0] == "Unreleased" and PYPROJECT["version"] in versions
