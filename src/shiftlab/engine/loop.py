"""The evaluation loop: one pass over a dataset for many methods.

Per sample: decode -> views (DataLoader workers, uint8) -> [attack] -> the image
tower once for all views (batched across samples) -> every requested method ->
one record per (sample, method, setting), appended and flushed per sample.
One batch of that is `shiftlab.engine.step.Runner.step`; this module plans the run around it.

Resumable (records already present are skipped), deterministic (views seeded per
sample), shardable (torchrun: ranks take blocks of the stream, see docs/SCALE_OUT.md).
"""
from __future__ import annotations

import copy
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..attacks import build_attack, split_budgets
from ..datasets.objects import as_dataset, is_run_dataset
from ..methods.base import get_method_class
from ..methods.catalogue.declarations import TEST_SET
from ..methods.kinds import kind_of
from ..models import ClipModel
from ..results import orders as results_orders
from ..results import summary as run_summary
from ..rundir import identity, record_files
from ..rundir.online_state import OnlineState
from ..rundir.records import Record, run_settings
from ..rundir.stream import order_seeds, read_stream, write_stream
from ..views.generator import ViewConfig, ViewGenerator
from . import distributed, interrupt, planning
from .config import (
    RunConfig,
    check_run_config,
    expand_methods,
    resolve_device,
    resolve_workers,
    run_stream,
)
from .features import open_run_features
from .phases import PhaseTimer
from .prepare import prepare
from .resuming import check_same_encoding, records_left, say_resuming
from .run_plan import RunPlan, resolve_plan
from .setting_states import setting_states
from .step import (
    Evaluator,
    Runner,
    StepContext,
    ViewDataset,
    collate,
    load_item,
    view_generators,
    views_per_group,
)

__all__ = ["RunHooks", "run"]


class RunHooks:
    """Observers of a run (tests, pacing, instrumentation); the default does nothing.

    `before_step(ids)` runs before each engine step, `after_step(ids, records)` after its
    records are written or held back, `after_checkpoint(ids)` after the online state of
    `ids` is checkpointed and before their online records are appended."""

    def before_step(self, ids: list[int]) -> None:
        pass

    def after_step(self, ids: list[int], recs: list[Record]) -> None:
        pass

    def after_checkpoint(self, ids: list[int]) -> None:
        pass


