"""shiftlab: test-time adaptation of CLIP-style models under distribution shift.

The names below load their module (and torch / open_clip) on first use, so that `import shiftlab`
and `shiftlab --help` stay fast."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "ClipModel": "models",
    "ModelLoadError": "models",
    "load_model": "models",
    "create_method": "methods",
    "list_methods": "methods",
    "predict": "methods",
    "Prediction": "prediction",
    "classnames": "datasets",
    "ClassHeads": "context",
    "SampleContext": "context",
    "FeatureStore": "feature_store",
}
__all__ = ["ClipModel", "ModelLoadError", "load_model", "create_method", "list_methods", "predict", "Prediction",
           "classnames", "ClassHeads", "SampleContext", "FeatureStore", "__version__"]

if TYPE_CHECKING:
    from .context import ClassHeads, SampleContext
    from .datasets import classnames
    from .feature_store import FeatureStore
    from .methods import create_method, list_methods, predict
    from .models import ClipModel, ModelLoadError, load_model
    from .prediction import Prediction


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shiftlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
