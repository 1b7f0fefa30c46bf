"""Models: open_clip CLIPs loaded by one rule (`load_model`), frozen, with their preprocessing and
normalisation inside (`ClipModel`); their architectures, checkpoint files, precision policy, text
heads and the learnable prompt over the text tower.

The public names load on first use (PEP 562), so that a torch-free module can import a torch-free
submodule (`models.precision`'s names, read by every method's spec) without loading torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from ..views.preprocess import OPENAI_MEAN, OPENAI_STD, Preprocess
    from .architectures import model_preprocess, register_architecture
    from .checkpoints import ModelLoadError
    from .clip_model import ClipModel
    from .loader import load_model, load_run_model, load_shared_model, state_dict_sha256

# public name -> the module that defines it (relative to this package)
_EXPORTS = {"OPENAI_MEAN": "..views.preprocess", "OPENAI_STD": "..views.preprocess", "Preprocess": "..views.preprocess",
            "model_preprocess": ".architectures", "register_architecture": ".architectures",
            "ModelLoadError": ".checkpoints", "ClipModel": ".clip_model", "load_model": ".loader",
            "load_run_model": ".loader", "load_shared_model": ".loader", "state_dict_sha256": ".loader"}

__all__ = ["ClipModel", "ModelLoadError", "Preprocess", "load_model", "load_run_model", "load_shared_model",
           "register_architecture",
           "model_preprocess", "state_dict_sha256", "OPENAI_MEAN", "OPENAI_STD"]


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
