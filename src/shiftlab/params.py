"""Valid values of config fields, declared once beside each cited default, and the one check that
every way of setting them goes through (`shiftlab run --set`, `create_method(**kw)`, a protocol's
overrides, a config handed to a `Method` directly).

    @dataclass
    class TPTConfig(ViewMethodConfig):
        lr: float = param(5e-3, ge=0)                               # azshue/TPT tpt_classification.py
        selection_ratio: float = param(0.1, gt=0, le=1)
        self_mask: str = param("index", choices=("index", "threshold"))

The type comes from the annotation: a float field takes an int (made a float) and must be finite
unless `finite=False`; an int field takes neither a bool nor a float; a str field takes no number;
`X | None` also takes None. `check_value` returns the value to use or raises a one-line ValueError
naming the field, the value and what the field accepts:

    tpt.selection_ratio: 5 is out of range; must be a finite float in (0, 1]

A field's annotation and range together are a `FieldSpec` (`field_specs`); `FieldSpec.check` is the one
check, which the CLI applies to refuse a bad `--set` before torch is imported (the config dataclasses live
in the methods' torch-free specs). `shiftlab methods --json` writes each as JSON (`FieldSpec.to_json`).

No imports from the rest of shiftlab, so that views.py, the methods and the catalogue can all use it.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import math
import types
import typing
from typing import Any

__all__ = ["Range", "FieldSpec", "param", "field_range", "field_specs", "check_value", "check_config", "describe",
           "annotation_text", "parse_annotation"]

_KEY = "shiftlab.range"


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds (gt/ge/lt/le, any of them) or `choices` of one field; `finite` refuses nan and inf."""
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None
    finite: bool = True

    def contains(self, value: Any) -> bool:
        if self.choices is not None:
            return value in self.choices
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))

    def bounds_text(self) -> str:
        """'in (0, 1]', '> 0', '>= 1', 'in [0, 18446744073709551615]' (an integer bound whole), '' (no bounds)."""
        gt, ge, lt, le = (None if b is None else _number(b) for b in (self.gt, self.ge, self.lt, self.le))
        low = f"({gt}" if gt is not None else f"[{ge}" if ge is not None else None
        high = f"{lt})" if lt is not None else f"{le}]" if le is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>' if low[0] == '(' else '>='} {low[1:]}"
        if high:
            return f"{'<' if high[-1] == ')' else '<='} {high[:-1]}"
        return ""

    def to_json(self) -> dict[str, Any]:
        """The declared entries only: {'gt': 0, 'le': 1}, {'choices': ['a', 'b']}, {'ge': 0, 'finite': False}."""
        out: dict[str, Any] = {k: getattr(self, k) for k in ("gt", "ge", "lt", "le") if getattr(self, k) is not None}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        if not self.finite:
            out["finite"] = False
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Range:
        choices = data.get("choices")
        return cls(**{**data, "choices": tuple(choices) if choices is not None else None})


def _number(bound: float) -> str:
    """A bound as a message writes it: an integer whole (2**64 - 1, never 1.84467e+19), a float shortest ('%g')."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def param(default: Any, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
          le: float | None = None, choices: tuple[Any, ...] | None = None, finite: bool = True) -> Any:
    """A dataclass field with `default` and its valid range (see the module docstring)."""
    rng = Range(gt=gt, ge=ge, lt=lt, le=le, choices=tuple(choices) if choices is not None else None,
                finite=finite)
    if not _fits(default, rng):
        raise ValueError(f"default {default!r} is outside its own range {rng}")
    return dataclasses.field(default=default, metadata={_KEY: rng})


def _fits(value: Any, rng: Range) -> bool:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return True
    if isinstance(value, str):
        return rng.choices is None or value in rng.choices
    if isinstance(value, float) and rng.finite and not math.isfinite(value):
        return False
    return rng.contains(value)


def field_range(f: dataclasses.Field) -> Range | None:
    """The range `param` declared for a dataclass field, or None."""
    return f.metadata.get(_KEY)


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass (cached: `get_type_hints` is slow)."""
    return typing.get_type_hints(cls)


def _arms(hint: Any) -> tuple[list[Any], bool]:
    """`X | Y | None` -> ([X, Y], True)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = list(typing.get_args(hint))
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], False


def _type_text(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if hint is bool:
        return "True or False"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a float"
    if hint is str:
        return "a string"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin is tuple:
        return "a list of strings" if typing.get_args(hint)[:1] == (str,) else "a list"
    return getattr(hint, "__name__", str(hint))


def describe(hint: Any, rng: Range | None = None) -> str:
    """What a field accepts, in words: 'a finite float > 0', 'an integer >= 1', "one of 'log2', 'ln'"."""
    arms, optional = _arms(hint)
    parts = []
    for arm in arms:
        if rng is not None and rng.choices is not None and arm in (str, int, float):
            parts.append("one of " + ", ".join(repr(c) for c in rng.choices))
            continue
        text = _type_text(arm)
        if arm is float and (rng is None or rng.finite):
            text = "a finite float"
        if arm in (int, float) and rng is not None and rng.bounds_text():
            text += " " + rng.bounds_text()
        parts.append(text)
    return " or ".join(parts + (["None"] if optional else []))


def _convert(value: Any, hint: Any) -> tuple[bool, Any]:
    """Whether `value` has type `hint` (one arm), and the value to use."""
    if hint is Any:
        return True, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if hint is str:
        return isinstance(value, str), value
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint), value
    if origin is tuple:
        item = typing.get_args(hint)[:1]
        if not isinstance(value, (list, tuple)) or (item and isinstance(item[0], type)
                                                     and not all(isinstance(v, item[0]) for v in value)):
            return False, value
        return True, tuple(value)
    if isinstance(hint, type):
        return isinstance(value, hint), value
    return True, value   # an annotation this check does not know: the method's own code decides


def check_value(owner: str, name: str, value: Any, hint: Any, rng: Range | None = None,
                shown: str | None = None) -> Any:
    """`value` for field `owner.name` (annotation `hint`, range `rng`) as the field stores it, or a
    one-line ValueError; `shown` is how the message spells the value (default: its repr)."""
    shown = shown if shown is not None else repr(value)
    arms, optional = _arms(hint)
    where = f"{owner}.{name}" if owner else name

    def refuse(reason: str) -> ValueError:
        return ValueError(f"{where}: {shown} {reason}; must be {describe(hint, rng)}")

    if value is None:
        if optional or hint is Any:
            return None
        raise refuse("is not allowed")
    for arm in arms:
        ok, converted = _convert(value, arm)
        if ok:
            break
    else:
        kinds = [a for a in arms if a in (int, float, str, bool)]
        if len(kinds) == 1:
            raise refuse(f"is not {_type_text(kinds[0])}")
        literal = any(typing.get_origin(a) is typing.Literal for a in arms)
        raise refuse("is not a choice" if literal else "has the wrong type")
    if rng is None or isinstance(converted, bool) or not isinstance(converted, (int, float, str)):
        return converted
    if isinstance(converted, float) and rng.finite and not math.isfinite(converted):
        raise refuse("is not finite")
    if isinstance(converted, str) and rng.choices is None:
        return converted
    if not rng.contains(converted):
        raise refuse("is not a choice" if rng.choices is not None else "is out of range")
    return converted


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """What one config field accepts: its annotation (`hint`) and declared range."""
    hint: Any
    range: Range | None = None

    def check(self, owner: str, name: str, value: Any, shown: str | None = None) -> Any:
        """`check_value` for this field: the value as stored, or a one-line ValueError."""
        return check_value(owner, name, value, self.hint, self.range, shown=shown)

    def to_json(self) -> dict[str, Any]:
        """{'type': 'float | None', 'range': {'gt': 0}} (no 'range' when none is declared)."""
        return {"type": annotation_text(self.hint), **({"range": self.range.to_json()} if self.range else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any], names: dict[str, Any] | None = None) -> FieldSpec:
        """The spec `to_json` wrote; `names`: the classes its type may name beyond the builtins."""
        rng = data.get("range")
        return cls(parse_annotation(data["type"], names), Range.from_json(rng) if rng is not None else None)


@functools.cache
def field_specs(cls: type) -> dict[str, FieldSpec]:
    """Every init field of config dataclass `cls` -> its `FieldSpec`, in declaration order."""
    types_ = hints(cls)
    return {f.name: FieldSpec(types_.get(f.name, Any), field_range(f)) for f in dataclasses.fields(cls) if f.init}


def check_config(owner: str, config: Any) -> Any:
    """Every init field of a config dataclass through `FieldSpec.check`; returns the config with the values
    as stored (an int in a float field made a float), the same object when nothing changed."""
    changes = {}
    for name, spec in field_specs(type(config)).items():
        value = getattr(config, name)
        checked = spec.check(owner, name, value)
        if checked is not value and (type(checked) is not type(value) or checked != value):
            changes[name] = checked
    return dataclasses.replace(config, **changes) if changes else config


# -- annotations as text (the catalogue's "type"), read back without eval ---------------------------

_NAMES: dict[str, Any] = {"bool": bool, "int": int, "float": float, "str": str, "tuple": tuple, "list": list,
                          "dict": dict, "Any": Any}


def annotation_text(hint: Any) -> str:
    """'float', 'float | None', 'tuple[str, ...] | None', "Literal['a', 'b']", 'ViewRecipe' (a class by name)."""
    if hint is None or hint is type(None):
        return "None"
    if hint is Any:
        return "Any"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(annotation_text(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in typing.get_args(hint)) + "]"
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else annotation_text(a) for a in typing.get_args(hint))
        return f"{origin.__name__}[{args}]"
    if isinstance(hint, type):
        return hint.__name__
    raise ValueError(f"annotation {hint!r} cannot be written as text")


def parse_annotation(text: str, names: dict[str, Any] | None = None) -> Any:
    """The annotation `annotation_text` wrote; `names` adds classes (e.g. {'ViewRecipe': ViewRecipe}).
    An unknown name is a ValueError."""
    known = {**_NAMES, **(names or {})}

    def walk(node: ast.expr) -> Any:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return walk(node.left) | walk(node.right)
        if isinstance(node, ast.Constant) and node.value is None:
            return type(None)
        if isinstance(node, ast.Name) and node.id in known:
            return known[node.id]
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if node.value.id == "Literal":
                return typing.Literal[tuple(ast.literal_eval(i) for i in items)]
            if known.get(node.value.id) in (tuple, list, dict):
                args = tuple(... if isinstance(i, ast.Constant) and i.value is Ellipsis else walk(i) for i in items)
                return known[node.value.id][args]
        raise ValueError(f"cannot read the annotation {text!r}")

    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read the annotation {text!r}") from None
    return walk(tree.body)
