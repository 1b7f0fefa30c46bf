"""A test-only method registered for the length of a `with` block (or a fixture's test), then removed from both
registries (the classes and the specs), so that no later test in the same worker sees it: the registry-wide tests
(the methods table, `--methods all`, every method's test_config) are parametrised over the registry.

tests/test_registrations.py checks that every test module registers a method through this helper only."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from shiftlab.methods import base as method_base
from shiftlab.methods.catalogue import declarations as method_specs


@contextlib.contextmanager
def registered(name: str, cls: type | None = None, spec: type | None = None) -> Iterator[str]:
    """Register method class `cls` as `name` (or, with `spec`, a spec alone), yield `name`, then remove it;
    the removal is checked: the name is no longer listed."""
    if spec is not None:
        method_specs.register_spec(spec)
    else:
        method_base.register_method(name)(cls)
    try:
        yield name
    finally:
        method_base._REGISTRY.pop(name, None)
        method_specs.SPECS.pop(name, None)
    assert name not in method_specs.spec_names(), f"test method {name!r} is still registered"
