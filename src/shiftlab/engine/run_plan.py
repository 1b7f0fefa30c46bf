"""A run's plan: its `RunConfig` resolved once, without torch, into what every stage of the run reads.

    plan = resolve_plan(config)                # or a one-line PlanError (a ValueError): the run cannot work
    plan.method_configs()                      # each method's effective config (defaults <- protocol <- views <- --set)
    plan.view_groups()                         # (view-recipe family, precision setting) -> the views encoded
    plan.encodings("cuda")                     # (family, precision key, views) of each encoding on that device
    plan.store_keys("cpu")                     # the feature-store entries a --features run reads and writes
    plan.method_models()                       # each method's CLIPs of its own (RLCF's reward model; torch)
    print(plan.text())                         # what `shiftlab run --dry-run` prints

`resolve_plan` resolves each method of each dataset with `catalogue.method_plan.plan_method`, the one function that
resolves a method's config (`create_method` builds one with it too). The CLI's checks (`settings_problem`),
`engine.prepare` (the methods' own models), the loop (`Evaluator.for_run`, `views_per_group`, the attack run.json
records) and sweeps are handed the plan instead of resolving again. What needs torch (each method's own models) is
asked of the plan by the stage that has it; what depends on the device (a precision setting's key) takes the
device's type.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..methods.catalogue.declarations import FROZEN_ENCODER
from ..methods.catalogue.method_plan import MethodPlan, left_out_of_all, plan_method

if TYPE_CHECKING:
    from ..methods.catalogue.declarations import MethodConfig
    from ..views.recipe import ViewRecipe

__all__ = ["MethodPlan", "PlanError", "RunPlan", "expand_names", "recipe_key", "resolve_plan"]


def recipe_key(recipe: ViewRecipe) -> str:
    """The key of a recipe's family (everything but the view count), as stable text."""
    return json.dumps(recipe.family.to_dict(), sort_keys=True)


class PlanError(ValueError):
    """The first reason a run cannot work, as one line (what `settings_problem` returns)."""


