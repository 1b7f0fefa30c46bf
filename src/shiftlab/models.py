"""CLIP models over open_clip: loading, freezing, preprocessing facts, normalisation inside.

`load_model` is the one loader (library, CLI and `engine.run` all call it). It returns a
`ClipModel` that carries the preprocessing open_clip publishes for its weights (input
size, mean/std, resize mode and interpolation), so model and views cannot drift apart,
and the SHA-256 of the weights file it read. The model takes images in [0, 1];
normalisation is its first layer, which is what lets attacks work in pixel space.

Where weights come from (`pretrained`), decided by these rules and nothing else:
- None: random weights, a function of `seed` alone (built under their own seeded CPU generator state,
  so the same bytes in every process and on every rank, whatever ran before; the global RNG state is
  left as it was). `ClipModel.weights_sha256` is their digest (`state_dict_sha256`).
- "hf-hub:ORG/REPO": the open_clip checkpoint of that Hugging Face repository, with the
  preprocessing of its open_clip_config.json.
- "file:PATH": the checkpoint file PATH, which must exist.
- a tag open_clip lists for the model (`open_clip.list_pretrained_tags_by_model(name)`),
  e.g. "openai": read from the cache, downloaded only with `allow_download`.
- anything else: a path to an existing checkpoint file; otherwise an error says it is
  neither a tag of the model nor a file.
The architecture is always the one named: a checkpoint whose tensors do not fit it is
refused, naming both.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from .checkpoints import (
    OPENAI_SCALARS,
    ModelLoadError,
    cached_tag_file,
    read_checkpoint,
    require_network,
    sha256_file,
    weights_source,
)
from .precision import Precision
from .views import base_view, to_uint8_tensor

__all__ = ["ClipModel", "ModelLoadError", "Preprocess", "load_model", "load_run_model", "register_architecture",
           "model_preprocess", "state_dict_sha256", "OPENAI_MEAN", "OPENAI_STD"]

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
OPENAI_PREPROCESS = {"mean": OPENAI_MEAN, "std": OPENAI_STD, "interpolation": "bicubic", "resize_mode": "shortest"}
ENCODE_CHUNK = 256      # views per image-tower call; one value for the engine and the library


@dataclass(frozen=True)
class Preprocess:
    """What a model expects of its input (open_clip's preprocess config, OpenAI's by default).

    `resize_mode`/`interpolation` say how the original view is made: "shortest" resizes the
    shorter side to `image_size` and centre-crops, "squash" resizes to a square, "longest"
    resizes the longer side and pads with `fill_color`.
    """
    image_size: int
    mean: tuple[float, float, float] = OPENAI_MEAN
    std: tuple[float, float, float] = OPENAI_STD
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"
    fill_color: int = 0

    @classmethod
    def from_open_clip(cls, cfg: dict[str, Any], image_size: int) -> Preprocess:
        def triple(v, default):
            v = default if v is None else v
            return tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else (v,) * 3))
        interpolation = cfg.get("interpolation") or "bicubic"
        return cls(int(image_size), triple(cfg.get("mean"), OPENAI_MEAN), triple(cfg.get("std"), OPENAI_STD),
                   "bilinear" if interpolation == "bilinear" else "bicubic",   # open_clip: "random" -> bicubic
                   cfg.get("resize_mode") or "shortest", int(cfg.get("fill_color") or 0))


class ClipModel(nn.Module):
    """A frozen open_clip CLIP in eval mode with normalisation inside.

    - `encode_pixels(x01)`: images in [0, 1] -> L2-normalised features.
    - `encode_normalized(x)`: normalised images -> L2-normalised features (with gradient).
    - `encode_views(x, precision)`: the image encoder of the engine and of `Method.predict`:
      chunked, no gradient, under the precision policy's autocast, float32 features.
    - `cast(dtype)`: this model with half-precision weights (the `fp16-pure` precision, shiftlab.precision).
    - `logit_scale`: the learned temperature (100 for OpenAI CLIP) as a float.
    - `checkpoint_sha256`: SHA-256 of the weights file read (None for random weights).
    - `weights_seed`, `weights_sha256`: for random weights, the seed they were built from and the digest
      of the weights (`state_dict_sha256`, taken on first use and kept: a run's identity asks for it);
      None for a checkpoint (its SHA-256 pins it).
    - `weights_source`: where that file verifiably came from ("openai-url", "hf-hub:ORG/REPO" or None;
      `shiftlab.checkpoints.weights_source`), what published numbers are shown by.
    """

    def __init__(self, clip: nn.Module, name: str, pretrained: str | None, preprocess: Preprocess,
                 checkpoint_sha256: str | None = None, weights_source: str | None = None,
                 weights_seed: int | None = None, weights_sha256: str | None = None):
        super().__init__()
        self.clip = clip.eval()
        for p in self.clip.parameters():
            p.requires_grad_(False)
        self.name = name
        self.pretrained = pretrained
        self.preprocess = preprocess
        self.checkpoint_sha256 = checkpoint_sha256
        self.weights_source = weights_source
        self.weights_seed = weights_seed
        self._weights_sha256 = weights_sha256
        self.register_buffer("mean", torch.tensor(preprocess.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(preprocess.std).view(1, 3, 1, 1), persistent=False)
        # Convolutional towers (ResNets) run in channels_last: ~1.2x faster on the CPU in fp32 (interleaved
        # A/B, benchmarks/image_tower_ab.py; same top-1, logits within 1e-5) and what lets fp16
        # convolutions use tensor cores on a GPU. Transformers gain nothing and keep their layout.
        self.channels_last = any(isinstance(m, nn.Conv2d) and m.kernel_size != m.stride
                                 for m in self.clip.visual.modules())
        if self.channels_last:
            self.clip.visual.to(memory_format=torch.channels_last)
        self.input_dtype = torch.float32   # what the image tower reads (float16 in a `cast` copy)

    def cast(self, dtype: torch.dtype) -> ClipModel:
        """A copy with its weights in `dtype` as the authors' half-precision CLIP holds them (open_clip's
        `convert_weights_to_lp`, the counterpart of OpenAI's `convert_weights` that their `clip.load`
        applies on CUDA: convolution, linear, attention and projection weights cast, normalisation
        layers' parameters kept float32). Made once and kept outside the module tree (its state_dict
        and `.to()` do not see it)."""
        import copy

        import open_clip
        copies = self.__dict__.setdefault("_cast_copies", {})
        if dtype not in copies:
            clip = copy.deepcopy(self.clip)
            open_clip.model.convert_weights_to_lp(clip, dtype)
            half = ClipModel(clip, self.name, self.pretrained, self.preprocess, self.checkpoint_sha256,
                             self.weights_source, self.weights_seed, self.weights_sha256)   # the float32 weights
            half.input_dtype = dtype
            copies[dtype] = half
        return copies[dtype]

    def train(self, mode: bool = True) -> ClipModel:
        # BatchNorm must keep its running statistics: the model is never put in train mode.
        return super().train(False)

    @property
    def weights_sha256(self) -> str | None:
        if self._weights_sha256 is None and self.weights_seed is not None:
            self._weights_sha256 = state_dict_sha256(self.clip)   # RN50, 102 M values: ~3 s on a busy CPU, once
        return self._weights_sha256

    @property
    def logit_scale(self) -> float:
        return float(self.clip.logit_scale.detach().exp())

    @property
    def device(self) -> torch.device:
        return self.clip.logit_scale.device

    @property
    def image_size(self) -> int:
        return self.preprocess.image_size

    def normalize(self, x01: torch.Tensor) -> torch.Tensor:
        return (x01 - self.mean.to(x01.dtype)) / self.std.to(x01.dtype)

    def encode_normalized(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return F.normalize(self.clip.encode_image(x.to(self.input_dtype)), dim=-1)

    def encode_pixels(self, x01: torch.Tensor) -> torch.Tensor:
        return self.encode_normalized(self.normalize(x01))

    def encode_views(self, x: torch.Tensor, precision: Precision | None = None,
                     chunk_size: int = ENCODE_CHUNK) -> torch.Tensor:
        """Normalised views (N, 3, S, S) -> (N, D) float32 L2-normalised features, without gradient.

        `precision` is the image tower's policy (`shiftlab.precision`; None: float32); the engine
        and `Method.predict` both encode through here, so they agree. Inference mode (faster than
        no_grad in the interleaved A/B, benchmarks/image_tower_ab.py); the result is cloned out of it
        so that methods may use it in autograd graphs (prompt tuning's loss). A policy with a
        `model_dtype` ("fp16-pure" on CUDA) encodes with the `cast` copy, as the authors' half model."""
        if precision is not None and precision.model_dtype is not None:
            return self.cast(precision.model_dtype).encode_views(x, None, chunk_size)
        with torch.inference_mode(), (precision.autocast() if precision is not None else contextlib.nullcontext()):
            feats = torch.cat([self.encode_normalized(x[i:i + chunk_size])
                               for i in range(0, x.shape[0], chunk_size)]).float()
        return feats.clone()

    def transform(self, image: Image.Image) -> torch.Tensor:
        """A PIL image -> (3, S, S) float32 normalised input, like open_clip's eval preprocess: the
        run's view 0 (this model's resize, centre crop and interpolation) in 8 bits, then normalised."""
        x = to_uint8_tensor(base_view(image.convert("RGB"), self.image_size, self.preprocess))
        return self.normalize(x.float().div(255).unsqueeze(0))[0]

    def forward(self, x01: torch.Tensor) -> torch.Tensor:
        return self.encode_pixels(x01)


# -- architectures ---------------------------------------------------------------------------------

_CONFIG_DIR: Path | None = None
_REGISTERED: set[str] = set()
_BUILTIN_DONE = False


def register_architecture(name: str, config: dict[str, Any] | str | Path) -> str:
    """Register an open_clip model config (a dict or a JSON file) under `name` via
    `open_clip.add_model_config`; returns `name`. Re-registering a name replaces its config;
    open_clip's own architectures cannot be replaced."""
    import open_clip
    global _CONFIG_DIR
    if not isinstance(config, dict):
        path = Path(config).expanduser()
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"model config {path} is not a readable JSON file ({exc})") from exc
    if not all(k in config for k in ("embed_dim", "vision_cfg", "text_cfg")):
        raise ModelLoadError(f"model config for {name!r} needs embed_dim, vision_cfg and text_cfg")
    config = json.loads(json.dumps(config))
    existing = open_clip.get_model_config(name)
    if name not in _REGISTERED and existing is not None and existing != config:
        raise ModelLoadError(f"{name!r} is an open_clip architecture; register the custom config under another name")
    if _CONFIG_DIR is None:
        _CONFIG_DIR = Path(tempfile.mkdtemp(prefix="shiftlab-model-configs-"))
    target = _CONFIG_DIR / f"{name}.json"
    target.write_text(json.dumps(config))
    open_clip.add_model_config(target)
    _REGISTERED.add(name)
    return name


