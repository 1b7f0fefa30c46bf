"""DiffTPT (Feng et al., ICCV 2023): TPT (methods/common/prompt_tuning.py) on the augmented views followed by the views
a diffusion model generated from the test image (read from a folder, views_folder.py), with the authors' selection:
of views 1..N-1 the `cosine_ratio` share whose logits are the most cosine-similar to view 0's is kept, then of view
0 + those the `selection_ratio` share of lowest entropy is the loss's (marginal entropy); view 0 is read out.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ...datasets.imageio import ImageDecodeError, decode_image_bytes
from ...views.generator import base_view, to_uint8_tensor
from ..common.confidence import n_selected, select_confident
from ..common.prompt_tuning import PromptTuning
from ..frozen_encoder import FrozenEncoder
from ..kinds import EpisodicMethod
from .spec import DiffTPTSpec
from .views_folder import read_manifest, view0_key


def cosine_then_confident(view_logits: torch.Tensor, cosine_ratio: float, entropy_ratio: float) -> torch.Tensor:
    """DiffTPT's selection, (B, N, C) logits -> (B, k) view indices: of views 1..N-1 the int((N-1) x cosine_ratio)
    whose logits have the largest cosine similarity to view 0's (most similar first, ties in index order), then of
    view 0 + those, in that order, the lowest-entropy int(that count x entropy_ratio) (TPT's rule)."""
    cosine = F.cosine_similarity(view_logits[:, 1:], view_logits[:, :1], dim=-1, eps=1e-8)     # (B, N-1)
    kept = 1 + torch.argsort(-cosine, dim=-1, stable=True)[:, :n_selected(cosine.shape[-1], cosine_ratio)]
    candidates = torch.cat([torch.zeros_like(kept[:, :1]), kept], dim=1)                      # (B, 1 + k1)
    chosen = torch.gather(view_logits, 1, candidates.unsqueeze(-1).expand(-1, -1, view_logits.shape[-1]))
    return torch.gather(candidates, 1, select_confident(chosen, entropy_ratio))


class DiffTPT(PromptTuning, EpisodicMethod):
    """DiffTPT: TPT's loss on the views the cosine filter and the entropy selection keep, diffusion views appended."""
    spec = DiffTPTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        self._encoder: FrozenEncoder | None = None
        if cfg.n_diffusion > 0:
            self._folder = Path(cfg.diffusion_views).expanduser()
            self._manifest = read_manifest(self._folder)
            if self._manifest["image_size"] != self.model.image_size:
                size = self._manifest["image_size"]
                raise ValueError(f"{self.name}.diffusion_views: {self._folder} is keyed by {size} px views but "
                                 f"{self.model.name} takes {self.model.image_size} px; generate the folder for this "
                                 "model's input size")
            identity = self.spec.frozen_encoder_identity(cfg)
            self._digest = identity["manifest_sha256"]
            self._encoder = FrozenEncoder(identity, encode=self.encode_generated)

    def frozen_encoder(self) -> FrozenEncoder | None:
        return self._encoder

    def loaded_weights(self) -> dict[str, Any]:
        return {} if self._encoder is None else {"diffusion_views_sha256": self._digest}

    def select(self, view_logits: torch.Tensor) -> torch.Tensor:
        return cosine_then_confident(view_logits, self.config.cosine_ratio, self.config.selection_ratio)

    def generated_views(self, view0: torch.Tensor) -> torch.Tensor:
        """A test image's generated views from the folder, as uint8 (K, 3, S, S) at the model's input size (their
        Resize + CenterCrop, the model's view 0): `view0` its normalised view 0 (1, 3, S, S), which keys them."""
        pixels = (view0[0].float() * self.model.std[0] + self.model.mean[0]).mul(255).round().clamp(0, 255)
        key = view0_key(pixels.to(torch.uint8).cpu().contiguous().numpy().tobytes())
        entry = self._manifest["images"].get(key)
        if entry is None:
            raise ValueError(f"{self.name}: {self._folder} holds no generated views for this image (its key {key}: "
                             "views_folder.view0_key of its view 0); generate them for this dataset and model size")
        views = []
        for i, want in enumerate(entry["views"][:self.config.n_diffusion]):
            path = self._folder / key / f"{i}.png"
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != want:
                raise ValueError(f"{self.name}: {path} differs from its SHA-256 in {self._folder}/manifest.json")
            try:
                image = decode_image_bytes(data, str(path))
            except ImageDecodeError as exc:
                raise ValueError(f"{self.name}: {exc}") from None
            views.append(to_uint8_tensor(base_view(image, self.model.image_size, self.model.preprocess)))
        return torch.stack(views)

    def encode_generated(self, view0: torch.Tensor) -> torch.Tensor:
        """The frozen encoding of a test image's generated views, flattened (K x D,) (a frozen encoder's one row)."""
        views = self.model.normalize(self.generated_views(view0).float().div(255).to(self.model.device))
        return self.model.encode_views(views, self.precision).flatten()

    def tuning_features(self, ctxs: Any) -> torch.Tensor:
        feats = super().tuning_features(ctxs)
        if self._encoder is None:
            return feats
        encoder = self._encoder
        generated = [c.encoded[encoder.id] if encoder.id in c.encoded else encoder.encode(c.views[:1]) for c in ctxs]
        generated = torch.stack(generated).view(len(ctxs), self.config.n_diffusion, -1)
        return torch.cat([feats, generated.to(feats)], dim=1)