@dataclass(frozen=True)
class RunPlan:
    """`config` (its methods named one by one: "all" expanded) resolved for each of `datasets` (the run's
    dataset, or a suite's): every method's `MethodPlan` per dataset, and the attack's full config."""
    config: Any                                   # the RunConfig (engine/config.py, which imports this module)
    datasets: tuple[str, ...]
    methods: dict[str, dict[str, MethodPlan]]     # dataset -> the run's method name -> its plan
    attack: dict[str, Any]
    # what "all" left out and why (`left_out_of_all_names`), said in `text` as the run warns it
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)

    def method_plans(self, dataset: str | None = None) -> dict[str, MethodPlan]:
        """The methods' plans on `dataset` (default: the run's, or a suite's first)."""
        if dataset is None:
            dataset = self.config.dataset if self.config.dataset in self.methods else self.datasets[0]
        return self.methods[dataset]

    def only(self, names: Sequence[str], config: Any = None) -> RunPlan:
        """This plan narrowed to the methods `names` (a subset: whatever refused none of them refuses none of
        these), for `config` (default: this plan's, with those methods): `--orders`' later orders, `shiftlab encode`
        without the methods that read pixels; nothing is resolved again."""
        missing = [n for n in names if n not in self.method_plans()]
        if missing:
            raise ValueError(f"the run's plan has no method {', '.join(missing)}")
        config = config if config is not None else dataclasses.replace(self.config, methods=list(names))
        return RunPlan(config, self.datasets, {d: {n: plans[n] for n in names} for d, plans in self.methods.items()},
                       self.attack)

    def for_dataset(self, config: Any) -> RunPlan | None:
        """The plan of a suite's run of one of its datasets (`config`: this plan's config but for its dataset, and
        its out and classnames), from what this plan resolved for that dataset; None where `config` differs in
        anything else (a corruption suite's entry: resolved by the run itself)."""
        free = ("dataset", "out", "classnames")
        same = all(getattr(config, f.name) == getattr(self.config, f.name)
                   for f in dataclasses.fields(self.config) if f.name not in free)
        if not same or config.dataset not in self.methods:
            return None
        return RunPlan(config, (config.dataset,), {config.dataset: self.methods[config.dataset]}, self.attack)

    def method_configs(self, dataset: str | None = None) -> dict[str, MethodConfig]:
        """Each method's effective config on `dataset` (default: the run's)."""
        return {name: m.config for name, m in self.method_plans(dataset).items()}

    def view_groups(self, dataset: str | None = None) -> dict[tuple[str, str], int]:
        """(view-recipe family, precision setting) -> the most views a method of that group reads: the views the
        engine draws and encodes once for the group. The device decides what "auto" becomes
        (`engine.step.views_per_group`)."""
        out: dict[tuple[str, str], int] = {}
        for m in self.method_plans(dataset).values():
            recipe = m.recipe
            key = (recipe_key(recipe), m.precision)
            out[key] = max(out.get(key, 0), recipe.n_views)
        return out

    def encodings(self, device_type: str, dataset: str | None = None) -> list[tuple[str, str, int]]:
        """(view-recipe family, precision key, views) of each encoding the engine makes of a sample on a device of
        `device_type` ("cpu", "cuda"): per family in the order of the methods reading it, per precision key
        (`models.precision.precision_key`: what each method's setting does there), the most views a method of the
        group reads (`engine.step.views_per_group`, what `Runner` encodes and keys the feature store with)."""
        from ..models.precision import precision_key
        most: dict[tuple[str, str], int] = {}
        for m in self.method_plans(dataset).values():
            key = (recipe_key(m.recipe), precision_key(m.precision, device_type, self.config.precision))
            most[key] = max(most.get(key, 0), m.recipe.n_views)
        families = list(dict.fromkeys(family for family, _ in most))
        return [(family, precision, n) for f in families for (family, precision), n in most.items() if family == f]

    def store_skipped(self, dataset: str | None = None) -> str | None:
        """Why a run of the plan reads and writes no feature store (no --features, an attacked setting, a method
        that reads pixels), or None."""
        from ..options import say
        if not self.config.features:
            return f"no feature store ({say('features')} keeps the view features)"
        if self.config.settings() != ["clean"]:
            return "no feature store read or written: an attacked setting decodes every sample"
        pixels = [name for name, m in self.method_plans(dataset).items() if m.needs_pixels]
        if pixels:
            return f"no feature store read or written: {', '.join(pixels)} read pixels, so every sample is decoded"
        return None

    def store_keys(self, device_type: str, dataset: str | None = None) -> list[dict[str, Any]]:
        """The fields this plan decides of every feature-store entry (`rundir.feature_store.feature_key`) a run
        reads and writes on a device of `device_type`: one per encoding (`encodings`), then one per method whose
        config reads view 0 through a frozen encoder of its own, keyed by its `"encoder"` (the encoder's identity,
        `MethodPlan.frozen_encoder_identity`; `"encoder_of"`, not part of the key: the method). The rest of a key
        (the samples, the model's weights and preprocessing, the device) is the run's. Empty where `store_skipped`
        says why; a one-line ValueError where an encoder's file cannot be read."""
        if self.store_skipped(dataset):
            return []
        from ..models.precision import precision_key
        c = self.config
        shared = {"seed": c.seed, "storage": c.features_dtype}
        keys = [{"recipe": json.loads(family), "n_views": n, "precision": precision, **shared}
                for family, precision, n in self.encodings(device_type, dataset)]
        keys += [{"recipe": json.loads(recipe_key(m.recipe)), "n_views": 1,
                  "precision": precision_key(m.precision, device_type, c.precision), **shared,
                  "encoder": m.frozen_encoder_identity, "encoder_of": name}
                 for name, m in self.method_plans(dataset).items() if m.reads_frozen_encoder]
        return keys

    def method_models(self, dataset: str | None = None) -> dict[str, list[Any]]:
        """Each method's CLIPs of its own (`Method.extra_models`: RLCF's reward model) under its config, for the
        methods that can have one: those running a tower of their own on pixels (`MethodPlan.needs_pixels`), so
        a plan of the others imports no torch; the methods without any are left out."""
        out = {}
        for name, m in self.method_plans(dataset).items():
            if m.needs_pixels:
                from ..methods.base import get_method_class
                extra = get_method_class(name).extra_models(m.config)
                if extra:
                    out[name] = list(extra)
        return out

    def extra_models(self) -> dict[tuple[str, str | None, int], tuple[str, str]]:
        """(arch, pretrained, seed) -> (the first method that loads it, how to choose another), over every
        dataset: the CLIPs the methods load themselves (`method_models`), which `engine.prepare` loads before
        any work. Imports the code of the methods that read pixels (torch)."""
        wanted: dict[tuple[str, str | None, int], tuple[str, str]] = {}
        for dataset in self.datasets:
            for name, extra_models in self.method_models(dataset).items():
                for extra in extra_models:
                    wanted.setdefault((extra.arch, extra.pretrained, extra.seed), (name, extra.settings))
        return wanted

    def device_types(self) -> list[str]:
        """The device types a run of the plan may encode on: the one its `device` names, or with "auto" CUDA's
        and the CPU's (which one is found when torch is loaded)."""
        device = str(self.config.device)
        return ["cuda", "cpu"] if device == "auto" else [device.split(":")[0]]

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-able data (what `shiftlab run --dry-run --json` would print)."""
        return {"methods": list(self.method_plans()), "protocol": self.config.protocol,
                "precision": self.config.precision, "attack": self.attack, "settings": self.config.settings(),
                "datasets": {d: {name: m.to_dict() for name, m in plans.items()} for d, plans in self.methods.items()},
                "view_groups": {d: [{"recipe": json.loads(k[0]), "precision": k[1], "n_views": n}
                                    for k, n in self.view_groups(d).items()] for d in self.datasets},
                "store_keys": {d: {t: self.store_keys(t, d) for t in self.device_types()} for d in self.datasets}}

    def unused_settings(self) -> str | None:
        """The line that names the method_config values (--set) of methods the run does not run, or None: the run
        keeps them (a shared config file may set them), nothing reads them. The dry run prints it, the run warns
        it."""
        from ..methods.catalogue.method_config import registered_name
        run = {n for plans in self.methods.values() for n in plans}
        run |= {registered_name(n) for n in run}   # a sweep's variant reads its base method's values
        unused = {m: fields for m, fields in (self.config.method_config or {}).items() if m not in run}
        if not unused:
            return None
        return ("settings for methods the run does not run (not used): "
                + "; ".join(f"{m} ({', '.join(fields)})" for m, fields in unused.items()))

    def text(self) -> str:
        """The plan in readable lines: per dataset, each method's kind, views, precision and config fields, what
        it reads of its own (its files, models and frozen encoder), the view groups the engine encodes and the
        feature-store entries it reads and writes; the attack and settings. Imports torch only where a method
        of the run reads pixels (its own models: `method_models`)."""
        c = self.config
        weights = c.pretrained or f"random weights, seed {c.seed if c.model_seed is None else c.model_seed}"
        if c.pretrained and os.path.isfile(os.path.expanduser(c.pretrained)):   # a checkpoint file: its digest
            weights += f": {_file_identity(os.path.expanduser(c.pretrained))}"
        base = f", text tower from {c.base_pretrained}" if c.base_pretrained else ""
        lines = [f"methods: {', '.join(self.method_plans())}  (protocol {c.protocol}, precision {c.precision})",
                 f"model: {c.model} ({weights}{base}); device {c.device}",
                 f"settings: {', '.join(c.settings())}; attack: {json.dumps(self.attack, sort_keys=True)}",
                 f"stream: {c.order}, seed {c.stream_seed_used()}, limit {c.limit}, batch size {c.batch_size}"]
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.left_out.items():
            by_reason.setdefault(reason, []).append(name)
        lines[1:1] = [f"methods 'all' leaves out {', '.join(names)} ({reason})" for reason, names in by_reason.items()]
        unused = self.unused_settings()
        if unused:
            lines.insert(1, unused)
        for dataset, plans in self.methods.items():
            lines.append(f"{dataset}:")
            models = self.method_models(dataset)
            for name, m in plans.items():
                d = m.to_dict()
                fields = ", ".join(f"{k}={v!r}" for k, v in d["config"].items())
                lines.append(f"  {name} ({m.kind}, reads {' + '.join(m.reads) or 'nothing'}): {m.recipe.n_views} "
                             f"view(s), precision {m.precision}; {fields}")
                lines += [f"    {name} loads its own model {e.arch} ({e.pretrained or 'random weights'}, seed "
                          f"{e.seed})" for e in models.get(name, [])]
                lines += [f"    {name} reads {field}={path} ({_file_identity(path)})"
                          for field, path in m.files.items()]
                if FROZEN_ENCODER in m.reads:
                    lines.append(f"    {name} {_encoder_line(m)}")
            for (family, precision), n in self.view_groups(dataset).items():
                recipe = {k: v for k, v in json.loads(family).items() if k != "n_views"}
                lines.append(f"  views encoded: {n} at precision {precision}, recipe {json.dumps(recipe)}")
            skipped = self.store_skipped(dataset)
            if skipped:
                lines.append(f"  feature store: {skipped}")
                continue
            lines.append(f"  feature store {c.features}: entries keyed by the samples, the model's weights and "
                         "preprocessing, the device type and:")
            try:
                keys = {t: self.store_keys(t, dataset) for t in self.device_types()}
            except ValueError:   # a frozen encoder's file that cannot be read: its method's line says why
                lines.append("    (not listed: a frozen encoder above cannot be had)")
                continue
            for device_type, device_keys in keys.items():
                for key in device_keys:
                    lines.append(f"    {key_line(key, device_type if len(self.device_types()) > 1 else None)}")
        return "\n".join(lines)


def _encoder_line(m: MethodPlan) -> str:
    """What method `m` (whose spec reads `FROZEN_ENCODER`) reads through a frozen encoder of its own under its
    config: the encoder's identity, none, or why its file cannot be read."""
    try:
        identity = m.frozen_encoder_identity
    except ValueError as exc:
        return f"reads view 0 through its frozen encoder, which cannot be had: {exc}"
    if identity is None:
        return "uses no frozen encoder of its own under this config"
    return (f"reads view 0 through its frozen encoder {json.dumps(identity, sort_keys=True)}: computed once per "
            "sample, stored beside the view features")


