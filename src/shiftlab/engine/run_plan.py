"""A run's plan: its `RunConfig` resolved once, without torch, into what every stage of the run reads.

    plan = resolve_plan(config)                # or a one-line PlanError (a ValueError): the run cannot work
    plan.method_configs()                      # each method's effective config (defaults <- protocol <- views <- --set)
    plan.view_groups()                         # (view-recipe family, precision setting) -> the views encoded
    print(plan.text())                         # what `shiftlab run --dry-run` prints

`resolve_plan` is the one place a run resolves its methods' configs (`catalogue.method_config.effective_config`):
the CLI's checks (`settings_problem`), `engine.prepare` (the methods' own models), the loop (`Evaluator.for_run`,
`views_per_group`) and sweeps are handed the plan instead of resolving again. What needs torch or the model
(each method's extra models, the device's precision groups, the feature-store keys) is asked of the plan by
the stage that has them (`RunPlan.extra_models`, `engine.step.views_per_group`).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..methods.catalogue.declarations import MethodConfig
    from ..views.recipe import ViewRecipe


def recipe_key(recipe: ViewRecipe) -> str:
    """The key of a recipe's family (everything but the view count), as stable text."""
    return json.dumps(recipe.family.to_dict(), sort_keys=True)


class PlanError(ValueError):
    """The first reason a run cannot work, as one line (what `settings_problem` returns)."""


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
        from ..views.recipe import ViewRecipe
        views = getattr(self.config, "views", None)
        return views if isinstance(views, ViewRecipe) else ViewRecipe(n_views=1)

    @property
    def precision(self) -> str:
        """Its precision setting ("auto": the run's)."""
        return getattr(self.config, "precision", "auto")

    def to_dict(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self.config)
        fields.pop("views", None)
        fields.pop("precision", None)
        return {"kind": self.kind, "reads": list(self.reads), "views": self.recipe.to_dict(),
                "precision": self.precision, "config": fields}


@dataclass(frozen=True)
class RunPlan:
    """`config` (its methods named one by one: "all" expanded) resolved for each of `datasets` (the run's
    dataset, or a suite's): every method's `MethodPlan` per dataset, and the attack's full config."""
    config: Any                                   # the RunConfig (engine/config.py, which imports this module)
    datasets: tuple[str, ...]
    methods: dict[str, dict[str, MethodPlan]]     # dataset -> the run's method name -> its plan
    attack: dict[str, Any]

    def method_plans(self, dataset: str | None = None) -> dict[str, MethodPlan]:
        """The methods' plans on `dataset` (default: the run's, or a suite's first)."""
        if dataset is None:
            dataset = self.config.dataset if self.config.dataset in self.methods else self.datasets[0]
        return self.methods[dataset]

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

    def extra_models(self) -> dict[tuple[str, str | None, int], tuple[str, str]]:
        """(arch, pretrained, seed) -> (the first method that loads it, how to choose another), over every
        dataset: the CLIPs the methods load themselves (`Method.extra_models`, RLCF's reward model). Imports
        the methods' code (torch)."""
        from ..methods.base import get_method_class
        wanted: dict[tuple[str, str | None, int], tuple[str, str]] = {}
        for plans in self.methods.values():
            for name, m in plans.items():
                for extra in get_method_class(name).extra_models(m.config):
                    wanted.setdefault((extra.arch, extra.pretrained, extra.seed), (name, extra.settings))
        return wanted

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-able data (what `shiftlab run --dry-run --json` would print)."""
        return {"methods": list(self.method_plans()), "protocol": self.config.protocol,
                "precision": self.config.precision, "attack": self.attack, "settings": self.config.settings(),
                "datasets": {d: {name: m.to_dict() for name, m in plans.items()} for d, plans in self.methods.items()},
                "view_groups": {d: [{"recipe": json.loads(k[0]), "precision": k[1], "n_views": n}
                                    for k, n in self.view_groups(d).items()] for d in self.datasets}}

    def text(self) -> str:
        """The plan in readable lines: per dataset, each method's kind, views, precision and config fields,
        then the view groups the engine encodes; the attack and settings."""
        c = self.config
        lines = [f"methods: {', '.join(self.method_plans())}  (protocol {c.protocol}, precision {c.precision})",
                 f"settings: {', '.join(c.settings())}; attack: {json.dumps(self.attack, sort_keys=True)}",
                 f"stream: {c.order}, seed {c.stream_seed_used()}, limit {c.limit}, batch size {c.batch_size}"]
        for dataset, plans in self.methods.items():
            lines.append(f"{dataset}:")
            for name, m in plans.items():
                d = m.to_dict()
                fields = ", ".join(f"{k}={v!r}" for k, v in d["config"].items())
                lines.append(f"  {name} ({m.kind}, reads {' + '.join(m.reads) or 'nothing'}): {m.recipe.n_views} "
                             f"view(s), precision {m.precision}; {fields}")
            for (family, precision), n in self.view_groups(dataset).items():
                recipe = {k: v for k, v in json.loads(family).items() if k != "n_views"}
                lines.append(f"  views encoded: {n} at precision {precision}, recipe {json.dumps(recipe)}")
        return "\n".join(lines)


def expand_names(config: Any) -> list[str]:
    """The run's method names with "all" expanded from the specs (no torch): every registered method whose image
    towers include the one `config.model`'s name tells and whose config the run can use (`left_out_of_all`), in
    registry order, each once (as `expand_methods`)."""
    from ..methods.catalogue.declarations import left_out_of_all, spec_names, tower_of_name
    from ..methods.catalogue.method_config import method_spec
    tower = tower_of_name(config.model)
    every = [n for n in spec_names() if (tower is None or tower in method_spec(n).towers)
             and not left_out_of_all(n, config.method_config, config.settings() != ["clean"])]
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
    from ..methods.catalogue.method_config import effective_config, method_spec, registered_name
    from ..rundir.stream import stream_problem
    from .attack_target import adaptive_problem, adaptive_views_problem
    from .shifts import shift_problem

    names = expand_names(config)
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
    problem = shift_problem(config)
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
                cfg = effective_config(name, config.protocol, canonical, config.precision, config.run_views(),
                                       **(config.method_config or {}).get(name, {}))
            except (TypeError, ValueError) as exc:
                raise PlanError(" ".join(line.strip() for line in str(exc).splitlines() if line.strip())) from None
            problem = adaptive_views_problem(config, name, cfg)
            if problem:
                raise PlanError(problem)
            spec = method_spec(name)
            unusable.append(spec.config_problem(cfg, config.settings() != ["clean"]))
            plans[dataset][name] = MethodPlan(name, spec.kind(), cfg, tuple(spec.capabilities.reads))
    problem = next((p for p in unusable if p), None)
    if problem:
        raise PlanError(problem)
    return RunPlan(resolved, tuple(plans), plans, attack)
