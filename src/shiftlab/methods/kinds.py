"""The four kinds of method, one base each; a method class derives exactly one (CONTRIBUTING.md, "Add a method").

    EpisodicMethod   one sample's views in, logits out: `predict_context(ctx)`; nothing outlives the sample
    OnlineMethod     state in, state out along the stream, one sample at a time in stream order: `predict_context`
                     updates the state; `save_state()` / `load_state(state)` say what it is, and the base saves and
                     restores it (checkpointed with the records, `rundir.online_state`; the version and class
                     count checked on restore)
    BatchMethod      adapts on a batch of test images together: `adapt_batch(ctxs)`, one output per context (the
                     episodic-batch protocol, docs/PROTOCOLS.md); a continual one (capabilities state "online") keeps
                     its state from batch to batch, saved and restored as an online method's
    TestSetMethod    a pass over the whole test set first (`observe_test_set`, `end_test_set`), then each sample as
                     an episodic method

Which kind a method is its spec's capabilities say (`kind_of`); a class whose base disagrees with its spec is
refused when it is defined, and the engine drives a method by its kind (shiftlab.engine.step.Evaluator.predict,
the test-set pass in shiftlab.engine.loop). A family's shared machinery (prompt tuning, the TDA cache, the
norm-layer adaptation) is a plain class in methods/common/ that a method mixes in before its kind base.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from ..views.recipe import ViewRecipe
from .base import Method, MethodOutput
from .catalogue.declarations import BATCH, EPISODIC, ONLINE, TEST_SET, MethodSpec
from .context import SampleContext

__all__ = ["KINDS", "STATE_VERSION", "BatchMethod", "EpisodicMethod", "OnlineMethod", "TestSetMethod",
           "check_state", "kind_of"]

KINDS = (EPISODIC, ONLINE, BATCH, TEST_SET)
STATE_VERSION = 1   # of an online method's saved state (`OnlineMethod.state_dict`)


def kind_of(spec: type[MethodSpec]) -> str:
    """The kind (one of KINDS) a spec's capabilities declare: a test-set pass, else batches, else its state."""
    caps = spec.capabilities
    if caps.reads_test_set:
        return TEST_SET
    return BATCH if caps.batches else caps.state


def check_state(name: str, state: dict, num_classes: int) -> None:
    """Refuse an online state saved by another version or for another class count."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"{name}: unsupported state version {state.get('version')!r}")
    if state.get("num_classes") != num_classes:
        raise ValueError(f"{name}: state was saved for {state.get('num_classes')} classes, this run has {num_classes}")


class _KindBase(Method):
    """A kind base: checks, when a method class naming a spec is defined, that the spec declares this kind."""
    _kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None and kind_of(spec) != cls._kind:
            base = KIND_BASES[kind_of(spec)].__name__
            raise TypeError(f"{cls.__qualname__}: its spec {spec.__qualname__} declares a {kind_of(spec)} method "
                            f"(capabilities), so it derives {base}, not {KIND_BASES[cls._kind].__name__}")


class _SavedState:
    """The state an online (or continual batch) method carries along the stream, saved and restored by the base:
    `state_dict()` is {"version", "num_classes", **save_state()}; `load_state_dict(state)` checks both, then
    `load_state(state)`. The values are tensors, numbers, strings, lists, dicts or None (a checkpoint is
    read with `torch.load(weights_only=True)`)."""

    def save_state(self) -> dict[str, Any]:
        """The method's own state: what `load_state` restores exactly (an exact resume mid-stream)."""
        raise NotImplementedError(f"{self.name}: an online method defines save_state")   # type: ignore[attr-defined]

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what `save_state` returned."""
        raise NotImplementedError(f"{self.name}: an online method defines load_state")   # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        """The state checkpointed with the records (shiftlab.rundir.online_state)."""
        return {"version": STATE_VERSION, "num_classes": len(self.classnames),   # type: ignore[attr-defined]
                **self.save_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state `state_dict` returned (refusing another version's, or another class count's)."""
        check_state(self.name, state, len(self.classnames))   # type: ignore[attr-defined]
        self.load_state(state)


def _defines(cls: type, name: str, base: type) -> bool:
    return getattr(cls, name) is not getattr(base, name)


class EpisodicMethod(_KindBase):
    """One sample's views in, logits out (`predict_context`); the engine hands it several samples at once
    (`predict_batch`, which a method overrides to batch work across them)."""
    _kind = EPISODIC


