"""Optional heavy test dependencies imported when a test first uses them, not when pytest collects the file.

Collecting the fast tier imports every test module; a module-level ``pytest.importorskip("sklearn.metrics")``
costs ~2.8 s of scipy and scikit-learn there even when no test of the file is selected. ``lazy_module(name)``
is what the module-level line becomes: the same skip (with importorskip's message) when the package is
missing, but at the first attribute read, inside the test that needs it.
"""
from __future__ import annotations

import types

import pytest


class LazyModule:
    """Stands for the module ``name``; reading an attribute imports it (or skips the running test)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: types.ModuleType | None = None

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        if self._module is None:
            self._module = pytest.importorskip(self._name)
        return getattr(self._module, attr)


def lazy_module(name: str) -> LazyModule:
    return LazyModule(name)
