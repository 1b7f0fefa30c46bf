"""Evaluation protocols: which views, text head and precision each method runs with.

A protocol is data that each method declares in its own module (`Method.protocols`, read through
`shiftlab.methods.catalogue.cards`): config overrides on top of the method's defaults. The defaults ARE the
`leaderboard` protocol; `paper` adds what each method's own code does for ImageNet-R. Layers, later wins:

    method defaults  <-  protocol overrides  <-  --set

except that a run's --precision other than "auto" replaces the protocol's precision entries
(the method then says "auto" and follows the run's setting, shiftlab.models.precision), so
`--precision fp32` runs every method in float32 even under `paper`; `--set` always has the
last word. The effective config (with its view recipe) is what a run records.

- `leaderboard` (the seed table, the R-TPT paper's): every method on the same 64 views
  (view 0 + 63 RandomResizedCrop + flip, no AugMix), "a photo of a {}." for the tuned and
  training-free methods of the seed table.
- `paper`: each method as its authors' code runs ImageNet-R (sources in the method's module); with a
  dataset (the engine passes the run's), also what the code sets for that dataset
  (`Method.dataset_values`: C-TPT's lambda, TDA's configs/<set>.yaml, DMN's weight, TPT's AugMix on
  the fine-grained sets, TDA's and DMN's per-dataset prompt templates).

Every function takes the method's class: this module reads what the class declares and imports no
method (the registry imports it).
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from .cards import declared, spec_of

LEADERBOARD, PAPER = PROTOCOLS = ("leaderboard", "paper")
DEFAULT_PROTOCOL = LEADERBOARD
# what a run that recorded no protocol ran: the only protocol before runs recorded theirs
UNRECORDED_PROTOCOL = LEADERBOARD


def check_protocol(protocol: str) -> str:
    """`protocol` if known, else a one-line ValueError."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    return protocol


def protocol_overrides(protocol: str, cls: type) -> dict[str, Any]:
    """The protocol's config overrides for a method class (a copy; {} where it runs its defaults)."""
    return copy.deepcopy(dict(declared(cls, "protocols").get(check_protocol(protocol), {})))


def merge_views(lower: Any, upper: Any) -> Any:
    """Two layers of `views` overrides: dicts merge field by field, a view count sets n_views,
    anything else (a ViewRecipe) replaces."""
    from ...views.recipe import ViewRecipe
    if isinstance(upper, int) and not isinstance(upper, bool):
        upper = {"n_views": upper}
    if isinstance(lower, int) and not isinstance(lower, bool):
        lower = {"n_views": lower}
    if isinstance(lower, ViewRecipe) and isinstance(upper, dict):
        return ViewRecipe.coerce(upper, base=lower)
    if isinstance(lower, dict) and isinstance(upper, dict):
        return {**lower, **upper}
    return upper


def dataset_overrides(protocol: str, cls: type, dataset: str | None) -> dict[str, Any]:
    """Under `paper`, what the method's code sets for `dataset` (its `dataset_values`: config fields,
    `views`, prompt `templates`); {} under `leaderboard`, without a dataset or for an unknown name.

    A method with a `templates` config field, on a dataset its code names nothing for (`imagefolder`),
    runs the dataset's CoOp template (shiftlab.datasets.classes.dataset_templates)."""
    if check_protocol(protocol) != PAPER or dataset is None:
        return {}
    cls = spec_of(cls)
    from ...datasets.specs import DATASETS
    if dataset not in DATASETS:
        return {}
    name = DATASETS.canonical(dataset)
    table = declared(cls, "dataset_values")
    out = copy.deepcopy(dict(table.get(name, {})))
    if name not in table and "templates" in {f.name for f in dataclasses.fields(cls.config_class)}:
        from ...datasets.classes import dataset_templates
        out["templates"] = tuple(dataset_templates(name))
    return out


def method_overrides(protocol: str, cls: type, user: Mapping[str, Any] | None = None,
                     run_precision: str = "auto", dataset: str | None = None) -> dict[str, Any]:
    """The overrides that make a method's effective config: protocol <- the protocol's per-dataset
    values (`dataset_overrides`) <- user; a run precision other than "auto" drops the protocol's own
    precision (the method then follows the run's)."""
    out = protocol_overrides(protocol, cls)
    for key, value in dataset_overrides(protocol, cls, dataset).items():
        out[key] = merge_views(out[key], value) if key == "views" and key in out else value
    if run_precision != "auto":
        out.pop("precision", None)
    for key, value in dict(user or {}).items():
        out[key] = merge_views(out[key], value) if key == "views" and key in out else value
    return _dataset_cupl_file(cls, out, dataset)


def _dataset_cupl_file(cls: type, out: dict[str, Any], dataset: str | None) -> dict[str, Any]:
    """Under every protocol: a `cupl_file` naming a directory of CuPL's per-dataset files becomes the
    dataset's file (the method's `cupl_files`, shiftlab.methods.head_kinds.dataset_cupl_file) when the method's
    head reads it, so a suite runs each dataset with its own descriptions and the run records the file."""
    if dataset is None or not out.get("cupl_file"):
        return out
    cls = spec_of(cls)
    from ..head_kinds import TIP_CUPL, dataset_cupl_file
    if out.get("text_head", getattr(cls.config_class, "text_head", None)) == TIP_CUPL:
        out["cupl_file"] = dataset_cupl_file(out["cupl_file"], dataset, declared(cls, "cupl_files"),
                                             f"{cls.name}.cupl_file")
    return out
