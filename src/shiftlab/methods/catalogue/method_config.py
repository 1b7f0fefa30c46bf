"""A run's method names and the config each method runs with, from the specs alone (no torch): what the
CLI checks before anything is loaded and what `methods.base` builds a method with.
"""
from __future__ import annotations

from typing import Any

from . import declarations as method_specs
from .declarations import MethodConfig, make_config
from .protocols import DEFAULT_PROTOCOL, merge_views, method_overrides

# A run's method name may carry a variant: "tda@pos_alpha=2.0" is TDA under its own config, a method of
# its own in the run (its records, summary row and online state), as `shiftlab sweep` runs a grid point.
VARIANT = "@"


def registered_name(name: str) -> str:
    """The registered method of a run's method name: "tda@pos_alpha=2.0" -> "tda"."""
    return name.partition(VARIANT)[0]


def method_spec(name: str) -> type[method_specs.MethodSpec]:
    """The spec of a run's method name (a variant's method's); a name that is not a string is a TypeError,
    an unknown one a one-line UnknownNameError."""
    if not isinstance(name, str):
        raise TypeError(f"method must be a method name (a string), got {type(name).__name__} {name!r}")
    return method_specs.spec(registered_name(name))


def effective_config(name: str, protocol: str = DEFAULT_PROTOCOL, dataset: str | None = None,
                     run_precision: str = "auto", run_views: dict[str, Any] | None = None,
                     **config: Any) -> MethodConfig:
    """The config a run gives method `name`, checked, without building it: its defaults <- the
    protocol (with its per-dataset values for `dataset`) <- the run's `run_views` ({"n_views": 4,
    "augmix": True}: --views, --augmix; view-reading methods only) <- `config` (--set)."""
    cls = method_spec(name)
    if run_views and cls.needs_views:
        config["views"] = merge_views(dict(run_views), config.get("views", {}))
    return make_config(cls, **method_overrides(protocol, cls, config, run_precision, dataset=dataset))
