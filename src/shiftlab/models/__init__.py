"""Models: open_clip CLIPs loaded by one rule (`load_model`), frozen, with their preprocessing and
normalisation inside (`ClipModel`); their architectures, checkpoint files, precision policy, text
heads and the learnable prompt over the text tower."""
from ..views.preprocess import OPENAI_MEAN, OPENAI_STD, Preprocess
from .architectures import model_preprocess, register_architecture
from .checkpoints import ModelLoadError
from .clip_model import ClipModel
from .loader import load_model, load_run_model, load_shared_model, state_dict_sha256

__all__ = ["ClipModel", "ModelLoadError", "Preprocess", "load_model", "load_run_model", "load_shared_model",
           "register_architecture",
           "model_preprocess", "state_dict_sha256", "OPENAI_MEAN", "OPENAI_STD"]
