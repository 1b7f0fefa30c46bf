"""A method's second frozen image encoder (a spec's `FROZEN_ENCODER` capability; COSMIC's DINOv2).

Like the frozen CLIP tower, it maps a sample's view 0 to a fixed vector that nothing adapts, so the engine computes
it once per sample (one image at a time, as the method would), hands it to the method in
`SampleContext.encoded[encoder.id]`, and a feature store holds it beside the CLIP view features, keyed by the
encoder's `identity` (its model, its checkpoint's SHA-256 or its random-weight seed, what it reads and returns).
A method declaring the capability returns one from `Method.frozen_encoder()` (None: this config runs without it),
built with the identity its spec declares (`MethodSpec.frozen_encoder_identity(config)`, torch-free: a run plan
keys the store entry with it before torch is imported).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class FrozenEncoder:
    """`identity`: every input that decides its output, JSON data (part of the feature-store key, so another
    checkpoint or model is another entry); `encode`: one sample's normalised view 0 (1, 3, S, S) -> (d,)."""
    identity: Mapping[str, Any]
    encode: Callable[[torch.Tensor], torch.Tensor] = field(compare=False)

    @property
    def id(self) -> str:
        """A short digest of `identity`: the name of its output in `SampleContext.encoded`."""
        return hashlib.sha256(json.dumps(dict(self.identity), sort_keys=True).encode()).hexdigest()[:16]

    def key_fields(self) -> dict[str, Any]:
        """What a feature-store key adds for this encoder's output (shiftlab.rundir.feature_store.feature_key)."""
        return json.loads(json.dumps(dict(self.identity), sort_keys=True))