def key_line(key: dict[str, Any], device_type: str | None) -> str:
    """One feature-store key of a plan as one line (`RunPlan.store_keys`)."""
    recipe = {k: v for k, v in key["recipe"].items() if k != "n_views"}
    what = (f"{key['encoder_of']}'s frozen encoder of view 0 {json.dumps(key['encoder'], sort_keys=True)}"
            if "encoder" in key else f"{key['n_views']} view(s)")
    on = f" on {device_type}" if device_type else ""
    return (f"{what}{on}: precision {key['precision']}, seed {key['seed']}, storage {key['storage']}, "
            f"recipe {json.dumps(recipe, sort_keys=True)}")


def _file_identity(path: str) -> str:
    """'file, sha256 <16 hex>' or 'folder' (a folder's identity is its method's: DiffTPT's manifest digest)."""
    import hashlib
    if os.path.isdir(path):
        return "folder"
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    return f"file, sha256 {digest.hexdigest()[:16]}"


def left_out_of_all_names(config: Any, datasets: Sequence[str] | None = None) -> dict[str, str]:
    """{name: why} of the registered methods that "all" in `config.methods` leaves out (no torch; {} without "all"):
    those bound to another image tower than the one `config.model`'s name tells, and those whose effective config
    under the run's protocol, on one of `datasets` (default: the run's), the run cannot use (`left_out_of_all`:
    a file it needs and was not given), in registry order (what `expand_methods` warns of)."""
    if "all" not in config.methods:
        return {}
    from ..methods.catalogue.declarations import spec_names, tower_of_name
    from ..methods.catalogue.method_config import method_spec
    tower = tower_of_name(config.model)
    out = {}
    for n in spec_names():
        reason = ("another image tower only" if tower is not None and tower not in method_spec(n).towers
                  else left_out_of_all(n, config.method_config, config.settings() != ["clean"], config.protocol,
                                       datasets or [config.dataset], config.precision, config.run_views()))
        if reason:
            out[n] = reason
    return out


