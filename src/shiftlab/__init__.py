"""shiftlab: test-time adaptation of CLIP-style models under distribution shift.

The names below load their module (and torch / open_clip) on first use, so that `import shiftlab`
and `shiftlab --help` stay fast."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_names
from .version import __version__

# public name -> the module that defines it
_EXPORTS = {
    "ClipModel": "models",
    "ModelLoadError": "models",
    "load_model": "models",
    "create_method": "methods",
    "list_methods": "methods",
    "list_attacks": "attacks",
    "predict": "methods",
    "Prediction": "methods.outputs",
    "classnames": "datasets",
    "build_dataset": "datasets",
    "as_dataset": "datasets.objects",
    "load_results": "results.frame",
    "ClassHeads": "methods.context",
    "SampleContext": "methods.context",
    "FeatureStore": "rundir.feature_store",
    "ViewRecipe": "views.recipe",
    "ViewConfig": "views.generator",
    "ViewGenerator": "views.generator",
    "RunConfig": "engine.config",
    "run": "engine.loop",
}
__all__ = ["ClipModel", "ModelLoadError", "load_model", "create_method", "list_methods", "list_attacks", "predict",
           "Prediction", "classnames", "build_dataset", "as_dataset", "load_results", "ClassHeads", "SampleContext",
           "FeatureStore", "ViewRecipe", "ViewConfig", "ViewGenerator", "RunConfig", "run", "__version__"]

if TYPE_CHECKING:
    from .attacks import list_attacks
    from .datasets.build import build_dataset
    from .datasets.objects import as_dataset
    from .datasets.specs import classnames
    from .engine.config import RunConfig
    from .engine.loop import run
    from .methods.base import create_method, list_methods
    from .methods.context import ClassHeads, SampleContext
    from .methods.outputs import Prediction
    from .methods.single_image import predict
    from .models import ClipModel, ModelLoadError, load_model
    from .results.frame import load_results
    from .rundir.feature_store import FeatureStore
    from .views.generator import ViewConfig, ViewGenerator
    from .views.recipe import ViewRecipe


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
