"""How a method is attacked through its adaptation (`--attack-target adaptive`), declared in its card, without torch.

Every method's spec says which of these its adaptive attack uses (Athalye et al., ICML 2018; Croce et al., ICML
2022) and names, for a `bpda` mode, the non-differentiable step the backward pass replaces:

- `full`: the gradient runs through the whole prediction, every adaptation step included (TPT's prompt update
  with create_graph, MTA's mode seeking);
- `bpda`: a named non-differentiable step (a selection by confidence, a cache write, a sort) is kept on the
  forward pass and taken as a constant (or its identity) on the backward pass;
- `eot`: the method's random views are drawn afresh for every gradient, K draws averaged per attack step
  (`--eot K`, recorded);
- `state`: an online method is attacked against the state it holds when the sample arrives; the attacked
  sample then updates the state as a clean one would.

`impl` ("package.module:function") is the differentiable prediction (`shiftlab.attacks.adaptive` calls it as
`function(method, views01) -> logits`, adding `sample_ids=` where the function takes them: TTC's random
start is drawn per sample); a method that declares its modes but whose prediction is not written
yet has `impl = ""` and an adaptive run refuses it in one line (`adaptive_problem`), before torch is imported.
"""
from __future__ import annotations

from dataclasses import dataclass

FULL, BPDA, EOT, STATE = "full", "bpda", "eot", "state"
ADAPTIVE_MODES = (FULL, BPDA, EOT, STATE)


@dataclass(frozen=True)
class Adaptive:
    """A spec's `adaptive`: `modes` (some of ADAPTIVE_MODES), `how` (one line: what the gradient goes through and,
    with `bpda`, the step it replaces), `impl` (the differentiable prediction; "": declared, not implemented)."""
    modes: tuple[str, ...]
    how: str
    impl: str = ""

    def __post_init__(self) -> None:
        modes = (self.modes,) if isinstance(self.modes, str) else tuple(self.modes)
        unknown = [m for m in modes if m not in ADAPTIVE_MODES]
        if not modes or unknown:
            raise ValueError(f"adaptive: modes must be some of {', '.join(ADAPTIVE_MODES)}, got {list(modes)}")
        if not self.how.strip():
            raise ValueError("adaptive: say in `how` what the gradient goes through (and the step bpda replaces)")
        if self.impl and ":" not in self.impl:
            raise ValueError(f"adaptive: impl must be 'package.module:function', got {self.impl!r}")
        object.__setattr__(self, "modes", tuple(m for m in ADAPTIVE_MODES if m in modes))

    @property
    def label(self) -> str:
        """'full+bpda+eot'."""
        return "+".join(self.modes)

    @property
    def implemented(self) -> bool:
        return bool(self.impl)


def adaptive_problem(spec: type) -> str | None:
    """Why method `spec` cannot be attacked adaptively (what an adaptive run's refusal says), or None."""
    adaptive = getattr(spec, "adaptive", None)
    if adaptive is None:
        return f"{spec.name} declares no adaptive attack mode ({', '.join(ADAPTIVE_MODES)})"
    if not adaptive.implemented:
        return (f"{spec.name}'s adaptive attack ({adaptive.label}: {adaptive.how}) is declared but its differentiable "
                "prediction is not implemented yet")
    return None
