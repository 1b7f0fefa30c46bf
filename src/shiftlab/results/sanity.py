"""Sanity checks of a robustness evaluation (Carlini et al., "On Evaluating Adversarial Robustness", 2019,
section 5): pure functions over summary numbers, so that a number an evaluation got wrong says so.

Each check takes `Point`s (one robust accuracy: method, attack, norm, budget, steps, target) and returns
`Warning`s, each naming the method and what the failure suggests:

- `rises_with_budget`: robust accuracy never rises with eps (same method, attack, norm, steps, target);
- `rises_with_steps`: ... nor with more attack steps (same budget);
- `adaptive_above_transfer`: an attack through the adaptation never leaves more accuracy than the
  transfer attack at the same budget (only where both were run);
- `noise_beats_attack`: uniform noise of the same budget never flips more zero-shot predictions than
  the attack;
- `large_budget_survives`: at a large budget (16/255 L-inf and above) zero-shot CLIP, attacked directly,
  falls to about 0 (at most `SURVIVE_MAX` percent).

`TOLERANCE` (percentage points) lets equal numbers pass; a rise by any more is reported. No torch here:
summary.py and the report call these.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..rundir.records import ADAPTIVE_SUFFIX

TOLERANCE = 1e-9          # percentage points: equal numbers pass, any rise is reported
LARGE_BUDGET = 16 / 255   # L-inf budget at which zero-shot CLIP must fall to about 0 (Carlini et al. 5.5)
SURVIVE_MAX = 1.0         # percent of zero-shot top-1 allowed to survive LARGE_BUDGET
ZERO_SHOT = "zeroshot"


@dataclass(frozen=True)
class Point:
    """One robust top-1 (percent) of `method` under `attack` at `budget` in `norm`, `steps` iterations
    (None: the attack has no steps) and `target` ("transfer": zero-shot attacked; "adaptive": the method)."""
    method: str
    attack: str
    norm: str
    budget: float
    robust: float
    steps: int | None = None
    target: str = "transfer"


@dataclass(frozen=True)
class Warning:
    check: str
    method: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"check": self.check, "method": self.method, "message": self.message}


def _eps(norm: str, budget: float) -> str:
    k = budget * 255
    shown = f"{round(k)}/255" if norm == "Linf" and abs(k - round(k)) < 1e-3 else f"{budget:.4g}"
    return f"{'L2 ' if norm == 'L2' else ''}eps={shown}"


def _rises(points: Iterable[Point], key, order, check: str, what: str) -> list[Warning]:
    groups: dict[Any, list[Point]] = defaultdict(list)
    for p in points:
        if order(p) is not None:
            groups[key(p)].append(p)
    out = []
    for group in groups.values():
        group.sort(key=order)
        for lo, hi in zip(group, group[1:]):
            if order(hi) != order(lo) and hi.robust > lo.robust + TOLERANCE:
                out.append(Warning(check, hi.method, (
                    f"{hi.method}: robust top-1 under {hi.attack} ({hi.target}) rises from {lo.robust:.2f}% to "
                    f"{hi.robust:.2f}% with {what} ({_describe(lo, what)} -> {_describe(hi, what)}): a stronger "
                    "attack left more accuracy, which suggests a weak or unconverged attack, or gradient masking")))
    return out


def _describe(p: Point, what: str) -> str:
    return _eps(p.norm, p.budget) if what == "the budget" else f"{p.steps} steps"


def rises_with_budget(points: Iterable[Point]) -> list[Warning]:
    """Robust accuracy must not rise with eps (same method, attack, norm, steps and target)."""
    return _rises(points, lambda p: (p.method, p.attack, p.norm, p.steps, p.target), lambda p: p.budget,
                  "rises_with_budget", "the budget")


def rises_with_steps(points: Iterable[Point]) -> list[Warning]:
    """Robust accuracy must not rise with the attack's steps (same method, attack, norm, budget and target)."""
    return _rises(points, lambda p: (p.method, p.attack, p.norm, p.budget, p.target), lambda p: p.steps,
                  "rises_with_steps", "more steps")


