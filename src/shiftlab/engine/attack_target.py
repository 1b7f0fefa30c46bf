"""`--attack-target adaptive|both` checked before anything is loaded: the attack and each method's declared mode
(`adaptive_problem`, from the specs alone), each method's views (`adaptive_views_problem`, from its effective
config); no torch. `engine.config.settings_problem` and `catalogue_problem` ask them."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..options import say


def adaptive_problem(config: Any, names: Sequence[str]) -> str | None:
    """Why `--attack-target adaptive|both` cannot run, in one line, or None: no attack, an attack that does not attack
    through a method, a method that declares no adaptive mode or whose differentiable prediction is not written
    (methods/adaptive_modes.py). Specs only, no torch; a method's views are `adaptive_views_problem`'s, given its
    effective config."""
    if config.attack_target == "transfer":
        return None if config.eot == 1 else (f"{say('eot')} sets the draws of an adaptive attack: add "
                                             f"{say('attack_target', 'adaptive')}")
    from ..attacks import specs as attack_specs
    from ..methods.adaptive_modes import adaptive_problem as method_problem
    from ..methods.catalogue.method_config import method_spec
    name = (config.attack or {}).get("name", "none")
    if name == "none":
        return f"{say('attack_target', config.attack_target)}: choose an attack with {say('attack')}"
    if not attack_specs.spec(name).adaptive:
        adaptive = [n for n in attack_specs.spec_names() if attack_specs.spec(n).adaptive]
        return (f"{say('attack_target', config.attack_target)}: attack {name} does not attack through a method's "
                f"adaptation (those that do: {', '.join(adaptive)})")
    for method in names:
        problem = method_problem(method_spec(method))
        if problem:
            return (f"{say('attack_target', config.attack_target)}: {problem}; leave it out of {say('methods')} or "
                    "attack it by transfer")
    return None


def adaptive_views_problem(config: Any, name: str, method_config: Any) -> str | None:
    """Why method `name`'s views (its effective config's recipe) cannot be drawn by an adaptive attack, or None:
    AugMix and Cutout are not differentiable here."""
    if config.attack_target == "transfer":
        return None
    views = getattr(method_config, "views", None)
    if getattr(views, "n_views", 1) > 1 and (views.augmix or views.cutout):
        return _undrawable(config, name)
    return None


def run_augmix_problem(config: Any, view_methods: Sequence[str]) -> str | None:
    """`--augmix` (AugMix on every view-reading method) with an adaptive target, from the flag alone: what the CLI
    says before it resolves any method's config."""
    if config.attack_target == "transfer" or not config.augmix or not view_methods:
        return None
    return _undrawable(config, view_methods[0])


def _undrawable(config: Any, name: str) -> str:
    return (f"{say('attack_target', config.attack_target)}: {name}'s AugMix/Cutout views cannot be drawn "
            "differentiably by the attack (not implemented); run it without AugMix")
