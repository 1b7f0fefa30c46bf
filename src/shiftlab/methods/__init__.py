"""The test-time methods: one folder each (`methods/<name>/`: spec.py, method.py, card.toml, README.md), found
by scanning; what is known about them without torch in `catalogue/` (their declarations, cards, protocols,
run configs and the listing); the shared machinery in `common/`, the contract in `base.py`, `context.py`,
`heads.py`.

Importing this package loads no torch: the public names load on first use (PEP 562), and a method's
class is imported the first time it is built."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .base import Method, create_method, get_method_class, list_methods, register_method
    from .catalogue.declarations import MethodConfig
    from .outputs import MethodOutput
    from .single_image import predict

# public name -> the module that defines it
_EXPORTS = {"predict": ".single_image", "Method": ".base", "MethodOutput": ".outputs", "create_method": ".base",
            "get_method_class": ".base", "list_methods": ".base", "register_method": ".base",
            "MethodConfig": ".catalogue.declarations"}

__all__ = ["Method", "MethodConfig", "MethodOutput", "create_method", "get_method_class", "list_methods",
           "predict", "register_method"]


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