class OnlineMethod(_SavedState, _KindBase):
    """Adapts along the stream, one sample at a time in stream order: `predict_context` reads and updates its
    state, which `reset()` makes anew and `save_state` / `load_state` save and restore."""
    _kind = ONLINE

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("spec") is not None and not (_defines(cls, "save_state", _SavedState)
                                                         and _defines(cls, "load_state", _SavedState)):
            raise TypeError(f"{cls.spec.name}: an online method must define save_state and load_state: its state "
                            "is checkpointed with the records and restored on resume")


class BatchMethod(_SavedState, _KindBase):
    """Adapts on a batch of test images together: `adapt_batch(ctxs)` adapts on the batch, then predicts each
    (one output per context, in order); the batch is the unit of its results and of a resume. Episodic (its
    capabilities' state): `reset()` before every batch; continual ("online"): its state kept from batch to batch,
    saved and restored (`save_state` / `load_state`)."""
    _kind = BATCH

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None and not spec.episodic and not (_defines(cls, "save_state", _SavedState)
                                                           and _defines(cls, "load_state", _SavedState)):
            raise TypeError(f"{spec.name}: a continual batch method (capabilities state {ONLINE!r}) must define "
                            "save_state and load_state: its state is checkpointed with the records")
        if spec is not None and not _defines(cls, "adapt_batch", BatchMethod):
            raise TypeError(f"{spec.name}: a batch method must define adapt_batch")

    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        """Adapt on the batch's samples together, then predict each; one output per context, in order."""
        raise NotImplementedError(f"{self.name}: a batch method defines adapt_batch")


class TestSetMethod(_SavedState, _KindBase):
    """Shown the whole test set before the stream: the engine's pass hands `observe_test_set` every decodable
    sample once, in sample-id order, in groups (`--batch-size`), clean views of its own recipe (or, where
    `test_set_views` names recipes, {name: contexts} per group, the k-th named recipe drawn from view seed stream
    k); `end_test_set()` follows the last group. Then each sample is predicted as an episodic method's (or, a
    continual one, capabilities state "online", along the stream with its state saved and restored)."""
    __test__ = False   # not a pytest test class, whatever its name
    _kind = TEST_SET
    # the test-set pass's own views, by name (None: the method's own recipe)
    test_set_views: ClassVar[dict[str, ViewRecipe] | None] = None
    # the run's seed, set by the test-set pass before its first group: what the method draws its own randomness
    # from (TIPPLE's stage-I shuffles), so a resumed run recomputes the same state
    test_set_seed: int = 0
    # set once the test-set pass has ended (`finish_test_set`): `predict` is refused before
    test_set_seen: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None and not _defines(cls, "observe_test_set", TestSetMethod):
            raise TypeError(f"{spec.name}: a test-set method must define observe_test_set: the engine shows it "
                            "the whole test set before the stream")
        if spec is not None and not spec.episodic and not (_defines(cls, "save_state", _SavedState)
                                                           and _defines(cls, "load_state", _SavedState)):
            raise TypeError(f"{spec.name}: a continual test-set method must define save_state and load_state")

    def observe_test_set(self, ctxs: Any) -> None:
        """One group of the test-set pass (contexts, or {name: contexts}); nothing is predicted here."""
        raise NotImplementedError(f"{self.name}: a test-set method defines observe_test_set")

    def end_test_set(self) -> None:
        """After the test-set pass: fit what the whole set decides (a task-level prompt). `reset()` returns to
        the state this leaves."""

    def finish_test_set(self) -> None:
        """End the test-set pass (`end_test_set`) and mark it seen: what the engine calls after the last group."""
        self.end_test_set()
        self.test_set_seen = True

    def _predict_views(self, views: torch.Tensor) -> MethodOutput:
        if not self.test_set_seen:
            named = " (per group {name: contexts} of its test_set_views)" if self.test_set_views is not None else ""
            raise ValueError(f"{self.name} reads the whole test set before predicting: hand it every test image's "
                             f"contexts with observe_test_set(...){named} and call finish_test_set() first "
                             "(shiftlab.run does)")
        return super()._predict_views(views)


KIND_BASES: dict[str, type[Method]] = {EPISODIC: EpisodicMethod, ONLINE: OnlineMethod, BATCH: BatchMethod,
                                       TEST_SET: TestSetMethod}