def run(config: RunConfig, model: ClipModel | None = None, dataset: Any = None,
        hooks: RunHooks | None = None, *, group_views: dict | None = None, plan: RunPlan | None = None) -> dict:
    """Evaluate `config.methods` over the dataset; returns the summary dict (with `config.orders` K > 1,
    order 0's, and `orders`: what `results.orders` writes to orders.json). `config` is not changed.

    Without `model` or `dataset`, the run starts as `shiftlab run` does (`engine.prepare.prepare`): the
    dataset listed (downloaded with `config.download`), refused when more than 5% of its classes have no
    images unless `config.allow_partial`, the model and the methods' own models loaded; every problem at
    once in one CannotStart (a ValueError). A `dataset` you pass is used as it is: one of shiftlab's
    (`build_dataset`), or any map-style dataset of (image, label) pairs with class names
    (`datasets.objects.as_dataset`: torchvision's ImageFolder, CIFAR, your own), which the run records under
    its name (`RunConfig.dataset` when that is no registered dataset's name, else the object's `name` or class
    name), so that no registered dataset's per-dataset settings apply to it.

    Raises RunLockedError (another process holds `config.out`), RunIdentityError (a `--resume`
    with other settings than the run directory's) and RunDirError (the directory cannot be written:
    a file in the way, read-only, disk full); their messages name the path. A KeyboardInterrupt
    (SIGINT/SIGTERM under the CLI, runtime.interrupt) leaves with `progress` = (samples done, in the stream)."""
    from .shifts import run_dataset

    config = check_run_config(copy.deepcopy(config))   # the caller's config stays as given: what runs is a copy
    if dataset is not None and not is_run_dataset(dataset):
        from ..datasets.specs import DATASETS
        dataset = as_dataset(dataset, name=None if config.dataset in DATASETS else config.dataset)
        config.dataset = dataset.name
    config.methods = expand_methods(config.methods, config.model, config.method_config,
                                    config.settings() != ["clean"], run=config)
    hooks = hooks or RunHooks()
    dist = distributed.context()
    device = resolve_device(config.device)
    if dist.world_size > 1 and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    if plan is None or plan.config != config:   # the plan the caller resolved (the CLI's), or this run's
        plan = resolve_plan(config)             # a PlanError (ValueError): the first reason it cannot work
    if dataset is None or model is None:   # as `shiftlab run` starts: every problem at once (CannotStart)
        given = {config.dataset: dataset} if dataset is not None else None
        prepared = prepare(config, [config.dataset], model=model, given=given, plan=plan)
        model, dataset = prepared.model, prepared.datasets[config.dataset]
    dataset = run_dataset(config, dataset)   # its corruption and OOD images (engine/shifts.py)
    model = model.to(device)
    run_stream(config, dataset)   # a stream the dataset cannot make (continual of one dataset) is refused here
    if config.orders > 1 and config.stream_seed is None:
        return run_summary.RunSummary(_run_orders(config, model, dataset, hooks, plan))
    # every setting is checked (methods built, attack built) before the run directory is touched
    evaluator = Evaluator.for_run(plan, model, dataset.classnames)
    config.attack = dict(plan.attack)   # what run.json records: every field of the attack, as the plan filled it
    attacker = _attackers(config, model, evaluator)
    run_dir = record_files.ensure_run_dir(Path(config.out))
    lock = distributed.acquire_for_job(run_dir, dist)   # one writer per run directory, before anything is read
    try:
        return run_summary.RunSummary(_run_locked(config, model, dataset, evaluator, attacker, device, dist, run_dir,
                                                  hooks, group_views))
    except KeyboardInterrupt as exc:   # SIGINT/SIGTERM (runtime.interrupt): the writer is closed; say how far
        stream = run_stream(config, dataset)
        interrupt.note_progress(exc, run_dir, stream, config.methods, config.settings())
        raise
    finally:
        if lock is not None:
            lock.release()


def _run_orders(config: RunConfig, model: ClipModel, dataset, hooks: RunHooks, plan: RunPlan) -> dict:
    """`--orders K`: order 0 (every method) in `config.out`, then orders 1..K-1 of the online methods alone,
    each a run directory of its own (`results.orders.order_dir`), each seeded by its own stream seed
    (`rundir.stream.order_seeds`); the episodic methods' records serve every order. The later orders encode
    what order 0 encoded (`group_views`), so with `--features` they read every feature from the store."""
    seeds = order_seeds(config.seed, config.orders)
    first = dataclasses.replace(config, stream_seed=seeds[0])
    evaluator_views = views_per_group(plan, model.device)
    summary = run(first, model, dataset, hooks, plan=dataclasses.replace(plan, config=first))   # the same plan
    online = [n for n in config.methods if not get_method_class(n).spec.episodic]
    episodic = [n for n in config.methods if n not in online]
    if online:
        for k in range(1, config.orders):
            sub = dataclasses.replace(config, stream_seed=seeds[k], methods=list(online),
                                      method_config={n: c for n, c in config.method_config.items() if n in online},
                                      out=str(results_orders.order_dir(config.out, k)))
            run(sub, model, dataset, hooks, group_views=evaluator_views, plan=plan.only(online, sub))
    if distributed.context().rank != 0:
        return summary
    table = results_orders.summarize_orders(config.out, config.orders, seeds, online, episodic)
    results_orders.write_orders(config.out, table)
    if config.progress:
        print(results_orders.orders_markdown(table))
    return {**summary, "orders": table}


