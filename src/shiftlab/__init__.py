"""shiftlab: test-time adaptation of CLIP-style models under distribution shift."""
from .context import ClassHeads, SampleContext
from .methods import create_method, list_methods
from .models import ClipModel, ModelLoadError, load_model

__version__ = "0.1.0"
__all__ = ["ClipModel", "ModelLoadError", "load_model", "create_method", "list_methods", "ClassHeads",
           "SampleContext", "__version__"]
