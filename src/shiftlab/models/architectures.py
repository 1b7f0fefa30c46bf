"""Architectures: registering open_clip configs (shiftlab's own in architectures/*.json), building
a model of a named architecture, its published preprocessing, and checking that a checkpoint's
tensors fit the architecture named."""
from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .. import writes
from ..options import name_of
from .checkpoints import (
    ModelLoadError,
)

# -- architectures ---------------------------------------------------------------------------------

# The tiny CLIP of the golden fixtures, the tests and the demo: ModifiedResNet (1,1,1,1) width 16 at 64x64,
# a 2-layer text tower (configs/shiftlab-tiny.json); `--model shiftlab-tiny`.
TINY_CLIP_NAME = "shiftlab-tiny"
# A tiny ViT of ViT-B/16's design (16-px patches, class token, pre-LN blocks, QuickGELU) at 64x64: 4 blocks of
# width 64 (one head: OpenAI's `build_model` derives heads = width // 64), the tiny CLIP's text tower
# (configs/shiftlab-tiny-vit.json). What methods that tune the image tower's attention (TTL) are made golden on.
TINY_VIT_NAME = "shiftlab-tiny-vit"
CONFIGS = Path(__file__).parent / "configs"
_REGISTERED: set[str] = set()
_BUILTIN_DONE = False


def register_architecture(name: str, config: dict[str, Any] | str | Path) -> str:
    """Register an open_clip model config (a dict or a JSON file) under `name` via
    `open_clip.add_model_config`; returns `name`. Re-registering a name replaces its config;
    open_clip's own architectures cannot be replaced."""
    import open_clip
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
    # open_clip registers a config by reading a file; it keeps what it read, so the file (and its folder) is
    # removed at once rather than left behind in the temp folder by every process that registers one.
    with tempfile.TemporaryDirectory(prefix="shiftlab-model-config-") as folder:
        target = Path(folder) / f"{name}.json"
        writes.write_file(target, json.dumps(config))
        open_clip.add_model_config(target)
    if open_clip.get_model_config(name) != config:
        raise ModelLoadError(f"open_clip did not keep the config registered as {name!r} once its file was removed")
    _REGISTERED.add(name)
    return name


def builtin_configs() -> dict[str, dict[str, Any]]:
    """shiftlab's own architectures, one JSON file each in models/configs/ (name = file stem)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(CONFIGS.glob("*.json"))}


def _register_builtin() -> None:
    """shiftlab's own architectures (the tiny test/demo CLIP) are known to every loader."""
    global _BUILTIN_DONE
    if not _BUILTIN_DONE:
        _BUILTIN_DONE = True
        for name, config in builtin_configs().items():
            register_architecture(name, config)


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
                         + ", ".join(p for p in parts if p)
                         + f". Pass the {name_of('model')} the checkpoint was trained as.")


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