def adaptive_above_transfer(points: Iterable[Point]) -> list[Warning]:
    """An adaptive attack must leave no more accuracy than the transfer attack of the same setting."""
    by: dict[tuple, dict[str, Point]] = defaultdict(dict)
    for p in points:
        by[(p.method, p.attack, p.norm, p.budget, p.steps)][p.target] = p
    out = []
    for pair in by.values():
        a, t = pair.get("adaptive"), pair.get("transfer")
        if a is not None and t is not None and a.robust > t.robust + TOLERANCE:
            out.append(Warning("adaptive_above_transfer", a.method, (
                f"{a.method}: the adaptive {a.attack} at {_eps(a.norm, a.budget)} leaves {a.robust:.2f}% top-1, more "
                f"than the transfer attack's {t.robust:.2f}%: the gradient through the adaptation is broken or "
                "obfuscated (gradient masking; try BPDA/EOT), not a sign of robustness")))
    return out


def noise_beats_attack(attack: str, norm: str, budget: float, attack_rate: float | None,
                       noise_rate: float | None) -> list[Warning]:
    """Uniform noise of the same budget must not flip more zero-shot predictions (percent) than the attack."""
    if attack_rate is None or noise_rate is None or noise_rate <= attack_rate + TOLERANCE:
        return []
    return [Warning("noise_beats_attack", ZERO_SHOT, (
        f"{ZERO_SHOT}: uniform noise at {_eps(norm, budget)} flips {noise_rate:.2f}% of the predictions, "
        f"{attack} only {attack_rate:.2f}%: the attack is weaker than random noise, which suggests a broken "
        "attack or gradient masking"))]


def large_budget_survives(points: Iterable[Point]) -> list[Warning]:
    """Zero-shot CLIP attacked directly (transfer target = zero-shot itself) at >= 16/255 L-inf must fall to ~0."""
    out = []
    for p in points:
        if (p.method == ZERO_SHOT and p.target == "transfer" and p.norm == "Linf"
                and p.budget >= LARGE_BUDGET - 1e-9 and p.robust > SURVIVE_MAX):
            out.append(Warning("large_budget_survives", p.method, (
                f"{p.method}: {p.robust:.2f}% top-1 survives {p.attack} at {_eps(p.norm, p.budget)}, where an "
                f"undefended CLIP falls to about 0 (at most {SURVIVE_MAX:g}% expected): the attack is weak "
                "(too few steps, a bad step size) or the gradients are masked")))
    return out


def check_points(points: Sequence[Point]) -> list[Warning]:
    """Every check over `points` that needs only robust accuracies."""
    return (rises_with_budget(points) + rises_with_steps(points) + adaptive_above_transfer(points)
            + large_budget_survives(points))


def points_of_summary(summary: Mapping[str, Any]) -> list[Point]:
    """A run summary's robust top-1 per method as Points, from its `attack` entry (its effective config),
    or from each setting of its `attacks` (an eps list: one per budget, robust top-1 in `robust_by_setting`):
    the transfer attack's (`robust`) and the adaptive attack's (`adaptive`, `adaptive_by_setting`)."""
    if summary.get("attacks"):
        return [p for setting, attack in summary["attacks"].items()
                for key, suffix, target in (("robust", "", "transfer"), ("adaptive", ADAPTIVE_SUFFIX, "adaptive"))
                for p in _points(summary, attack, target,
                                 lambda m, s=setting + suffix, k=key: (m.get(f"{k}_by_setting") or {}).get(s))]
    attack = summary.get("attack") or {}
    return (_points(summary, attack, "transfer", lambda m: m.get("robust"))
            + _points(summary, attack, "adaptive", lambda m: m.get("adaptive")))


def _points(summary: Mapping[str, Any], attack: Mapping[str, Any], target: str, robust_of) -> list[Point]:
    name = attack.get("name")
    budget = attack.get("budget", attack.get("eps"))
    if not name or not isinstance(budget, (int, float)):
        return []
    norm = attack.get("norm", "Linf")
    steps = attack.get("steps") if isinstance(attack.get("steps"), int) else None
    out = []
    for method, m in (summary.get("methods") or {}).items():
        robust = (robust_of(m) or {}).get("top1")
        if isinstance(robust, (int, float)):
            out.append(Point(method, name, norm, float(budget), float(robust), steps, target))
    return out


def check_summary(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """The checks one robust run's summary can answer by itself, as JSON ({"check", "method", "message"})."""
    found = check_points(points_of_summary(summary))
    for attack in (summary.get("attacks") or {"": summary.get("attack") or {}}).values():
        found += noise_beats_attack(str(attack.get("name")), attack.get("norm", "Linf"),
                                    float(attack.get("budget", attack.get("eps", 0)) or 0),
                                    attack.get("success_rate"), attack.get("noise_success_rate"))
    return [w.to_json() for w in found]
