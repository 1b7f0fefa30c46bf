"""The method catalogue: what `shiftlab methods` prints, what the CLI's flag checks read and the methods
table, read from the methods' specs (`shiftlab.methods.catalogue.declarations`: every `methods/<name>/spec.py`, found by
scanning the package), so that listing the methods, refusing a bad `--methods` or `--set` and reading the
published numbers import no torch. Nothing is generated or committed: a new method folder is listed,
checked and tabled as soon as it exists. A value is checked by `params.FieldSpec.check`, the check
`make_config` applies when the method is built.

One entry per method: name, label, aliases, episodic, uses_views, summary, defaults, accepts (what
`--set` takes, in words), min_views, protocols ({protocol: views, views_text, precision, text_head,
sets}), paper_datasets (the datasets the method's code sets values for under `paper`), published
(shiftlab.methods.catalogue.cards), fidelity, kind ("episodic" or "online"), reads (its capabilities), reads_ahead
(None, "batch" or "test_set"), block (the table block it is shown in, `BLOCKS`), family (the group it declares
itself part of, `facts.FAMILIES`, or "") and fields ({field: params.FieldSpec.to_json(): type and declared range}).

The blocks (docs/PROTOCOLS.md, "The transductive track"): every table (the methods table, `shiftlab methods`,
suite.md, report.html) shows single-image methods (each prediction reads the current image and the images
before it) apart from the methods that read other test images: those that read their batch of
`--batch-size` images ("batch-transductive") and those that read the whole test set ("transductive"), each
block under its own label, so that their numbers never sit in one column with the single-image ones.

    python -m shiftlab.methods.catalogue.listing   # the methods table, as `shiftlab methods --table` prints it
"""
from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import json
import sys
from collections.abc import Iterator
from typing import Any

from ... import params
from ...views.recipe import ViewRecipe
from .. import head_kinds as heads
from . import cards as facts
from . import protocols as method_protocols
from .declarations import make_config, refused_methods, spec, spec_names
from .declarations import refusal as method_refusal

COMMAND = "shiftlab methods --table"   # prints `readme_table`


# the blocks of every methods table, in table order: (block, label); a method's block is its `reads_ahead`
SINGLE_IMAGE, BATCH_TRANSDUCTIVE, TRANSDUCTIVE = "single-image", "batch-transductive", "transductive"
BLOCKS = {
    SINGLE_IMAGE: "Single-image methods: each prediction reads the current image and the images before it",
    BATCH_TRANSDUCTIVE: "Batch-transductive methods: each prediction reads the other images of its batch of "
                        "--batch-size test images (not comparable with single-image methods)",
    TRANSDUCTIVE: "Transductive methods: each prediction reads the whole test set (not comparable with "
                  "single-image methods)",
}
_BLOCK_OF = {None: SINGLE_IMAGE, "batch": BATCH_TRANSDUCTIVE, "test_set": TRANSDUCTIVE}


def block(method: str) -> str:
    """The block a method key ('tda', 'tda@pos_alpha=2') is tabled in (`BLOCKS`), from its spec's capabilities;
    a name no spec holds (a test's method registered at run time, a removed one) is read as single-image only
    when no registered class says otherwise."""
    name = method.split("@", 1)[0]
    try:
        reads_ahead = spec(name).capabilities.reads_ahead
    except (KeyError, ValueError):
        reads_ahead = _registered_reads_ahead(name)
    return _BLOCK_OF[reads_ahead]


def _registered_reads_ahead(name: str) -> str | None:
    """A method registered at run time without a folder (`register_method`): its class's declaration, if the
    methods package is loaded (the catalogue never imports torch for it)."""
    registry = getattr(sys.modules.get("shiftlab.methods.base"), "_REGISTRY", None)
    cls = registry.get(name) if registry is not None and name in registry else None
    return cls.spec.reads_ahead if cls is not None and cls.spec is not None else None


def by_block(methods: list[str]) -> list[tuple[str, list[str]]]:
    """`methods` split into the blocks that hold any, in `BLOCKS` order, each keeping the given order."""
    blocks = [(b, [m for m in methods if block(m) == b]) for b in BLOCKS]
    return [(b, ms) for b, ms in blocks if ms]


def published_note(method: str) -> str:
    """What a published number of `method` is said with: '' for a single-image method, else its block
    ('transductive', 'batch-transductive')."""
    b = block(method)
    return "" if b == SINGLE_IMAGE else b


