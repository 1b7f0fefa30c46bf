"""shiftlab: test-time adaptation of CLIP-style models under distribution shift."""
from .models import ClipModel, ModelLoadError, load_model
from .methods import create_method, list_methods
from .context import ClassHeads, SampleContext

__version__ = "0.1.0"
__all__ = ["ClipModel", "ModelLoadError", "load_model", "create_method", "list_methods", "ClassHeads",
           "SampleContext", "__version__"]
