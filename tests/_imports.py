"""Optional heavy test dependencies imported when a test first uses them, not when pytest collects the file.

Collecting the fast tier imports every test module; a module-level ``pytest.importorskip("sklearn.metrics")``
costs ~2.8 s of scipy and scikit-learn there even when no test of the file is selected. ``lazy_module(name)``
is what the module-level line becomes: the same skip (with importorskip's message) when the package is
missing, but at the first attribute read, inside the test that needs it.

``lazy_module(name, optional=False)`` does the same for a package the tests cannot do without (open_clip,
torchvision): a failed import is an error there, not a skip. open_clip imports torchvision, and torchvision
torch._dynamo (~4 s of CPU, as much as torch itself): the test modules that compare with them name them so, and
collecting the tests imports neither.
"""
from __future__ import annotations

import importlib
import types

import pytest


class LazyModule:
    """Stands for the module ``name``; reading an attribute imports it (or skips the running test when the
    module is optional and missing). Setting an attribute is refused: a monkeypatch must reach the real
    module (``monkeypatch.setattr("open_clip.NAME", ...)``), not this stand-in."""

    def __init__(self, name: str, optional: bool = True) -> None:
        self._name = name
        self._optional = optional
        self._module: types.ModuleType | None = None

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        if self._module is None:
            self._module = pytest.importorskip(self._name) if self._optional else importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __setattr__(self, attr: str, value) -> None:
        if not attr.startswith("_"):
            raise AttributeError(f"set {attr} on the module itself ({self._name}), not on its lazy stand-in")
        super().__setattr__(attr, value)


def lazy_module(name: str, optional: bool = True) -> LazyModule:
    return LazyModule(name, optional)