def names() -> list[str]:
    """The registered method names, sorted."""
    return spec_names()


def refused() -> dict[str, str]:
    """{name: why it cannot run on CLIP here} of the registered methods that are refused (GTTA), sorted."""
    return refused_methods()


def refusal(name: str) -> str | None:
    """The one line a run naming a refused method gets (`methods.catalogue.declarations.refusal`), or None."""
    return method_refusal(name)


def family_members(family: str) -> list[str]:
    """The registered methods whose spec declares `family` (`facts.FAMILIES`: "classic", the classic batch TTA
    methods), sorted: a new method joins by declaring it, never by being added to a list."""
    if family not in facts.FAMILIES:
        raise ValueError(f"unknown method family {family!r}; known: {', '.join(facts.FAMILIES)}")
    return [n for n in names() if facts.family(spec(n)) == family]


def protocols() -> tuple[str, ...]:
    """The protocol names (shiftlab.methods.catalogue.protocols.PROTOCOLS: leaderboard, paper)."""
    return tuple(method_protocols.PROTOCOLS)


def default_protocol() -> str:
    """The protocol a run gets without `--protocol` (shiftlab.methods.catalogue.protocols.DEFAULT_PROTOCOL)."""
    return method_protocols.DEFAULT_PROTOCOL


def unrecorded_protocol() -> str:
    """The protocol of a run that recorded none (shiftlab.methods.catalogue.protocols.UNRECORDED_PROTOCOL)."""
    return method_protocols.UNRECORDED_PROTOCOL


def field_specs(method: str) -> dict[str, params.FieldSpec]:
    """A registered method's config fields -> what each accepts (`params.FieldSpec`)."""
    return params.field_specs(spec(method).config_class)


def published() -> dict[str, dict[str, Any]]:
    """Every method's published numbers with its label and aliases: {name: {"label", "aliases", "published"}}."""
    return {name: _published_facts(name) for name in names()}


def own_ood_score(method: str) -> str:
    """The name and source of method's own OOD score (a run's variant `name@field=v` is its base method's);
    "" when it has none (MCM only) or is not registered."""
    try:
        return spec(method.partition("@")[0]).own_ood_score
    except (KeyError, ValueError):
        return ""


def entries() -> list[dict[str, Any]]:
    """Every method's entry (see the module docstring), sorted by name, as JSON reads it back; inside
    `read_once`, made once (per set of specs) and read back from its JSON after."""
    held = _ONE_READING.get()
    key = tuple((n, spec(n)) for n in names()) if held is not None else None   # the classes themselves
    text = held.get(key) if held is not None else None
    if text is None:
        text = json.dumps([entry(n) for n in names()], default=str)
        if held is not None:
            held[key] = text
    return json.loads(text)


_ONE_READING: contextvars.ContextVar[dict | None] = contextvars.ContextVar("catalogue_entries", default=None)


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """Inside, `entries()` is computed once for one set of registered specs: a command's checks read the
    catalogue five times (~20 ms each, most of a tiny run's checks; `commands.run.refusal`). One command's
    checks, not the process: a test may change a spec between two commands; a spec registered inside is a
    new key, hence a new reading. Nested, the outer reading is kept."""
    token = _ONE_READING.set({}) if _ONE_READING.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _ONE_READING.reset(token)


def _published_facts(name: str) -> dict[str, Any]:
    cls = spec(name)
    return {"label": facts.label(cls), "aliases": list(facts.declared(cls, "aliases")),
            "published": [dict(e) for e in facts.declared(cls, "published")]}


def _describe(protocol: str, cls: Any) -> dict[str, Any]:
    """What a method runs with under a protocol, without a dataset: `views`, `precision`, `config`."""
    fields = dataclasses.asdict(make_config(cls, **method_protocols.protocol_overrides(protocol, cls)))
    return {"views": fields.pop("views", {"n_views": 1}), "precision": fields.pop("precision"), "config": fields}


