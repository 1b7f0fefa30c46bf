"""CLIP models over open_clip: loading, freezing, preprocessing facts, normalisation inside.

`load_model` is the one loader (library, CLI and `engine.run` all call it). It returns a
`ClipModel` that carries the preprocessing open_clip publishes for its weights (input
size, mean/std, resize mode and interpolation), so model and views cannot drift apart,
and the SHA-256 of the weights file it read. The model takes images in [0, 1];
normalisation is its first layer, which is what lets attacks work in pixel space.

Where weights come from (`pretrained`), decided by these rules and nothing else:
- None (or "none"/"random", the command line's spelling): random weights, a function of `seed` alone (built
  under their own seeded CPU generator state, so the same bytes in every process and on every rank, whatever
  ran before; the global RNG state is left as it was). `ClipModel.weights_sha256` is their digest (`state_dict_sha256`).
- "hf-hub:ORG/REPO": the open_clip checkpoint of that Hugging Face repository, with the
  preprocessing of its open_clip_config.json.
- "file:PATH": the checkpoint file PATH, which must exist.
- a tag open_clip lists for the model (`open_clip.list_pretrained_tags_by_model(name)`),
  e.g. "openai": read from the cache, else downloaded (as open_clip does; `allow_download=False` refuses
  instead, and the command line downloads only with --download). Without a network the download is
  refused in one line, decided by a name lookup before any connection.
- anything else: a path to an existing checkpoint file; otherwise an error says it is
  neither a tag of the model nor a file.
The architecture is always the one named: a checkpoint whose tensors do not fit it is
refused, naming both.

A checkpoint holding only an image tower (FARE's and TeCoA's published .pt files, R-TPT's TeCoA RN50
`{"vision_encoder_state_dict": ...}`: the keys of `clip.visual`, no `visual.` prefix) replaces the image
tower of the base CLIP `base_pretrained` names (read by the same rules; its text tower, logit scale and
preprocessing are kept), as R-TPT and RobustVLM load them over OpenAI's CLIP. Without `base_pretrained`
such a file is refused in one line. `ClipModel.checkpoint_sha256` is then the image tower file's digest and
`ClipModel.base_checkpoint_sha256` the base's.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..options import say
from ..views.preprocess import OPENAI_PREPROCESS, Preprocess
from .architectures import (
    _check_fits,
    _create,
    _is_openai_state_dict,
    _known_model,
    _quickgelu_name,
    _register_builtin,
    model_preprocess,
    register_architecture,
)
from .checkpoints import (
    OPENAI_SCALARS,
    ModelLoadError,
    cached_tag_file,
    check_finite,
    read_checkpoint,
    require_network,
    sha256_file,
    weights_source,
)
from .clip_model import ClipModel, state_dict_sha256

__all__ = ["is_random_weights", "load_model", "load_run_model", "run_model_seed", "state_dict_sha256"]




SEED_RANGE = (-(2 ** 63), 2 ** 64)   # what torch.Generator.manual_seed accepts (negative values wrap)


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {seed!r}")
    return seed


@contextmanager
def _seeded_cpu_rng(seed: int) -> Iterator[None]:
    """The CPU generator seeded with `seed` inside, restored after: module initialisation draws from it
    (open_clip's init takes no generator). Only the CPU generator: the model is built on the CPU, and
    `torch.manual_seed` would also reseed every CUDA generator for good."""
    state = torch.get_rng_state()
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(state)


RANDOM_WEIGHTS = ("none", "random")   # `pretrained` spellings of random weights, as --pretrained takes them


def is_random_weights(pretrained: object) -> bool:
    """Whether `pretrained` asks for random weights: None, or "none"/"random" in any case."""
    return pretrained is None or (isinstance(pretrained, str) and pretrained.strip().lower() in RANDOM_WEIGHTS)


def _resolve(name: str, pretrained: str) -> tuple[str, str]:
    """-> (kind, value): ("hf-hub", repo), ("file", path) or ("tag", tag), by the module docstring's rules."""
    import open_clip
    if pretrained.startswith("hf-hub:"):
        repo = pretrained[len("hf-hub:"):].strip("/")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise ModelLoadError(f"{say('pretrained')}{pretrained!r}: expected hf-hub:ORG/REPO")
        return "hf-hub", repo
    if pretrained.startswith("file:"):
        return "file", pretrained[len("file:"):]
    tags = open_clip.list_pretrained_tags_by_model(name)
    path = Path(pretrained).expanduser()
    if pretrained not in tags and path.is_file():
        return "file", pretrained
    _known_model(name)
    if pretrained in tags:
        return "tag", pretrained
    if os.sep in pretrained or path.suffix:
        raise ModelLoadError(f"checkpoint file {path} does not exist (and {pretrained!r} is not a pretrained tag "
                             f"of {name})")
    raise ModelLoadError(f"unknown pretrained tag {pretrained!r} for model {name!r}; known tags: {tags or 'none'}; "
                         "a checkpoint file must exist (write file:PATH to say so), or use hf-hub:ORG/REPO")


def _download(what: str, where: str, fetch) -> Path:
    require_network(where)
    try:
        return Path(fetch())
    except Exception as exc:  # network and hub errors come in many types; each is one line to the user
        raise ModelLoadError(f"downloading {what} failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                             f"download {where} by hand or pass {say('pretrained_file')}") from exc


def _hf_hub_files(repo: str, cache_dir: str | None, allow_download: bool) -> tuple[Path, dict[str, Any]]:
    """(weights file, preprocess config) of an open_clip repository on the Hugging Face hub."""
    from open_clip.pretrained import download_pretrained_from_hf

    from .checkpoints import WEIGHT_FILES, hf_snapshot_files
    cached = [p for p in hf_snapshot_files(repo, WEIGHT_FILES, cache_dir) if p.is_file()]
    if cached:
        weights = cached[0]
    elif allow_download:
        weights = _download(f"hf-hub:{repo}", f"the Hugging Face repository {repo}",
                            lambda: download_pretrained_from_hf(repo, cache_dir=cache_dir))
    else:
        raise ModelLoadError(f"weights hf-hub:{repo} are not in the Hugging Face cache and downloading was not "
                             f"requested; pass {say('download')}, or `hf download {repo}`")
    config_file = weights.parent / "open_clip_config.json"
    cfg = json.loads(config_file.read_text()) if config_file.is_file() else {}
    return weights, cfg.get("preprocess_cfg", {})


def load_model(name: str = "RN50", pretrained: str | None = "openai", *, device: str | torch.device = "cpu",
               cache_dir: str | None = None, allow_download: bool = True, trust_checkpoint: bool = False,
               model_config: dict | str | Path | None = None, seed: int = 0,
               base_pretrained: str | None = None) -> ClipModel:
    """Load a frozen CLIP model in eval mode with normalisation inside (rules: module docstring).

    `model_config` registers a custom architecture under `name` first (`register_architecture`).
    A checkpoint in OpenAI's key layout builds the QuickGELU variant of `name`, as OpenAI trained.
    `seed` decides random weights (`pretrained=None`, "none" or "random") and nothing else. Weights not in
    the cache are downloaded unless `allow_download=False` (the command line's default: --download asks).
    `base_pretrained`: the CLIP whose text tower completes a checkpoint holding only an image tower (module
    docstring); ignored for a checkpoint that holds a whole CLIP.
    """
    import open_clip
    _register_builtin()
    if model_config is not None:
        register_architecture(name, model_config)
    if is_random_weights(pretrained):
        seed = _check_seed(seed)
        _known_model(name)
        with _seeded_cpu_rng(seed):
            clip = _create(name, quick_gelu=False)
        return _finish(clip, name, None, model_preprocess(name), None, device, seed=seed)
    kind, value = _resolve(name, str(pretrained))
    if kind == "hf-hub":
        _known_model(name)
    if kind == "tag":
        tag_cfg = open_clip.get_pretrained_cfg(name, value)
        arch = _quickgelu_name(name, bool(tag_cfg.get("quick_gelu")))
        local, where = cached_tag_file(open_clip.get_pretrained_cfg(arch, value) or tag_cfg, cache_dir)
        if local is None:
            if not allow_download:
                raise ModelLoadError(
                    f"weights {name}/{value} are not in the cache and downloading was not requested. "
                    f"Download {where}; or pass {say('download')} on a machine with internet; "
                    f"or pass {say('pretrained_file')}.")
            local = _download(f"{name}/{value}", where, lambda: open_clip.download_pretrained(
                open_clip.get_pretrained_cfg(arch, value) or tag_cfg, cache_dir=cache_dir))
        return _load_file(arch, local, trust_checkpoint, model_preprocess(arch, value), value, device)
    if kind == "hf-hub":
        weights, pp = _hf_hub_files(value, cache_dir, allow_download)
        from open_clip.transform import PreprocessCfg, merge_preprocess_dict
        return _load_file(name, weights, trust_checkpoint, merge_preprocess_dict(PreprocessCfg(), pp),
                          str(pretrained), device)
    path = Path(value).expanduser()
    sd, openai_release = read_checkpoint(path, trust_checkpoint)
    if _is_image_tower(sd):
        def base() -> ClipModel:
            return load_model(name, base_pretrained, cache_dir=cache_dir, allow_download=allow_download,
                              trust_checkpoint=trust_checkpoint)
        return _load_image_tower(name, path, sd, base_pretrained, base, str(pretrained), device)
    return _load_file(name, path, trust_checkpoint, None, str(pretrained), device, (sd, openai_release))


def _is_image_tower(sd: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict is `clip.visual`'s alone: the stem every CLIP image tower (ViT, ModifiedResNet)
    starts with at its top level, and none of the text tower's own keys (a ViT tower has a `transformer` too)."""
    return "conv1.weight" in sd and not any(
        k.startswith(("visual.", "token_embedding.", "ln_final.")) or k in ("text_projection", "logit_scale")
        for k in sd)


def _load_image_tower(name: str, path: Path, sd: dict[str, torch.Tensor], base_pretrained: str | None, base,
                      label: str, device: str | torch.device) -> ClipModel:
    if base_pretrained is None or is_random_weights(base_pretrained):
        raise ModelLoadError(
            f"{path} holds only an image tower ({len(sd)} tensors, as FARE and TeCoA publish them); name the CLIP "
            f"whose text tower completes it with {say('base_pretrained')} (e.g. openai, as R-TPT and RobustVLM do)")
    check_finite(path, sd)
    try:
        model = base()
    except ModelLoadError as exc:
        raise ModelLoadError(f"the base CLIP of {path} ({say('base_pretrained')}{base_pretrained}): {exc}") from exc
    visual = model.clip.visual
    _check_fits(visual, sd, f"{model.name}'s image tower", path)
    visual.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, strict=False)
    sha = sha256_file(path)
    model.pretrained = label
    model.base_pretrained, model.base_checkpoint_sha256 = str(base_pretrained), model.checkpoint_sha256
    model.checkpoint_sha256, model.weights_source = sha, weights_source(path, sha)
    return model.to(device)


def _load_file(name: str, path: Path, trust_checkpoint: bool, preprocess: dict[str, Any] | None, label: str,
               device: str | torch.device, read: tuple[dict, bool] | None = None) -> ClipModel:
    sd, openai_release = read or read_checkpoint(path, trust_checkpoint)
    check_finite(path, sd)
    _known_model(name, (path, sd))
    openai_layout = _is_openai_state_dict(sd)
    arch = _quickgelu_name(name, openai_layout)
    clip = _create(arch, quick_gelu=openai_layout)
    sd = {k: v for k, v in sd.items() if k not in OPENAI_SCALARS}
    _check_fits(clip, sd, name, path)
    # Reload in float32: OpenAI's fp16 files are exact in float32, a float32 file is not rounded.
    clip.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, strict=False)
    if preprocess is None:
        preprocess = OPENAI_PREPROCESS if openai_release else model_preprocess(arch)
    sha = sha256_file(path)
    return _finish(clip, arch, label, preprocess, sha, device, weights_source(path, sha))


def _finish(clip: nn.Module, name: str, label: str | None, preprocess: dict[str, Any], sha: str | None,
            device: str | torch.device, source: str | None = None, seed: int | None = None) -> ClipModel:
    clip = clip.float()
    size = clip.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    model = ClipModel(clip, name, label, Preprocess.from_open_clip(preprocess, int(size)), checkpoint_sha256=sha,
                      weights_source=source, weights_seed=seed)
    return model.to(device).eval()


_SHARED: dict[tuple, ClipModel] = {}


def _device_key(device: str | torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def load_shared_model(name: str, pretrained: str | None, *, device: str | torch.device = "cpu", seed: int = 0,
                      cache_dir: str | None = None, allow_download: bool = False,
                      trust_checkpoint: bool = False) -> ClipModel:
    """`load_model`, once per process for each (name, pretrained, random-weight seed, device): a CLIP that
    a method loads besides the run's model (RLCF's reward model), frozen and in eval mode like every
    model here. `shiftlab run` loads it first with the run's weight flags (--download, --cache-dir,
    --trust-checkpoint), before any work, so that a missing one is refused there; the method then finds
    it here. A checkpoint file is keyed by its path, size and modification time too, so a file replaced
    on disk is read again."""
    stamp = None
    path = os.path.expanduser(str(pretrained).removeprefix("file:")) if pretrained is not None else ""
    if os.path.isfile(path):
        st = os.stat(path)
        stamp = (st.st_size, st.st_mtime_ns)
    random = is_random_weights(pretrained)
    key = (name, None if random else pretrained, seed if random else None, stamp, _device_key(device))
    if key not in _SHARED:
        _SHARED[key] = load_model(name, pretrained, device=device, cache_dir=cache_dir, allow_download=allow_download,
                                  trust_checkpoint=trust_checkpoint, seed=seed)
    return _SHARED[key]


def run_model_seed(config: Any) -> int:
    """The seed of a run's random weights: `config.model_seed`, else the run's `config.seed`."""
    seed = getattr(config, "model_seed", None)
    return int(getattr(config, "seed", 0) or 0) if seed is None else seed


def load_run_model(config: Any, device: str | torch.device) -> ClipModel:
    """The model of a run (CLI and `engine.run(model=None)`): reads `config.model`, `.pretrained`,
    `.cache_dir`, `.download`, `.trust_checkpoint`, `.base_pretrained` and, for random weights,
    `run_model_seed(config)`."""
    return load_model(config.model, config.pretrained, device=device, cache_dir=getattr(config, "cache_dir", None),
                      allow_download=getattr(config, "download", False),
                      trust_checkpoint=getattr(config, "trust_checkpoint", False), seed=run_model_seed(config),
                      base_pretrained=getattr(config, "base_pretrained", None))
