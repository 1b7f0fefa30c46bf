"""Classic batch TTA on CLIP: the image tower's normalisation layers adapted on a batch of test images.

What TENT, EATA, SAR (and DeYO, CLIPArTT, WATT, CLIPTTA) share, as the CLIP toolkits run them
(CLIPTTA's `ttavlm/methods/abstract_model.py`, mariodoebler/test-time-adaptation's `methods/tent.py`):

- `NormTower(clip)`: a private copy of the image tower whose normalisation layers (LayerNorm, GroupNorm,
  BatchNorm) own their affine parameters (weight = scale, bias = shift), cloned from the frozen tower;
  every other tensor IS the shared model's (no copy, never written), so the frozen tower that the other
  methods read never changes. Its BatchNorm layers normalise with the statistics of the batch they see
  (`track_running_stats` off), as TENT's `configure_model` does (and CLIPTTA's `model.train()`);
- `make_optimizer(config, params)`: SGD / Adam / AdamW as CLIPTTA's `setup_optimizer` builds them;
- `NormTTAMethod`: the `Method` base of these methods: the tower, its optimiser, the text head; `reset`
  (the initial parameters and an empty optimiser state), `state_dict` / `load_state_dict` holding the
  adapted parameters AND the optimiser state (an exact resume mid-stream), `adapt_batch` (view 0 of each
  image of the batch through the adapted tower: the subclass's `adapt`), the episodic / continual switch
  (`config.episodic`).

A subclass implements `adapt(pixels) -> (logits, extras)` with the helpers `logits(pixels)` and `step(loss)`
(`adapt_on_loss(pixels, loss)` where an update is one step on a loss of the batch's logits: TENT, RPL), and may
keep state of its own (`extra_state` / `load_extra_state` / `reset_extra`).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models.lora_tower import shared_copy
from ...options import say
from ..base import MethodOutput
from ..context import SampleContext, batch_pixels
from ..kinds import BatchMethod

# the layers whose affine parameters adapt (abstract_model.py:609 and :644 of CLIPTTA; tent.py:60 of mariodoebler's)
NORM_LAYERS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d)


# the module-name tests of the two codes that leave the top layers out (substrings, then whole names): CLIPTTA's
# `--skip_top_layers` (abstract_model.py:610-616) and SAR's collect_params (mr-eggplant/SAR sar.py:117-130). Both
# test "blocks.9" ... "blocks.11" as substrings of the names, so on CLIP's ViT (transformer.resblocks.N) they skip
# blocks 9-11 whatever the depth: the top three of ViT-B (12 blocks), middle blocks of ViT-L (24); none of a
# tower with fewer than 10 blocks
TOP_LAYER_NAMES = {
    "top": (("layer4", "conv5_x", "blocks.9", "blocks.10", "blocks.11", "ln_post"), ("norm",)),
    "sar_names": (("layer4", "blocks.9", "blocks.10", "blocks.11", "norm."), ("norm",)),
}


def skips_top_layer(name: str, rule: str) -> bool:
    """Whether the normalisation layer `name` (a module name inside the image tower) is left out under `rule`
    (norm_config.TOP_LAYER_RULES: "none", "top", "sar_names")."""
    if rule == "none":
        return False
    parts, whole = TOP_LAYER_NAMES[rule]
    return any(part in name for part in parts) or name in whole


# what a NormTower adapts: the normalisation layers' affine parameters, or every module's own weight and bias
ADAPTED_PARAMETERS = ("norm", "weights")


def norm_layers(visual: nn.Module, kinds: tuple[type, ...] = NORM_LAYERS) -> list[tuple[str, nn.Module]]:
    """(name, module) of `visual`'s normalisation layers of `kinds` with affine parameters, in module order."""
    return [(name, m) for name, m in visual.named_modules()
            if isinstance(m, kinds) and getattr(m, "weight", None) is not None]


class BatchStatisticsError(ValueError):
    """A BatchNorm layer of the tower was handed one value per channel: no batch statistics to normalise with."""