def _register_builtin() -> None:
    """shiftlab's own architectures (the tiny test/demo CLIP) are known to every loader."""
    global _BUILTIN_DONE
    if not _BUILTIN_DONE:
        from .synthetic import TINY_CLIP_CONFIG, TINY_CLIP_NAME
        _BUILTIN_DONE = True
        register_architecture(TINY_CLIP_NAME, TINY_CLIP_CONFIG)


def _quickgelu_name(name: str, quick_gelu: bool) -> str:
    # OpenAI's CLIPs were trained with QuickGELU; plain "RN50" in open_clip means GELU.
    import open_clip
    if quick_gelu and not name.endswith("-quickgelu") and f"{name}-quickgelu" in open_clip.list_models():
        return f"{name}-quickgelu"
    return name


@contextmanager
def _quiet_open_clip() -> Iterator[None]:
    root = logging.getLogger()
    was_disabled, root.disabled = root.disabled, True   # open_clip logs "initialized randomly" etc.
    try:
        yield
    finally:
        root.disabled = was_disabled


def state_dict_sha256(module: nn.Module) -> str:
    """SHA-256 over `module.state_dict()`: each tensor's key, dtype, shape and bytes in the standard
    (contiguous) layout, keys in sorted order, so the memory format and the device do not change it."""
    digest = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{key}\t{data.dtype}\t{tuple(data.shape)}\n".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


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


