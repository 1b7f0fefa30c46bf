"""The method catalogue: what `shiftlab methods` prints, what the CLI's flag checks read and what the
README's methods table shows, as data (shiftlab/data/methods.json), so that listing the methods,
refusing a bad `--methods` or `--set` and reading the published numbers import no torch.

The file is generated from the method registry. After adding a method, or changing a config field,
default, range, summary, protocol recipe, published number or fidelity note, regenerate it and the
README's table (one command, which also rewrites the attack catalogue, data/attacks.json, from the attack
registry: `shiftlab.attacks.catalogue`):

    python -m shiftlab.catalogue --write        # or: make catalogue

tests/test_catalogue.py rebuilds both in memory and fails while the committed ones differ. Where the
registry is already imported (library use, tests, a script that registers its own method and then
calls `shiftlab.cli.main`), every answer comes from the registry itself, so a method registered at
run time is listed and checked too. Either way a value is checked by `params.FieldSpec.check`, the
check `make_config` applies when the method is built.

One entry per method: name, label, aliases, episodic, uses_views, summary, defaults, accepts (what
`--set` takes, in words), min_views, protocols ({protocol: views, views_text, precision, text_head,
sets}), paper_datasets (the datasets the method's code sets values for under `paper`), published
(shiftlab.methods.facts), fidelity, kind ("episodic" or "online") and fields ({field:
params.FieldSpec.to_json(): type and declared range}).
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
README = Path(__file__).resolve().parents[2] / "README.md"   # a source checkout's; absent from an installed wheel
COMMAND = "python -m shiftlab.catalogue --write"
TABLE_START = f"<!-- methods table: generated from the method registry by `{COMMAND}` -->"
TABLE_END = "<!-- end of the methods table -->"
# the classes a field's type may name beyond the builtins (params.parse_annotation)
NAMES: dict[str, Any] = {"ViewRecipe": ViewRecipe}


def _registry_loaded() -> bool:
    """Whether the method registry is imported (then it, not the file, answers)."""
    return "shiftlab.methods" in sys.modules


@functools.cache
def _file() -> dict[str, Any]:
    return json.loads(PATH.read_text(encoding="utf-8"))


@functools.cache
def _committed() -> dict[str, dict[str, Any]]:
    """The catalogue file: method name -> entry."""
    return {e["name"]: e for e in _file()["methods"]}


def names() -> list[str]:
    """The registered method names, sorted."""
    if _registry_loaded():
        from .methods.base import list_methods
        return list_methods()
    return sorted(_committed())


def protocols() -> tuple[str, ...]:
    """The protocol names (shiftlab.methods.protocols.PROTOCOLS: leaderboard, paper)."""
    return tuple(_protocol_fact("PROTOCOLS"))


def default_protocol() -> str:
    """The protocol a run gets without `--protocol` (shiftlab.methods.protocols.DEFAULT_PROTOCOL)."""
    return str(_protocol_fact("DEFAULT_PROTOCOL"))


def unrecorded_protocol() -> str:
    """The protocol of a run that recorded none (shiftlab.methods.protocols.UNRECORDED_PROTOCOL)."""
    return str(_protocol_fact("UNRECORDED_PROTOCOL"))


def _protocol_fact(name: str) -> Any:
    if _registry_loaded():
        from .methods import protocols as module
        return getattr(module, name)
    return _file()["protocols"][name]


def field_specs(method: str) -> dict[str, params.FieldSpec]:
    """A registered method's config fields -> what each accepts (`params.FieldSpec`)."""
    if _registry_loaded():
        from .methods.base import get_method_class
        return params.field_specs(get_method_class(method).config_class)
    return {k: params.FieldSpec.from_json(v, NAMES) for k, v in _committed()[method]["fields"].items()}


def published() -> dict[str, dict[str, Any]]:
    """Every method's published numbers with its label and aliases: {name: {"label", "aliases", "published"}}."""
    if _registry_loaded():
        return {name: _published_facts(name) for name in names()}
    return {name: {k: e[k] for k in ("label", "aliases", "published")} for name, e in _committed().items()}


def entries() -> list[dict[str, Any]]:
    """Every method's entry (see the module docstring), sorted by name."""
    if _registry_loaded():
        return build()
    return [_committed()[n] for n in sorted(_committed())]


# -- building it from the registry (imports the methods, hence torch) ------------------------------------

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


def _published_facts(name: str) -> dict[str, Any]:
    from .methods import facts
    from .methods.base import get_method_class
    cls = get_method_class(name)
    return {"label": facts.label(cls), "aliases": list(facts.declared(cls, "aliases")),
            "published": [dict(e) for e in facts.declared(cls, "published")]}


