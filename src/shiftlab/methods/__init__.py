"""Registered test-time methods; importing this package fills the registry."""
# each module registers its methods
from . import (  # noqa: F401
    baselines,
    boostadapter,
    dmn,
    dota,
    dpe,
    dynaprompt,
    ecalp,
    mta,
    oga,
    onzeta,
    prompt_tuning,
    rlcf,
    tda,
    tps,
    ttl,
    zero,
)
from .api import predict
from .base import Method, MethodConfig, MethodOutput, create_method, get_method_class, list_methods, register_method

__all__ = ["Method", "MethodConfig", "MethodOutput", "create_method", "get_method_class", "list_methods",
           "predict", "register_method"]
