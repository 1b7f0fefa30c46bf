"""Method base class and registry.

A method turns one sample's `SampleContext` into class scores. A method is a folder,
`shiftlab/methods/<name>/` (CONTRIBUTING.md): its `spec.py` declares the config and the capabilities without
torch (`shiftlab.methods.catalogue.declarations.MethodSpec`), its `card.toml` the facts, its `method.py` holds a
class deriving the base of its kind (shiftlab.methods.kinds) and naming that spec (`spec = MTASpec`), whose
declarations it reads there (`self.spec`). The registry finds the specs by scanning the folders
and imports a method's class the first time it is built (`get_method_class`); tests are parametrised
over the registry. A script or test registers a class of its own with `register_method("name")`.

Every config field declares its valid range beside its default (`shiftlab.params.param`);
`make_config` is the one check of a config (ranges, types, the method's minimum views) that
`shiftlab run --set`, `create_method(**kw)`, the protocols and `Method.__init__` all go through.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import torch

from ..models import ClipModel
from ..models.precision import Precision
from ..models.precision import resolve as resolve_precision
from ..registry import Registry
from ..views.generator import ViewConfig, ViewGenerator
from ..views.recipe import ViewRecipe
from .catalogue import declarations as method_specs
from .catalogue.declarations import (
    BATCH,
    EPISODIC,
    FROZEN_ENCODER,
    FROZEN_FEATURES,
    ONLINE,
    OWN_TOWER,
    TEST_SET,
    Capabilities,
    MethodConfig,
    MethodSpec,
    ViewMethodConfig,
    check_method_config,
    make_config,
)
from .catalogue.method_config import effective_config, registered_name
from .catalogue.method_plan import plan_method
from .catalogue.protocols import DEFAULT_PROTOCOL, protocol_overrides
from .context import ClassHeads, SampleContext
from .outputs import MethodOutput, Prediction, load_image, make_prediction

__all__ = ["ExtraModel", "Method", "MethodConfig", "MethodOutput", "ViewMethodConfig", "check_method_config",
           "create_method", "effective_config", "get_method_class", "list_methods", "make_config", "register_method"]


class _ClassRegistry(Registry["type[Method]"]):
    """The imported method classes; removing one removes its spec too (tests register temporary methods). A class's
    name is its spec's (`Method.name`), never set on it."""
    names_classes = False

    def pop(self, name: str, default: Any = None) -> Any:
        method_specs.SPECS.pop(name)
        return super().pop(name, default)


_REGISTRY: Registry[type[Method]] = _ClassRegistry("method")


class ExtraModel(NamedTuple):
    """A CLIP a method loads itself: `load_shared_model(arch, pretrained, seed=seed)`; `settings` says how to
    choose another (e.g. "--set rlcf.reward_model=ARCH --set rlcf.reward_pretrained=TAG|FILE|hf-hub:ORG/REPO")."""
    arch: str
    pretrained: str | None
    seed: int
    settings: str


class _MethodType(type):
    """Reads a method class's old attributes (`episodic`, `summary`, ...) from its spec, with a DeprecationWarning:
    a method's declarations live in its spec only (`Method.spec`)."""

    def __getattr__(cls, attr: str) -> Any:
        return _deprecated_spec_attribute(cls, attr)


def _deprecated_spec_attribute(cls: Any, attr: str) -> Any:
    klass = cls if isinstance(cls, type) else type(cls)
    spec = type.__getattribute__(klass, "spec")
    if attr == "in_groups":   # a method of Method's once, a function of this module now
        warnings.warn("Method.in_groups is deprecated: use shiftlab.methods.base.in_groups", DeprecationWarning,
                      stacklevel=3)
        return in_groups
    if attr not in SPEC_ATTRIBUTES or spec is None:
        raise AttributeError(f"{type.__getattribute__(klass, '__name__')!r} object has no attribute {attr!r}")
    warnings.warn(f"Method.{attr} is deprecated: read the method's spec, `.spec.{attr}`", DeprecationWarning,
                  stacklevel=3)
    return getattr(spec, attr)