def _check_batch_statistics(name: str) -> Any:
    """A forward pre-hook for BatchNorm layer `name`: refuses an input with one value per channel (a batch of one
    image whose feature map there is 1x1), where torch would stop with its own traceback-worthy message."""
    def hook(module: nn.Module, args: tuple) -> None:
        x = args[0]
        if x.numel() <= x.shape[1]:
            n = x.shape[0]
            raise BatchStatisticsError(
                f"a batch of {n} image{'s' if n != 1 else ''} leaves its BatchNorm layer {name} one value per "
                f"channel (a {'x'.join(map(str, x.shape[2:])) or 'flat'} feature map there): batch statistics need "
                f"two or more; use batches of two or more images ({say('batch_size', 2)} or more)")
    return hook


def use_batch_statistics(module: nn.Module) -> None:
    """A BatchNorm layer of the private copy normalises with its batch's statistics in every mode, the shared
    running statistics neither read nor updated (TENT's and SAR's configure_model, for every BatchNorm layer)."""
    module.track_running_stats = False
    module.running_mean = None
    module.running_var = None
    module.num_batches_tracked = None


class NormTower(nn.Module):
    """The image tower of `clip` with its normalisation layers' affine parameters as its own trainable copies.

    `parameter_names` and `adapted_parameters()` list them in module order, weight before bias (the order the
    authors' `collect_params` walks, so an optimiser's state lines up with theirs); `skip_top_layers` (a rule of
    norm_config.TOP_LAYER_RULES) leaves the top layers' norms out, shared and frozen. Every BatchNorm layer, adapted
    or not, uses the batch's statistics (their running statistics are neither read nor updated) unless
    `batch_statistics` is off (then the shared running statistics, in eval mode); `kinds` and `keep(name)` narrow the
    adapted layers to those classes and names.

    `adapt` = "weights": every module's own `weight` and `bias` adapt instead (convolutions, linear layers and
    norms alike: CoTTA's configure_model + base.collect_params in mariodoebler/test-time-adaptation, which name-match
    `weight`/`bias`, so a ViT's `in_proj_weight`, embeddings and `proj` stay shared and frozen)."""

    def __init__(self, clip: nn.Module, skip_top_layers: str = "none", kinds: tuple[type, ...] = NORM_LAYERS,
                 keep: Callable[[str], bool] | None = None, batch_statistics: bool = True, adapt: str = "norm"):
        super().__init__()
        if adapt not in ADAPTED_PARAMETERS:
            raise ValueError(f"adapt must be one of {', '.join(ADAPTED_PARAMETERS)}, got {adapt!r}")
        visual = shared_copy(clip.visual)
        layers = norm_layers(visual)
        for name, module in layers:
            if not isinstance(module, nn.modules.batchnorm._BatchNorm):
                continue
            if batch_statistics:
                use_batch_statistics(module)     # adapted or not, as their configure_model sets every one
                module.register_forward_pre_hook(_check_batch_statistics(name))
            else:
                module.eval()                    # the shared running statistics, read and never updated
        if adapt == "weights":
            layers = [(name, m) for name, m in visual.named_modules()
                      if any(isinstance(m._parameters.get(w), nn.Parameter) for w in ("weight", "bias"))]
        else:
            layers = [(name, module) for name, module in layers if isinstance(module, kinds)]
        layers = [(name, module) for name, module in layers
                  if not skips_top_layer(name, skip_top_layers) and (keep is None or keep(name))]
        if not layers:
            words = ("layer with a weight or bias" if adapt == "weights" else
                     " or ".join(k.__name__ for k in kinds) if kinds != NORM_LAYERS else
                     "normalisation layer (LayerNorm, GroupNorm or BatchNorm)")
            raise ValueError(f"its image tower ({type(clip.visual).__name__}) has no {words} to adapt"
                             + (f" outside the top layers (skip_top_layers {skip_top_layers!r})"
                                if skip_top_layers != "none" else ""))
        self.parameter_names: list[str] = []
        for name, module in layers:
            for which in ("weight", "bias"):
                tensor = module._parameters.get(which)
                if tensor is None:
                    continue
                # a new tensor in the copy only: the shared tower keeps its own
                setattr(module, which, nn.Parameter(tensor.detach().clone(), requires_grad=True))
                self.parameter_names.append(f"{name}.{which}" if name else which)
        self.visual = visual
        self._params = [visual.get_parameter(n) for n in self.parameter_names]

    def adapted_parameters(self) -> list[nn.Parameter]:
        return list(self._params)

    def norm_state(self) -> dict[str, torch.Tensor]:
        """{parameter name: a copy of its current value}."""
        return {n: p.detach().clone() for n, p in zip(self.parameter_names, self._params)}

    @torch.no_grad()
    def load_norm_state(self, state: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.parameter_names if n not in state]
        if missing or len(state) != len(self.parameter_names):
            raise ValueError(f"norm state must hold exactly the parameters {self.parameter_names}")
        for name, p in zip(self.parameter_names, self._params):
            p.copy_(state[name])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.visual(x)