def _run_locked(config: RunConfig, model: ClipModel, dataset, evaluator: Evaluator, attacker,
                device: torch.device, dist, run_dir: Path, hooks: RunHooks, group_views: dict | None) -> dict:
    from ..version import __version__

    settings = config.settings()
    order = run_stream(config, dataset)
    run_identity = identity.build(config, model, dataset, evaluator.methods, __version__)
    identity.check_ranks(distributed.all_gather(dist, run_identity))   # torchrun: one model on every rank
    # a directory with nothing to protect (a run that failed before its first record) is simply reused
    has_work = bool(record_files.record_files(run_dir)) or (run_dir / OnlineState.FILE).is_file()
    old_identity = identity.read(run_dir) if config.resume and has_work else None
    resumed = _check_resume(run_dir, old_identity, run_identity, dist) if config.resume else None
    if resumed is not None:
        run_identity = resumed.identity
    # the records already there must be this run's: its samples, settings and the methods run.json listed
    schema = run_summary.run_schema(old_identity or run_identity, ids=frozenset(order), samples=dataset.samples,
                                    n_classes=len(dataset.classnames))
    new_methods = resumed.added_methods if resumed is not None else []   # their online state is not theirs
    done = distributed.prior_records(run_dir, config.resume, dist, schema)  # all ranks read before any writes
    done |= outside_attack_subset(config, order)   # no record is wanted there: as if written
    check_same_encoding(run_dir, old_identity, config, order, settings, done)
    if dist.rank == 0:   # with the summary's config, so that `shiftlab merge` labels it as the run does
        identity.write(run_dir, {**run_identity, run_summary.CONFIG: _config_dict(config, model, dataset,
                                                                                   run_identity, evaluator.methods)})
        earlier = (read_stream(run_dir) or {}).get("online", []) if config.resume else []   # a resume adding methods
        online_names = list(dict.fromkeys([*earlier, *(n for n, m in evaluator.methods.items()
                                                       if not m.spec.episodic)]))
        batched = any(m.spec.adapts_on_batches for m in evaluator.methods.values())
        write_stream(run_dir, order, config.order, config.stream_seed_used(), config.delta, online_names,
                     config.batch_size if batched else None, getattr(dataset, "domains", None),
                     getattr(dataset, "domain_index", None))
    plan = planning.plan(order, dist, evaluator.methods, block=config.batch_size)  # online: rank 0, whole stream
    online = list(plan.online)

    views = view_generators(evaluator.methods, model.preprocess, config.seed)   # one per recipe family
    writer = record_files.RecordWriter(distributed.records_path(run_dir, dist),
                                       probs=_probs_writer(config, run_dir, dist))
    # test-set methods see the whole test set first; recomputed on every start, so a resume is exact (an online
    # one's checkpoint, restored below, then replaces what the pass left with the state the stream reached); a
    # method with nothing left to compute (a finished run resumed) is not shown the set again
    test_set_pass(evaluator, dataset, views, order, config.batch_size,
                  names=unfinished_test_set_methods(evaluator, order, settings, done), seed=config.seed)
    state = None
    online_start = 0
    # several settings: each online method adapts along each setting's stream with a state of its own, from the
    # state it holds now (after the test-set pass); the checkpoint holds them all
    per_setting = setting_states(evaluator.methods, online, settings)
    in_files = set(done)   # before any held-back online record is restored from the checkpoint
    finished = config.resume and not records_left(list(evaluator.methods), order, settings, done)
    if finished:   # every record is in the files: the online methods' stream is over, nothing is restored
        online_start = len(order)
    elif online:
        state = OnlineState(run_dir, {n: per_setting.get(n, evaluator.methods[n]) for n in online},
                            every_seconds=config.online_checkpoint_seconds, on_checkpoint=hooks.after_checkpoint,
                            every_samples=config.online_checkpoint_samples)
        if config.resume:
            online_start = state.resume(order, writer, done, settings, schema, new_methods)
    if resumed is not None and dist.rank == 0 and (done or old_identity):
        say_resuming(run_dir, resumed, order, config.methods, settings, in_files, done, state)
    pending = plan.pending(settings, done)
    if online:  # the online state must see every sample from where it stands
        wanted = set(order[online_start:]) | set(pending)
        pending = [sid for sid in plan.ids if sid in wanted]
    if any(m.spec.adapts_on_batches for m in evaluator.methods.values()):
        pending = _whole_batches(plan, pending)
    timer = PhaseTimer()
    store = open_run_features(config, dist, dataset, model, run_identity) if config.features else None
    runner = Runner(StepContext(evaluator, dataset, views, settings=settings, attacker=attacker, plan=plan,
                                done=done, timer=timer, online_start=online_start, features=store,
                                group_views=group_views or {}, eot=config.eot, setting_states=per_setting))
    served = store.served(pending, runner.store_keys()) if store is not None else set()
    workers = resolve_workers(config.workers, device, dist)
    loader = DataLoader(ViewDataset(dataset, pending, runner.recipes, served), batch_sampler=plan.batches(pending),
                        num_workers=workers, collate_fn=collate, pin_memory=device.type == "cuda",
                        prefetch_factor=4 if workers > 0 else None,
                        persistent_workers=False, worker_init_fn=interrupt.ignore_in_worker)
    progress = _Progress(len(pending), config.methods, enabled=config.progress and dist.rank == 0)
    t_start = time.perf_counter()
    stepping = False   # True while a step runs: the online methods' state is then part-way through a batch
    try:
        for batch in loader:
            ids = [item.sample_id for item in batch]
            hooks.before_step(ids)
            stepping = True
            recs = [r for r in runner.step(batch) if r.key not in done]
            _write_step(ids, recs, writer, state, plan, online_start, progress)
            stepping = False
            hooks.after_step(ids, recs)
        if state is not None:
            state.flush(writer)
    except KeyboardInterrupt:
        # between steps the online state matches its held-back records: checkpoint it and write them, so the
        # interrupted line counts what is on disk and --resume continues from here
        if state is not None and not stepping:
            state.flush(writer)
        raise
    finally:
        writer.close()
        progress.close()
        if store is not None:
            failing = sys.exc_info()[1]
            store.close(failing)
            if failing is None or isinstance(failing, KeyboardInterrupt):   # a failure is said in its one line
                print(store.line(), file=sys.stderr, flush=True)
    wall = time.perf_counter() - t_start

    timings = distributed.gather_timings(dist, run_dir, wall, len(pending), timer.seconds.get("encode", 0.0))
    if timings is None:  # not rank 0 (or rank 0 cannot see every shard: merge later)
        return {}
    if config.resume:
        timings = run_summary.combine_timings(run_summary.previous_timings(run_dir), timings)
    summary, md = run_summary.finish_run(run_dir, timings)   # as `shiftlab merge` does
    if config.progress:
        print(md)
    return summary


