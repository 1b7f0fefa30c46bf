"""`shiftlab methods`: the registered methods, their defaults, and what each protocol runs."""
from __future__ import annotations

import argparse
import dataclasses
import json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("methods", help="list registered methods, their defaults and both protocols' recipes")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=run)


def text_head_text(cls: type, fields: dict) -> str:
    """The class head a method reads under an effective config (`fields`), in words."""
    head = fields.get("text_head")
    if head == "ensemble" and fields.get("head_templates"):     # OnZeta: its authors' own template list
        return f"{len(fields['head_templates'])} templates of the method's code (head_templates)"
    if head == "ensemble":
        templates = fields.get("templates")
        return f"{len(templates)} templates of the dataset" if templates else "CLIP's 80 templates"
    if head == "zeroshot":
        return "'a photo of a {}.'"
    if head == "tip_cupl":
        return "tip_cupl: 7 Tip-Adapter templates + CuPL descriptions (cupl_file)"
    if "ctx_init" in fields:
        if fields.get("ctx_checkpoint"):
            return f"{fields['n_ctx']} tuned context tokens from {fields['ctx_checkpoint']} + '{{}}.'"
        init = fields["ctx_init"]
        return f"{fields['n_ctx']} tuned context tokens from " + (f"'{init}'" if init else "random") + " + '{}.'"
    return "CLIP's 80 templates" if cls.fixed_text_head == "ensemble" else "'a photo of a {}.'"


def method_table() -> list[dict]:
    """One row per method: kind, summary, config defaults and, per protocol, views, precision, text
    head and the fields the protocol sets."""
    from ..methods import get_method_class, list_methods
    from ..protocols import PROTOCOLS, describe, protocol_overrides
    from ..views import ViewRecipe
    rows = []
    for name in list_methods():
        cls = get_method_class(name)
        defaults = {f.name: f.default for f in dataclasses.fields(cls.config_class)
                    if f.default is not dataclasses.MISSING}
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
        rows.append({"name": name, "episodic": cls.episodic, "uses_views": cls.needs_views,
                     "summary": cls.summary, "defaults": defaults, "protocols": protocols})
    return rows


def run(args: argparse.Namespace) -> int:
    rows = method_table()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for r in rows:
        kind = "episodic" if r["episodic"] else "online"
        print(f"{r['name']:<16} {kind:<9} {r['summary']}")
        defaults = {k: v for k, v in r["defaults"].items() if k not in ("views", "precision")}
        if defaults:
            print(" " * 27 + ", ".join(f"{k}={v}" for k, v in defaults.items()))
        for protocol, p in r["protocols"].items():
            extra = "".join(f", {k}={v}" for k, v in p["sets"].items())
            print(" " * 27 + f"{protocol + ':':<13} {p['views_text']}; precision {p['precision']}; "
                  f"text {p['text_head']}{extra}")
    print("\nprecision 'auto' follows `shiftlab run --precision` (fp16 autocast on CUDA, float32 on CPU); "
          "'fp16-pure' is the model itself in float16 on CUDA (the authors' clip.load), float32 on CPU.")
    return 0
