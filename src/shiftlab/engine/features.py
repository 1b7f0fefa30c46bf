"""A run's use of a feature store (shiftlab.rundir.feature_store): what `shiftlab run --features DIR` reads
and writes, and `shiftlab encode`, which fills a store without running methods."""
from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import writes
from ..options import say
from ..rundir.feature_store import FeatureStore, feature_key, file_digest, sample_info
from ..rundir.lock import store_advice
from . import interrupt

if TYPE_CHECKING:
    from ..models import ClipModel
    from .config import RunConfig
    from .run_plan import RunPlan


class RunFeatures:
    """A run's view of a store: the key of each (recipe, precision, view count) it encodes, what it
    reads (`read`) and what it writes (`put`, when `writable`), and the counts the run reports.

    `base` holds the key fields that do not vary within a run (feature_key's keyword arguments
    other than recipe, n_views and precision).

    A sample is the same as the stored one when its content digest is (the dataset's
    `content_digest`: file, webdataset member or parquet cell alike, hashed once per run)."""

    def __init__(self, store: FeatureStore, base: Mapping[str, Any], dataset: Any, writable: bool):
        self.store, self.base, self.dataset, self.writable = store, dict(base), dataset, writable
        self.read_ids: set[int] = set()
        self.encoded_ids: set[int] = set()
        self._digests: dict[int, str | None] = {}

    def _digest(self, sid: int) -> str | None:
        """The sample's content digest, computed once (None: its bytes cannot be read, never served)."""
        if sid not in self._digests:
            # a dataset that wraps another (a corruption made on the fly, an open-set stream) names the file
            # its sample comes from; the key says what was done to it (run.json's corruption)
            digest = getattr(self.dataset, "content_digest", None)
            try:
                self._digests[sid] = digest(sid) if callable(digest) else file_digest(self.dataset.path(sid))
            except (OSError, ValueError):
                self._digests[sid] = None
        return self._digests[sid]

    def _source(self, sid: int) -> str:
        source = getattr(self.dataset, "source", None)
        return source(sid) if callable(source) else str(self.dataset.path(sid))

    def _identity(self, sid: int) -> dict[str, Any]:
        return dict(digest=lambda: self._digest(sid))

    def key(self, recipe: Any, precision: str, n_views: int,
            encoder: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The entry of `n_views` CLIP view features of `recipe`, or (`encoder`: a method's own frozen encoder's
        identity) of that encoder's output of view 0."""
        return feature_key(recipe=recipe, precision=precision, n_views=n_views, encoder=encoder, **self.base)

    def served(self, ids: Sequence[int], keys: Sequence[Mapping[str, Any]]) -> set[int]:
        """The ids whose features are stored under every key (and whose files are unchanged)."""
        if not keys:
            return set()
        entries = [self.store.entry(k) for k in keys]
        return {sid for sid in ids if all(e.has(sid, **self._identity(sid)) for e in entries)}

    def read(self, key: Mapping[str, Any], sid: int) -> torch.Tensor | None:
        feats = self.store.entry(key).features(sid, **self._identity(sid))
        if feats is not None:
            self.read_ids.add(sid)
        return feats

    def put(self, key: Mapping[str, Any], sid: int, features: torch.Tensor) -> None:
        self.encoded_ids.add(sid)
        if self.writable:
            info = sample_info(self._source(sid), self._digest(sid), self.dataset.label(sid))
            self.store.put(key, sid, None, features, info=info)

    def close(self, failing: BaseException | None = None) -> None:
        """Write the features still buffered and release the lock. While `failing` (the exception a run
        is leaving with) is in flight, a store that cannot be written adds no second error: the first
        failure is the one said."""
        try:
            self.store.close()
        except OSError:
            if failing is None:
                raise

    def line(self) -> str:
        read = len(self.read_ids - self.encoded_ids)
        enc = len(self.encoded_ids)
        verb = "encoded and stored" if self.writable else "encoded (store read-only)"
        return f"shiftlab: features: {read} sample(s) read from the store {self.store.root}, {enc} {verb}"


def encode(config: RunConfig, model: ClipModel | None = None, dataset: Any = None,
           plan: RunPlan | None = None) -> dict[str, int]:
    """Fill `config.features` with the clean view features a run of `config` would encode (every
    recipe family and precision of `config.methods`), running no method: `shiftlab encode`. `plan`: the plan
    of a run of `config` (`engine.run_plan`, as the CLI's checks resolved it), else resolved here.
    Returns {"samples", "stored_before", "encoded", "errors"}."""
    import dataclasses

    from torch.utils.data import DataLoader

    from ..methods.catalogue.method_config import method_spec
    from ..rundir import identity
    from ..version import __version__
    from . import distributed
    from .config import check_run_config, expand_methods, resolve_device, resolve_workers, run_stream
    from .prepare import prepare
    from .run_plan import resolve_plan
    from .shifts import run_dataset
    from .step import Evaluator, Runner, StepContext, ViewDataset, collate, view_generators
    config = check_run_config(config)
    if not config.features:
        raise ValueError(f"encode needs a feature store directory ({say('features')})")
    dist = distributed.context()
    device = resolve_device(config.device)
    # a copy: the caller's config is not changed; methods that need pixels have nothing to store
    names = expand_methods(config.methods, config.model, config.method_config, run=config)
    kept = [n for n in names if not method_spec(n).needs_pixels]
    if plan is not None and plan.config == dataclasses.replace(config, methods=names):
        plan = plan.only(kept)   # the run's plan without them: nothing resolved again
    else:
        plan = resolve_plan(dataclasses.replace(config, methods=kept))
    config = plan.config
    if dataset is None or model is None:   # as `shiftlab encode` starts (its methods' own models are not needed)
        given = {config.dataset: dataset} if dataset is not None else None
        prepared = prepare(config, [config.dataset], model=model, given=given, method_models=False)
        model, dataset = prepared.model, prepared.datasets[config.dataset]
    model = model.to(device)
    dataset = run_dataset(config, dataset)   # its corruption and OOD images (engine/shifts.py)
    evaluator = Evaluator.for_run(plan, model, dataset.classnames)
    order = run_stream(config, dataset)
    run_identity = identity.build(config, model, dataset, evaluator.methods, __version__)
    store = open_run_features(config, dist, dataset, model, run_identity)
    if store is None or not store.writable:
        raise FileExistsError(f"{config.features} is being written by another process; try again when it is done")
    runner = Runner(StepContext(evaluator, dataset, view_generators(evaluator.methods, model.preprocess, config.seed),
                                settings=["clean"], features=store))
    before = store.served(order, runner.store_keys())
    todo = [sid for i, sid in enumerate(order) if sid not in before and i % dist.world_size == dist.rank]
    workers = resolve_workers(config.workers, device, dist)
    loader = DataLoader(ViewDataset(dataset, todo, runner.recipes), batch_size=config.batch_size,
                        num_workers=workers, collate_fn=collate, prefetch_factor=4 if workers > 0 else None,
                        worker_init_fn=interrupt.ignore_in_worker)
    errors = 0
    try:
        for batch in loader:
            errors += runner.fill_store(batch)
    finally:
        store.close(failing=sys.exc_info()[1])
        evaluator.close()
    return {"samples": len(order), "stored_before": len(before), "encoded": len(store.encoded_ids),
            "errors": errors}


def open_run_features(config: RunConfig, dist: Any, dataset: Any, model: ClipModel,
                      run_identity: dict) -> RunFeatures | None:
    """The run's feature store: written by this job (rank 0 holds its lock, every rank writes its own
    shards) unless another process writes it, then only read."""
    from ..rundir.lock import RunLockedError
    from .distributed import acquire_for_job
    root = Path(config.features)
    shared = run_identity["shared"]
    base = {"samples_sha256": shared["samples_sha256"], "model": model, "seed": config.seed,
            "checkpoint_sha256": shared["checkpoint_sha256"], "weights_sha256": shared["weights_sha256"],
            "storage": config.features_dtype}
    if shared.get("corruption"):   # the same paths hold other pixels: a corrupted image's features are its own
        base["corruption"] = shared["corruption"]
    try:
        writes.make_dirs(root, store_advice())
        lock = acquire_for_job(root, dist, purpose="feature store")
        store = FeatureStore(root, "w", rank=dist.rank, lock=lock if lock is not None else False)
        writable = True
    except RunLockedError as exc:
        print(f"shiftlab: warning: {exc}; reading the feature store without adding to it", file=sys.stderr)
        store = FeatureStore(root, "r") if (root / "store.json").is_file() else None
        writable = False
    if store is None:
        return None
    return RunFeatures(store, base, dataset, writable)
