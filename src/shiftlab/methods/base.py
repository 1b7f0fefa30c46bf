"""Method base class and registry.

A method turns one sample's `SampleContext` into class scores. A method is a folder,
`shiftlab/methods/<name>/` (CONTRIBUTING.md): its `spec.py` declares the config, the capabilities
and the facts without torch (`shiftlab.methods.catalogue.declarations.MethodSpec`), its `method.py` holds a `Method`
subclass naming that spec (`spec = MTASpec`). The registry finds the specs by scanning the folders
and imports a method's class the first time it is built (`get_method_class`); tests are parametrised
over the registry. A script or test registers a class of its own with `register_method("name")`.

Every config field declares its valid range beside its default (`shiftlab.params.param`);
`make_config` is the one check of a config (ranges, types, the method's minimum views) that
`shiftlab run --set`, `create_method(**kw)`, the protocols and `Method.__init__` all go through.
"""
from __future__ import annotations

import dataclasses
import importlib
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
    EPISODIC,
    FROZEN_ENCODER,
    FROZEN_FEATURES,
    ONLINE,
    OWN_TOWER,
    STATES,
    TEST_SET,
    Capabilities,
    MethodConfig,
    MethodSpec,
    ViewMethodConfig,
    check_method_config,
    make_config,
)
from .catalogue.method_config import effective_config, registered_name
from .catalogue.protocols import DEFAULT_PROTOCOL, protocol_overrides
from .context import ClassHeads, SampleContext
from .frozen_encoder import FrozenEncoder
from .prediction import MethodOutput, Prediction, load_image, make_prediction

__all__ = ["ExtraModel", "Method", "MethodConfig", "MethodOutput", "ViewMethodConfig", "check_method_config",
           "create_method", "effective_config", "get_method_class", "list_methods", "make_config", "register_method"]


class _ClassRegistry(Registry["type[Method]"]):
    """The imported method classes; removing one removes its spec too (tests register temporary methods)."""

    def pop(self, name: str, default: Any = None) -> Any:
        method_specs.SPECS.pop(name)
        return super().pop(name, default)


_REGISTRY: Registry[type[Method]] = _ClassRegistry("method")
METHOD_KINDS = STATES


class ExtraModel(NamedTuple):
    """A CLIP a method loads itself: `load_shared_model(arch, pretrained, seed=seed)`; `settings` says how to
    choose another (e.g. "--set rlcf.reward_model=ARCH --set rlcf.reward_pretrained=TAG|FILE|hf-hub:ORG/REPO")."""
    arch: str
    pretrained: str | None
    seed: int
    settings: str