def unfinished_test_set_methods(evaluator: Evaluator, order: Sequence[int], settings: Sequence[str],
                                done: set) -> list[str]:
    """The test-set methods a (resumed) run must show the test set: those with a record left to compute, and
    the online ones while any method of the run has one left (their state runs along the whole stream)."""
    run_left = records_left(list(evaluator.methods), order, settings, done)
    return [n for n, m in evaluator.methods.items() if kind_of(m.spec) == TEST_SET
            and (records_left([n], order, settings, done) or (not m.spec.episodic and run_left))]


def test_set_pass(evaluator: Evaluator, dataset: Any, views: dict, order: Sequence[int], batch_size: int,
                  names: Sequence[str] | None = None, seed: int = 0) -> list[str]:
    """The transductive track's pass (docs/PROTOCOLS.md): every method that reads the whole test set
    (`reads_ahead == "test_set"`; `names`: only these of them) is shown each decodable sample of the run once,
    in sample-id order (the test set as a set: what it learns does not depend on the stream order), in groups
    of `batch_size`, the clean views of its own recipe encoded as the stream encodes them (or of the recipes it
    names in `test_set_views`, each from its own seed stream); then `end_test_set()`. Deterministic (the views
    are seeded by (run seed, sample id), `test_set_seed` is the run seed), so a resumed run recomputes the same
    state. Returns the methods shown the set."""
    names = [n for n, m in evaluator.methods.items() if kind_of(m.spec) == TEST_SET and (names is None or n in names)]
    if not names:
        return []
    plain = [n for n in names if evaluator.methods[n].test_set_views is None]
    runner = Runner(StepContext(evaluator, dataset, views, methods=plain))
    own = {n: own_test_set_generators(evaluator.methods[n], evaluator.model.preprocess, seed)
           for n in names if n not in plain}
    for name in names:
        evaluator.methods[name].test_set_seed = int(seed)
    ids = sorted(order)
    for start in range(0, len(ids), max(1, batch_size)):
        chunk = ids[start:start + batch_size]
        good = [item for item in runner.load(chunk) if item.error is None] if plain else []
        if good:
            for name, ctxs in runner.contexts(good, plain).items():
                evaluator.methods[name].observe_test_set(ctxs)
        for name, generators in own.items():
            method = evaluator.methods[name]
            items = [item for item in (load_item(dataset, sid, generators) for sid in chunk) if item.error is None]
            if items:
                method.observe_test_set({key: evaluator.contexts([item.views[key] for item in items],
                                                                 [item.sample_id for item in items], all_views=True,
                                                                 precision=method.precision)
                                         for key in generators})
    for name in names:
        evaluator.methods[name].finish_test_set()
    return names


