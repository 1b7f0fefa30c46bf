"""The benchmark's model: a real architecture, random weights made non-degenerate.

A freshly initialised CLIP predicts almost uniformly: on RN50 with ImageNet-R's 200
classes, the 64 views' entropies all lie within 5e-5 of log(200), and the 6th and 7th
most confident views differ by ONE float32 ulp. TPT's view selection is then decided by
rounding, and no two correct implementations (the library and the baseline, or the
baseline on two thread counts) can be expected to agree. Pretrained weights do not have
this problem, but the benchmark must run offline.

`condition_random_clip` applies the recipe the golden fixtures use (tests/fixtures/golden), which
changes no shape and no cost: logit scale ln(100); the image embedding centred through
`attnpool.c_proj.bias` (ResNet towers) on a few synthetic images; the text embedding
centred through `ln_final.bias` over the class prompts. The views' entropies then spread
over ~1.5 nats and the selection margins are ~1e-2, far above rounding.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..models import ClipModel
from ..models.text import DEFAULT_TEMPLATE, encode_texts, tokenize
from ..synthetic import random_image
from ..views.generator import base_view, to_uint8_tensor

__all__ = ["condition_random_clip", "load_bench_model", "own_models_config"]


@torch.no_grad()
def condition_random_clip(model: ClipModel, classnames: Sequence[str], n_images: int = 16,
                          seed: int = 10_000_000) -> ClipModel:
    """Make a random-weight CLIP's predictions non-degenerate, in place (see the module docstring)."""
    clip = model.clip
    clip.logit_scale.fill_(math.log(100.0))
    attnpool = getattr(clip.visual, "attnpool", None)
    if attnpool is not None and attnpool.c_proj.bias is not None:
        images = torch.stack([to_uint8_tensor(base_view(random_image((320, 256), seed=seed + i), model.image_size))
                              for i in range(n_images)]).to(model.device)
        attnpool.c_proj.bias -= clip.encode_image(model.normalize(images.float().div(255))).mean(0)
    texts = [DEFAULT_TEMPLATE.format(c.replace("_", " ")) for c in classnames]
    captured: list[torch.Tensor] = []
    hook = clip.ln_final.register_forward_hook(lambda module, args, out: captured.append(out))
    try:
        encode_texts(model, texts)
    finally:
        hook.remove()
    eot = tokenize(texts).argmax(-1).to(model.device)
    outputs = torch.cat(captured)
    clip.ln_final.bias -= outputs[torch.arange(len(texts), device=model.device), eot].mean(0)
    return model


def load_bench_model(name: str, pretrained: str | None, classnames: Sequence[str], device: torch.device,
                     condition: bool = True, tiny: bool = False, **load_kwargs: Any) -> tuple[ClipModel, dict]:
    """The model `shiftlab bench` measures, and a description of it for the report.

    Random weights (`pretrained=None`) use the `-quickgelu` variant of a ResNet name (the
    architecture of OpenAI's weights) and, unless `condition=False`, `condition_random_clip`.
    `tiny`: the tests' tiny CLIP, left as initialised (its 2-layer text tower gives nearly equal
    prompt embeddings, so centring them would leave mostly rounding noise).
    """
    from ..models import load_model
    from ..models.architectures import TINY_CLIP_NAME
    tiny = tiny or (name == TINY_CLIP_NAME and pretrained is None)    # `--model shiftlab-tiny` is `--tiny`
    if tiny:
        from ..synthetic import tiny_clip
        model, name = tiny_clip(0, device=device), "shiftlab-tiny"
    else:
        if pretrained is None and not name.endswith("-quickgelu"):
            import open_clip
            if f"{name}-quickgelu" in open_clip.list_models():
                name = f"{name}-quickgelu"
        model = load_model(name, pretrained, device=device, **load_kwargs)
        name = model.name
    conditioned = pretrained is None and condition and not tiny
    if conditioned:
        condition_random_clip(model, classnames)
    return model, {"name": name, "pretrained": pretrained, "conditioned_random_weights": conditioned}


def own_models_config(methods: Sequence[str], info: dict, method_config: dict[str, dict]) -> dict[str, dict]:
    """`method_config` with, for every method that loads models of its own (RLCF's reward model), the weights
    matching the bench model's: its `offline_config` on the tests' tiny CLIP, its `random_weights_config`
    (same architectures, random weights: the same cost) when the bench model has random weights. What the
    user sets wins."""
    from ..methods import get_method_class
    out = {name: dict(values) for name, values in method_config.items()}
    if info.get("pretrained") is not None:
        return out
    tiny = info.get("name") == "shiftlab-tiny"
    for name in methods:
        cls = get_method_class(name)
        defaults = cls.spec.offline_config if tiny else cls.spec.random_weights_config
        if defaults:
            out[name] = dict(defaults) | out.get(name, {})
    return out