def _create(name: str, quick_gelu: bool) -> nn.Module:
    import open_clip
    with _quiet_open_clip():
        return open_clip.create_model(name, pretrained=None, force_quick_gelu=quick_gelu and
                                      not open_clip.get_model_config(name).get("quick_gelu", False))


def model_preprocess(name: str, tag: str | None = None) -> dict[str, Any]:
    """open_clip's preprocess config for model `name` with weights `tag`.

    Without a tag (a checkpoint file, random weights): the preprocessing that every tag open_clip
    publishes for the model agrees on; where they disagree or there are none, open_clip's
    default (OpenAI's)."""
    import open_clip
    from open_clip.transform import PreprocessCfg, merge_preprocess_dict
    def of(tag: str | None) -> str:   # as JSON, so that configs compare by value (lists vs tuples)
        published = open_clip.get_pretrained_cfg(name, tag) if tag else {}
        return json.dumps(merge_preprocess_dict(PreprocessCfg(), published), sort_keys=True)
    if tag is not None:
        return json.loads(of(tag))
    found = {of(t) for t in open_clip.list_pretrained_tags_by_model(name)}
    return json.loads(found.pop() if len(found) == 1 else of(None))


# -- checking a checkpoint against the named architecture ---------------------------------------------

def _is_openai_state_dict(sd: dict) -> bool:
    return "text_projection" in sd and "token_embedding.weight" in sd and (
        "visual.attnpool.positional_embedding" in sd or "visual.proj" in sd)


