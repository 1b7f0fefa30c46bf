"""Everything one sample needs, computed at most once and shared by every method."""
from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import torch

from ..models import ClipModel
from ..models.precision import Precision
from ..models.text import DEFAULT_TEMPLATE, TIP_TEMPLATES, class_head, load_descriptions, tip_cupl_head


class ClassHeads:
    """Label-free class heads of one run, each computed once on first use."""

    def __init__(self, model: ClipModel, classnames: Sequence[str], templates: Sequence[str] | None = None):
        self.model = model
        self.classnames = list(classnames)
        self._templates = templates
        self._cache: dict[str, torch.Tensor] = {}
        self.shared: dict = {}   # other per-run state that methods share (e.g. the initial prompt's graph)

    @property
    def zeroshot(self) -> torch.Tensor:
        """(C, D) features of "a photo of a {name}."."""
        if "zeroshot" not in self._cache:
            self._cache["zeroshot"] = class_head(self.model, self.classnames, [DEFAULT_TEMPLATE])
        return self._cache["zeroshot"]

    @property
    def ensemble(self) -> torch.Tensor:
        """(C, D) features of CLIP's 80-template prompt ensemble."""
        if "ensemble" not in self._cache:
            templates = self._templates
            if templates is None:
                from ..datasets.classes import load_templates
                templates = load_templates()
            self._cache["ensemble"] = class_head(self.model, self.classnames, templates)
        return self._cache["ensemble"]

    def tip_cupl(self, cupl_file: str, field: str = "cupl_file",
                 templates: Sequence[str] | None = None) -> torch.Tensor:
        """(C, D) DMN's `tip_cupl` head: `templates` (None: the 7 Tip-Adapter ones) + the CuPL
        descriptions in `cupl_file`."""
        key = f"tip_cupl:{cupl_file}:" + "\x1f".join(templates or ())
        if key not in self._cache:
            descriptions = load_descriptions(cupl_file, self.classnames, field)
            self._cache[key] = tip_cupl_head(self.model, self.classnames, descriptions, templates or TIP_TEMPLATES)
        return self._cache[key]

    def templated(self, templates: Sequence[str]) -> torch.Tensor:
        """(C, D) features of `templates` averaged per class (e.g. a dataset's own prompt templates,
        shiftlab.datasets.classes.dataset_templates), computed once per distinct list."""
        key = "templates:" + "\x1f".join(templates)
        if key not in self._cache:
            self._cache[key] = class_head(self.model, self.classnames, list(templates))
        return self._cache[key]


class SampleContext:
    """One sample: its normalised views and lazily computed, shared quantities.

    Image features are computed once (without gradient: the image tower is frozen) by
    `ClipModel.encode_views`, the encoder the engine uses too, and reused by every method;
    `image_features` may also be handed in by the engine when it encodes many samples'
    views in one batch. `precision` is the image tower's policy (`shiftlab.models.precision`; None:
    float32). `views` is None when the features come from a feature store (no pixels decoded).
    `encoded`: the outputs of methods' own frozen encoders (`FrozenEncoder.id` -> (d,)), filled by the engine
    (computed once per sample, or read from a feature store).
    """

    def __init__(self, model: ClipModel, heads: ClassHeads, views: torch.Tensor | None,
                 image_features: torch.Tensor | None = None, sample_id: int | None = None,
                 precision: Precision | None = None, encoded: dict[str, torch.Tensor] | None = None):
        self.model = model
        self.heads = heads
        self.views = views
        self.sample_id = sample_id
        self.precision = precision
        self.encoded: dict[str, torch.Tensor] = {} if encoded is None else encoded
        if image_features is not None:
            self.__dict__["image_features"] = image_features

    def first_views(self, n: int) -> SampleContext:
        """The context of this sample's first `n` views, sharing the features already encoded (itself when it
        has no more than `n`)."""
        if n >= self.n_views:
            return self
        views = None if self.views is None else self.views[:n]
        encoded = self.__dict__.get("image_features")     # None: nothing encoded (no method of the group reads it)
        return SampleContext(self.model, self.heads, views, image_features=None if encoded is None else encoded[:n],
                             sample_id=self.sample_id, precision=self.precision, encoded=self.encoded)

    @property
    def n_views(self) -> int:
        if self.views is None:   # features read from a feature store: no pixels
            return self.image_features.shape[0]
        return self.views.shape[0]

    @cached_property
    def image_features(self) -> torch.Tensor:
        """(N, D) L2-normalised features of all views."""
        return self.model.encode_views(self.views, self.precision)

    @cached_property
    def base_feature(self) -> torch.Tensor:
        """(D,) feature of view 0; encodes view 0 alone unless all views are already encoded."""
        if "image_features" in self.__dict__:
            return self.image_features[0]
        return self.model.encode_views(self.views[:1], self.precision)[0]

    @cached_property
    def zeroshot_view_logits(self) -> torch.Tensor:
        """(N, C) zero-shot logits of every view."""
        return self.model.logit_scale * self.image_features @ self.heads.zeroshot.T

    @cached_property
    def zeroshot_logits(self) -> torch.Tensor:
        """(C,) zero-shot logits of view 0."""
        return self.model.logit_scale * self.base_feature @ self.heads.zeroshot.T


def batch_pixels(ctxs: Sequence[SampleContext], device: torch.device | str, refusal: str) -> torch.Tensor:
    """The normalised pixels of the samples' view 0 (B, 3, S, S) on `device`, for a method that runs the image tower
    itself; `refusal` (one line) when a sample came from a feature store (no pixels)."""
    if any(c.views is None for c in ctxs):
        raise ValueError(refusal)
    return torch.cat([c.views[:1] for c in ctxs]).to(device)
