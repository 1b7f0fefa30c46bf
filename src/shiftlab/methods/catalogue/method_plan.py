"""One method as a run (or `create_method`) runs it, resolved without torch: `plan_method` is the one function
that turns a method's name, the run's protocol, dataset, precision, views and `--set` values into its checked
config (`method_config.effective_config`), and says what else it reads (its capabilities' `reads`, the files
and folders its config names).

    m = plan_method("tda", "leaderboard", None, "auto", {"n_views": 8}, pos_alpha=2.0)
    m.config.pos_alpha, m.kind, m.recipe.n_views, m.precision      # 2.0, "online", 8, "auto"

`engine.run_plan.resolve_plan` calls it once per method and dataset of a run; `methods.base.create_method` once for
the method it builds; nothing else resolves a method's config.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...params import field_range
from ...views.recipe import ViewRecipe
from .declarations import FROZEN_ENCODER, OWN_TOWER, MethodConfig
from .method_config import effective_config, method_spec
from .protocols import DEFAULT_PROTOCOL

# fields that name a setting, never a file, whatever is on disk under that name
_NOT_FILES = ("precision", "views")


def named_files(config: MethodConfig) -> dict[str, str]:
    """{field: path} of the config's text fields whose value names an existing file or folder (DiffTPT's
    `diffusion_views`, TAPT's statistics files, COSMIC's DINOv2 checkpoint, a CoOp `ctx_checkpoint`): what the
    method reads from disk besides the run's data and model, in field order. A field of declared choices (a text
    head's name) is a setting, whatever the working folder holds."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if (f.name in _NOT_FILES or not isinstance(value, str) or not value.strip()
                or getattr(field_range(f), "choices", None)):
            continue
        path = os.path.expanduser(value)
        if os.path.exists(path):
            out[f.name] = path
    return out


@dataclass(frozen=True)
class MethodPlan:
    """One method of a run: its name in the run (a sweep's variant `tda@pos_alpha=2.0` too), its kind
    ("episodic" or "online"), its effective config and what it reads (its capabilities' `reads`: the frozen
    view features, a tower of its own, a frozen encoder of its own, which the engine computes and a feature
    store keeps)."""
    name: str
    kind: str
    config: MethodConfig
    reads: tuple[str, ...] = ()

    @property
    def recipe(self) -> ViewRecipe:
        """The views it reads (`Method.view_recipe`): its config's recipe, or view 0 alone."""
        views = getattr(self.config, "views", None)
        return views if isinstance(views, ViewRecipe) else ViewRecipe(n_views=1)

    @property
    def precision(self) -> str:
        """Its precision setting ("auto": the run's)."""
        return getattr(self.config, "precision", "auto")

    @property
    def needs_pixels(self) -> bool:
        """Runs its views' pixels through a tower of its own (a feature store cannot serve it); the only kind of
        method that may load a model of its own (`Method.extra_models`)."""
        return OWN_TOWER in self.reads

    @functools.cached_property
    def frozen_encoder_identity(self) -> dict[str, Any] | None:
        """The identity of the frozen encoder of its own that reads view 0 under its config
        (`MethodSpec.frozen_encoder_identity`, what the built method's `FrozenEncoder` holds: the `encoder` of its
        feature-store entry, as that key holds it), or None where the config uses none. A file it names that cannot
        be read (COSMIC's DINOv2 checkpoint) is a one-line ValueError, as in the run."""
        if FROZEN_ENCODER not in self.reads:
            return None
        identity = method_spec(self.name).frozen_encoder_identity(self.config)
        return None if identity is None else json.loads(json.dumps(identity, sort_keys=True))

    @property
    def reads_frozen_encoder(self) -> bool:
        """Reads view 0 through a frozen encoder of its own (`Method.frozen_encoder`): its config uses one (one whose
        file cannot be read too: `frozen_encoder_identity` says why)."""
        try:
            return self.frozen_encoder_identity is not None
        except ValueError:
            return True

    @property
    def files(self) -> dict[str, str]:
        """The files and folders its config names (`named_files`)."""
        return named_files(self.config)

    def problem(self, attacked: bool = False) -> str | None:
        """Why a run (`attacked`: with an attacked setting) cannot use its effective config although each field is
        in range, as one line, or None: its spec's `config_problem` (a file or folder it needs and was not given:
        DiffTPT's generated views, DMN-ZS's CuPL file under `--protocol paper`), or a frozen encoder whose file
        cannot be read (COSMIC's DINOv2 checkpoint)."""
        spec = method_spec(self.name)
        problem = spec.config_problem(self.config, attacked)
        if problem is None and FROZEN_ENCODER in self.reads:
            try:
                _ = self.frozen_encoder_identity
            except ValueError as exc:
                problem = str(exc)
        return problem

    def to_dict(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self.config)
        fields.pop("views", None)
        fields.pop("precision", None)
        return {"kind": self.kind, "reads": list(self.reads), "views": self.recipe.to_dict(),
                "precision": self.precision, "config": fields, "files": self.files}


def plan_method(name: str, protocol: str = DEFAULT_PROTOCOL, dataset: str | None = None,
                run_precision: str = "auto", run_views: dict[str, Any] | None = None, **config: Any) -> MethodPlan:
    """Method `name` (a run's name: a variant `tda@pos_alpha=2.0` too) as a run gives it: its config checked
    (defaults <- `protocol`, with its values for `dataset` <- `run_views` ({"n_views": 8, "augmix": True}: --views,
    --augmix) <- `config`, the --set values; `run_precision` is the run's setting, kept for "auto"), its kind and
    what it reads. An unknown field is a TypeError, a bad value a ValueError (`make_config`)."""
    cfg = effective_config(name, protocol, dataset, run_precision, run_views, **config)
    spec = method_spec(name)
    return MethodPlan(name, spec.kind(), cfg, tuple(spec.capabilities.reads))


def left_out_of_all(name: str, method_config: dict[str, Any] | None = None, attacked: bool = False,
                    protocol: str = DEFAULT_PROTOCOL, datasets: Sequence[str | None] = (None,),
                    run_precision: str = "auto", run_views: dict[str, Any] | None = None) -> str | None:
    """Why `--methods all` leaves method `name` out, or None: `MethodPlan.problem` of its effective config as the
    run gives it (`plan_method`: its defaults <- `protocol`, with its values for each of `datasets` <- the run's
    views <- its `method_config` values), on the first of `datasets` where there is one. Named explicitly, it is
    refused with that reason instead; a value out of range is left to the run's own check (None here). The one
    place this is decided: the run plan's list (`engine.run_plan.left_out_of_all_names`), the run's expansion of
    "all" (`engine.config.expand_methods`) and the CLI's check of a method named (`catalogue_problem`) ask it."""
    from ...datasets.specs import DATASETS
    for dataset in dict.fromkeys(datasets or (None,)):
        canonical = DATASETS.canonical(dataset) if dataset in DATASETS else None
        try:
            plan = plan_method(name, protocol, canonical, run_precision, run_views,
                               **dict((method_config or {}).get(name, {})))
        except (TypeError, ValueError):
            return None
        problem = plan.problem(attacked)
        if problem:
            return problem
    return None
