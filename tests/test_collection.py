"""Collecting the tests stays cheap: the fast tier's `--collect-only` is what every `pytest -k` pays first."""
from __future__ import annotations

from conftest import collection_imports


def test_collecting_the_tests_imports_no_open_clip_or_torchvision(pytestconfig):
    # conftest records what was imported once every test module was imported (pytest_collection_modifyitems);
    # a test module (or a shiftlab module it imports) importing one of them at its top level shows here
    assert pytestconfig.stash[collection_imports] == []
