"""The test-time methods: one folder each (`methods/<name>/`: spec.py, method.py, settings.json,
README.md), found by scanning (`shiftlab.methods.specs`); the shared machinery in `common/`, the
contract in `base.py`, `context.py`, `heads.py`, `protocols.py`, `facts.py`.

Importing this package loads no torch: the public names load on first use (PEP 562), and a method's
class is imported the first time it is built."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Method, create_method, get_method_class, list_methods, register_method
    from .outputs import MethodOutput
    from .single_image import predict
    from .specs import MethodConfig

# public name -> the module that defines it
_EXPORTS = {"predict": ".single_image", "Method": ".base", "MethodOutput": ".outputs", "create_method": ".base",
            "get_method_class": ".base", "list_methods": ".base", "register_method": ".base",
            "MethodConfig": ".specs"}

__all__ = ["Method", "MethodConfig", "MethodOutput", "create_method", "get_method_class", "list_methods",
           "predict", "register_method"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
