"""What a method is without its torch code: its spec, found by scanning the method folders.

Every method lives in a folder `shiftlab/methods/<name>/` (CONTRIBUTING.md):

    spec.py      the config dataclass (cited defaults, declared ranges), a `MethodSpec` subclass: the
                 method's capabilities and a small `test_config`; its name (the folder's), `config_class`
                 (the module's `<Stem>Config`) and `impl`, where its class lives ("shiftlab.methods.mta.
                 method:MTA"), follow from the folder and the class name (`derive_declarations`) unless
                 declared; imports only the standard library and shiftlab's torch-free modules
                 (tests/methods/test_specs.py imports each in a fresh interpreter and checks)
    method.py    the torch code: a `Method` subclass naming its spec (`spec = MTASpec`)
    card.toml    its facts as data (summary, paper, protocols, published numbers, fidelity, per-dataset
                 values, label, aliases, cost rows; `cards`), set on its spec class when the class is defined
    README.md    what it is, its paper and code, every choice that differs, its published numbers

A folder may hold a family (one spec class per registered name, e.g. tpt/: tpt, ctpt, rtpt). The
registry reads the specs (`spec`, `spec_names`): listing the methods, checking `--methods` and
`--set`, the protocols and the methods table need no torch; a method's class is imported the first
time it is built (`shiftlab.methods.base.get_method_class` imports `impl`).

Capabilities (`Capabilities`) say once what a method reads and whether it carries state along the
stream; the engine derives from them what to encode, whether a feature store can serve the method and
how a resumed stream restarts.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ...models.precision import PRECISIONS, PURE_FP16
from ...options import say, say_set
from ...params import check_config, param
from ...registry import Registry, scan_folders
from ...views.recipe import ViewRecipe
from ..adaptive_modes import Adaptive
from .cards import FAMILIES, card_facts

__all__ = ["BATCH", "EPISODIC", "FROZEN_ENCODER", "FROZEN_FEATURES",
           "ONLINE", "OWN_TOWER", "READS", "READS_AHEAD", "STATES", "TEST_SET",
           "Capabilities", "MethodConfig",
           "MethodSpec", "ViewMethodConfig", "check_method_config", "make_config", "register_spec", "spec",
           "spec_names", "specs"]


@dataclass
class MethodConfig:
    """Base of every method's config dataclass (the papers' defaults live in subclasses).

    `precision`: "auto" follows the run's setting (shiftlab.models.precision); "fp32", "fp16" or
    "bf16" fix this method's own; "fp16-pure" (the model itself in float16, on CUDA) only where the
    method supports it (`MethodSpec.supports_pure_fp16`)."""
    precision: str = param("auto", choices=PRECISIONS)


@dataclass
class ViewMethodConfig(MethodConfig):
    """Config of a method that reads augmented views: `views` is its recipe (shiftlab.views.recipe.ViewRecipe:
    count incl. the original, crop scale and ratio, flip, AugMix). Only these views are generated and
    encoded for it; methods with equal recipes share them."""
    views: ViewRecipe = ViewRecipe()


# -- capabilities ----------------------------------------------------------------------------------------

# what a method reads of a sample
FROZEN_FEATURES = "frozen_features"   # the frozen image tower's features of its views (a feature store serves them)
OWN_TOWER = "own_tower"   # its views' pixels, through a tower of its own (TTL's LoRA tower, RLCF's reward CLIP)
# beside the frozen CLIP features, view 0 through a second frozen encoder of its own (COSMIC's DINOv2): a frozen
# encoding like the CLIP features, which the engine computes once per sample and a feature store holds
# (`Method.frozen_encoder`, methods/frozen_encoder.py)
FROZEN_ENCODER = "frozen_encoder"
READS = (FROZEN_FEATURES, OWN_TOWER, FROZEN_ENCODER)
# whether it carries state along the stream
EPISODIC = "episodic"                 # reset to its initial state before every sample
ONLINE = "online"                     # adapts along the stream: checkpointed with the records, replayed on resume
STATES = (EPISODIC, ONLINE)
# what it reads beyond the current sample and the samples before it (the transductive track, docs/PROTOCOLS.md)
BATCH = "batch"                       # the other images of its batch of --batch-size stream positions
TEST_SET = "test_set"                 # the whole test set, in a pass before the stream (`Method.observe_test_set`)
READS_AHEAD = (BATCH, TEST_SET)


@dataclass(frozen=True)
class Capabilities:
    """What a method reads (`reads`: some of READS), whether it carries state (`state`: one of STATES) and
    whether it adapts on a batch of test images together (`batches`: the episodic-batch protocol,
    docs/PROTOCOLS.md: the engine hands `Method.adapt_batch` each batch of `--batch-size` stream positions)
    and what it reads beyond the current sample and its past (`reads_ahead`: None, BATCH or TEST_SET, the
    transductive track). A batch method reads its batch: `batches=True` alone is `reads_ahead="batch"`, and
    `reads_ahead="batch"` without `batches=True` is refused; a TEST_SET method is shown the whole test set
    before the stream (`Method.observe_test_set`, `Method.end_test_set`), with or without batches.

    The engine derives from them: a feature store can serve a method only when it reads no pixels
    (`needs_pixels`); a precision group of methods none of which reads the frozen features is not
    encoded (`reads_features`); a method reading a frozen encoder of its own (`reads_frozen_encoder`) has
    that encoding computed once per sample by the engine and held by a feature store beside the CLIP
    features; online methods are checkpointed and replayed on resume (`episodic`);
    batch methods make the batch the unit of results and resume (`adapts_on_batches`).
    Invalid declarations are refused when the spec class is defined."""
    reads: tuple[str, ...] = (FROZEN_FEATURES,)
    state: str = EPISODIC
    batches: bool = False
    reads_ahead: str | None = None

    def __post_init__(self) -> None:
        reads = (self.reads,) if isinstance(self.reads, str) else tuple(self.reads)
        if not reads:
            raise ValueError(f"capabilities: reads nothing; a method reads some of {', '.join(READS)}")
        unknown = [r for r in reads if r not in READS]
        if unknown:
            raise ValueError(f"capabilities: unknown reads {unknown}; known: {', '.join(READS)}")
        if len(set(reads)) != len(reads):
            raise ValueError(f"capabilities: reads {list(reads)} names one input twice")
        if FROZEN_ENCODER in reads and (OWN_TOWER in reads or FROZEN_FEATURES not in reads):
            raise ValueError(f"capabilities: {FROZEN_ENCODER!r} is read beside {FROZEN_FEATURES!r} and never with "
                             f"{OWN_TOWER!r} (a method that reads pixels is never served by a feature store, which "
                             f"is what a frozen encoder's output is for), got reads {list(reads)}")
        if self.state not in STATES:
            raise ValueError(f"capabilities: state must be one of {', '.join(STATES)}, got {self.state!r}")
        if not isinstance(self.batches, bool):
            raise ValueError(f"capabilities: batches must be True or False, got {self.batches!r}")
        if self.reads_ahead is not None and self.reads_ahead not in READS_AHEAD:
            raise ValueError(f"capabilities: reads_ahead must be None or one of {', '.join(READS_AHEAD)}, "
                             f"got {self.reads_ahead!r}")
        if self.reads_ahead == BATCH and not self.batches:
            raise ValueError("capabilities: reads_ahead 'batch' without batches=True: only a batch method is "
                             "handed the other images of its batch")
        if self.batches and self.reads_ahead is None:
            object.__setattr__(self, "reads_ahead", BATCH)   # a batch method reads its batch: one declaration
        object.__setattr__(self, "reads", tuple(r for r in READS if r in reads))

    @property
    def episodic(self) -> bool:
        return self.state == EPISODIC

    @property
    def needs_pixels(self) -> bool:
        """Reads pixels, not only view features: never served by a feature store."""
        return OWN_TOWER in self.reads

    @property
    def reads_features(self) -> bool:
        return FROZEN_FEATURES in self.reads

    @property
    def reads_frozen_encoder(self) -> bool:
        """Reads view 0 through a frozen encoder of its own besides the CLIP features (`Method.frozen_encoder`)."""
        return FROZEN_ENCODER in self.reads

    @property
    def adapts_on_batches(self) -> bool:
        return self.batches

    @property
    def reads_test_set(self) -> bool:
        """Shown the whole test set before the stream (the engine's test-set pass)."""
        return self.reads_ahead == TEST_SET

    @property
    def transductive(self) -> bool:
        """Reads more than the current sample and its past (its batch, or the whole test set)."""
        return self.reads_ahead is not None


# -- the spec ----------------------------------------------------------------------------------------------

# facts read from a spec's own body, never inherited (shiftlab.methods.catalogue.cards), and their defaults
FACTS: dict[str, Any] = {"protocols": {}, "published": (), "fidelity": "", "dataset_values": {}, "label": "",
                         "aliases": (), "cupl_files": {}, "family": ""}
# what a spec declares (inherited defaults) and the method class carries over
ATTRIBUTES = ("name", "config_class", "summary", "capabilities", "towers", "towers_why", "text_head", "min_views",
              "min_views_why", "supports_pure_fp16", "offline_config", "random_weights_config", "cupl_templates",
              "own_ood_score", "adaptive")
# what the capabilities and the config class decide, never declared
DERIVED = ("episodic", "needs_views", "needs_pixels", "reads_features", "adapts_on_batches", "reads_ahead")


TOWERS = ("vit", "resnet")   # the two CLIP image towers (shiftlab.models.tower_tokens.tower_kind)


def tower_of_name(model: str) -> str | None:
    """The image tower an open_clip / shiftlab model name tells ("ViT-B-16" -> "vit", "RN50-quickgelu" ->
    "resnet", "shiftlab-tiny" -> "resnet"), or None where the name does not tell (checked at model load)."""
    # shiftlab.models.architectures' TINY_VIT_NAME / TINY_CLIP_NAME (spelled out: that module imports torch)
    if model == "shiftlab-tiny-vit" or model.lower().startswith("vit-"):
        return "vit"
    if model == "shiftlab-tiny" or model.upper().startswith("RN"):
        return "resnet"
    return None


def tower_problem(cls: Any, tower: str | None, model: str) -> str | None:
    """One line saying why the method (a spec or method class) cannot run on `model`'s `tower`, or None."""
    if tower is None or tower in cls.towers:
        return None
    return (f"{cls.name}: runs on a {' or '.join(t if t == 'resnet' else 'ViT' for t in cls.towers)} image tower "
            f"only, and {model} is a {'ViT' if tower == 'vit' else 'ResNet'}"
            + (f": {cls.towers_why}" if cls.towers_why else ""))


def method_folder(module: str) -> str | None:
    """The method folder whose spec module `module` is ("shiftlab.methods.rmt.spec" -> "rmt"), or None (a spec
    defined anywhere else: a script's, a test's, a shared base in methods/common/)."""
    package, _, leaf = module.rpartition(".")
    parent, _, folder = package.rpartition(".")
    return folder if leaf == "spec" and parent == _PACKAGE and folder not in SHARED_FOLDERS else None


def derive_declarations(cls: type[MethodSpec]) -> None:
    """Set what a spec class in a method folder (`methods/<folder>/spec.py`) leaves undeclared and its folder and
    class name tell: `name` is the folder's ("rmt"); `config_class` is the `<Stem>Config` its module holds
    (RMTSpec: RMTConfig), where it holds one (else inherited); `impl` is "shiftlab.methods.<folder>.method:<Stem>"
    (RMTSpec: ...rmt.method:RMT), a refused spec having none. A declared value always wins: a family folder's
    variants declare their names (tpt/: ctpt, rtpt), a config named otherwise is declared (dmn_zs: DMNConfig)."""
    folder = method_folder(cls.__module__)
    stem = cls.__name__.removesuffix("Spec")
    if folder is None or stem == cls.__name__:
        return
    if "name" not in cls.__dict__:
        cls.name = folder
    config = getattr(sys.modules.get(cls.__module__), f"{stem}Config", None)
    if "config_class" not in cls.__dict__ and isinstance(config, type) and issubclass(config, MethodConfig):
        cls.config_class = config
    if "impl" not in cls.__dict__ and not cls.__dict__.get("refused"):
        cls.impl = f"{_PACKAGE}.{folder}.method:{stem}"


class MethodSpec:
    """A method's declaration: subclass it in `methods/<folder>/spec.py` (one class per registered name).

    Besides the attributes below, a spec's own body may declare the facts (`FACTS`: protocols,
    published, fidelity, dataset_values, label, aliases, cupl_files, family; shiftlab.methods.catalogue.cards says what
    each holds). `episodic`, `needs_views`, `needs_pixels`, `reads_features`, `adapts_on_batches` and `reads_ahead` are
    derived (from the capabilities and the config class), never declared."""
    name: ClassVar[str] = ""
    impl: ClassVar[str] = ""                 # "package.module:Class", imported when the method is built
    config_class: ClassVar[type] = MethodConfig
    summary: ClassVar[str] = ""              # one line for `shiftlab methods`
    capabilities: ClassVar[Capabilities] = Capabilities()
    # the image towers (TOWERS) its computation is defined on; a method that works inside a ViT's token sequence
    # (TCA) declares ("vit",): refused in one line on another tower (`tower_problem`, then at model load)
    towers: ClassVar[tuple[str, ...]] = TOWERS
    towers_why: ClassVar[str] = ""           # why only those (the refusal's reason)
    # the class head it reads (a kind of shiftlab.methods.head_kinds) where its config has no `text_head` field
    text_head: ClassVar[str] = "zeroshot"
    # the fewest views (incl. the original) its computation is defined for; a minimum that depends on the
    # config overrides `needed_views` and says why in `min_views_why`
    min_views: ClassVar[int] = 1
    min_views_why: ClassVar[str] = ""
    supports_pure_fp16: ClassVar[bool] = False   # accepts precision "fp16-pure" (its image features and text head)
    # config overrides that run it with nothing downloaded (`shiftlab demo`, the registry tests: the tiny CLIP)
    offline_config: ClassVar[dict[str, Any]] = {}
    # config overrides giving every model it loads itself random weights (what `shiftlab bench` measures)
    random_weights_config: ClassVar[dict[str, Any]] = {}
    # the templates a `tip_cupl` head pools where its config sets none (shiftlab.methods.head_kinds.CUPL_TEMPLATES)
    cupl_templates: ClassVar[str] = "tip"
    # a small config (with `offline_config`) that the registry-wide tests run it with on the tiny CLIP
    test_config: ClassVar[dict[str, Any]] = {}
    # its own OOD score where its paper (its authors' code) defines one: the score's name and source, e.g.
    # "OCE (CLIPTTA, ttavlm/methods/...)"; the method then returns it per sample as `MethodOutput.ood_score`
    # (higher: more in-distribution, as MCM), recorded on open-set runs beside MCM as `own_ood_score` and scored
    # in a column of its own (docs/PROTOCOLS.md). "": MCM only
    own_ood_score: ClassVar[str] = ""
    # why it cannot run on CLIP here, in one line (GTTA: it trains on labelled source data): a refused method is
    # registered and listed (`refused_methods`, `shiftlab methods`) with no `impl`, left out of `spec_names()` (so
    # `--methods all` and the registry-wide tests pass it by) and refused in one line when named (`refusal`)
    refused: ClassVar[str] = ""
    # how `--attack-target adaptive` attacks it through its adaptation (methods/adaptive_modes.py); None: it cannot
    # be, and an adaptive run refuses it in one line
    adaptive: ClassVar[Adaptive | None] = None

    # derived, set on every subclass
    episodic: ClassVar[bool] = True
    needs_views: ClassVar[bool] = False
    needs_pixels: ClassVar[bool] = False
    reads_features: ClassVar[bool] = True
    adapts_on_batches: ClassVar[bool] = False
    reads_ahead: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        derive_declarations(cls)
        if cls.__dict__.get("name"):   # its facts: the card beside its spec module (methods/<folder>/card.toml)
            for fact, value in card_facts(cls.__module__, cls.__dict__["name"]).items():
                if fact in cls.__dict__:
                    raise TypeError(f"{cls.__qualname__}: {fact} is declared in its spec and in its card.toml; "
                                    "keep the card's")
                setattr(cls, fact, value)
        if "transductive" in cls.__dict__:   # one declaration: what it reads ahead is a capability
            raise TypeError(f"{cls.__qualname__}: declare `capabilities = Capabilities(..., reads_ahead=...)` "
                            f"({' or '.join(map(repr, READS_AHEAD))}) instead of `transductive`")
        if "dataset_settings" in cls.__dict__:   # the fact's old name: refused, never silently ignored
            raise TypeError(f"{cls.__qualname__}: `dataset_settings` is now `dataset_values` (a run's 'setting' is "
                            "clean or attacked; a method's per-dataset values are its dataset_values)")
        family = cls.__dict__.get("family", "")
        if family and family not in FAMILIES:
            raise TypeError(f"{cls.__qualname__}: family {family!r} is none of {', '.join(FAMILIES)} "
                            "(shiftlab.methods.catalogue.cards.FAMILIES)")
        derived = [k for k in DERIVED if k in cls.__dict__]
        if derived:
            raise TypeError(f"{cls.__qualname__}: {', '.join(derived)} are derived from `capabilities` and the "
                            "config class; declare `capabilities = Capabilities(reads=..., state=...)`")
        if cls.adaptive is not None and not isinstance(cls.adaptive, Adaptive):
            raise TypeError(f"{cls.__qualname__}.adaptive must be an Adaptive (methods/adaptive_modes.py), got "
                            f"{type(cls.adaptive).__name__}")
        if not isinstance(cls.capabilities, Capabilities):
            raise TypeError(f"{cls.__qualname__}.capabilities must be a Capabilities, got "
                            f"{type(cls.capabilities).__name__}")
        declared = any("frozen_encoder_identity" in k.__dict__ for k in cls.__mro__ if k is not MethodSpec)
        if cls.capabilities.reads_frozen_encoder and not declared:
            raise TypeError(f"{cls.__qualname__}: reads {FROZEN_ENCODER!r} and must define frozen_encoder_identity "
                            "(its encoder's identity under a config, or None where the config uses none)")
        if not (isinstance(cls.config_class, type) and issubclass(cls.config_class, MethodConfig)):
            raise TypeError(f"{cls.__qualname__}.config_class must subclass MethodConfig")
        if not (isinstance(cls.towers, tuple) and cls.towers and set(cls.towers) <= set(TOWERS)):
            raise TypeError(f"{cls.__qualname__}.towers must be a non-empty tuple of {TOWERS}, got {cls.towers!r}")
        cls.episodic = cls.capabilities.episodic
        cls.needs_pixels = cls.capabilities.needs_pixels
        cls.reads_features = cls.capabilities.reads_features
        cls.adapts_on_batches = cls.capabilities.adapts_on_batches
        cls.reads_ahead = cls.capabilities.reads_ahead
        cls.needs_views = any(f.name == "views" for f in dataclasses.fields(cls.config_class))

    @classmethod
    def needed_views(cls, config: Any) -> int:
        """The fewest views (incl. the original) this method can use under `config`."""
        return cls.min_views

    @classmethod
    def config_problem(cls, config: Any, attacked: bool = False) -> str | None:
        """Why a run (or `create_method`) cannot use `config` although each field is in its range (DiffTPT: the
        folder of generated views it reads is unset or missing; `attacked`: in a run with an attacked setting, the
        generated views of an attacked image), as one line, or None. Torch-free: a run plan
        (`engine.run_plan.resolve_plan`) asks it before torch is imported. By default: a `tip_cupl` text head
        without its CuPL file (DMN-ZS, DPE and COSMIC under `--protocol paper`)."""
        from ..head_kinds import cupl_problem
        return cupl_problem(cls.name, config)

    @classmethod
    def frozen_encoder_identity(cls, config: Any) -> dict[str, Any] | None:
        """The identity of the frozen encoder of its own that reads view 0 under `config` (a method whose
        capabilities read `FROZEN_ENCODER`: COSMIC's DINOv2, DiffTPT's generated views), or None where this config
        uses none: every input that decides the encoder's output, JSON data, the `encoder` of its feature-store
        entry. Its one owner: the method builds its `FrozenEncoder` with it (`Method.frozen_encoder`) and a run plan
        keys the entry with it before torch is imported. A file it names that cannot be read is a one-line
        ValueError."""
        return None

    @classmethod
    def kind(cls) -> str:
        """"episodic" or "online" (its capabilities' state)."""
        return cls.capabilities.state


# -- the one check of a config ------------------------------------------------------------------------------

def check_method_config(cls: Any, config: Any) -> Any:
    """`config` with every field in its declared range (an int in a float field made a float), and
    views enough for the method (`needed_views`), "fp16-pure" only where supported; else a
    one-line ValueError such as "tpt.lr: inf is not finite; must be a finite float >= 0".
    `cls` is a spec or a method class (both carry the attributes read here)."""
    config = check_config(cls.name, config)
    if getattr(config, "precision", None) == PURE_FP16 and not cls.supports_pure_fp16:
        supported = ", ".join(n for n in spec_names() if spec(n).supports_pure_fp16)
        raise ValueError(f"{cls.name}.precision: {PURE_FP16!r} (the authors' half-precision model) is implemented "
                         f"for {supported} only; use fp16 (autocast) or fp32")
    recipe = getattr(config, "views", None)
    if cls.needs_views and isinstance(recipe, ViewRecipe):
        needed = cls.needed_views(config)
        if recipe.n_views < needed:
            raise ValueError(f"{cls.name}: needs at least {needed} views (incl. the original), got {recipe.n_views}"
                             + (f": {cls.min_views_why}" if cls.min_views_why else "")
                             + f"; raise {say('views')} or {say_set(cls.name, 'views', needed)}")
    return config


def make_config(cls: Any, **overrides: Any) -> Any:
    """The method's config: its defaults, overridden field by field, checked (`check_method_config`).
    `views` may be a ViewRecipe, a view count, or a dict of recipe fields merged onto the method's
    default recipe. An unknown field is a TypeError, a bad value a one-line ValueError."""
    fields = {f.name: f for f in dataclasses.fields(cls.config_class)}
    unknown = set(overrides) - set(fields)
    if unknown:
        raise TypeError(f"{cls.name}: unknown config field(s) {sorted(unknown)}; known: {sorted(fields)}")
    if "views" in overrides and isinstance(fields["views"].default, ViewRecipe):
        try:
            overrides["views"] = ViewRecipe.coerce(overrides["views"], base=fields["views"].default)
        except ValueError as exc:
            raise ValueError(f"{cls.name}: {exc}") from None
    return check_method_config(cls, cls.config_class(**overrides))


# -- discovery -------------------------------------------------------------------------------------------

SPECS: Registry[type[MethodSpec]] = Registry("method")
_PACKAGE = __name__.rsplit(".", 2)[0]     # shiftlab.methods
SHARED_FOLDERS = ("common", "catalogue")   # folders of shared machinery, not methods


def specs_of(module: Any) -> list[type[MethodSpec]]:
    """The spec classes a spec module defines (its own, with a name), in definition order."""
    return [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, MethodSpec)
            and v.__module__ == module.__name__ and v.name]


