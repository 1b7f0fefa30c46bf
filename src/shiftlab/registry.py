"""One small registry type for everything selectable by name: methods, attacks, datasets.

    METHODS = Registry("method")
    @METHODS.register("tpt")
    class TPT(Method): ...
    METHODS.get("tpt")                      # the class
    METHODS.names(episodic=False)           # names whose entry has .episodic == False
    METHODS.get("nope")                     # UnknownNameError: unknown method 'nope'; known: dmn_zs, ...

An entry may have aliases (datasets answer to CLIP_benchmark's and TPT's names too); ``get`` and
``canonical`` resolve them, ``names`` lists canonical names only. With ``normalize`` (e.g.
case-folding) lookups compare normalised names, so ``R`` and ``r`` are the same alias.
"""
from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "UnknownNameError", "scan_folders"]

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered. A KeyError for lookups, a ValueError for argument checks;
    ``str()`` is the plain message (a bare KeyError would wrap it in quotes)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Named entries of one kind, with aliases, attribute filters and a one-line unknown-name error."""
    names_classes = True   # a class entry gets its `name` attribute set to its registered name

    def __init__(self, kind: str, *, error: type[Exception] = UnknownNameError,
                 normalize: Callable[[str], str] | None = None, also_known: tuple[str, ...] = ()):
        self.kind = kind
        self.error = error
        self._normalize = normalize or (lambda name: name)
        self._also_known = also_known  # accepted by the caller outside the registry (e.g. attack "none")
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}  # normalised name or alias -> canonical name

    def register(self, name: str, entry: T | None = None, *, aliases: tuple[str, ...] = (),
                 replace: bool = False) -> Any:
        """Register ``entry`` under ``name`` (returns it), or use as a decorator when ``entry`` is omitted.

        Registering a taken name or alias twice is an error unless ``replace`` (a re-import of the same
        object is accepted). A class entry gets its ``name`` attribute set to ``name``.
        """
        if entry is None:
            return lambda obj: self.register(name, obj, aliases=aliases, replace=replace)
        keys = [self._normalize(name), *(self._normalize(a) for a in aliases)]
        for key in keys:
            owner = self._aliases.get(key)
            if owner is not None and not replace and self._entries[owner] is not entry:
                raise ValueError(f"{self.kind} {key!r} is already registered (as {owner!r})")
        if isinstance(entry, type) and self.names_classes:
            entry.name = name  # type: ignore[attr-defined]
        self._entries[name] = entry
        for key in keys:
            self._aliases[key] = name
        return entry

    def canonical(self, name: str) -> str:
        """The registered name that ``name`` (a name or alias) stands for; raises ``self.error`` if none, a
        TypeError if ``name`` is not a string."""
        if not isinstance(name, str):
            raise TypeError(f"a {self.kind} name must be a string, got {type(name).__name__} {name!r}")
        key = self._normalize(str(name))
        if key not in self._aliases:
            known = ", ".join([*self._also_known, *self.names()])
            raise self.error(f"unknown {self.kind} {str(name)!r}{self.suggest(str(name))}; known: {known}")
        return self._aliases[key]

    def suggest(self, name: str) -> str:
        """' (did you mean 'x'?)' for the closest registered name or alias (case-insensitive), else ''."""
        keys = {k.lower(): v for k, v in self._aliases.items()}
        keys.update({a.lower(): a for a in self._also_known})
        close = difflib.get_close_matches(name.lower(), list(keys), n=1, cutoff=0.75)
        return f" (did you mean {keys[close[0]]!r}?)" if close else ""

    def get(self, name: str) -> T:
        """The entry registered as ``name`` (or one of its aliases)."""
        return self._entries[self.canonical(name)]

    __getitem__ = get

    def names(self, where: Callable[[T], bool] | None = None, **attributes: Any) -> list[str]:
        """Sorted canonical names, optionally only entries with ``entry.<attr> == value`` for every given
        attribute and for which ``where(entry)`` is true."""
        return sorted(
            name for name, entry in self._entries.items()
            if all(getattr(entry, attr, _MISSING) == value for attr, value in attributes.items())
            and (where is None or where(entry)))

    def aliases(self, name: str) -> list[str]:
        """Every normalised key that resolves to ``name``'s entry, the canonical one first."""
        canonical = self.canonical(name)
        return [canonical] + sorted(k for k, v in self._aliases.items() if v == canonical and k != canonical)

    def items(self) -> list[tuple[str, T]]:
        return [(name, self._entries[name]) for name in self.names()]

    def pop(self, name: str, default: Any = None) -> Any:
        """Remove an entry and its aliases (tests register temporary entries)."""
        key = self._normalize(name)
        canonical = self._aliases.get(key)
        if canonical is None:
            return default
        self._aliases = {k: v for k, v in self._aliases.items() if v != canonical}
        return self._entries.pop(canonical)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._normalize(name) in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    def implementation(self, spec: Any) -> T:
        """The class a spec's `impl` ("package.module:Class") names, imported the first time and registered here
        under the spec's name (a method's, an attack's); a TypeError where that class does not name `spec` as its
        spec."""
        if spec.name in self:
            return self.get(spec.name)
        module, _, qualname = spec.impl.partition(":")
        cls = getattr(importlib.import_module(module), qualname)
        if cls.__dict__.get("spec") is not spec:
            raise TypeError(f"{spec.impl} does not name {spec.__qualname__} as its spec")
        return self.register(spec.name, cls)


_MISSING = object()


def scan_folders(package: str, module: str = "spec", skip: tuple[str, ...] = ()) -> list[ModuleType]:
    """Import `<package>.<folder>.<module>` for every sub-package folder of `package` that has a `<module>.py`
    (sorted; `skip` names folders that are not entries, e.g. shared code): how methods and attacks are found,
    one folder each, without a list to keep in step."""
    paths = importlib.import_module(package).__path__
    found = sorted(m.name for m in pkgutil.iter_modules(paths) if m.ispkg and m.name not in skip
                   and any(os.path.isfile(os.path.join(p, m.name, f"{module}.py")) for p in paths))
    return [importlib.import_module(f"{package}.{folder}.{module}") for folder in found]
