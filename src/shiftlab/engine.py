"""The evaluation loop: one pass over a dataset for many methods.

Per sample: decode -> views (DataLoader workers, uint8) -> [attack] -> the image
tower once for all views (batched across samples) -> every requested method ->
one record per (sample, method, setting), appended and flushed per sample.

Resumable (records already present are skipped), deterministic (views seeded per
sample), shardable (torchrun: ranks take blocks of the stream, see docs/SCALE_OUT.md).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from . import distributed, results
from .context import ClassHeads, SampleContext
from .imageio import ImageDecodeError, decode_image
from .methods import Method, create_method, get_method_class, list_methods
from .methods.base import MethodOutput
from .models import ClipModel
from .precision import resolve as resolve_precision
from .views import ViewConfig, ViewGenerator


@dataclass
class RunConfig:
    dataset: str = "imagenet-r"
    data: str = ""
    model: str = "RN50"
    pretrained: str | None = "openai"
    cache_dir: str | None = None     # weights cache, download and trust: see models.load_model
    download: bool = False
    trust_checkpoint: bool = False
    methods: list[str] = field(default_factory=lambda: ["zeroshot"])
    method_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    views: int = 64
    augmix: bool = False
    seed: int = 0
    limit: int | None = None
    out: str = "runs/run"
    resume: bool = False
    device: str = "auto"
    workers: int = -1                # DataLoader workers; -1: auto (see resolve_workers)
    batch_size: int = 8              # samples per engine step (shared encoding, batched tuning)
    order: str = "shuffled"          # stream order: "shuffled" (seeded by `seed`) or "sorted"
    attack: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    clean_and_robust: bool = False
    classnames: list[str] | None = None
    progress: bool = True
    precision: str = "auto"          # auto: fp16 autocast on CUDA, float32 on CPU; fp32 | fp16 | bf16
    online_checkpoint_seconds: float = 60.0   # online state + records checkpoint interval (0: every batch)

    def settings(self) -> list[str]:
        name = self.attack.get("name", "none")
        if name == "none":
            return ["clean"]
        return ["clean", name] if self.clean_and_robust else [name]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_workers(workers: int, device: torch.device, dist=None) -> int:
    """-1 -> on CUDA most of this process's share of the CPU cores (decoding and 64 crops per image
    must keep a GPU fed); on CPU one worker, leaving the cores to the model."""
    if workers >= 0:
        return workers
    import os
    per_process = (os.cpu_count() or 2) // max(1, getattr(dist, "local_world_size", 1))
    return max(1, min(16, per_process - 1)) if device.type == "cuda" else 1


def expand_methods(names: Sequence[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        for n in (list_methods() if name == "all" else [name]):
            get_method_class(n)
            if n not in out:
                out.append(n)
    return out


def stream_order(n: int, order: str, seed: int) -> list[int]:
    if order == "sorted":
        return list(range(n))
    if order != "shuffled":
        raise ValueError(f"order must be 'shuffled' or 'sorted', got {order!r}")
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randperm(n, generator=gen).tolist()


class ViewDataset(Dataset):
    """Sample id -> (id, uint8 views or None, error or None); runs in DataLoader workers."""

    def __init__(self, dataset, ids: Sequence[int], views: ViewGenerator):
        self.dataset, self.ids, self.views = dataset, list(ids), views

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        sid = self.ids[i]
        try:
            img = decode_image(self.dataset.path(sid))
            return sid, self.views(img, sid), None
        except ImageDecodeError as exc:
            return sid, None, str(exc)
        except Exception as exc:  # a view or resize failure must not stop the run
            return sid, None, f"{type(exc).__name__}: {exc}"


def _collate(batch):
    return batch


def prediction_record(out: MethodOutput, label: int) -> dict[str, Any]:
    probs = out.probabilities().detach().float().cpu()
    top5 = probs.topk(min(5, probs.numel())).indices.tolist()
    pred = int(out.logits.detach().float().argmax())
    return {"pred": pred, "top5": top5, "confidence": float(probs.max()),
            "true_prob": float(probs[label]), "correct": pred == label, "extras": out.extras}


class Evaluator:
    """Holds model, class heads and method instances; turns batches of views into records."""

    def __init__(self, model: ClipModel, classnames: Sequence[str], method_names: Sequence[str],
                 method_config: dict[str, dict] | None = None, precision: str = "auto"):
        self.model = model
        self.classnames = list(classnames)
        self.heads = ClassHeads(model, classnames)
        self.precision = resolve_precision(precision, model.device)   # the image tower's
        method_config = method_config or {}
        self.methods: dict[str, Method] = {
            n: create_method(n, model, classnames, heads=self.heads, run_precision=precision,
                             **method_config.get(n, {}))
            for n in method_names}
        self.needs_views = any(m.needs_views for m in self.methods.values())
        for method in self.methods.values():
            method.prepare()
        self.encode_seconds = 0.0

    def contexts(self, views_u8: list[torch.Tensor], ids: list[int]) -> list[SampleContext]:
        """Normalise on the device and encode all samples' views in one pass."""
        t0 = time.perf_counter()
        dev = self.model.device
        stacked = torch.cat([v if self.needs_views else v[:1] for v in views_u8]).to(dev, non_blocking=True)
        x = self.model.normalize(stacked.float().div_(255))
        feats = self.model.encode_views(x, self.precision)
        n = x.shape[0] // len(views_u8)
        ctxs = [SampleContext(self.model, self.heads, x[i * n:(i + 1) * n], image_features=feats[i * n:(i + 1) * n],
                              sample_id=sid, precision=self.precision) for i, sid in enumerate(ids)]
        self.encode_seconds += time.perf_counter() - t0
        return ctxs

    def predict(self, name: str, ctxs: list[SampleContext]) -> tuple[list[MethodOutput], float]:
        method = self.methods[name]
        t0 = time.perf_counter()
        if method.episodic:
            outs = method.predict_batch(ctxs)
        else:  # online: one sample at a time, in stream order
            outs = [method.predict_context(c) for c in ctxs]
        return outs, (time.perf_counter() - t0) / max(len(ctxs), 1)