def make_optimizer(config: Any, params: Sequence[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimiser CLIPTTA's `setup_optimizer` builds (abstract_model.py:660-685): Adam / AdamW with eps
    `adam_eps`, SGD with `momentum` (their SGD passes no weight decay; here `weight_decay` applies to all three).
    A config with a `nesterov` field (mariodoebler's methods: their setup_optimizer's SGD, base.py:182-189,
    dampening 0) takes Nesterov momentum where it is on and the momentum is not 0."""
    params = list(params)
    if config.optimizer == "sgd":
        nesterov = bool(getattr(config, "nesterov", False)) and config.momentum > 0
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                               nesterov=nesterov)
    cls = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=config.lr, weight_decay=config.weight_decay, eps=config.adam_eps)


def mean_prediction_entropy(logits: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Entropy of the batch's mean probability (CLIPTTA's `softmax_mean_entropy`: eps inside the log)."""
    mean = logits.softmax(-1).mean(0)
    return -(mean * torch.log(mean + eps)).sum()


def cloned(state: Any) -> Any:
    """A deep copy of a (nested) state with every tensor cloned and detached."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {k: cloned(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(cloned(v) for v in state)
    return copy.deepcopy(state)


class HeadAtScale:
    """The class head and logit scale a config with `text_head` and `logit_scale` fields chooses (the classic TTA
    methods on CLIP, `norm_config.NormTTAConfig`; the statistics methods, `norm_statistics.StatsTowerMethod`)."""
    config: Any
    heads: Any
    model: Any

    @property
    def head(self) -> torch.Tensor:
        """(C, D) unit class features: "a photo of a {}." or the 80-template ensemble."""
        return self.heads.ensemble if self.config.text_head == "ensemble" else self.heads.zeroshot

    @property
    def scale(self) -> float:
        return self.config.logit_scale if self.config.logit_scale is not None else self.model.logit_scale


class NormTTAMethod(HeadAtScale, BatchMethod):
    """Base of the classic batch TTA methods on CLIP (a spec with `Capabilities(reads=OWN_TOWER, state=ONLINE,
    batches=True)` and a config subclassing `norm_config.NormTTAConfig`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        try:
            self.tower = self.make_tower()
        except ValueError as exc:
            raise ValueError(f"{self.name}: {self.model.name}: {exc}") from None
        self.optimizer = self.make_optimizer(self.tower.adapted_parameters())
        self._initial_norm = self.tower.norm_state()
        self._initial_optimizer = cloned(self.optimizer.state_dict())
        self.seen = 0           # images adapted on since the initial state
        self.reset_extra()

    # -- what a subclass may override ---------------------------------------------------------------------
    # BatchNorm normalises with the batch's statistics (TENT's configure_model); False: the running statistics
    batch_statistics = True

    def adapted_layer_kinds(self) -> tuple[type, ...]:
        """The normalisation layer classes whose affine parameters adapt."""
        return NORM_LAYERS

    def adapts_layer_named(self, name: str) -> bool:
        """Whether the normalisation layer `name` (a module name inside the image tower) adapts."""
        return True

    def make_tower(self) -> NormTower:
        """The private tower whose parameters adapt (a ValueError says why the model has none)."""
        return NormTower(self.model.clip, getattr(self.config, "skip_top_layers", "none"),
                         self.adapted_layer_kinds(), self.adapts_layer_named, self.batch_statistics)

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return make_optimizer(self.config, params)

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        """Adapt on a batch's normalised pixels (B, 3, S, S); return its logits (B, C) and one extras dict per image."""
        raise NotImplementedError

    def adapt_on_loss(self, pixels: torch.Tensor, loss: Callable[[torch.Tensor], torch.Tensor]
                      ) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        """`adapt` for a method whose update is one optimiser step on `loss(logits)` ((B, C) -> scalar) of the
        batch's logits, `steps` times (TENT, RPL). Its outputs: the logits of the last forward that adapted, or
        with the config's `predict_after_update`, of a forward after the updates."""
        losses, logits = [], None
        for _ in range(self.config.steps):
            logits = self.logits(pixels)
            value = loss(logits)
            losses.append(float(value.detach()))
            self.step(value)
        if self.config.predict_after_update or logits is None:
            with torch.no_grad():
                logits = self.logits(pixels)
        extras = {"loss": losses[0], "last_loss": losses[-1]}
        return logits.detach(), [dict(extras) for _ in range(pixels.shape[0])]

    def extra_state(self) -> dict[str, Any]:
        """The method's own state carried across batches (tensors, numbers, None), for `state_dict`."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def reset_extra(self) -> None:
        """Return the method's own state to its initial value."""

    # -- the tower ----------------------------------------------------------------------------------------------
    def encode(self, pixels: torch.Tensor, tower: nn.Module | None = None) -> torch.Tensor:
        """(B, 3, S, S) normalised pixels -> (B, D) unit features through the adapted tower, or through `tower` (a
        mean teacher's, an anchor's), gradients kept."""
        if self.model.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        with self.precision.autocast():
            features = (self.tower if tower is None else tower)(pixels)
        return F.normalize(features.float(), dim=-1)

    def logits(self, pixels: torch.Tensor, tower: nn.Module | None = None) -> torch.Tensor:
        """(B, C) logits = scale x cosine to the class head (through `encode`'s tower)."""
        return self.scale * self.encode(pixels, tower) @ self.head.T

    def step(self, loss: torch.Tensor) -> None:
        """One optimiser step on `loss` (backward, step, zero the gradients, as their forward_and_adapt)."""
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- state ----------------------------------------------------------------------------------------------
    def reset_tower(self) -> None:
        """The initial adapted parameters and an empty optimiser state (the method's own state left as it is:
        what the authors' `reset` restores, e.g. SAR's model recovery)."""
        self.tower.load_norm_state(self._initial_norm)
        self.optimizer.load_state_dict(cloned(self._initial_optimizer))

    def reset(self) -> None:
        self.reset_tower()
        self.seen = 0
        self.reset_extra()

    def episodic_reset(self) -> None:
        """What `config.episodic` does before every batch: `reset` (a method whose authors keep some state
        across their episodic reset overrides it)."""
        self.reset()

    def save_state(self) -> dict[str, Any]:
        return {"seen": self.seen,
                "norm": self.tower.norm_state(), "optimizer": cloned(self.optimizer.state_dict()),
                "extra": cloned(self.extra_state())}

    def load_state(self, state: dict[str, Any]) -> None:
        self.tower.load_norm_state(state["norm"])
        self.optimizer.load_state_dict(cloned(state["optimizer"]))
        self.seen = int(state["seen"])
        self.load_extra_state(cloned(state.get("extra", {})))

    # -- the engine -----------------------------------------------------------------------------------------
    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        if not ctxs:
            return []
        pixels = batch_pixels(ctxs, self.model.device,
                              f"{self.name} adapts the image tower and needs the images' pixels, not stored features")
        if self.config.episodic:
            self.episodic_reset()
        try:
            with torch.enable_grad():       # a caller's no_grad block must not stop the adaptation
                logits, extras = self.adapt(pixels)
        except BatchStatisticsError as exc:
            raise ValueError(f"{self.name}: {self.model.name}: {exc}") from None
        self.seen += len(ctxs)
        return [MethodOutput(row.detach().float(), extras=extra) for row, extra in zip(logits, extras)]

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        """One image alone: a batch of one."""
        return self.adapt_batch([ctx])[0]


def refuse_continual(method: NormTTAMethod) -> None:
    """A one-line ValueError for `episodic=False` on a method declared episodic (its spec's capabilities): the
    engine neither checkpoints nor replays its state, so a continual run could not resume."""
    if not method.config.episodic:
        raise ValueError(f"{method.name}.episodic: False (continual) is not offered: {method.name} is declared "
                         "episodic (reset before every batch), as its authors' code runs it")
