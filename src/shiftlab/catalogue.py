"""The method catalogue: what `shiftlab methods` prints and what the CLI's flag checks read, as data
(shiftlab/data/methods.json), so that listing the methods and refusing a bad `--methods` or `--set`
import no torch.

The file is generated from the method registry. After adding a method, or changing a config field,
default, range, summary or protocol recipe, regenerate it (one command, which also rewrites the attack
catalogue, data/attacks.json, from the attack registry: `shiftlab.attacks.catalogue`):

    python -m shiftlab.catalogue --write        # or: make catalogue

tests/test_catalogue.py rebuilds it in memory and fails while the committed file differs. Where the
registry is already imported (library use, tests, a script that registers its own method and then
calls `shiftlab.cli.main`), every answer comes from the registry itself, so a method registered at
run time is listed and checked too. Either way a value is checked by `params.FieldSpec.check`, the
check `make_config` applies when the method is built.

One entry per method: name, episodic, uses_views, summary, defaults, accepts (what `--set` takes, in
words), min_views, protocols ({protocol: views, views_text, precision, text_head, sets}), kind
("episodic" or "online") and fields ({field: params.FieldSpec.to_json(): type and declared range}).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any

from . import params
from .views.recipe import ViewRecipe

PATH = Path(__file__).parent / "data" / "methods.json"
COMMAND = "python -m shiftlab.catalogue --write"
# the classes a field's type may name beyond the builtins (params.parse_annotation)
NAMES: dict[str, Any] = {"ViewRecipe": ViewRecipe}


def _registry_loaded() -> bool:
    """Whether the method registry is imported (then it, not the file, answers)."""
    return "shiftlab.methods" in sys.modules


@functools.cache
def _committed() -> dict[str, dict[str, Any]]:
    """The catalogue file: method name -> entry."""
    return {e["name"]: e for e in json.loads(PATH.read_text(encoding="utf-8"))["methods"]}


def names() -> list[str]:
    """The registered method names, sorted."""
    if _registry_loaded():
        from .methods.base import list_methods
        return list_methods()
    return sorted(_committed())


def field_specs(method: str) -> dict[str, params.FieldSpec]:
    """A registered method's config fields -> what each accepts (`params.FieldSpec`)."""
    if _registry_loaded():
        from .methods.base import get_method_class
        return params.field_specs(get_method_class(method).config_class)
    return {k: params.FieldSpec.from_json(v, NAMES) for k, v in _committed()[method]["fields"].items()}


def entries() -> list[dict[str, Any]]:
    """Every method's entry (see the module docstring), sorted by name."""
    if _registry_loaded():
        return build()
    return [_committed()[n] for n in sorted(_committed())]


# -- building it from the registry (imports the methods, hence torch) ------------------------------------

def text_head_text(cls: type, fields: dict[str, Any]) -> str:
    """The class head a method reads under an effective config (`fields`), in words."""
    head = fields.get("text_head")
    if head == "ensemble" and fields.get("head_templates"):     # OnZeta: its authors' own template list
        return f"{len(fields['head_templates'])} templates of the method's code (head_templates)"
    if head == "ensemble":
        templates = fields.get("templates")
        return f"{len(templates)} templates of the dataset" if templates else "CLIP's 80 templates"
    if head == "zeroshot":
        return "'a photo of a {}.'"
    if head == "tip_cupl" and getattr(cls, "cupl_templates", None):   # a method whose head pools other templates
        return f"tip_cupl: {cls.cupl_templates} + CuPL descriptions (cupl_file)"
    if head == "tip_cupl":
        return "tip_cupl: 7 Tip-Adapter templates + CuPL descriptions (cupl_file)"
    if "ctx_init" in fields:
        if fields.get("ctx_checkpoint"):
            return f"{fields['n_ctx']} tuned context tokens from {fields['ctx_checkpoint']} + '{{}}.'"
        init = fields["ctx_init"]
        return f"{fields['n_ctx']} tuned context tokens from " + (f"'{init}'" if init else "random") + " + '{}.'"
    return "CLIP's 80 templates" if cls.fixed_text_head == "ensemble" else "'a photo of a {}.'"


def _field_json(method: str, name: str, spec: params.FieldSpec) -> dict[str, Any]:
    """`spec` as the file holds it; a ValueError when reading it back would give another spec."""
    try:
        data = spec.to_json()
        if params.FieldSpec.from_json(data, NAMES) == spec:
            return data
    except ValueError:
        pass
    raise ValueError(f"{method}.{name}: the catalogue cannot write the annotation {spec.hint!r} (use bool, int, "
                     f"float, str, X | None, tuple[...], Literal[...] or one of {', '.join(NAMES)})")


def entry(name: str) -> dict[str, Any]:
    """One method's entry, built from its registered class."""
    from .methods.base import get_method_class, method_kind
    from .methods.protocols import PROTOCOLS, describe, protocol_overrides
    cls = get_method_class(name)
    config_fields = dataclasses.fields(cls.config_class)
    specs = params.field_specs(cls.config_class)
    protocols = {}
    for protocol in PROTOCOLS:
        effective = describe(protocol, name)
        sets = protocol_overrides(protocol, name)
        protocols[protocol] = {
            "views": effective["views"],
            "views_text": ViewRecipe.coerce(effective["views"]).describe(),
            "precision": effective["precision"],
            "text_head": text_head_text(cls, effective["config"]),
            "sets": {k: v for k, v in sets.items() if k not in ("views", "precision", "text_head")},
        }
    return {
        "name": name, "episodic": cls.episodic, "uses_views": cls.needs_views, "summary": cls.summary,
        "defaults": {f.name: f.default for f in config_fields if f.default is not dataclasses.MISSING},
        "accepts": {k: "a view count or a dict of recipe fields" if spec.hint is ViewRecipe
                    else params.describe(spec.hint, spec.range) for k, spec in specs.items()},
        "min_views": cls.needed_views(cls.config_class()) if cls.needs_views else 1,
        "protocols": protocols,
        "kind": method_kind(cls),
        "fields": {k: _field_json(name, k, spec) for k, spec in specs.items()},
    }


def build() -> list[dict[str, Any]]:
    """Every registered method's entry, as JSON reads it back (tuples are lists, a recipe its repr)."""
    from .methods.base import list_methods
    return json.loads(json.dumps([entry(n) for n in list_methods()], default=str))


def render() -> str:
    """The catalogue file's text, from the registry."""
    return json.dumps({"generated_by": f"{COMMAND} (from the method registry; do not edit by hand)",
                       "methods": build()}, indent=2, allow_nan=False) + "\n"


def _files() -> list[tuple[Path, str, str]]:
    """Each generated file, what it lists and the text the registry gives: the methods', then the attacks'."""
    from .attacks import catalogue as attacks
    return [(PATH, "methods", render()), (attacks.PATH, "attacks", attacks.render_file())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shiftlab.catalogue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help=f"rewrite {PATH.name} (and attacks.json, the attack catalogue) from the registries")
    args = parser.parse_args(argv)
    status = 0
    for path, kind, text in _files():
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if args.write:
            if text != current:
                path.write_text(text, encoding="utf-8")
            print(f"{path}: {len(json.loads(text)[kind])} {kind}" + (" (unchanged)" if text == current else ""))
        elif text != current:
            print(f"{path} is out of date with the {kind[:-1]} registry: run `{COMMAND}`", file=sys.stderr)
            status = 1
        else:
            print(f"{path}: up to date")
    return status


if __name__ == "__main__":
    sys.exit(main())