def own_test_set_generators(method: Any, preprocess: Any, seed: int) -> dict[str, ViewGenerator]:
    """A method's named test-set recipes (`Method.test_set_views`) as view generators of the run's seed, the
    k-th (k = 1, 2, ...) on view seed stream k, so that no two recipes draw the same crops."""
    return {key: ViewGenerator(ViewConfig.from_recipe(recipe), seed=seed, preprocess=preprocess, stream=k)
            for k, (key, recipe) in enumerate(method.test_set_views.items(), start=1)}


def _check_resume(run_dir: Path, old: dict | None, new: dict, dist) -> identity.Resume:
    """identity.check_resume on every rank; all ranks raise together (before anything is touched)."""
    resumed, problem = None, None
    try:
        resumed = identity.check_resume(run_dir, old, new)
    except identity.RunIdentityError as exc:
        problem = str(exc)
    problems = [p for p in distributed.all_gather(dist, problem) if p]
    if problems:
        raise identity.RunIdentityError(problems[0])
    return resumed


def _write_step(ids: list[int], recs: list[Record], writer: record_files.RecordWriter, state: OnlineState | None,
                plan: planning.Plan, online_start: int, progress: _Progress) -> None:
    """Append a step's episodic records one sample at a time; hold online ones back for the checkpoint."""
    for rec in recs:
        if rec.method is not None and rec.error is None and rec.ood is not True:   # OOD samples have no class
            progress.update_method(rec.method, bool(rec.correct))
    online = [r for r in recs if state is not None and r.method in state.methods]
    by_sample: dict[int, list[Record]] = {sid: [] for sid in ids}
    for rec in recs:
        if state is None or rec.method not in state.methods:
            by_sample[rec.id].append(rec)
    for sid in ids:
        writer.write(by_sample[sid])
        progress.step()
    if state is not None:
        state.add([sid for sid in ids if plan.position[sid] >= online_start], online, writer)