def _count(sd: dict, prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in sd if k.startswith(prefix)})


def _signature_of_state_dict(sd: dict[str, torch.Tensor]) -> tuple | None:
    """The architecture of a CLIP in OpenAI's key layout (the facts open_clip's builder reads)."""
    if not _is_openai_state_dict(sd):
        return None
    text = (int(sd["ln_final.weight"].shape[0]), _count(sd, "transformer.resblocks."))
    embed = int(sd["text_projection"].shape[1])
    if "visual.proj" in sd:
        width, patch = int(sd["visual.conv1.weight"].shape[0]), int(sd["visual.conv1.weight"].shape[-1])
        grid = round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5)
        return ("ViT", _count(sd, "visual.transformer.resblocks."), width, patch, grid * patch, embed, text)
    layers = tuple(_count(sd, f"visual.layer{b}.") for b in (1, 2, 3, 4))
    grid = round((sd["visual.attnpool.positional_embedding"].shape[0] - 1) ** 0.5)
    return ("ResNet", layers, int(sd["visual.layer1.0.conv1.weight"].shape[0]), None, grid * 32, embed, text)


def _signature_of_config(cfg: dict[str, Any]) -> tuple | None:
    v, t = cfg.get("vision_cfg", {}), cfg.get("text_cfg", {})
    if "timm_model_name" in v or "hf_model_name" in t or cfg.get("custom_text"):
        return None
    size = v.get("image_size", 224)
    size = size[0] if isinstance(size, (list, tuple)) else size
    text = (t.get("width", 512), t.get("layers", 12))
    if isinstance(v.get("layers"), (list, tuple)):
        return ("ResNet", tuple(v["layers"]), v.get("width", 64), None, size, cfg["embed_dim"], text)
    return ("ViT", v.get("layers", 12), v.get("width", 768), v.get("patch_size", 16), size, cfg["embed_dim"], text)


def _describe(sig: tuple) -> str:
    kind, layers, width, patch, size, embed, (twidth, tlayers) = sig
    import open_clip
    names = [m for m in open_clip.list_models() if _signature_of_config(open_clip.get_model_config(m)) == sig]
    vision = (f"ResNet {'-'.join(map(str, layers))} width {width}" if kind == "ResNet"
              else f"ViT {layers} layers width {width} patch {patch}")
    known = f"{' / '.join(names[:4])}: " if names else ""
    return f"{known}{vision}, {size} px, embed {embed}, text {tlayers} layers width {twidth}"


def _check_fits(clip: nn.Module, sd: dict[str, torch.Tensor], name: str, path: Path) -> None:
    want = clip.state_dict()
    missing = [k for k in want if k not in sd and k != "logit_bias"]
    unexpected = [k for k in sd if k not in want]
    shapes = [f"{k} {tuple(sd[k].shape)} vs {tuple(want[k].shape)}" for k in want
              if k in sd and sd[k].shape != want[k].shape]
    if not (missing or unexpected or shapes):
        return
    sig = _signature_of_state_dict(sd)
    holds = f" holds {_describe(sig)} and" if sig else ""
    parts = [f"{len(shapes)} tensor shapes differ (file vs model): {'; '.join(shapes[:3])}" if shapes else "",
             f"missing {missing[:5]}" if missing else "", f"unexpected {unexpected[:5]}" if unexpected else ""]
    raise ModelLoadError(f"checkpoint {path}{holds} does not fit the model {name!r}: "
                         + ", ".join(p for p in parts if p) + ". Pass the --model the checkpoint was trained as.")


