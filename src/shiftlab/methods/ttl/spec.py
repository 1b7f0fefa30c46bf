"""TTL: test-time low-rank adaptation (Imam et al. 2024, arXiv 2407.15913), episodic."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...params import param
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, MethodSpec, ViewMethodConfig

INITS = ("xavier", "gaussian", "kaiming")


@dataclass
class TTLConfig(ViewMethodConfig):
    steps: int = param(1, ge=0)              # TTA_STEPS=1 (scripts/test_ttl.sh:11); 0: zero-shot through the tower
    lr: float = param(5e-3, ge=0)            # LR=5e-3 (scripts/test_ttl.sh:10)
    weight_decay: float = param(0.01, ge=0)  # torch.optim.AdamW's default, kept (ttl.py:218)
    rank: int = param(16, ge=1)              # RANK=16 (scripts/test_ttl.sh:18), LoraConfig(r=rank) (custom_clip.py:584)
    alpha: float = param(32.0, gt=0)         # lora_alpha=32 (custom_clip.py:585): updates scaled by alpha / rank
    # LAYER_RANGE=9,11 (scripts/test_ttl.sh:15): the last 3 of ViT-B/16's 12 blocks; here counted from the end
    # (the last `lora_layers` attention layers, all where the tower has fewer: a ResNet's attention pool is one)
    lora_layers: int = param(3, ge=1)
    margin: float = param(0.4, ge=0)         # --deyo_margin_e0 0.4 (ttl.py:417): weights exp(margin - H) (deyo.py:175)
    max_entropy: float = param(math.log(1000), gt=0)   # views with H <= ln 1000 train (deyo.py:107)
    init: str = param("xavier", choices=INITS)  # INIT_METHOD='xavier' (test_ttl.sh:16), on A (custom_clip.py:185)
    # A is drawn once per run from this seed (the authors': from the RNG stream after set_random_seed(0), ttl.py:124,
    # which no other code reproduces); the same A starts every image
    init_seed: int = param(0, ge=0)
    loss_scale: float = param(1000.0, gt=0)  # GradScaler(init_scale=1000) (ttl.py:222), applied under fp16 only


class TTLSpec(MethodSpec):
    capabilities = Capabilities(reads=(OWN_TOWER), state=EPISODIC)
    # nothing per dataset: ttl.py:255-271 sets only the class names, the same recipe for every set
    dataset_values: dict[str, dict[str, Any]] = {}