def _whole_batches(plan: planning.Plan, pending: list[int]) -> list[int]:
    """`pending` grown to whole batches (blocks of `batch_size` stream positions): a batch method adapts on its
    whole batch, so a batch interrupted half-written is evaluated again whole (the records it already has are
    not written twice)."""
    blocks = {plan.position[sid] // plan.block for sid in pending}
    return [sid for sid in plan.ids if plan.position[sid] // plan.block in blocks]


def _probs_writer(config: RunConfig, run_dir: Path, dist):
    """--save-probs, or a resumed run directory that already holds vectors (its new records get theirs too)."""
    from ..rundir import probs
    if not (config.save_probs or (config.resume and probs.has_probs(run_dir))):
        return None
    return probs.ProbsWriter(run_dir, probs.stem_for(dist.rank, dist.world_size))


def _config_dict(config: RunConfig, model: ClipModel, dataset, run_identity: dict, methods: dict) -> dict:
    cfg = dataclasses.asdict(config)
    cfg["model"] = config.model
    cfg["model_resolved"] = model.name
    cfg["classnames"] = list(dataset.classnames)
    cfg["n_samples"] = len(dataset)
    # samples the dataset's files promise but cannot deliver (a truncated shard, a null cell), run with
    # --allow-partial: said in summary.json, summary.md and the report, never dropped silently
    cfg["dataset_lost"] = list(getattr(dataset, "lost", []))
    # the transductive track (docs/PROTOCOLS.md): what each method reads beyond the current sample and its past
    cfg["reads_ahead"] = {n: m.spec.reads_ahead for n, m in methods.items() if m.spec.reads_ahead}
    # every method's effective config (incl. earlier ones), without the digests of what it read: a later run
    # takes it back as its method_config
    cfg["method_settings"] = {n: identity.method_settings(n, e) for n, e in run_identity["methods"].items()}
    cfg["checkpoint_sha256"] = getattr(model, "checkpoint_sha256", None)   # what published numbers compare by
    cfg["weights_source"] = getattr(model, "weights_source", None)         # ... with where the file came from
    return identity.jsonable(cfg)


class _Progress:
    """tqdm bar with images/s and running top-1 per method."""

    def __init__(self, total: int, methods: Sequence[str], enabled: bool = True):
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, unit="img", disable=not enabled, dynamic_ncols=True)
        self.correct = {m: 0 for m in methods}
        self.count = {m: 0 for m in methods}

    def update_method(self, name: str, correct: bool) -> None:
        self.count[name] += 1
        self.correct[name] += int(correct)

    def step(self) -> None:
        self.bar.update(1)
        post = {m: f"{100 * self.correct[m] / self.count[m]:.1f}" for m in self.count if self.count[m]}
        self.bar.set_postfix(post, refresh=False)

    def close(self) -> None:
        self.bar.close()


_SUBSET_SALT = 0xA77AC5   # keeps the attack subset's draw apart from the run's other seeded draws


def attack_subset_ids(order: Sequence[int], n: int | None, seed: int) -> set[int]:
    """The samples a run with `--attack-subset N` attacks: N of the stream's, drawn without replacement by
    `seed` (the run's --seed) from the sorted ids, so the subset depends only on the samples and the seed,
    not on the stream's order; every sample when N is None or at least the stream's length."""
    ids = sorted(int(i) for i in order)
    if n is None or n >= len(ids):
        return set(ids)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), _SUBSET_SALT]))
    return {ids[i] for i in rng.choice(len(ids), size=n, replace=False)}


def outside_attack_subset(config: RunConfig, order: Sequence[int]) -> set[tuple[int, None, str]]:
    """(sample, None, attacked setting) for every sample of the stream outside the attack subset: the keys
    that mark a sample's setting as done for every method (`records.is_missing`), so that none is computed."""
    if config.attack_subset is None:
        return set()
    attacked = [s for s in config.settings() if s != "clean"]
    keep = attack_subset_ids(order, config.attack_subset, config.seed)
    return {(int(sid), None, s) for s in attacked for sid in order if int(sid) not in keep}


def _attackers(config: RunConfig, model: ClipModel, evaluator: Evaluator):
    """The run's attack (None for a clean run), or {setting: attack} for a list of budgets (one per budget)."""
    if not isinstance(config.attack.get("eps"), list):
        return build_attack(config.attack, model, evaluator.heads.zeroshot)
    budgets = run_settings(config.attack, False)   # the transfer settings: one per budget, in the eps list's order
    return {s: build_attack(one, model, evaluator.heads.zeroshot)
            for s, one in zip(budgets, split_budgets(config.attack))}

