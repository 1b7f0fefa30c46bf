"""Every public function and method of the package has type hints (parameters and return)."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import shiftlab


def _public_modules():
    for info in pkgutil.walk_packages(shiftlab.__path__, "shiftlab."):
        parts = info.name.split(".")
        if info.name.endswith("__main__") or any(p.startswith("_") for p in parts):
            continue
        yield importlib.import_module(info.name)


def _functions(module):
    """(qualified name, function) of the public functions and methods defined in `module`."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    yield f"{module.__name__}.{name}.{attr}", member


def _missing_hints(func) -> list[str]:
    sig = inspect.signature(func)
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if func.__name__ != "__init__" and sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_every_public_function_has_type_hints():
    problems = set()
    for module in _public_modules():
        for qualname, func in _functions(module):
            missing = _missing_hints(func)
            if missing:
                problems.add(f"{qualname}: {', '.join(missing)}")
    assert not problems, "missing type hints:\n" + "\n".join(sorted(problems))


def test_the_hint_check_sees_a_missing_hint():
    def public(x, y: int):
        return x
    assert _missing_hints(public) == ["x", "return"]