def entry(name: str) -> dict[str, Any]:
    """One method's entry, read from its spec."""
    cls = spec(name)
    config_fields = dataclasses.fields(cls.config_class)
    specs = params.field_specs(cls.config_class)
    recipes = {}
    for protocol in method_protocols.PROTOCOLS:
        effective = _describe(protocol, cls)
        sets = method_protocols.protocol_overrides(protocol, cls)
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
        "accepts": {k: "a view count or a dict of recipe fields" if spec_.hint is ViewRecipe
                    else params.describe(spec_.hint, spec_.range) for k, spec_ in specs.items()},
        "min_views": cls.needed_views(cls.config_class()) if cls.needs_views else 1,
        "protocols": recipes,
        "paper_datasets": sorted(facts.declared(cls, "dataset_values")),
        "fidelity": facts.declared(cls, "fidelity"),
        "kind": cls.kind(),
        "reads": list(cls.capabilities.reads),
        "reads_ahead": cls.capabilities.reads_ahead,
        "block": _BLOCK_OF[cls.capabilities.reads_ahead],
        "family": facts.family(cls),
        "fields": {k: spec_.to_json() for k, spec_ in specs.items()},
    }

# -- the methods table ----------------------------------------------------------------------------

def published_entry(e: dict[str, Any], protocol: str, dataset: str = "imagenet-r", backbone: str = "RN50",
                    metric: str = "top1") -> dict[str, Any] | None:
    """The first published number of an entry for (dataset, backbone, protocol, metric), with its source, or None."""
    return next((p for p in e["published"] if (p["dataset"], p["backbone"], p["protocol"], p["metric"])
                 == (dataset, backbone, protocol, metric)), None)


def published_value(e: dict[str, Any], protocol: str, dataset: str = "imagenet-r", backbone: str = "RN50",
                    metric: str = "top1") -> float | None:
    """The first number an entry publishes for (dataset, backbone, protocol, metric), or None."""
    found = published_entry(e, protocol, dataset, backbone, metric)
    return None if found is None else found["value"]


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


READS_TEXT = {"frozen_features": "view features", "own_tower": "pixels (own tower)",
              "frozen_encoder": "+ its own frozen encoder"}   # `reads` in the table's words


def reads_text(e: dict[str, Any]) -> str:
    """What a method reads, in the table's words ("view features", "pixels (own tower)", ...)."""
    return " ".join(READS_TEXT[r] for r in e["reads"]) or "view features"


def readme_table(rows: list[dict[str, Any]]) -> str:
    """The methods table (markdown) from catalogue entries: one table per block (`BLOCKS`, under its label),
    in each the episodic methods, then the online ones, each by name, each linking its folder's README.md.
    The published ImageNet-R top-1 per backbone and protocol, each with a numbered source listed under the
    tables; a transductive method's numbers say so ("64.17 (transductive)")."""
    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|") if text not in (None, "") else "—"

    sources: list[str] = []

    def number(e: dict[str, Any], protocol: str, backbone: str) -> str:
        found = published_entry(e, protocol, backbone=backbone)
        if found is None:
            return "—"
        if found["source"] not in sources:
            sources.append(found["source"])
        note = "" if e["block"] == SINGLE_IMAGE else f" ({e['block']})"
        return f"{found['value']}{note} [{sources.index(found['source']) + 1}]"

    head = ["| method | what it does | kind | reads | leaderboard RN50 | paper RN50 | paper ViT-B/16 | "
            "`--protocol paper` runs it with | fidelity |", "|---|---|---|---|---|---|---|---|---|"]
    board, paper = protocols()
    tables = []
    for name, label in BLOCKS.items():
        members = sorted((e for e in rows if e["block"] == name), key=lambda e: (e["kind"] != "episodic", e["name"]))
        if not members:
            continue
        lines = [f"**{label}**", "", *head]
        for e in members:
            lines.append("| " + " | ".join([f"[`{e['name']}`]({readme_link(e['name'])})", cell(e["summary"]),
                                            e["kind"], reads_text(e), number(e, board, "RN50"),
                                            number(e, paper, "RN50"), number(e, paper, "ViT-B/16"),
                                            cell(paper_recipe_text(e)), cell(e["fidelity"])]) + " |")
        tables.append("\n".join(lines))
    listed = [f"{i}. {cell(source)}" for i, source in enumerate(sources, 1)]
    return "\n\n".join(tables + ["Published ImageNet-R top-1 (%), sources:\n\n" + "\n".join(listed)])


def readme_link(name: str, base: str = "src/shiftlab/methods") -> str:
    """Where a method's README.md lies, relative to the checkout's root (its spec's folder)."""
    return f"{base}/{spec(name).__module__.split('.')[-2]}/README.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shiftlab.methods.catalogue.listing",
                                     description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    print(readme_table(entries()))
    return 0


if __name__ == "__main__":
    sys.exit(main())