def entry(name: str) -> dict[str, Any]:
    """One method's entry, built from its registered class."""
    from .methods import facts, heads
    from .methods.base import describe, get_method_class, method_kind
    from .methods.protocols import PROTOCOLS, protocol_overrides
    cls = get_method_class(name)
    config_fields = dataclasses.fields(cls.config_class)
    specs = params.field_specs(cls.config_class)
    recipes = {}
    for protocol in PROTOCOLS:
        effective = describe(protocol, name)
        sets = protocol_overrides(protocol, cls)
        recipes[protocol] = {
            "views": effective["views"],
            "views_text": ViewRecipe.coerce(effective["views"]).describe(),
            "precision": effective["precision"],
            "text_head": heads.describe(cls, effective["config"]),
            "sets": {k: v for k, v in sets.items() if k not in ("views", "precision", "text_head")},
        }
    return {
        "name": name, **_published_facts(name),
        "episodic": cls.episodic, "uses_views": cls.needs_views, "summary": cls.summary,
        "defaults": {f.name: f.default for f in config_fields if f.default is not dataclasses.MISSING},
        "accepts": {k: "a view count or a dict of recipe fields" if spec.hint is ViewRecipe
                    else params.describe(spec.hint, spec.range) for k, spec in specs.items()},
        "min_views": cls.needed_views(cls.config_class()) if cls.needs_views else 1,
        "protocols": recipes,
        "paper_datasets": sorted(facts.declared(cls, "dataset_settings")),
        "fidelity": facts.declared(cls, "fidelity"),
        "kind": method_kind(cls),
        "fields": {k: _field_json(name, k, spec) for k, spec in specs.items()},
    }


def build() -> list[dict[str, Any]]:
    """Every registered method's entry, as JSON reads it back (tuples are lists, a recipe its repr)."""
    from .methods.base import list_methods
    return json.loads(json.dumps([entry(n) for n in list_methods()], default=str))


def render() -> str:
    """The catalogue file's text, from the registry."""
    from .methods import protocols as module
    facts = {name: getattr(module, name) for name in ("PROTOCOLS", "DEFAULT_PROTOCOL", "UNRECORDED_PROTOCOL")}
    return json.dumps({"generated_by": f"{COMMAND} (from the method registry; do not edit by hand)",
                       "protocols": {k: list(v) if isinstance(v, tuple) else v for k, v in facts.items()},
                       "methods": build()}, indent=2, allow_nan=False) + "\n"


# -- the README's methods table ----------------------------------------------------------------------------

def published_value(e: dict[str, Any], protocol: str, dataset: str = "imagenet-r", backbone: str = "RN50",
                    metric: str = "top1") -> float | None:
    """The first number an entry publishes for (dataset, backbone, protocol, metric), or None."""
    return next((p["value"] for p in e["published"] if (p["dataset"], p["backbone"], p["protocol"], p["metric"])
                 == (dataset, backbone, protocol, metric)), None)


def paper_recipe_text(e: dict[str, Any]) -> str:
    """What `--protocol paper` changes for a method, in words ("as leaderboard" when nothing)."""
    board, paper = (e["protocols"][p] for p in protocols())
    parts = [] if paper["views_text"] == board["views_text"] else [paper["views_text"]]
    if paper["precision"] != board["precision"]:
        parts.append(f"precision {paper['precision']}")
    if paper["text_head"] != board["text_head"]:
        parts.append(f"text {paper['text_head']}")
    parts += [f"{k}={v}" for k, v in paper["sets"].items()]
    if e["paper_datasets"]:
        parts.append(f"its code's values on {len(e['paper_datasets'])} datasets")
    return "; ".join(parts) if parts else "as leaderboard"


def readme_table(rows: list[dict[str, Any]]) -> str:
    """The README's methods table (between its markers) from catalogue entries: episodic methods, then
    online ones, each by name."""
    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|") if text not in (None, "") else "—"

    lines = [TABLE_START,
             "| method | what it does | kind | leaderboard | paper | `--protocol paper` runs it with | fidelity |",
             "|---|---|---|---|---|---|---|"]
    board, paper = protocols()
    for e in sorted(rows, key=lambda e: (e["kind"] != "episodic", e["name"])):
        lines.append("| " + " | ".join([f"`{e['name']}`", cell(e["summary"]), e["kind"],
                                        cell(published_value(e, board)), cell(published_value(e, paper)),
                                        cell(paper_recipe_text(e)), cell(e["fidelity"])]) + " |")
    return "\n".join(lines + [TABLE_END])


def readme_with_table(text: str, rows: list[dict[str, Any]]) -> str:
    """`text` (the README) with its methods table replaced; a ValueError when it lacks the markers."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"README.md has no methods table markers ({TABLE_START} ... {TABLE_END})")
    return text[:start] + readme_table(rows) + text[end + len(TABLE_END):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shiftlab.catalogue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help=f"rewrite {PATH.name}, the README's methods table and attacks.json (the attack "
                             "catalogue) from the registries")
    args = parser.parse_args(argv)
    from .attacks import catalogue as attacks
    text, attacks_text = render(), attacks.render_file()
    files = {PATH: text, attacks.PATH: attacks_text}
    if README.is_file():
        files[README] = readme_with_table(README.read_text(encoding="utf-8"), json.loads(text)["methods"])
    stale = [path for path, want in files.items() if not path.is_file() or path.read_text(encoding="utf-8") != want]
    if args.write:
        for path in stale:
            path.write_text(files[path], encoding="utf-8")
        print(f"{PATH}: {len(json.loads(text)['methods'])} methods, {attacks.PATH.name}: "
              f"{len(json.loads(attacks_text)['attacks'])} attacks; "
              + (f"rewrote {', '.join(p.name for p in stale)}" if stale else "unchanged"))
        return 0
    if stale:
        print(f"{', '.join(map(str, stale))} out of date with the registries: run `{COMMAND}`", file=sys.stderr)
        return 1
    print(f"{PATH}, {attacks.PATH.name}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
