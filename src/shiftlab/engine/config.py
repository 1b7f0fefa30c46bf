"""`RunConfig`: everything a run is asked to do; the devices, workers and method list it resolves to."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..attacks import attack_config
from ..methods.base import get_method_class, list_methods
from ..methods.protocols import DEFAULT_PROTOCOL
from ..rundir import records
from . import distributed


@dataclass
class RunConfig:
    dataset: str = "imagenet-r"
    data: str = ""
    model: str = "RN50"
    pretrained: str | None = "openai"
    cache_dir: str | None = None     # weights cache, download and trust: see models.load_model
    download: bool = False
    trust_checkpoint: bool = False
    model_seed: int | None = None    # random weights' seed (pretrained None); None: `seed` (models.run_model_seed)
    methods: list[str] = field(default_factory=lambda: ["zeroshot"])
    method_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    protocol: str = DEFAULT_PROTOCOL    # each method's views, text head and precision (shiftlab.methods.protocols)
    views: int | None = None         # views per image for every view-reading method (None: each method's recipe)
    augmix: bool = False             # AugMix on every view-reading method's augmented views (as --set M.views=...)
    seed: int = 0
    limit: int | None = None
    out: str = "runs/run"
    resume: bool = False
    device: str = "auto"
    workers: int = -1                # DataLoader workers; -1: auto (see resolve_workers)
    # samples per engine step (shared encoding, batched tuning) and, for a method that adapts on batches
    # (`Method.adapts_on_batches`), the batch B of the episodic-batch protocol (docs/PROTOCOLS.md)
    batch_size: int = 8
    # the stream kind (shiftlab.rundir.stream): "shuffled" (i.i.d., seeded by `seed`; "iid" says the same),
    # "sorted", "class-sorted" or "dirichlet" (label shift of concentration `delta`)
    order: str = "shuffled"
    delta: float | None = None       # the dirichlet stream's concentration (RoTTA: 0.1; ImageNet-C runs 0.01)
    orders: int = 1                  # K seeded orders of the same samples (engine.orders; OGA's 100 runs)
    stream_seed: int | None = None   # the stream's seed (None: `seed`); `--orders` sets one per order
    # {"name": an attack, and any of its config fields}; the run fills the rest (shiftlab.attacks.attack_config)
    attack: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    clean_and_robust: bool = False
    classnames: list[str] | None = None
    progress: bool = True
    precision: str = "auto"          # auto: fp16 autocast on CUDA, float32 on CPU; fp32 | fp16 | bf16
    online_checkpoint_seconds: float = 60.0   # online state + records checkpoint interval (0: every batch)
    save_probs: bool = False         # float16 probability vectors in probs/ (shiftlab.rundir.probs); kept on --resume
    features: str | None = None      # a feature store directory (shiftlab.rundir.feature_store): read, and fill
    features_dtype: str = "fp16"     # storage of new entries: fp16 (half the bytes, ~1e-3 off) | fp32 (exact)

    def run_views(self) -> dict[str, Any]:
        """What --views and --augmix set on every view-reading method's recipe ({} when neither is given)."""
        return ({"n_views": self.views} if self.views is not None else {}) | ({"augmix": True} if self.augmix else {})

    def canonical_dataset(self) -> str | None:
        """The registry's name for `dataset` (the key of its per-dataset method settings); None if unknown."""
        from ..datasets.specs import DATASETS
        return DATASETS.canonical(self.dataset) if self.dataset in DATASETS else None

    def stream_seed_used(self) -> int:
        """The seed of this run's stream order (the views stay seeded by `seed`)."""
        return self.seed if self.stream_seed is None else self.stream_seed

    def settings(self) -> list[str]:
        return records.run_settings(self.attack, self.clean_and_robust)


def settings_problem(config: RunConfig, datasets: Sequence[str] | None = None) -> str | None:
    """The first reason a run of `config` cannot work, as one line, or None: an attack config its attack
    refuses, online methods with --clean-and-robust, or a method whose effective config (defaults <- the
    protocol, with its values for each of `datasets` (default: the run's) <- --views/--augmix <- --set) is
    refused, e.g. MTA under --views 4. The CLI asks before it loads anything; `engine.loop.run` before it
    touches the run directory."""
    from ..datasets.specs import DATASETS
    from ..methods.base import effective_config
    from ..rundir.stream import stream_problem
    names = expand_methods(config.methods)
    problem = stream_problem(config.order, config.delta, config.orders)
    if problem:
        return problem
    online = [n for n in names if not get_method_class(n).episodic]
    if online and len(config.settings()) > 1:   # one state would adapt along both streams, interleaved by batch
        return (f"--clean-and-robust: online methods ({', '.join(online)}) adapt along one stream and would mix "
                "clean and attacked samples; run them once clean and once with --attack, or leave them out of "
                "--methods")
    try:
        attack_config(config.attack)
    except (TypeError, ValueError) as exc:
        return f"attack: {exc}"
    for dataset in datasets or [config.dataset]:
        canonical = DATASETS.canonical(dataset) if dataset in DATASETS else None
        for name in names:
            try:
                effective_config(name, config.protocol, canonical, config.precision, config.run_views(),
                                 **(config.method_config or {}).get(name, {}))
            except (TypeError, ValueError) as exc:
                return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return None


def run_stream(config: RunConfig, dataset: Any) -> list[int]:
    """The sample ids of a run in stream order (its kind, delta and stream seed), cut at `limit`."""
    from ..rundir.stream import canonical_kind, stream_order
    labels = None if canonical_kind(config.order) in ("shuffled", "sorted") else [lab for _, lab in dataset.samples]
    order = stream_order(len(dataset), config.order, config.stream_seed_used(), labels=labels, delta=config.delta)
    return order if config.limit is None else order[:config.limit]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_workers(workers: int, device: torch.device, dist: distributed.DistContext | None = None) -> int:
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
