"""The engine step: a batch of decoded samples -> records, for every method and setting.

    runner = Runner(StepContext(evaluator, dataset, view_generators(evaluator.methods, model.preprocess, seed)))
    records = runner.step(runner.load(ids))       # or batches of BatchItem from a DataLoader

A `BatchItem` carries its views keyed by view recipe family (`recipe_key`: recipes that differ
only in their view count draw the same views, so a family is generated once, with the most views
any of its methods reads: `view_generators`). Contexts (features of the views) are encoded once
per family and precision, and every method gets the first `n_views` of them: methods sharing a
recipe share the encodings, and only the views a method reads are encoded for it.
Every phase is reported to the runner's `PhaseTimer` (shiftlab.engine.phases), which is how
`shiftlab bench` measures the engine.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from ..datasets.imageio import ImageDecodeError
from ..methods.base import Method, MethodOutput, build_method, create_method
from ..methods.catalogue.declarations import BATCH, ONLINE
from ..methods.catalogue.protocols import DEFAULT_PROTOCOL
from ..methods.context import ClassHeads, SampleContext
from ..methods.kinds import kind_of
from ..models import ClipModel
from ..models.precision import Precision
from ..models.precision import resolve as resolve_precision
from ..rundir.records import ADAPTIVE_SUFFIX, Record, is_adaptive, is_missing
from ..views.generator import ViewConfig, ViewGenerator
from ..views.preprocess import Preprocess
from ..views.recipe import ViewRecipe
from .phases import PhaseTimer, text_tower_timer
from .run_plan import recipe_key
from .setting_states import SettingStates

if TYPE_CHECKING:
    from ..attacks.pixels import ImageAttack
    from ..datasets.base import FolderDataset
    from .planning import Plan
    from .run_plan import RunPlan


def view_generators(methods: Mapping[str, Method], preprocess: Preprocess, seed: int) -> dict[str, ViewGenerator]:
    """One generator per recipe family of `methods`, drawing the most views any of them reads."""
    longest: dict[str, ViewRecipe] = {}
    for method in methods.values():
        recipe, key = method.view_recipe, recipe_key(method.view_recipe)
        if key not in longest or recipe.n_views > longest[key].n_views:
            longest[key] = recipe
    return {key: ViewGenerator(ViewConfig.from_recipe(recipe), seed=seed, preprocess=preprocess)
            for key, recipe in longest.items()}


def views_per_group(plan: RunPlan, device: torch.device) -> dict[tuple[str, str], int]:
    """(recipe family, precision key) -> the most views of a run's methods in it (what `Runner._groups`
    encodes), from the effective configs of its plan without building them (`engine.run_plan.RunPlan.encodings`)."""
    return {(family, precision): n for family, precision, n in plan.encodings(device.type, plan.config.dataset)}


@dataclass
class BatchItem:
    """One sample ready for the model: uint8 views (N,3,S,S) per recipe, or the reason it failed.
    `from_store`: not decoded, its features are read from the run's feature store instead
    (`features`: key digest -> (N, D), filled by the Runner)."""
    sample_id: int
    views: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str | None = None
    from_store: bool = False
    features: dict[str, torch.Tensor] = field(default_factory=dict)


def load_item(dataset: Any, sid: int, recipes: Mapping[str, ViewGenerator]) -> BatchItem:
    """Decode a sample once and generate each recipe's views; a failure becomes the item's error."""
    try:
        img = dataset.image(sid)
        return BatchItem(sid, {key: gen(img, sid) for key, gen in recipes.items()})
    except ImageDecodeError as exc:
        return BatchItem(sid, error=str(exc))
    except Exception as exc:  # a view or resize failure must not stop the run
        return BatchItem(sid, error=f"{type(exc).__name__}: {exc}")


class ViewDataset(Dataset):
    """Sample id -> BatchItem; runs in DataLoader workers."""

    def __init__(self, dataset: Any, ids: Sequence[int], recipes: Mapping[str, ViewGenerator],
                 from_store: set[int] | None = None):
        self.dataset, self.ids, self.recipes = dataset, list(ids), dict(recipes)
        self.from_store = from_store or set()   # served by the feature store: never decoded

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> BatchItem:
        sid = self.ids[i]
        if sid in self.from_store:
            return BatchItem(sid, from_store=True)
        return load_item(self.dataset, sid, self.recipes)


def collate(batch: list[BatchItem]) -> list[BatchItem]:
    return batch


class Evaluator:
    """Holds model, class heads and method instances; encodes views and runs methods.

    With a `text_timer` (a PhaseTimer with `text=True`), every prompt-tuning method's text tower
    is timed from construction on (before `prepare()`, so graphs built there are timed too) until
    `close()`. `configs`: each method's config as a run's plan resolved it (`engine.run_plan`: what runs, encode
    and bench hand it); without it, each is resolved here from `method_config`, `protocol`, `run_views` and
    `dataset` (a canonical name: `--protocol paper`'s per-dataset values), as `create_method` does."""

    def __init__(self, model: ClipModel, classnames: Sequence[str], method_names: Sequence[str],
                 method_config: dict[str, dict] | None = None, precision: str = "auto",
                 text_timer: PhaseTimer | None = None, protocol: str = DEFAULT_PROTOCOL,
                 run_views: Mapping[str, Any] | None = None, dataset: str | None = None,
                 configs: Mapping[str, Any] | None = None, trust_checkpoint: bool = False):
        self.model = model
        self.classnames = list(classnames)
        self.heads = ClassHeads(model, classnames)
        self.precision = resolve_precision("auto", model.device, run=precision)   # the image tower's: the run's
        method_config = method_config or {}
        self.methods: dict[str, Method] = {}
        for n in method_names:
            # the dataset's class list as published: CLIP's ImageNet names hold two duplicates
            if configs is not None:   # resolved already (a run's plan)
                self.methods[n] = build_method(n, model, classnames, configs[n], heads=self.heads,
                                               run_precision=precision, allow_duplicate_names=True,
                                               trust_checkpoint=trust_checkpoint)
                continue
            self.methods[n] = create_method(n, model, classnames, heads=self.heads, run_precision=precision,
                                            protocol=protocol, dataset=dataset, run_views=run_views,
                                            allow_duplicate_names=True, trust_checkpoint=trust_checkpoint,
                                            **dict(method_config.get(n, {})))
        self.needs_views = any(m.spec.needs_views for m in self.methods.values())
        self._timers = contextlib.ExitStack()
        if text_timer is not None and text_timer.text:
            def sink(seconds: float) -> None:
                text_timer.add(f"text:{text_timer.current_method}", seconds)
            for method in self.methods.values():
                self._timers.enter_context(text_tower_timer(method, text_timer.now, sink))
        for method in self.methods.values():
            method.prepare()

    @classmethod
    def for_run(cls, plan: RunPlan, model: ClipModel, classnames: Sequence[str]) -> Evaluator:
        """The evaluator of a run: its methods built with the configs its plan resolved (`engine.run_plan`: as
        its protocol, dataset, --views, --augmix, --set and precision make them)."""
        config = plan.config
        return cls(model, classnames, config.methods, config.method_config, config.precision,
                   protocol=config.protocol, configs=plan.method_configs(config.dataset),
                   trust_checkpoint=config.trust_checkpoint)

    def close(self) -> None:
        """Remove the text-tower timers (if any)."""
        self._timers.close()

    def contexts(self, views_u8: Sequence[torch.Tensor], ids: Sequence[int],
                 all_views: bool | None = None, precision: Precision | None = None,
                 encode: bool = True) -> list[SampleContext]:
        """Normalise on the device and encode all samples' views in one pass (view 0 only unless
        `all_views`, default: whether any method needs augmented views), under `precision`
        (default: the run's); `encode=False`: normalise only (a context encodes on first reading)."""
        all_views = self.needs_views if all_views is None else all_views
        precision = precision or self.precision
        dev = self.model.device
        stacked = torch.cat([v if all_views else v[:1] for v in views_u8]).to(dev, non_blocking=True)
        x = self.model.normalize(stacked.float().div_(255))
        feats = self.model.encode_views(x, precision) if encode else None
        n = x.shape[0] // len(views_u8)
        return [SampleContext(self.model, self.heads, x[i * n:(i + 1) * n], sample_id=sid, precision=precision,
                              image_features=None if feats is None else feats[i * n:(i + 1) * n])
                for i, sid in enumerate(ids)]

    def predict(self, name: str, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        """Method `name` on `ctxs` as its kind is driven (shiftlab.methods.kinds)."""
        method = self.methods[name]
        kind = kind_of(method.spec)
        if kind == BATCH:   # the episodic-batch protocol: `ctxs` is one whole batch of the stream
            if method.spec.episodic:
                method.reset()
            return method.adapt_batch(list(ctxs))
        if kind == ONLINE:
            return [method.predict_context(c) for c in ctxs]   # one sample at a time, in stream order
        return method.predict_batch(list(ctxs))   # episodic, or test-set after its pass


OutputsHook = Callable[[str, str, list[int], list[MethodOutput]], None]


@dataclass
class StepContext:
    """Everything an engine step works with besides its batch, typed: the evaluator (model, heads, methods),
    the samples and the view generators (one per recipe family, `view_generators`); then what a run sets:
    its `settings` ("clean", an attack's), the `attacker` of attacked settings, the `plan` (which rank
    owns which record) and `done` (the resume's record keys, `rundir.records.is_missing`), the `methods`
    to run (default: all of the evaluator's), the `timer`, `online_start` (the stream position from which
    online methods compute), the `features` store, `on_outputs(method, setting, ids, outputs)` (the
    benchmark compares logits) and `group_views` ((recipe family, precision key) -> the fewest views its
    encodings hold: `--orders`' later orders encode what the first order's methods did), and, in a run of several
    settings, each online method's `setting_states` (one state per setting: engine.setting_states)."""
    evaluator: Evaluator
    dataset: FolderDataset   # or what answers as one: samples, image(i), label(i) (a bench's images, domains)
    recipes: Mapping[str, ViewGenerator]
    settings: Sequence[str] = ("clean",)
    attacker: ImageAttack | dict[str, ImageAttack] | None = None   # a dict: one per budget of an eps list
    plan: Plan | None = None
    done: set[tuple[int, str, str]] = field(default_factory=set)
    methods: Sequence[str] | None = None
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    online_start: int = 0
    features: Any = None   # an engine.features.RunFeatures (which imports this module: named, not imported)
    on_outputs: OutputsHook | None = None
    group_views: Mapping[tuple[str, str], int] = field(default_factory=dict)
    eot: int = 1   # `--attack-target adaptive`: draws of a method's random views per attack gradient
    # several settings: each online method's state per setting (engine.setting_states), loaded for its setting's work
    setting_states: Mapping[str, SettingStates] = field(default_factory=dict)


class Runner:
    """One engine step over a batch, with what its `StepContext` says: `done` (resume keys) and `plan`
    (which rank owns which record) decide what is computed; online methods (`episodic = False`) compute
    every sample at stream position >= `online_start` (their state must see the whole stream; the caller
    drops records that already exist)."""

    def __init__(self, context: StepContext):
        self.context = context
        self.evaluator = context.evaluator
        self.dataset = context.dataset
        self.recipes = dict(context.recipes)
        self.settings = list(context.settings)
        self.attacker = context.attacker
        self.plan = context.plan
        self.done = context.done
        self.methods = list(context.methods) if context.methods is not None else list(self.evaluator.methods)
        self.timer = context.timer
        self.online_start = context.online_start
        self.on_outputs = context.on_outputs
        self.features = context.features   # a feature_store.RunFeatures, or None
        self.group_views = dict(context.group_views)
        self.setting_states = {n: s for n, s in context.setting_states.items() if n in self.methods}
        # each method's own frozen encoder of view 0 (COSMIC's DINOv2), computed once per sample and stored
        self.encoders = {n: e for n in self.methods if self.evaluator.methods[n].spec.capabilities.reads_frozen_encoder
                         and (e := self.evaluator.methods[n].frozen_encoder()) is not None}
        # (method, sample id) -> why its own encoder failed on that sample's view 0 (DiffTPT's view not its manifest's):
        # that method's error record for that sample alone (`_predict`), never a stopped run
        self.encoder_failures: dict[tuple[str, int], str] = {}

    def recipe_of(self, method: str) -> str:
        """The key of the recipe family a method reads (`recipe_key`)."""
        return recipe_key(self.evaluator.methods[method].view_recipe)

    def _groups(self, names: list[str]) -> list[tuple[list[str], int]]:
        """The methods of one recipe family grouped by precision, with the group's view count (from
        every method of the group, not only those with records missing: the tower's batch shape, and
        so its rounding, must not depend on what a resume still has to do)."""
        methods = self.evaluator.methods
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(methods[n].precision.key, []).append(n)
        return [(g, max([methods[n].view_recipe.n_views for n in g]
                        + [self.group_views.get((self.recipe_of(g[0]), methods[g[0]].precision.key), 0)]))
                for g in groups.values()]

    def store_keys(self) -> list[dict]:
        """The feature-store key of every encoding a clean step makes (empty: no store, an attack, or a
        method that needs pixels; those runs decode every sample)."""
        methods = self.evaluator.methods
        if (self.features is None or self.settings != ["clean"]
                or any(methods[n].spec.needs_pixels for n in self.methods)):
            return []
        keys = []
        for recipe in dict.fromkeys(self.recipe_of(n) for n in self.methods):
            names = [n for n in self.methods if self.recipe_of(n) == recipe]
            for group, n_max in self._groups(names):
                keys.append(self.features.key(methods[group[0]].view_recipe, methods[group[0]].precision.key, n_max))
        encoder_keys = {json.dumps(k, sort_keys=True): k for k in map(self._encoder_key, self.encoders)}
        return keys + list(encoder_keys.values())

    def _encoder_key(self, name: str) -> dict:
        """The store key of method `name`'s own frozen encoder's output (its recipe's view 0)."""
        method = self.evaluator.methods[name]
        return self.features.key(method.view_recipe, method.precision.key, 1, encoder=self.encoders[name].key_fields())

    def _attach_encoded(self, names: Sequence[str], ctxs: list[SampleContext], ids: list[int], features: list[dict],
                        wanted: Mapping[str, Sequence[int]] | None, store: bool, failures: dict | None = None) -> None:
        """Put each of `names`' own frozen encoder's output in the contexts (`SampleContext.encoded`): read from the
        store where the item was served by it, else encoded from view 0, one image at a time as the method itself
        would (the same numbers whatever the batch), and written to the store when `store` (a clean step).
        `failures`: where an encoding that raises is said ((method, sample id) -> the error), instead of raising."""
        from ..rundir.feature_store import key_digest
        dev = self.evaluator.model.device
        for name in names:
            encoder = self.encoders.get(name)
            if encoder is None:
                continue
            key = self._encoder_key(name) if self.features is not None else None
            digest = key_digest(key) if key is not None else None
            for i in (range(len(ctxs)) if wanted is None else wanted[name]):
                ctx = ctxs[i]
                if encoder.id in ctx.encoded:
                    continue
                stored = features[i].get(digest) if digest is not None else None
                if stored is not None:
                    ctx.encoded[encoder.id] = stored[0].to(dev)
                    continue
                with self.timer.phase("encode_own"):
                    try:
                        ctx.encoded[encoder.id] = encoder.encode(ctx.views[:1])
                    except Exception as exc:
                        if failures is None:
                            raise
                        failures[(name, ids[i])] = f"{type(exc).__name__}: {exc}"
                        continue
                if store and key is not None:
                    self.features.put(key, ids[i], ctx.encoded[encoder.id].unsqueeze(0))

    def _fill_from_store(self, batch: Sequence[BatchItem]) -> list[BatchItem]:
        """Read the stored features of undecoded items; an item any of whose features cannot be read
        (a damaged shard) is decoded here instead."""
        from ..rundir.feature_store import key_digest
        keys = self.store_keys() if any(item.from_store for item in batch) else []
        out = []
        for item in batch:
            if item.from_store:
                with self.timer.phase("store_read"):
                    feats = {key_digest(k): self.features.read(k, item.sample_id) for k in keys}
                if keys and all(f is not None for f in feats.values()):
                    item.features = feats
                else:
                    item = self.load([item.sample_id])[0]
            out.append(item)
        return out

    def _stored_contexts(self, views: list, ids: list[int], key: dict | None, n_max: int,
                         precision: Precision, features: list[dict], encode: bool = True) -> list[SampleContext]:
        """Contexts of a group: stored features for undecoded items, the rest encoded in one pass
        (and written to the store when the step is clean); `encode=False`: the views only, normalised."""
        from ..rundir.feature_store import key_digest
        digest = key_digest(key) if key is not None else None
        todo = [i for i, v in enumerate(views) if v is not None]
        encoded: dict[int, SampleContext] = {}
        if todo:
            with self.timer.phase("encode") if encode else contextlib.nullcontext():
                ctxs = self.evaluator.contexts([views[i][:n_max] for i in todo], [ids[i] for i in todo],
                                               all_views=True, precision=precision, encode=encode)
            encoded = dict(zip(todo, ctxs))
            if key is not None:
                for i, c in encoded.items():
                    self.features.put(key, ids[i], c.image_features)
        dev = self.evaluator.model.device
        return [encoded[i] if i in encoded else
                SampleContext(self.evaluator.model, self.evaluator.heads, None, sample_id=ids[i], precision=precision,
                              image_features=features[i][digest].to(dev)) for i in range(len(ids))]

    def _encode(self, names: list[str], wanted: dict[str, list[int]], views: list[torch.Tensor | None],
                ids: list[int], recipe: str, features: list[dict]) -> dict[str, list[SampleContext]]:
        """Each method's contexts: one encoding per precision of the family's views (as many as the
        group's longest recipe), each method reading its first n_views of it; none for a group none of
        whose methods reads the frozen tower's features (`MethodSpec.reads_features`: TTL's own tower)."""
        methods = self.evaluator.methods
        out: dict[str, list[SampleContext]] = {}
        clean = self.features is not None and self.settings == ["clean"] and bool(self.store_keys())
        for group, n_max in self._groups(names):
            if not any(wanted[n] for n in group):
                continue
            precision = methods[group[0]].precision
            key = self.features.key(methods[group[0]].view_recipe, precision.key, n_max) if clean else None
            reads = any(methods[n].spec.reads_features for n in group)
            ctxs = self._stored_contexts(views, ids, key if reads else None, n_max, precision, features, reads)
            self._attach_encoded(group, ctxs, ids, features, wanted, store=clean, failures=self.encoder_failures)
            by_count: dict[int, list[SampleContext]] = {n_max: ctxs}
            for n in group:
                k = methods[n].view_recipe.n_views
                if k not in by_count:
                    by_count[k] = [c.first_views(k) for c in ctxs]
                out[n] = by_count[k]
        return out

    def fill_store(self, batch: Sequence[BatchItem]) -> int:
        """Encode a batch's clean views into the feature store, running no method (`shiftlab encode`);
        returns how many samples failed to decode."""
        methods = self.evaluator.methods
        good = [item for item in batch if item.error is None and not item.from_store]
        ids = [item.sample_id for item in good]
        if good and self.store_keys():
            for recipe in dict.fromkeys(self.recipe_of(n) for n in self.methods):
                names = [n for n in self.methods if self.recipe_of(n) == recipe]
                for group, n_max in self._groups(names):
                    precision = methods[group[0]].precision
                    key = self.features.key(methods[group[0]].view_recipe, precision.key, n_max)
                    ctxs = self._stored_contexts([item.views[recipe] for item in good], ids, key, n_max, precision,
                                                 [{} for _ in good])
                    self._attach_encoded(group, ctxs, ids, [{} for _ in good], None, store=True)
        return sum(item.error is not None for item in batch)

    def contexts(self, items: Sequence[BatchItem], names: Sequence[str]) -> dict[str, list[SampleContext]]:
        """Each of `names`' clean contexts of decoded `items` (its recipe's views, encoded as a step encodes
        them): what the test-set pass (shiftlab.engine.loop.test_set_pass) hands a method."""
        ids = [item.sample_id for item in items]
        out: dict[str, list[SampleContext]] = {}
        for recipe in dict.fromkeys(self.recipe_of(n) for n in names):
            group = [n for n in names if self.recipe_of(n) == recipe]
            out.update(self._encode(group, {n: list(range(len(ids))) for n in group},
                                    [item.views[recipe] for item in items], ids, recipe, [{} for _ in items]))
        return out

    def load(self, ids: Sequence[int]) -> list[BatchItem]:
        """Decode and generate views in this process (a run does this in DataLoader workers)."""
        with self.timer.phase("decode_views"):
            return [load_item(self.dataset, sid, self.recipes) for sid in ids]

    def _base(self, sid: int, setting: str) -> dict[str, Any]:
        base = {"id": sid, "path": self.dataset.samples[sid][0], "label": self.dataset.label(sid), "setting": setting}
        is_ood = getattr(self.dataset, "is_ood", None)   # an open-set stream (datasets/openset.py)
        return {**base, "ood": bool(is_ood(sid))} if callable(is_ood) else base

    def _wanted(self, name: str, sid: int, setting: str) -> bool:
        if self.plan is not None and not self.plan.owns(sid, name):
            return False
        if not self.evaluator.methods[name].spec.episodic and self.plan is not None:
            return self.plan.position[sid] >= self.online_start
        return is_missing(sid, name, setting, self.done)

    def step(self, batch: Sequence[BatchItem]) -> list[Record]:
        """Records of a batch, grouped by sample in batch order."""
        batch = self._fill_from_store(batch) if self.features is not None else batch
        per_sample: dict[int, list[Record]] = {item.sample_id: [] for item in batch}
        for item in batch:
            if item.error is not None:
                for setting in self.settings:
                    per_sample[item.sample_id].append(
                        Record.failure(**self._base(item.sample_id, setting), method=None, error=item.error))
        good = [item for item in batch if item.error is None]
        if good:
            ids = [item.sample_id for item in good]
            for setting in self.settings:
                with contextlib.ExitStack() as states:   # each online method adapts along this setting's stream
                    for held in self.setting_states.values():
                        states.enter_context(held.use(setting))
                    for recipe in dict.fromkeys(self.recipe_of(n) for n in self.methods):
                        self._step_recipe(good, ids, setting, recipe, per_sample)
        return [rec for item in batch for rec in per_sample[item.sample_id]]

    def _step_recipe(self, good: list[BatchItem], ids: list[int], setting: str, recipe: str,
                     per_sample: dict[int, list[Record]]) -> None:
        names = [n for n in self.methods if self.recipe_of(n) == recipe]
        wanted = {n: [i for i, sid in enumerate(ids) if self._wanted(n, sid, setting)] for n in names}
        for n in names:   # a batch method adapts on the whole batch (the loop drops records already written)
            if wanted[n] and self.evaluator.methods[n].spec.adapts_on_batches:
                wanted[n] = list(range(len(ids)))
        if not any(wanted.values()):
            return
        if is_adaptive(setting):
            self._step_adaptive(good, ids, setting, recipe, names, wanted, per_sample)
            return
        views = [item.views.get(recipe) for item in good]   # None: served by the feature store
        attack_info: dict[int, dict] = {}
        if setting != "clean":
            with self.timer.phase("attack"):
                views, attack_info = self._attacker(setting).perturb(ids, views, [self.dataset.label(s) for s in ids],
                                                      self.recipes[recipe])
        ctxs_of = self._encode(names, wanted, views, ids, recipe, [item.features for item in good])
        for name in names:
            if wanted[name]:
                self._predict(name, setting, ids, wanted[name], ctxs_of[name], attack_info, per_sample)

    def _attacker(self, setting: str) -> Any:
        """The attack of an attacked setting: the run's, or its budget's for an eps list (an adaptive setting is its
        budget's setting + "-adaptive")."""
        if not isinstance(self.attacker, dict):
            return self.attacker
        return self.attacker[setting.removesuffix(ADAPTIVE_SUFFIX)]

    def _step_adaptive(self, good: list[BatchItem], ids: list[int], setting: str, recipe: str, names: list[str],
                       wanted: dict[str, list[int]], per_sample: dict[int, list[Record]]) -> None:
        """An attack through each method's own prediction (`--attack-target adaptive`): every method's samples
        attacked against the method as it stands, then scored. An episodic method's samples are attacked one by one
        and predicted together; a batch method's batch is attacked together; an online method's samples one at a
        time, each attacked against the state the samples before it left (and then updating it as a clean one
        would). Each sample's views are encoded alone, so its features do not depend on the batch."""
        for name in names:
            method = self.evaluator.methods[name]
            todo = wanted[name]
            units = [todo] if method.spec.episodic or method.spec.adapts_on_batches else [[i] for i in todo]
            for unit in units:
                unit_ids = [ids[i] for i in unit]
                with self.timer.phase("attack"):
                    views, info = self._attacker(setting).perturb_adaptive(
                        method, unit_ids, [good[i].views[recipe] for i in unit],
                        [self.dataset.label(s) for s in unit_ids], self.recipes[recipe], self.context.eot,
                        together=method.spec.adapts_on_batches)
                ctxs = [self._encode([name], {name: [0]}, [v], [sid], recipe, [{}])[name][0]
                        for v, sid in zip(views, unit_ids)]
                self._predict(name, setting, unit_ids, list(range(len(unit))), ctxs, info, per_sample)

    def _predict(self, name: str, setting: str, ids: list[int], todo: list[int], ctxs: list[SampleContext],
                 attack_info: dict[int, dict], per_sample: dict[int, list[Record]]) -> None:
        """Method `name` on the contexts `todo` of `ids`, its records (or one failure per sample) into `per_sample`."""
        failed = {i: self.encoder_failures.pop((name, ids[i])) for i in todo if (name, ids[i]) in self.encoder_failures}
        for i, error in failed.items():
            per_sample[ids[i]].append(Record.failure(**self._base(ids[i], setting), method=name, error=error))
        todo = [i for i in todo if i not in failed]
        if not todo:
            return
        self.timer.current_method = name
        t0 = self.timer.now()
        try:
            outs = self.evaluator.predict(name, [ctxs[i] for i in todo])
        except Exception as exc:  # one method failing must not lose the others' records
            for i in todo:
                per_sample[ids[i]].append(Record.failure(**self._base(ids[i], setting), method=name,
                                                         error=f"{type(exc).__name__}: {exc}"))
            return
        finally:
            seconds = self.timer.now() - t0
            self.timer.add(f"predict:{name}", seconds)
            self.timer.current_method = None
        secs = seconds / max(len(todo), 1)
        for i, out in zip(todo, outs):
            sid = ids[i]
            rec = Record.prediction(**self._base(sid, setting), method=name, output=out, seconds=secs)
            per_sample[sid].append(rec.with_attack(attack_info.get(sid)))
        if self.on_outputs is not None:
            self.on_outputs(name, setting, [ids[i] for i in todo], outs)
