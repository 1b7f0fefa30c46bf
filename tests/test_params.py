"""shiftlab.params: the range declared beside a config default, and the one check of a value."""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

import pytest

from shiftlab.params import (
    FieldSpec,
    Range,
    annotation_text,
    check_config,
    check_value,
    describe,
    field_specs,
    param,
    parse_annotation,
)


@pytest.mark.parametrize("hint, rng, text", [
    (float, Range(gt=0), "a finite float > 0"),
    (float, Range(gt=0, le=1), "a finite float in (0, 1]"),
    (float, Range(ge=0, lt=1), "a finite float in [0, 1)"),
    (float, Range(le=2, finite=False), "a float <= 2"),
    (int, Range(ge=1), "an integer >= 1"),
    # an integer bound as an integer: a seed's read "in [0, 1.84467e+19]"
    (int | None, Range(ge=0, le=2 ** 64 - 1), "an integer in [0, 18446744073709551615] or None"),
    (int, Range(gt=-1, lt=10 ** 7), "an integer in (-1, 10000000)"),
    (float, Range(ge=0, le=1e7), "a finite float in [0, 1e+07]"),
    (float | None, Range(gt=0), "a finite float > 0 or None"),
    (str, Range(choices=("log2", "ln")), "one of 'log2', 'ln'"),
    (str | None, None, "a string or None"),
    (bool, None, "True or False"),
    (Literal["a", "b"], None, "one of 'a', 'b'"),
])
def test_describe(hint, rng, text):
    assert describe(hint, rng) == text


@pytest.mark.parametrize("value, hint, rng, want", [
    (3, float, Range(gt=0), 3.0),          # an int is a float field's value, stored as a float
    (0.5, float, Range(gt=0, le=1), 0.5),
    (1.0, float, Range(gt=0, le=1), 1.0),  # the closed end
    (0, int, Range(ge=0), 0),
    (None, float | None, Range(gt=0), None),
    (["a {}."], tuple[str, ...] | None, None, ("a {}.",)),   # JSON lists become the field's tuple
    (math.inf, float, Range(finite=False), math.inf),
    ("ln", str, Range(choices=("log2", "ln")), "ln"),
    ("any text", str | None, None, "any text"),
])
def test_accepted_values(value, hint, rng, want):
    got = check_value("m", "f", value, hint, rng)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("value, hint, rng, message", [
    (True, int, Range(ge=1), "m.f: True is not an integer; must be an integer >= 1"),
    (True, float, Range(gt=0), "m.f: True is not a float; must be a finite float > 0"),
    ("1e-3", float, Range(gt=0), "m.f: '1e-3' is not a float; must be a finite float > 0"),
    (2.0, int, Range(ge=1), "m.f: 2.0 is not an integer; must be an integer >= 1"),
    (math.nan, float, Range(ge=0), "m.f: nan is not finite; must be a finite float >= 0"),
    (0.0, float, Range(gt=0, le=1), "m.f: 0.0 is out of range; must be a finite float in (0, 1]"),
    (-1, int | None, Range(ge=0, le=2 ** 64 - 1),
     "m.f: -1 is out of range; must be an integer in [0, 18446744073709551615] or None"),
    (None, float, Range(gt=0), "m.f: None is not allowed; must be a finite float > 0"),
    (3, str, Range(choices=("x",)), "m.f: 3 is not a string; must be one of 'x'"),
    ("y", str, Range(choices=("x",)), "m.f: 'y' is not a choice; must be one of 'x'"),
    ([1], tuple[str, ...] | None, None, "m.f: [1] has the wrong type; must be a list of strings or None"),
    ("c", Literal["a", "b"], None, "m.f: 'c' is not a choice; must be one of 'a', 'b'"),
])
def test_refused_values_are_one_line(value, hint, rng, message):
    with pytest.raises(ValueError) as info:
        check_value("m", "f", value, hint, rng)
    assert str(info.value) == message


def test_param_refuses_a_default_outside_its_own_range():
    with pytest.raises(ValueError, match="outside its own range"):
        param(0.0, gt=0)
    with pytest.raises(ValueError, match="outside its own range"):
        param("c", choices=("a", "b"))


def test_check_config_converts_and_keeps_an_unchanged_config():
    @dataclasses.dataclass
    class Config:
        lr: float = param(0.1, gt=0)
        steps: int = param(1, ge=1)

    same = Config()
    assert check_config("x", same) is same
    converted = check_config("x", Config(lr=2))
    assert converted == Config(lr=2.0) and type(converted.lr) is float
    with pytest.raises(ValueError, match=r"^x\.steps: 0 is out of range; must be an integer >= 1$"):
        check_config("x", Config(steps=0))


# -- a field's spec as data (the method catalogue): the same check from the file ----------------------

class Recipe:
    """A class a field may name (the catalogue passes ViewRecipe this way)."""


@pytest.mark.parametrize("hint, text", [
    (float, "float"),
    (int, "int"),
    (bool, "bool"),
    (float | None, "float | None"),
    (str | None, "str | None"),
    (tuple[str, ...] | None, "tuple[str, ...] | None"),
    (tuple[int, float], "tuple[int, float]"),
    (Literal["a", "b"], "Literal['a', 'b']"),
    (Literal["a"] | None, "Literal['a'] | None"),
    (Recipe, "Recipe"),
])
def test_an_annotation_is_written_as_text_and_read_back(hint, text):
    assert annotation_text(hint) == text
    assert parse_annotation(text, {"Recipe": Recipe}) == hint


@pytest.mark.parametrize("text", ["Recipe", "Path | None", "__import__('os')", "float |", "list[open]"])
def test_an_annotation_naming_anything_else_is_refused(text):
    with pytest.raises(ValueError, match="cannot read the annotation"):
        parse_annotation(text)


@pytest.mark.parametrize("rng", [Range(gt=0), Range(ge=0, le=1), Range(lt=2, finite=False), Range(choices=("x", "y")),
                                 Range(gt=-1.5, lt=0.25)])
def test_a_range_reads_back_from_json(rng):
    import json
    assert Range.from_json(json.loads(json.dumps(rng.to_json()))) == rng


def test_a_spec_from_json_checks_as_the_dataclass_field_does():
    import json

    @dataclasses.dataclass
    class Config:
        lr: float = param(0.1, gt=0)
        rule: str = param("soft", choices=("soft", "hard"))
        ratio: float | None = param(None, gt=0, le=1)

    live = field_specs(Config)
    read = {k: FieldSpec.from_json(json.loads(json.dumps(s.to_json()))) for k, s in live.items()}
    assert read == live
    for name, value in [("lr", 0), ("lr", "x"), ("rule", "medium"), ("ratio", 1.5), ("ratio", True)]:
        with pytest.raises(ValueError) as want:
            live[name].check("m", name, value)
        with pytest.raises(ValueError) as got:
            read[name].check("m", name, value)
        assert str(got.value) == str(want.value)
    assert read["lr"].check("m", "lr", 2) == 2.0 and read["ratio"].check("m", "ratio", None) is None