@functools.cache
def _scanned() -> bool:
    """Import every folder's spec.py once and register its specs (name and aliases)."""
    for module in scan_folders(_PACKAGE, "spec", skip=SHARED_FOLDERS):
        found = specs_of(module)
        if not found:
            raise ValueError(f"{module.__name__} defines no MethodSpec subclass with a name")
        for cls in found:
            register_spec(cls)
    return True


def register_spec(cls: type[MethodSpec], replace: bool = False) -> type[MethodSpec]:
    """Register a spec under its name and aliases (discovery does this for every folder; a script or test
    registers a method of its own with `shiftlab.methods.base.register_method`)."""
    if getattr(cls, "refused", "") and cls.impl:
        raise ValueError(f"{cls.__qualname__}: a refused method has no impl, got {cls.impl!r}")
    if not getattr(cls, "refused", "") and (not cls.impl or ":" not in cls.impl):
        raise ValueError(f"{cls.__qualname__}.impl must be 'package.module:Class' (in a method folder, a class "
                         f"named '<Method>Spec' derives it), got {cls.impl!r}")
    # a spec's `aliases` are the spellings of published tables (shiftlab.results.published), not run names
    return SPECS.register(cls.name, cls, replace=replace)


def spec_names(kind: str | None = None) -> list[str]:
    """The registered method names that run, sorted (a refused one is not among them: `refused_methods`); `kind`
    ("episodic" or "online") keeps only those."""
    _scanned()
    if kind is not None and kind not in STATES:
        raise ValueError(f"unknown method kind {kind!r}; known: {', '.join(STATES)}")
    return SPECS.names(where=lambda cls: not getattr(cls, "refused", "") and kind in (None, cls.capabilities.state))


def refused_methods() -> dict[str, str]:
    """{name: why it cannot run on CLIP here} of the registered methods that are refused, sorted."""
    _scanned()
    return {name: SPECS.get(name).refused for name in SPECS.names(where=lambda cls: bool(getattr(cls, "refused", "")))}


def refusal(name: str) -> str | None:
    """The one line a run or `create_method` naming a refused method gets, or None where `name` is no refused
    method."""
    reason = refused_methods().get(name)
    return f"{name} is registered but cannot run here: {reason}" if reason else None


def spec(name: str) -> type[MethodSpec]:
    """The spec registered as `name`; an unknown name is a one-line UnknownNameError (a KeyError and a ValueError)."""
    _scanned()
    return SPECS.get(name)


def specs() -> Mapping[str, type[MethodSpec]]:
    """Every registered spec by name, sorted."""
    _scanned()
    return dict(SPECS.items())