def expand_names(config: Any, datasets: Sequence[str] | None = None,
                 left_out: dict[str, str] | None = None) -> list[str]:
    """The run's method names with "all" expanded from the specs (no torch): every registered method that
    `left_out_of_all_names` (or `left_out`, what it returned) does not leave out, in registry order, each once (as
    `expand_methods`)."""
    from ..methods.catalogue.declarations import spec_names
    left_out = left_out_of_all_names(config, datasets) if left_out is None else left_out
    every = [n for n in spec_names() if n not in left_out]
    return list(dict.fromkeys(n for name in config.methods for n in (every if name == "all" else [name])))


def resolve_plan(config: Any, datasets: Sequence[str] | None = None) -> RunPlan:
    """`config` resolved for each of `datasets` (default: the run's), or PlanError with the first reason the run
    cannot work: a stream's flags, a method bound to another image tower, online methods with
    clean_and_robust, an attack config its attack refuses, a shift, or a method whose effective config
    (defaults <- the protocol, with its values for the dataset <- views/augmix <- method_config) is refused,
    e.g. MTA under 4 views. Reads the specs and catalogues only: no torch."""
    from ..attacks import attack_config
    from ..datasets.specs import DATASETS
    from ..methods.catalogue.declarations import refusal, tower_of_name, tower_problem
    from ..methods.catalogue.method_config import method_spec, registered_name
    from ..rundir.stream import stream_problem
    from .attack_target import adaptive_problem, adaptive_views_problem
    from .shifts import shift_problem

    left_out = left_out_of_all_names(config, datasets)
    names = expand_names(config, datasets, left_out)
    for name in names:      # a registered method that cannot run here (GTTA): its reason
        problem = refusal(registered_name(name)) if isinstance(name, str) else None
        if problem:
            raise PlanError(problem)
    problem = stream_problem(config.order, config.delta, config.orders)
    if problem:
        raise PlanError(problem)
    for name in names:   # a method bound to one image tower, on a model whose name tells another
        problem = tower_problem(method_spec(name), tower_of_name(config.model), config.model)
        if problem:
            raise PlanError(problem)
    try:
        attack = attack_config(config.attack)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"attack: {exc}") from None
    problem = adaptive_problem(config, names)
    if problem:
        raise PlanError(problem)
    for dataset in [config.dataset, *(d for d in datasets or [] if d != config.dataset)]:   # a suite's each
        problem = shift_problem(dataclasses.replace(config, dataset=dataset))
        if problem:
            raise PlanError(problem)
    resolved = dataclasses.replace(config, methods=names)
    plans: dict[str, dict[str, MethodPlan]] = {}
    unusable: list[str | None] = []   # a config in range that a run cannot use (a missing folder): after the ranges
    for dataset in dict.fromkeys(datasets or [config.dataset]):
        canonical = DATASETS.canonical(dataset) if dataset in DATASETS else None
        plans[dataset] = {}
        for name in names:
            try:
                method = plan_method(name, config.protocol, canonical, config.precision, config.run_views(),
                                     **(config.method_config or {}).get(name, {}))
            except (TypeError, ValueError) as exc:
                raise PlanError(" ".join(line.strip() for line in str(exc).splitlines() if line.strip())) from None
            problem = adaptive_views_problem(config, name, method.config)
            if problem:
                raise PlanError(problem)
            unusable.append(method_spec(name).config_problem(method.config, config.settings() != ["clean"]))
            plans[dataset][name] = method
    problem = next((p for p in unusable if p), None)
    if problem:
        raise PlanError(problem)
    return RunPlan(resolved, tuple(plans), plans, attack, left_out)