class Method:
    """A method's torch code. A method with a folder names its spec (`spec = MTASpec`), from which the
    class gets its name, config class, summary, text head, minimum views, offline configs, facts and
    capabilities when it is defined; the attributes below are those a class registered without a
    folder declares itself (`register_method`). `episodic`, `needs_views`, `needs_pixels`, `reads_features`,
    `adapts_on_batches` and `reads_ahead` are read from the capabilities
    (`shiftlab.methods.catalogue.declarations.Capabilities`)."""
    spec: ClassVar[type[MethodSpec] | None] = None
    name: str = ""
    config_class: type = MethodConfig
    episodic: bool = True       # reset to the initial state before every sample
    needs_views: bool = True    # uses the augmented views (False: view 0 only)
    # reads pixels, not only view features (tunes the image tower): never served by a feature store
    needs_pixels: bool = False
    # reads the frozen image tower's view features (`SampleContext.image_features`); False (a method that encodes
    # the pixels through a tower of its own, so needs_pixels too): the engine does not encode a sample's views for
    # a group of methods none of which reads them (a context still encodes on first reading)
    reads_features: bool = True
    summary: str = ""           # one line for `shiftlab methods`
    supports_pure_fp16: bool = False   # accepts precision "fp16-pure" (its image features and text head)
    # the class head it reads (a kind of shiftlab.methods.heads) where its config has no `text_head` field
    text_head: str = "zeroshot"
    # the fewest views (incl. the original) the method's computation is defined for; a method whose
    # minimum depends on its config overrides `needed_views`, and says why in `min_views_why`
    min_views: int = 1
    min_views_why: str = ""
    own_ood_score: str = ""     # its own OOD score's name and source ("": MCM only; MethodSpec.own_ood_score)
    # adapts on a batch of test images together (the episodic-batch protocol, docs/PROTOCOLS.md; a spec's
    # `Capabilities(batches=True)`): the engine hands `adapt_batch` each batch of `--batch-size` consecutive
    # stream positions whole, after `reset()` when the method is `episodic` (the state kept from batch to
    # batch otherwise: continual)
    adapts_on_batches: bool = False
    # what it reads beyond the current sample and its past (a spec's `Capabilities(reads_ahead=...)`: None, "batch",
    # "test_set"); a "test_set" method is shown the whole test set before the stream (`observe_test_set`)
    reads_ahead: str | None = None
    # how `--attack-target adaptive` attacks it (a spec's `Adaptive`, methods/adaptive_modes.py); None: it cannot be
    adaptive: Any = None
    # config overrides that run the method with nothing downloaded, as `shiftlab demo` and the registry tests do
    # on the tiny random CLIP (RLCF: a random-weight reward model instead of OpenAI's ViT-L/14)
    offline_config: dict[str, Any] = {}
    # config overrides that give every model the method loads itself random weights of the same architecture
    # (same cost, nothing downloaded): what `shiftlab bench` measures it with when the run's model is random too
    random_weights_config: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            _take_spec(cls, spec)

    def __init__(self, model: ClipModel, classnames: Sequence[str], config: Any = None,
                 heads: ClassHeads | None = None, run_precision: str = "auto",
                 allow_duplicate_names: bool = False):
        self.model = model
        self.classnames = check_classnames(classnames, allow_duplicate_names)
        self.config = check_method_config(type(self), config if config is not None else self.config_class())
        problem = self.spec.config_problem(self.config) if self.spec is not None else None
        if problem:   # what a run plan refuses before torch (a folder the method reads that is missing)
            raise ValueError(problem)
        # a method bound to some image towers (its spec's `towers`): the loaded tower decides, in one line
        if tuple(getattr(self, "towers", method_specs.TOWERS)) != method_specs.TOWERS:
            from ..models.tower_tokens import tower_kind
            try:
                tower = tower_kind(model.clip.visual)
            except ValueError as exc:
                raise ValueError(f"{self.name}: {model.name}: {exc}") from None
            problem = method_specs.tower_problem(self, tower, model.name)
            if problem:
                raise ValueError(problem)
        self.heads = heads if heads is not None else ClassHeads(model, self.classnames)
        self.run_precision = run_precision
        # the run's precision is a run setting; the method's own config wins unless it says "auto"
        self.precision: Precision = resolve_precision(getattr(self.config, "precision", "auto"), model.device,
                                                      run=run_precision)
        if self.precision.model_dtype is not None:
            # fp16-pure: the authors' class head comes from their half model's text tower too; the engine
            # encodes the views with the same cast copy (ClipModel.cast, by precision key)
            self.heads = ClassHeads(model.cast(self.precision.model_dtype), self.classnames)

    @classmethod
    def needed_views(cls, config: Any) -> int:
        """The fewest views (incl. the original) this method can use under `config` (its spec's rule)."""
        return cls.spec.needed_views(config) if cls.spec is not None else cls.min_views

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
        if self.reads_ahead == TEST_SET and not self.test_set_seen:
            named = " (per group {name: contexts} of its test_set_views)" if self.test_set_views is not None else ""
            raise ValueError(f"{self.name} reads the whole test set before predicting: hand it every test image's "
                             f"contexts with observe_test_set(...){named} and call finish_test_set() first "
                             "(shiftlab.run does)")
        check_views(views, self.model)
        needed = self.needed_views(self.config) if self.needs_views else 1
        if views.shape[0] < needed:
            raise ValueError(f"{self.name}: needs at least {needed} views (incl. the original), got "
                             f"{views.shape[0]}" + (f": {self.min_views_why}" if self.min_views_why else ""))
        views = views[:self.view_recipe.n_views].to(self.model.device)
        ctx = SampleContext(self.model, self.heads, views, precision=self.precision)
        return self.predict_context(ctx)

    # -- engine use -------------------------------------------------------------
    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        raise NotImplementedError

    def predict_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        """Several samples; methods override this to batch work across samples."""
        return [self.predict_context(c) for c in ctxs]

    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        """A batch method (`adapts_on_batches`): adapt on the batch's samples together, then predict each;
        one output per context, in order. The batch is the unit of its results (and of a resume)."""
        raise NotImplementedError(f"{self.name}: adapts_on_batches is declared but adapt_batch is not implemented")

    def frozen_encoder(self) -> FrozenEncoder | None:
        """Its second frozen encoder of view 0 (a spec's FROZEN_ENCODER capability), whose output the engine puts in
        `SampleContext.encoded[encoder.id]` and a feature store holds; None: none (in this config)."""
        return None

    def observe_test_set(self, ctxs: Sequence[SampleContext]) -> None:
        """A test-set method (`reads_ahead == "test_set"`): the engine's pass over the whole test set before the
        stream hands it every decodable sample once, in sample-id order, in groups (`--batch-size`), clean
        views of its own recipe; `end_test_set()` follows the last group. Nothing is predicted here."""
        raise NotImplementedError(f"{self.name}: reads_ahead 'test_set' is declared but observe_test_set is not "
                                  "implemented")

    # the test-set pass's own views, by name (None: the method's own recipe, `observe_test_set(ctxs)`); a method
    # naming some (TIPPLE's weak and strong views) is handed {name: contexts} per group instead, the k-th named
    # recipe drawn from view seed stream k (`ViewGenerator(stream=k)`, k = 1, 2, ...: independent of the others)
    test_set_views: dict[str, ViewRecipe] | None = None
    # the run's seed, set by the test-set pass before its first group: what a test-set method draws its own
    # randomness from (TIPPLE's stage-I shuffles), so a resumed run recomputes the same state
    test_set_seed: int = 0

    def end_test_set(self) -> None:
        """After the test-set pass: fit what the whole set decides (a task-level prompt). `reset()` returns to
        the state this leaves, and an online method's checkpoints hold it."""

    # set once the test-set pass has ended (`finish_test_set`): a test-set method refuses `predict` before
    test_set_seen: bool = False

    def finish_test_set(self) -> None:
        """End the test-set pass (`end_test_set`) and mark it seen: what the engine calls after the last group."""
        self.end_test_set()
        self.test_set_seen = True

    def in_groups(self, ctxs: Sequence[SampleContext], size: int,
                  predict_group: Callable[[Sequence[SampleContext]], list[MethodOutput]]) -> list[MethodOutput]:
        """`predict_group` over consecutive groups of at most `size` samples, outputs in order."""
        outputs: list[MethodOutput] = []
        for start in range(0, len(ctxs), max(1, size)):
            outputs.extend(predict_group(ctxs[start:start + size]))
        return outputs

    def prepare(self) -> None:
        """One-off work before the first sample (class heads, prompts), kept out of per-image timings."""
        _ = self.heads.zeroshot

    def reset(self) -> None:
        """Return to the initial state (episodic methods do this before every sample)."""

    def state_dict(self) -> dict[str, Any]:
        """Online state to checkpoint with the records (episodic methods have none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


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


def _take_spec(cls: type[Method], spec: type[MethodSpec]) -> None:
    """Give a method class its spec's declarations (facts into its own body: `facts.declared` reads them
    there), refusing a class that cannot do what the spec declares."""
    module, _, qualname = spec.impl.partition(":")
    if (module, qualname) != (cls.__module__, cls.__qualname__):
        raise TypeError(f"{cls.__qualname__} names spec {spec.__qualname__}, whose impl is {spec.impl!r}, "
                        f"not '{cls.__module__}:{cls.__qualname__}'")
    if not spec.episodic and (cls.state_dict is Method.state_dict or cls.load_state_dict is Method.load_state_dict):
        raise TypeError(f"{spec.name}: an online method (capabilities state {ONLINE!r}) must define state_dict and "
                        "load_state_dict: its state is checkpointed with the records and restored on resume")
    if spec.capabilities.reads_frozen_encoder and cls.frozen_encoder is Method.frozen_encoder:
        raise TypeError(f"{spec.name}: a method reading a frozen encoder of its own (capabilities reads "
                        f"{FROZEN_ENCODER!r}) must define frozen_encoder: the engine computes and stores its output")
    if spec.reads_ahead == TEST_SET and cls.observe_test_set is Method.observe_test_set:
        raise TypeError(f"{spec.name}: a test-set method (reads_ahead 'test_set') must define observe_test_set: the "
                        "engine shows it the whole test set before the stream")
    for attr in (*method_specs.ATTRIBUTES, *method_specs.DERIVED):
        setattr(cls, attr, getattr(spec, attr))
    for fact in method_specs.FACTS:
        if fact in spec.__dict__:
            setattr(cls, fact, spec.__dict__[fact])
        elif fact in cls.__dict__:
            raise TypeError(f"{cls.__qualname__}: the fact {fact!r} belongs in its spec ({spec.__qualname__})")


def _spec_from_class(name: str, cls: type[Method]) -> type[MethodSpec]:
    """A spec for a class registered without a folder, from the attributes it declares."""
    reads = tuple(r for r, on in ((FROZEN_FEATURES, cls.reads_features), (OWN_TOWER, cls.needs_pixels)) if on)
    body: dict[str, Any] = {attr: getattr(cls, attr) for attr in method_specs.ATTRIBUTES if hasattr(cls, attr)}
    body.update({fact: cls.__dict__[fact] for fact in method_specs.FACTS if fact in cls.__dict__})
    body.update(name=name, impl=f"{cls.__module__}:{cls.__qualname__}", __module__=cls.__module__,
                capabilities=Capabilities(reads=reads, state=EPISODIC if cls.episodic else ONLINE,
                                          batches=bool(cls.adapts_on_batches), reads_ahead=cls.reads_ahead))
    if cls.needed_views.__func__ is not Method.needed_views.__func__:   # type: ignore[attr-defined]
        body["needed_views"] = classmethod(lambda spec, config: cls.needed_views(config))
    spec = type(f"{cls.__name__}Spec", (MethodSpec,), body)
    if spec.needs_views != cls.needs_views:
        spec.needs_views = cls.needs_views
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


def method_kind(cls: type[Method]) -> str:
    """"episodic" (reset before every sample) or "online" (adapts along the stream)."""
    return EPISODIC if cls.episodic else ONLINE


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
    if spec.name in _REGISTRY:
        return _REGISTRY.get(spec.name)
    module, _, qualname = spec.impl.partition(":")
    cls = getattr(importlib.import_module(module), qualname)
    if cls.__dict__.get("spec") is not spec:
        raise TypeError(f"{spec.impl} does not name {spec.__qualname__} as its spec")
    return _REGISTRY.register(spec.name, cls)


def describe(protocol: str, name: str) -> dict[str, Any]:
    """What method `name` runs with under a protocol, without a dataset: `views` (its recipe as a dict),
    `precision` and `config` (the other fields of its effective config)."""
    spec = method_specs.spec(name)
    fields = dataclasses.asdict(make_config(spec, **protocol_overrides(protocol, spec)))
    return {"views": fields.pop("views", {"n_views": 1}), "precision": fields.pop("precision"), "config": fields}


def create_method(name: str, model: ClipModel, classnames: Sequence[str], heads: ClassHeads | None = None,
                  run_precision: str = "auto", protocol: str = DEFAULT_PROTOCOL, dataset: str | None = None,
                  run_views: dict[str, Any] | None = None, allow_duplicate_names: bool = False,
                  **config: Any) -> Method:
    """Build a registered method as `protocol` runs it (shiftlab.methods.catalogue.protocols: "leaderboard", the
    defaults, or "paper", the authors' own recipe, with their per-dataset values for `dataset`),
    overridden by `config` (`effective_config`); `run_precision` is the run's precision setting,
    used where the method's own `precision` is "auto". `classnames`: a list of distinct names
    (`check_classnames`). Bad values are one-line ValueErrors, an unknown field a TypeError."""
    get_method_class(name)
    check_model(model)
    check_classnames(classnames, allow_duplicate_names)
    cfg = effective_config(name, protocol, dataset, run_precision, run_views, **config)
    return build_method(name, model, classnames, cfg, heads=heads, run_precision=run_precision,
                        allow_duplicate_names=allow_duplicate_names)


def build_method(name: str, model: ClipModel, classnames: Sequence[str], config: MethodConfig,
                 heads: ClassHeads | None = None, run_precision: str = "auto",
                 allow_duplicate_names: bool = False) -> Method:
    """Build a registered method with a config already resolved (`create_method`'s, or a run plan's:
    `engine.run_plan.RunPlan.method_configs`)."""
    cls = get_method_class(name)
    check_model(model)
    names = check_classnames(classnames, allow_duplicate_names)
    return cls(model, names, config, heads=heads, run_precision=run_precision,
               allow_duplicate_names=allow_duplicate_names)
