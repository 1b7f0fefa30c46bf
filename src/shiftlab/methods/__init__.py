"""Registered test-time methods; importing this package fills the registry."""
from . import baselines, dmn, ecalp, mta, onzeta, prompt_tuning, tda, zero  # noqa: F401  (each module registers its methods)
from .base import Method, MethodConfig, MethodOutput, create_method, get_method_class, list_methods, register_method

__all__ = ["Method", "MethodConfig", "MethodOutput", "create_method", "get_method_class", "list_methods",
           "register_method"]
