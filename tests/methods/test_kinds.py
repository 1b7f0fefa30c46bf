"""One method contract (issue #39): a base per kind of method (shiftlab.methods.kinds), every method deriving
exactly the one its spec's capabilities declare, its declarations read from `self.spec` (never copied onto the
class), and a common `Method` base at most half the size of the one it replaced."""
from __future__ import annotations

import pytest

import shiftlab
from shiftlab.methods.base import Method, MethodOutput, get_method_class
from shiftlab.methods.catalogue.declarations import ATTRIBUTES, DERIVED, Capabilities, MethodSpec, spec, spec_names
from shiftlab.methods.kinds import KIND_BASES, BatchMethod, EpisodicMethod, OnlineMethod, TestSetMethod, kind_of

CLASSNAMES = ["cat", "dog", "car"]
# The public surface of `Method` on main before the kind bases (commit 3ce779a): 39 public names of the class
# (`[n for n in dir(Method) if not n.startswith("_")]`: 20 attributes such as episodic, summary, adaptive, and
# methods from predict to observe_test_set, in_groups, finish_test_set) + 6 attributes its __init__ sets
# (model, classnames, config, heads, run_precision, precision).
SURFACE_BEFORE = 39 + 6


def _surface(instance: Method) -> set[str]:
    on_class = {n for n in dir(Method) if not n.startswith("_")}
    return on_class | {n for n in vars(instance) if not n.startswith("_")}


def test_the_common_base_is_at_most_half_the_old_one(tiny_model):
    surface = _surface(shiftlab.create_method("zeroshot", tiny_model, CLASSNAMES))
    assert len(surface) <= SURFACE_BEFORE // 2, sorted(surface)
    # what a spec declares is read there, not carried by the class
    assert not (surface & {*ATTRIBUTES, *DERIVED} - {"name"}), sorted(surface & {*ATTRIBUTES, *DERIVED})


@pytest.mark.parametrize("name", spec_names())
def test_every_method_derives_exactly_the_base_of_its_kind(name):
    cls = get_method_class(name)
    bases = [b for b in cls.__mro__ if b in KIND_BASES.values()]
    assert bases == [KIND_BASES[kind_of(spec(name))]], (name, bases)
    assert not {*ATTRIBUTES, *DERIVED} & set(vars(cls)), name   # nothing copied from the spec


def _spec(name: str, capabilities: Capabilities) -> type[MethodSpec]:
    return type(f"{name}Spec", (MethodSpec,), {"name": name, "impl": f"{__name__}:{name}",
                                               "capabilities": capabilities, "__module__": __name__})


def _class(name: str, bases: tuple, spec_: type[MethodSpec], **body) -> type:
    return type(name, bases, {"spec": spec_, "__module__": __name__, "__qualname__": name, **body})


def test_a_class_whose_base_is_not_its_spec_kind_is_refused():
    online = _spec("Drifting", Capabilities(state="online"))
    with pytest.raises(TypeError, match="declares a online method .*so it derives OnlineMethod, not EpisodicMethod"):
        _class("Drifting", (EpisodicMethod,), online)
    with pytest.warns(DeprecationWarning, match="a method derives the base of its kind"):   # today's shape
        _class("Drifting", (Method,), online)
    batch = _spec("Batchy", Capabilities(batches=True))
    with pytest.raises(TypeError, match="a batch method must define adapt_batch"):
        _class("Batchy", (BatchMethod,), batch)
    assert _class("Batchy", (BatchMethod,), batch, adapt_batch=lambda self, ctxs: []).spec is batch
    whole = _spec("Whole", Capabilities(reads_ahead="test_set"))
    assert issubclass(_class("Whole", (TestSetMethod,), whole, observe_test_set=lambda self, c: None), TestSetMethod)


def test_the_old_class_attributes_are_read_from_the_spec_with_a_warning(tiny_model):
    tda = get_method_class("tda")
    with pytest.warns(DeprecationWarning, match=r"Method.episodic is deprecated: read the method's spec"):
        assert tda.episodic is False
    method = shiftlab.create_method("zeroshot", tiny_model, CLASSNAMES)
    with pytest.warns(DeprecationWarning, match=r"`.spec.summary`"):
        assert method.summary == spec("zeroshot").summary
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        _ = method.no_such_thing


class _Counter(OnlineMethod):
    """Folderless (a script's): zero-shot logits; its state, the count of samples seen, saved by the base."""

    def reset(self) -> None:
        self.seen = 0

    def predict_context(self, ctx):
        self.seen += 1
        return MethodOutput(ctx.zeroshot_logits, extras={"seen": self.seen})

    def save_state(self):
        return {"seen": self.seen}

    def load_state(self, state):
        self.seen = int(state["seen"])


def test_the_online_base_saves_and_restores_the_state_of_a_folderless_method(tiny_model):
    from _registered import registered
    with registered("test_counter", _Counter) as name:
        assert kind_of(spec(name)) == "online" and not spec(name).episodic
        method = shiftlab.create_method(name, tiny_model, CLASSNAMES)
        method.reset()
        method.seen = 7
        state = method.state_dict()
        assert state == {"version": 1, "num_classes": 3, "seen": 7}
        other = shiftlab.create_method(name, tiny_model, CLASSNAMES)
        other.load_state_dict(state)
        assert other.seen == 7
        with pytest.raises(ValueError, match="test_counter: state was saved for 3 classes, this run has 2"):
            shiftlab.create_method(name, tiny_model, CLASSNAMES[:2]).load_state_dict(state)
