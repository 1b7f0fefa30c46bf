"""A method is a folder: every `methods/<name>/spec.py` imports no torch, is found by scanning, and declares
capabilities the registry can trust (invalid ones refused when declared)."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _registered import registered
from shiftlab.methods.base import Method, MethodOutput, get_method_class
from shiftlab.methods.catalogue import declarations as specs
from shiftlab.methods.catalogue.declarations import (
    EPISODIC,
    FROZEN_ENCODER,
    FROZEN_FEATURES,
    ONLINE,
    OWN_TOWER,
    Capabilities,
    MethodSpec,
    ViewMethodConfig,
)
from shiftlab.methods.kinds import EpisodicMethod, OnlineMethod

PACKAGE = Path(specs.__file__).parents[1]   # shiftlab/methods
HEAVY = ("torch", "numpy", "PIL", "open_clip", "torchvision")

# each spec module in turn; after each, the heavy modules it brought (none may)
IMPORT_EACH = f"""
import importlib, json, sys
found = {{}}
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
    found[name] = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps(found))
"""


def spec_modules() -> list[str]:
    return sorted(f"shiftlab.methods.{p.parent.name}.spec" for p in PACKAGE.glob("*/spec.py"))


def test_every_spec_imports_no_torch():
    modules = spec_modules() + ["shiftlab.methods.catalogue.declarations", "shiftlab.attacks.pgd.spec",
                                "shiftlab.attacks.specs"]
    proc = subprocess.run([sys.executable, "-c", IMPORT_EACH, json.dumps(modules)], capture_output=True, text=True,
                          check=True, timeout=120)
    assert json.loads(proc.stdout) == {m: [] for m in modules}


def test_every_folder_is_found_and_names_its_class():
    folders = {p.parent.name for p in PACKAGE.glob("*/spec.py")}
    assert folders == {s.__module__.split(".")[-2] for s in specs.specs().values()}
    assert "common" not in folders and len(specs.spec_names()) >= 20
    for name, spec in specs.specs().items():
        folder = PACKAGE / spec.__module__.split(".")[-2]
        if spec.refused:    # registered, not runnable: no impl, no method.py; refused by name in one line
            assert not spec.impl and name not in specs.spec_names() and "method.py" not in {p.name for p in
                                                                                              folder.iterdir()}
            with pytest.raises(ValueError, match=f"^{name} is registered but cannot run here: "):
                get_method_class(name)
            continue
        cls = get_method_class(name)
        assert cls.spec is spec and spec.name == name and f"{cls.__module__}:{cls.__qualname__}" == spec.impl
        # its declarations are read from the spec (`self.spec`), never copied onto the class
        assert not {"name", "episodic", "needs_views", "needs_pixels", "reads_features"} & set(vars(cls)), name
        assert {"spec.py", "method.py", "README.md"} <= {p.name for p in folder.iterdir()}, folder


def test_the_capabilities_say_what_the_booleans_said():
    # what the classes declared before the folders (ttl: its own tower only; rlcf: also a reward CLIP on pixels);
    # calip: the frozen tower's spatial tokens, read from view 0's pixels
    reads = {name: spec.capabilities.reads for name, spec in specs.specs().items()}
    assert reads["ttl"] == (OWN_TOWER,) and reads["rlcf"] == (FROZEN_FEATURES, OWN_TOWER)
    assert reads["calip"] == (OWN_TOWER,) and reads["tent"] == reads["eata"] == reads["sar"] == (OWN_TOWER,)
    assert reads["deyo"] == (OWN_TOWER,)
    assert reads["cliptta"] == reads["cliptta_ood"] == reads["clipartt"] == reads["watt"] == (OWN_TOWER,)
    # its DINOv2 of view 0: a frozen encoder of its own, whose output a feature store holds (no pixels needed)
    assert reads["cosmic"] == (FROZEN_FEATURES, FROZEN_ENCODER) and not specs.spec("cosmic").needs_pixels
    assert reads["tca"] == (OWN_TOWER,) and specs.spec("tca").towers == ("vit",)   # tokens inside a ViT
    assert reads["scap"] == (OWN_TOWER,) and specs.spec("scap").towers == ("vit",)  # prompts inside a ViT's attention
    # the methods that read only the frozen tower's view features (a method added later declares its own reads
    # in its spec and is checked by its own tests, not listed here)
    frozen_only = ("boostadapter", "ctpt", "dmn_zs", "dota", "dpe", "dynaprompt", "ecalp", "lame", "mta", "oga",
                   "oga_batch", "onzeta", "otpt", "prompt_ensemble", "rtpt", "stata", "tda", "tipple", "tps", "tpt",
                   "view_ensemble", "zero", "zeroshot")
    assert all(reads[n] == (FROZEN_FEATURES,) for n in frozen_only)
    assert {"boostadapter", "dmn_zs", "dota", "dpe", "dynaprompt", "ecalp", "oga", "onzeta", "tda"} <= set(
        specs.spec_names(ONLINE))
    assert not specs.spec("ttl").reads_features and specs.spec("ttl").needs_pixels
    assert not specs.spec("zeroshot").needs_views and specs.spec("mta").needs_views


@pytest.mark.parametrize("kwargs, says", [
    ({"reads": ()}, "reads nothing"),
    ({"reads": ("pixels",)}, "unknown reads ['pixels']"),
    ({"reads": (FROZEN_FEATURES, FROZEN_FEATURES)},
     "reads ['frozen_features', 'frozen_features'] names one input twice"),
    ({"state": "continual"}, "state must be one of episodic, online"),
])
def test_invalid_capabilities_are_refused(kwargs, says):
    with pytest.raises(ValueError, match=re.escape(f"capabilities: {says}")):
        Capabilities(**kwargs)


def test_the_old_name_of_the_per_dataset_values_is_refused():
    with pytest.raises(TypeError, match="`dataset_settings` is now `dataset_values`"):
        type("Old", (MethodSpec,), {"name": "old", "dataset_settings": {"dtd": {"lr": 1.0}}})


def test_a_spec_cannot_declare_the_derived_booleans():
    with pytest.raises(TypeError, match="episodic are derived from `capabilities`"):
        type("Bad", (MethodSpec,), {"name": "bad", "episodic": False})
    with pytest.raises(TypeError, match="capabilities must be a Capabilities"):
        type("Bad", (MethodSpec,), {"name": "bad", "capabilities": "online"})


def test_an_online_method_without_state_is_refused_when_defined():
    @dataclasses.dataclass
    class Config(ViewMethodConfig):
        pass

    spec = type("StatelessSpec", (MethodSpec,), {
        "name": "stateless", "impl": f"{__name__}:Stateless", "config_class": Config,
        "capabilities": Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE), "__module__": __name__})
    with pytest.raises(TypeError, match="an online method must define save_state and load_state"):
        type("Stateless", (OnlineMethod,), {"spec": spec, "__module__": __name__, "__qualname__": "Stateless",
                                      "predict_context": lambda self, ctx: MethodOutput(ctx.zeroshot_logits[0])})
    episodic = type("EpisodicSpec", (MethodSpec,), {
        "name": "episodic_ok", "impl": f"{__name__}:Episodic", "config_class": Config,
        "capabilities": Capabilities(state=EPISODIC), "__module__": __name__})
    cls = type("Episodic", (EpisodicMethod,), {"spec": episodic, "__module__": __name__, "__qualname__": "Episodic"})
    assert cls.spec is episodic and "episodic" not in vars(cls)   # read from the spec, never copied onto the class
    assert cls.spec.name == "episodic_ok" and cls.spec.episodic and cls.spec.needs_views


def test_a_class_must_be_where_its_spec_says():
    spec = type("ElsewhereSpec", (MethodSpec,), {"name": "elsewhere", "impl": "somewhere.else:Thing"})
    with pytest.raises(TypeError, match="whose impl is 'somewhere.else:Thing'"):
        type("Thing", (Method,), {"spec": spec, "__module__": __name__, "__qualname__": "Thing"})


def test_a_spec_is_built_from_the_class_its_impl_names_once_and_only_if_that_class_names_it():
    from shiftlab.methods.tent.method import Tent
    from shiftlab.registry import Registry

    class ClassRegistry(Registry):   # as the methods' registry: a registered class is not renamed (test_kinds)
        names_classes = False

    registry = ClassRegistry("method")
    stranger = type("StrangerSpec", (MethodSpec,), {"name": "stranger", "impl": "shiftlab.methods.tent.method:Tent"})
    with pytest.raises(TypeError, match="does not name StrangerSpec as its spec"):
        registry.implementation(stranger)
    assert "stranger" not in registry
    assert registry.implementation(Tent.spec) is Tent and list(registry) == ["tent"]
    assert registry.implementation(Tent.spec) is Tent   # found, not imported again


def test_a_folder_spec_derives_its_name_config_and_impl_unless_declared(monkeypatch):
    """In `methods/<folder>/spec.py` a `<Stem>Spec` is named after the folder, takes the module's `<Stem>Config` and
    lives at `shiftlab.methods.<folder>.method:<Stem>`; what it declares wins; elsewhere nothing is derived."""
    import types

    module = types.ModuleType("shiftlab.methods.scratch_folder.spec")   # no __file__: no card beside it

    @dataclasses.dataclass
    class ScratchConfig(ViewMethodConfig):
        weight: float = 1.0

    module.ScratchConfig = ScratchConfig
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def define(class_name: str, base: type = MethodSpec, **body: object) -> type:
        return type(class_name, (base,), {"__module__": module.__name__, **body})

    derived = define("ScratchSpec")
    assert (derived.name, derived.config_class, derived.impl) == (
        "scratch_folder", ScratchConfig, "shiftlab.methods.scratch_folder.method:Scratch")
    assert derived.needs_views   # derived from the derived config class
    variant = define("ScratchBatchSpec", derived, name="scratch_batch")   # a variant: no ScratchBatchConfig here
    assert (variant.name, variant.config_class, variant.impl) == (
        "scratch_batch", ScratchConfig, "shiftlab.methods.scratch_folder.method:ScratchBatch")
    declared = define("ScratchSpec", name="other", impl="elsewhere.module:Other", config_class=ViewMethodConfig)
    assert (declared.name, declared.config_class, declared.impl) == (
        "other", ViewMethodConfig, "elsewhere.module:Other")
    assert define("ScratchSpec", refused="needs source data").impl == ""   # a refused method has no impl
    outside = type("ScratchSpec", (MethodSpec,), {"__module__": __name__})   # a test's own spec: nothing derived
    assert (outside.name, outside.impl, outside.config_class) == ("", "", specs.MethodConfig)
    with pytest.raises(ValueError, match="impl must be 'package.module:Class'"), \
            registered("scratch_folder", spec=type("Named", (MethodSpec,), {"__module__": module.__name__})):
        pass


@pytest.mark.parametrize("name", sorted(specs.spec_names()))
def test_every_test_config_is_a_checked_config_of_the_method(name):
    spec = specs.spec(name)
    config = specs.make_config(spec, **{**spec.offline_config, **spec.test_config})
    assert all(getattr(config, k) == v for k, v in spec.test_config.items()), name