class Method(metaclass=_MethodType):
    """What every method is: built for a model and its class names with a checked config, it turns one sample's
    `SampleContext` into class scores (`predict_context`). A method derives the base of its kind
    (shiftlab.methods.kinds: `EpisodicMethod`, `OnlineMethod`, `BatchMethod`, `TestSetMethod`), which says how the
    engine drives it; everything it declares (name, config class, capabilities, facts) it reads from `self.spec`,
    its `MethodSpec` (methods/<name>/spec.py; a class registered without a folder gets one made from the
    attributes it declares, `register_method`)."""
    spec: ClassVar[type[MethodSpec] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            _check_spec(cls, spec)

    def __init__(self, model: ClipModel, classnames: Sequence[str], config: Any = None,
                 heads: ClassHeads | None = None, run_precision: str = "auto",
                 allow_duplicate_names: bool = False, trust_checkpoint: bool = False):
        if type(self).spec is None:   # a class of a script's that was never registered: its declared attributes
            type(self).spec = _spec_from_class(type(self).__name__.lower(), type(self))
        spec = self.spec
        self.model = model
        self.classnames = check_classnames(classnames, allow_duplicate_names)
        self.config = check_method_config(spec, config if config is not None else spec.config_class())
        problem = spec.config_problem(self.config)
        if problem:   # what a run plan refuses before torch (a folder the method reads that is missing)
            raise ValueError(problem)
        # a method bound to some image towers (its spec's `towers`): the loaded tower decides, in one line
        if tuple(spec.towers) != method_specs.TOWERS:
            from ..models.tower_tokens import tower_kind
            try:
                tower = tower_kind(model.clip.visual)
            except ValueError as exc:
                raise ValueError(f"{spec.name}: {model.name}: {exc}") from None
            problem = method_specs.tower_problem(spec, tower, model.name)
            if problem:
                raise ValueError(problem)
        self.heads = heads if heads is not None else ClassHeads(model, self.classnames)
        self.run_precision = run_precision
        # the run's --trust-checkpoint: a file the method reads that holds Python objects beyond tensors (a dassl
        # prompt checkpoint) is unpickled only then (models.checkpoints.read_pickle)
        self.trust_checkpoint = bool(trust_checkpoint)
        # the run's precision is a run setting; the method's own config wins unless it says "auto"
        self.precision: Precision = resolve_precision(getattr(self.config, "precision", "auto"), model.device,
                                                      run=run_precision)
        if self.precision.model_dtype is not None:
            # fp16-pure: the authors' class head comes from their half model's text tower too; the engine
            # encodes the views with the same cast copy (ClipModel.cast, by precision key)
            self.heads = ClassHeads(model.cast(self.precision.model_dtype), self.classnames)

    def __getattr__(self, attr: str) -> Any:
        return _deprecated_spec_attribute(self, attr)

    @property
    def name(self) -> str:
        """The registered name (its spec's)."""
        return self.spec.name if self.spec is not None else ""

    @classmethod
    def extra_models(cls, config: Any) -> list[ExtraModel]:
        """The CLIPs this method loads itself besides the run's model under `config` (RLCF's reward model),
        for `models.load_shared_model`. `shiftlab run` loads them with the run's weight flags before any
        work and refuses one that cannot be loaded."""
        return []

    def loaded_weights(self) -> dict[str, Any]:
        """What decides this method's results besides its config and the run's model: the weights it
        loaded itself (a checkpoint's SHA-256, or the digest of random weights), as JSON scalars. The run
        identity records them beside the method's config, so a --resume with other weights is refused."""
        return {}

    @property
    def view_recipe(self) -> ViewRecipe:
        """The views this method reads (view 0 only for methods without a `views` config field)."""
        recipe = getattr(self.config, "views", None)
        return recipe if isinstance(recipe, ViewRecipe) else ViewRecipe(n_views=1)

    # -- library use ------------------------------------------------------------
    def __repr__(self) -> str:
        """The method's name, its classes and its effective config, field by field, on one line."""
        def shown(value: Any) -> str:
            return repr(value.describe()) if isinstance(value, ViewRecipe) else repr(value)
        fields = ", ".join(f"{f.name}={shown(getattr(self.config, f.name))}" for f in dataclasses.fields(self.config))
        return f"{type(self).__name__}({self.name!r}, {len(self.classnames)} classes, {fields})"

    def predict(self, views: torch.Tensor) -> torch.Tensor:
        """Normalised views (N, 3, S, S) float, view 0 the original, S the model's input size -> logits (C,).

        Views from `ViewGenerator` are uint8: pass `model.normalize(views.float() / 255)`. Only the
        first `view_recipe.n_views` views are read (and encoded). The image tower runs under the
        method's precision (its own, or the run's where it says "auto"), through the engine's encoder,
        as a run encodes each method's views, so `predict` gives what a run gives.
        """
        return self._predict_views(views).logits

    def predict_image(self, image: Any, seed: int = 0, sample_id: int = 0) -> Prediction:
        """One image (a path, a PIL image, a uint8 array) -> `Prediction` (class index and name,
        probabilities, logits, `top(k)`), with this method's own views: its view recipe drawn as a
        run draws them for sample `sample_id` of a run seeded `seed`."""
        for argument, value in (("seed", seed), ("sample_id", sample_id)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{argument} must be an integer >= 0, got {value!r}")
        config = ViewConfig.from_recipe(self.view_recipe)
        views_u8 = ViewGenerator(config, seed, preprocess=self.model.preprocess)(load_image(image), sample_id)
        out = self._predict_views(self.model.normalize(views_u8.float() / 255))
        return make_prediction(out.logits, out.probabilities(), self.classnames)

    def _predict_views(self, views: torch.Tensor) -> MethodOutput:
        check_views(views, self.model)
        spec = self.spec
        needed = spec.needed_views(self.config) if spec.needs_views else 1
        if views.shape[0] < needed:
            raise ValueError(f"{self.name}: needs at least {needed} views (incl. the original), got "
                             f"{views.shape[0]}" + (f": {spec.min_views_why}" if spec.min_views_why else ""))
        views = views[:self.view_recipe.n_views].to(self.model.device)
        ctx = SampleContext(self.model, self.heads, views, precision=self.precision)
        return self.predict_context(ctx)

    # -- engine use -------------------------------------------------------------
    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        """One sample's context -> its output (logits (C,), optional OOD score and extras)."""
        raise NotImplementedError

    def predict_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        """Several samples, each on its own (an episodic or test-set method; methods override this to batch work
        across samples)."""
        return [self.predict_context(c) for c in ctxs]

    def prepare(self) -> None:
        """One-off work before the first sample (class heads, prompts), kept out of per-image timings."""
        _ = self.heads.zeroshot

    def reset(self) -> None:
        """Return to the initial state (what an episodic method does before every sample, an online method at the
        start of its stream)."""


# what a method class once carried over from its spec, read from the spec now (`_deprecated_spec_attribute`)
SPEC_ATTRIBUTES = frozenset((*method_specs.ATTRIBUTES, *method_specs.DERIVED, "needed_views", "test_config"))


def in_groups(ctxs: Sequence[SampleContext], size: int,
              predict_group: Callable[[Sequence[SampleContext]], list[MethodOutput]]) -> list[MethodOutput]:
    """`predict_group` over consecutive groups of at most `size` samples, outputs in order."""
    outputs: list[MethodOutput] = []
    for start in range(0, len(ctxs), max(1, size)):
        outputs.extend(predict_group(ctxs[start:start + size]))
    return outputs


def check_views(views: object, model: ClipModel) -> None:
    """Raise a one-line ValueError unless `views` is a float (N>=1, 3, S, S) tensor at the model's input size."""
    size = model.image_size
    if not isinstance(views, torch.Tensor):
        raise ValueError(f"views must be a torch.Tensor (N, 3, {size}, {size}), got {type(views).__name__}")
    if not views.is_floating_point():
        raise ValueError(f"views must be a float tensor normalised by the model, got {views.dtype}; "
                         "for ViewGenerator's uint8 views pass model.normalize(views.float() / 255)")
    if views.ndim != 4 or views.shape[1] != 3:
        raise ValueError(f"views must be (N, 3, {size}, {size}), got shape {tuple(views.shape)}")
    if views.shape[0] < 1:
        raise ValueError("views must hold at least one view (view 0, the original), got N = 0")
    if tuple(views.shape[-2:]) != (size, size):
        raise ValueError(f"views are {views.shape[-2]}x{views.shape[-1]} px but {model.name} takes {size}x{size}; "
                         "ViewGenerator(ViewConfig(), seed, preprocess=model.preprocess) makes views of that size")
    finite = torch.isfinite(views).flatten(1).all(-1)
    if not bool(finite.all()):
        # an online method would keep the NaN in its memory and score every later sample with it
        bad = (~finite).nonzero().flatten().tolist()
        raise ValueError(f"views hold NaN or inf values (view {bad[0]}" + (f" and {len(bad) - 1} more" if len(bad) > 1
                         else "") + "); pass finite, normalised pixels")


def check_model(model: object) -> None:
    """A TypeError naming `model` unless it is a loaded model (`shiftlab.load_model`: it encodes views)."""
    if not callable(getattr(model, "encode_views", None)):
        raise TypeError(f"model must be a loaded model (shiftlab.load_model(...)), got {type(model).__name__}"
                        + (f" {model!r}" if isinstance(model, str) else ""))


def check_classnames(classnames: object, allow_duplicates: bool = False) -> list[str]:
    """`classnames` as a list, or a one-line ValueError: it must be a non-empty list (or tuple) of
    non-empty strings, each name once unless `allow_duplicates` (CLIP's ImageNet list names two
    pairs of classes alike, 'missile' and 'sunglasses'; the datasets pass it as published)."""
    if not isinstance(classnames, (list, tuple)):
        shown = repr(classnames) if isinstance(classnames, str) and len(classnames) <= 40 else type(classnames).__name__
        raise ValueError(f"classnames must be a list of class names, got {shown}"
                         + (" (a string would make one class of each character)" if isinstance(classnames, str)
                            else ""))
    if not classnames:
        raise ValueError("classnames is empty: give the dataset's class names, one per class")
    for i, name in enumerate(classnames):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"classnames[{i}] is {name!r}; every class name must be a non-empty string")
    if not allow_duplicates:
        seen: dict[str, int] = {}
        for i, name in enumerate(classnames):
            if name in seen:
                raise ValueError(f"classnames[{i}] {name!r} repeats classnames[{seen[name]}]: two classes with one "
                                 "name get the same text features; name every class once")
            seen[name] = i
    return list(classnames)


def _check_spec(cls: type[Method], spec: type[MethodSpec]) -> None:
    """Refuse a method class that cannot do what its spec declares (nothing is copied: it reads `self.spec`)."""
    module, _, qualname = spec.impl.partition(":")
    if (module, qualname) != (cls.__module__, cls.__qualname__):
        raise TypeError(f"{cls.__qualname__} names spec {spec.__qualname__}, whose impl is {spec.impl!r}, "
                        f"not '{cls.__module__}:{cls.__qualname__}'")
    if not getattr(cls, "_kind", ""):   # today's shape until every folder is converted: driven by its spec's kind
        warnings.warn(f"{cls.__qualname__}: a method derives the base of its kind (shiftlab.methods.kinds: "
                      "EpisodicMethod, OnlineMethod, BatchMethod or TestSetMethod); deriving Method itself is "
                      "deprecated", DeprecationWarning, stacklevel=3)
    if spec.capabilities.reads_frozen_encoder and not callable(cls.__dict__.get("frozen_encoder")
                                                               or getattr(cls, "frozen_encoder", None)):
        raise TypeError(f"{spec.name}: a method reading a frozen encoder of its own (capabilities reads "
                        f"{FROZEN_ENCODER!r}) must define frozen_encoder: the engine computes and stores its output")
    for fact in method_specs.FACTS:
        if fact in cls.__dict__:
            raise TypeError(f"{cls.__qualname__}: the fact {fact!r} belongs in its spec ({spec.__qualname__})")


def _declared(cls: type, attr: str, default: Any) -> Any:
    """What a class registered without a folder declares in its own bodies (not a base's property or method)."""
    for klass in cls.__mro__:
        if klass is Method or attr not in klass.__dict__:
            continue
        value = klass.__dict__[attr]
        return default if isinstance(value, (property, classmethod, staticmethod)) else value
    return default


def _spec_from_class(name: str, cls: type[Method]) -> type[MethodSpec]:
    """A spec for a class registered without a folder, from the attributes it declares (its kind from the kind
    base it derives, or, a class deriving `Method` itself, from `episodic`, `adapts_on_batches`, `reads_ahead`)."""
    kind = getattr(cls, "_kind", "")
    batches = kind == BATCH or bool(_declared(cls, "adapts_on_batches", False))
    episodic = _declared(cls, "episodic", kind in ("", EPISODIC, TEST_SET, BATCH))
    reads_ahead = TEST_SET if kind == TEST_SET else _declared(cls, "reads_ahead", None)
    reads = tuple(r for r, on in ((FROZEN_FEATURES, _declared(cls, "reads_features", True)),
                                  (OWN_TOWER, _declared(cls, "needs_pixels", False))) if on)
    body: dict[str, Any] = {attr: cls.__dict__[attr] if attr in cls.__dict__ else _declared(cls, attr, None)
                            for attr in method_specs.ATTRIBUTES}
    body = {attr: value for attr, value in body.items() if value is not None}
    body.update({fact: cls.__dict__[fact] for fact in method_specs.FACTS if fact in cls.__dict__})
    body.update(name=name, impl=f"{cls.__module__}:{cls.__qualname__}", __module__=cls.__module__,
                capabilities=Capabilities(reads=reads, state=EPISODIC if episodic else ONLINE,
                                          batches=batches, reads_ahead=reads_ahead))
    needed = _declared(cls, "needed_views", None)
    if needed is not None:
        body["needed_views"] = classmethod(lambda spec, config: needed.__get__(None, cls)(config))
    spec = type(f"{cls.__name__}Spec", (MethodSpec,), body)
    needs_views = _declared(cls, "needs_views", None)
    if needs_views is not None and spec.needs_views != needs_views:
        spec.needs_views = needs_views
    return spec


def register_method(name: str) -> Callable[[type[Method]], type[Method]]:
    """Class decorator for a method without a folder (a script's, a test's): make a `Method` subclass
    available as `--methods NAME`, its spec made from the attributes it declares."""
    def register(cls: type[Method]) -> type[Method]:
        spec = cls.__dict__.get("spec") or _spec_from_class(name, cls)
        method_specs.register_spec(spec, replace=True)
        if cls.__dict__.get("spec") is None:
            cls.spec = spec
        return _REGISTRY.register(name, cls, replace=True)
    return register


def list_methods(kind: str | None = None) -> list[str]:
    """Registered method names, sorted; `kind` ("episodic" or "online") keeps only those."""
    return method_specs.spec_names(kind)


def get_method_class(name: str) -> type[Method]:
    """The class registered as `name` (or as the method of a variant, `registered_name`), imported from its
    spec's `impl` on first use; an unknown name raises `UnknownNameError` (a KeyError), a name that is not a
    string a TypeError."""
    if not isinstance(name, str):
        raise TypeError(f"method must be a method name (a string), got {type(name).__name__} {name!r}")
    spec = method_specs.spec(registered_name(name))
    problem = method_specs.refusal(spec.name)
    if problem:
        raise ValueError(problem)
    return _REGISTRY.implementation(spec)


def describe(protocol: str, name: str) -> dict[str, Any]:
    """What method `name` runs with under a protocol, without a dataset: `views` (its recipe as a dict),
    `precision` and `config` (the other fields of its effective config)."""
    spec = method_specs.spec(name)
    fields = dataclasses.asdict(make_config(spec, **protocol_overrides(protocol, spec)))
    return {"views": fields.pop("views", {"n_views": 1}), "precision": fields.pop("precision"), "config": fields}


def create_method(name: str, model: ClipModel, classnames: Sequence[str], heads: ClassHeads | None = None,
                  run_precision: str = "auto", protocol: str = DEFAULT_PROTOCOL, dataset: str | None = None,
                  run_views: dict[str, Any] | None = None, allow_duplicate_names: bool = False,
                  trust_checkpoint: bool = False, **config: Any) -> Method:
    """Build a registered method as `protocol` runs it (shiftlab.methods.catalogue.protocols: "leaderboard", the
    defaults, or "paper", the authors' own recipe, with their per-dataset values for `dataset`),
    overridden by `config`, resolved as a run resolves each of its methods (`catalogue.method_plan.plan_method`,
    which `engine.run_plan.resolve_plan` calls too); `run_precision` is the run's precision setting,
    used where the method's own `precision` is "auto". `classnames`: a list of distinct names
    (`check_classnames`). `trust_checkpoint`: a checkpoint the method reads itself may hold pickled Python objects
    (refused otherwise, as `load_model`'s). Bad values are one-line ValueErrors, an unknown field a TypeError."""
    get_method_class(name)
    check_model(model)
    check_classnames(classnames, allow_duplicate_names)
    cfg = plan_method(name, protocol, dataset, run_precision, run_views, **config).config
    return build_method(name, model, classnames, cfg, heads=heads, run_precision=run_precision,
                        allow_duplicate_names=allow_duplicate_names, trust_checkpoint=trust_checkpoint)


def build_method(name: str, model: ClipModel, classnames: Sequence[str], config: MethodConfig,
                 heads: ClassHeads | None = None, run_precision: str = "auto",
                 allow_duplicate_names: bool = False, trust_checkpoint: bool = False) -> Method:
    """Build a registered method with a config already resolved (`create_method`'s, or a run plan's:
    `engine.run_plan.RunPlan.method_configs`)."""
    cls = get_method_class(name)
    check_model(model)
    names = check_classnames(classnames, allow_duplicate_names)
    return cls(model, names, config, heads=heads, run_precision=run_precision,
               allow_duplicate_names=allow_duplicate_names, trust_checkpoint=trust_checkpoint)
