"""`--attack-target adaptive|both` checked before anything is loaded: the attack, each method's declared mode and
its views, read from the specs alone (no torch). `engine.config.settings_problem` and `catalogue_problem` ask it."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..options import say


def adaptive_problem(config: Any, names: Sequence[str]) -> str | None:
    """Why `--attack-target adaptive|both` cannot run, in one line, or None: no attack, an attack that does not attack
    through a method, a method that declares no adaptive mode or whose differentiable prediction is not written
    (methods/adaptive_modes.py), views the attack cannot draw differentiably (AugMix, Cutout). Specs only, no torch."""
    if config.attack_target == "transfer":
        return None if config.eot == 1 else (f"{say('eot')} sets the draws of an adaptive attack: add "
                                             f"{say('attack_target', 'adaptive')}")
    from ..attacks import specs as attack_specs
    from ..methods.adaptive_modes import adaptive_problem as method_problem
    from ..methods.effective import effective_config, method_spec
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
        try:
            cfg = effective_config(method, config.protocol, config.canonical_dataset(), config.precision,
                                   config.run_views(), **(config.method_config or {}).get(method, {}))
        except (TypeError, ValueError):
            continue   # said by the config check
        views = getattr(cfg, "views", None)
        if getattr(views, "n_views", 1) > 1 and (views.augmix or views.cutout):
            return (f"{say('attack_target', config.attack_target)}: {method}'s AugMix/Cutout views cannot be drawn "
                    "differentiably by the attack (not implemented); run it without AugMix")
    return None