# -- where the weights come from ------------------------------------------------------------------------

def _known_model(name: str, checkpoint: tuple[Path, dict] | None = None) -> None:
    import open_clip
    if open_clip.get_model_config(name) is not None:
        return
    import difflib
    known = {m.lower(): m for m in open_clip.list_models()}
    close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.75)
    guess = f" (did you mean {known[close[0]]!r}?)" if close else ""
    msg = f"unknown model {name!r}{guess} (see `open_clip.list_models()`, or register_architecture)"
    if checkpoint is not None:
        path, sd = checkpoint
        sig = _signature_of_state_dict(sd)
        msg += f"; checkpoint {path} holds " + (_describe(sig) if sig else "a non-OpenAI-layout CLIP")
    raise ModelLoadError(msg)


def _resolve(name: str, pretrained: str) -> tuple[str, str]:
    """-> (kind, value): ("hf-hub", repo), ("file", path) or ("tag", tag), by the module docstring's rules."""
    import open_clip
    if pretrained.startswith("hf-hub:"):
        repo = pretrained[len("hf-hub:"):].strip("/")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise ModelLoadError(f"--pretrained {pretrained!r}: expected hf-hub:ORG/REPO")
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
                             f"download {where} by hand or pass --pretrained /path/to/checkpoint") from exc


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
                             f"requested; run with --download, or `hf download {repo}`")
    config_file = weights.parent / "open_clip_config.json"
    cfg = json.loads(config_file.read_text()) if config_file.is_file() else {}
    return weights, cfg.get("preprocess_cfg", {})


def load_model(name: str = "RN50", pretrained: str | None = "openai", *, device: str | torch.device = "cpu",
               cache_dir: str | None = None, allow_download: bool = False, trust_checkpoint: bool = False,
               model_config: dict | str | Path | None = None, seed: int = 0) -> ClipModel:
    """Load a frozen CLIP model in eval mode with normalisation inside (rules: module docstring).

    `model_config` registers a custom architecture under `name` first (`register_architecture`).
    A checkpoint in OpenAI's key layout builds the QuickGELU variant of `name`, as OpenAI trained.
    `seed` decides random weights (`pretrained=None`) and nothing else.
    """
    import open_clip
    _register_builtin()
    if model_config is not None:
        register_architecture(name, model_config)
    if pretrained is None:
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
                    f"Download {where}; or run with --download on a machine with internet; "
                    "or pass --pretrained /path/to/checkpoint.")
            local = _download(f"{name}/{value}", where, lambda: open_clip.download_pretrained(
                open_clip.get_pretrained_cfg(arch, value) or tag_cfg, cache_dir=cache_dir))
        return _load_file(arch, local, trust_checkpoint, model_preprocess(arch, value), value, device)
    if kind == "hf-hub":
        weights, pp = _hf_hub_files(value, cache_dir, allow_download)
        from open_clip.transform import PreprocessCfg, merge_preprocess_dict
        return _load_file(name, weights, trust_checkpoint, merge_preprocess_dict(PreprocessCfg(), pp),
                          str(pretrained), device)
    return _load_file(name, Path(value).expanduser(), trust_checkpoint, None, str(pretrained), device)


def _load_file(name: str, path: Path, trust_checkpoint: bool, preprocess: dict[str, Any] | None, label: str,
               device: str | torch.device) -> ClipModel:
    sd, openai_release = read_checkpoint(path, trust_checkpoint)
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


def run_model_seed(config: Any) -> int:
    """The seed of a run's random weights: `config.model_seed`, else the run's `config.seed`."""
    seed = getattr(config, "model_seed", None)
    return int(getattr(config, "seed", 0) or 0) if seed is None else seed


def load_run_model(config: Any, device: str | torch.device) -> ClipModel:
    """The model of a run (CLI and `engine.run(model=None)`): reads `config.model`, `.pretrained`,
    `.cache_dir`, `.download`, `.trust_checkpoint` and, for random weights, `run_model_seed(config)`."""
    return load_model(config.model, config.pretrained, device=device, cache_dir=getattr(config, "cache_dir", None),
                      allow_download=getattr(config, "download", False),
                      trust_checkpoint=getattr(config, "trust_checkpoint", False), seed=run_model_seed(config))