def run(config: RunConfig, model: ClipModel | None = None, dataset=None) -> dict:
    """Evaluate `config.methods` over the dataset; returns the summary dict."""
    from .datasets import build_dataset
    from .published import published_for_run

    dist = distributed.context()
    device = resolve_device(config.device)
    if dist.world_size > 1 and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    config.methods = expand_methods(config.methods)
    online_names = [n for n in config.methods if not get_method_class(n).episodic]
    if online_names and len(config.settings()) > 1:  # one state would adapt along both streams, interleaved by batch
        raise ValueError(f"online methods ({', '.join(online_names)}) adapt along one stream; with "
                         "--clean-and-robust they would mix clean and attacked samples. Run them without it "
                         "(once clean, once with --attack) or drop them from --methods")
    if dataset is None:
        dataset = build_dataset(config.dataset, config.data, classnames=config.classnames)
    if model is None:
        from .models import load_run_model
        model = load_run_model(config, device)
    model = model.to(device)
    run_dir = Path(config.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    done = distributed.prior_records(run_dir, config.resume, dist)  # all ranks read before any writes

    evaluator = Evaluator(model, dataset.classnames, config.methods, config.method_config, config.precision)
    settings = config.settings()
    order = stream_order(len(dataset), config.order, config.seed)
    if config.limit is not None:
        order = order[:config.limit]
    plan = distributed.plan(order, dist, evaluator.methods, block=config.batch_size)  # online: rank 0, whole stream
    online = list(plan.online)
    pending = plan.pending(settings, done)

    views = ViewGenerator(ViewConfig(n_views=config.views if evaluator.needs_views else 1, augmix=config.augmix),
                          seed=config.seed, preprocess=model.preprocess)
    attacker = None
    if config.attack.get("name", "none") != "none":
        from .attacks import build_attack
        attacker = build_attack(config.attack, evaluator)
    writer = results.RecordWriter(distributed.records_path(run_dir, dist))
    state = None
    if online:
        state = distributed.OnlineState(run_dir, {n: evaluator.methods[n] for n in online},
                                        every_seconds=config.online_checkpoint_seconds)
        if config.resume:
            state.load(stream=order)
            state.restore_missing(writer, done)
            pending = plan.pending(settings, done)
    workers = resolve_workers(config.workers, device, dist)
    loader = DataLoader(ViewDataset(dataset, pending, views), batch_sampler=plan.batches(pending),
                        num_workers=workers, collate_fn=_collate, pin_memory=device.type == "cuda",
                        prefetch_factor=4 if workers > 0 else None,
                        persistent_workers=False)
    progress = _Progress(len(pending), config.methods, enabled=config.progress and dist.rank == 0)
    t_start = time.perf_counter()
    try:
        for batch in loader:
            _process_batch(batch, dataset, evaluator, settings, done, attacker, views, writer, progress, state,
                           plan)
        if state is not None:
            state.flush(writer)
    finally:
        writer.close()
        progress.close()
    wall = time.perf_counter() - t_start

    timings = distributed.gather_timings(dist, run_dir, wall, len(pending), evaluator.encode_seconds)
    if timings is None:  # not rank 0 (or rank 0 cannot see every shard: merge later)
        return {}
    results.merge_records(run_dir)
    cfg = _config_dict(config, model, dataset)
    summary = results.summarize(results.load_records(run_dir), cfg, timings)
    md = results.write_summary(run_dir, summary, published_for_run(summary))
    if config.progress:
        print(md)
    return summary


def _missing(sid: int, method: str, setting: str, done: set) -> bool:
    return (sid, method, setting) not in done and (sid, None, setting) not in done


def _process_batch(batch, dataset, evaluator: Evaluator, settings, done, attacker, views, writer, progress, state,
                   plan=None):
    good = [(sid, v) for sid, v, err in batch if err is None]
    per_sample: dict[int, list[dict]] = {sid: [] for sid, _, _ in batch}
    for sid, _, err in batch:
        if err is not None:
            for setting in settings:
                per_sample[sid].append(_base(dataset, sid, setting) | {"method": None, "error": err})
    if good:
        for setting in settings:
            ids = [sid for sid, _ in good]
            vs = [v for _, v in good]
            attack_info: dict[int, dict] = {}
            if setting != "clean":
                vs, attack_info = attacker.perturb(ids, vs, [dataset.label(s) for s in ids], views)
            ctxs = evaluator.contexts(vs, ids)
            for name in evaluator.methods:
                todo = [i for i, sid in enumerate(ids)
                        if (plan is None or plan.owns(sid, name)) and _missing(sid, name, setting, done)]
                if not todo:
                    continue
                try:
                    outs, secs = evaluator.predict(name, [ctxs[i] for i in todo])
                except Exception as exc:  # one method failing must not lose the others' records
                    for i in todo:
                        per_sample[ids[i]].append(_base(dataset, ids[i], setting) |
                                                  {"method": name, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                for i, out in zip(todo, outs):
                    sid = ids[i]
                    rec = _base(dataset, sid, setting) | {"method": name, "seconds": secs}
                    rec |= prediction_record(out, dataset.label(sid))
                    if sid in attack_info:
                        rec["attack"] = attack_info[sid]
                    per_sample[sid].append(rec)
                    progress.update_method(name, rec["correct"])
    if state is not None:
        online = [r for recs in per_sample.values() for r in recs if r.get("method") in state.methods]
        for sid in per_sample:
            per_sample[sid] = [r for r in per_sample[sid] if r.get("method") not in state.methods]
    for sid, _, _ in batch:
        writer.write(per_sample[sid])
        progress.step()
    if state is not None:
        state.add([sid for sid, _, _ in batch], online, writer)


def _base(dataset, sid: int, setting: str) -> dict:
    return {"id": sid, "path": dataset.samples[sid][0], "label": dataset.label(sid), "setting": setting}


def _config_dict(config: RunConfig, model: ClipModel, dataset) -> dict:
    cfg = dataclasses.asdict(config)
    cfg["model"] = config.model
    cfg["model_resolved"] = model.name
    cfg["classnames"] = list(dataset.classnames)
    cfg["n_samples"] = len(dataset)
    cfg["method_settings"] = {}
    cfg["checkpoint_sha256"] = getattr(model, "checkpoint_sha256", None)   # what published numbers compare by
    return cfg


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
