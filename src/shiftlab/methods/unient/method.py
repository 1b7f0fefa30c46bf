"""UniEnt on CLIP (Gao et al., CVPR 2024), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at f4221f4,
`ttavlm/methods/unient.py` on `abstract_model.py`), for every batch of test images (view 0 of each, through the
tower of `common.norm_adaptation`), `steps` times:

1. cosines to the class head; each image's max softmax probability at the logit scale, min-max normalised over
   the batch; OOD score o = 1 - that (unient.py:58-64);
2. a two-component Gaussian mixture fitted to o (scikit-learn's GaussianMixture, as theirs); each image's
   posterior of the lower-mean component is its ID weight w, of the other its OOD weight 1 - w (unient.py:66-72);
3. loss = tta_weight x mean(w x H) - mean_entropy_weight x H(mean prediction) [- ood_weight x mean((1 - w) x H)],
   H each image's prediction entropy at the logit scale (unient.py:75-141); one optimiser step.

Then the batch's logits through the adapted tower, and its own OOD score (`score` of the cosines at
`ood_logit_scale`, unient.py:147-151) recorded with each image. README.md lists what differs from the authors'.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..common.confidence import entropy
from ..common.norm_adaptation import mean_prediction_entropy
from ..common.ood_scores import OwnOODScoreMethod
from .spec import UniEntSpec


def normalised_ood_scores(logits: torch.Tensor) -> torch.Tensor:
    """(B, C) scaled logits -> (B,) 1 - the max softmax probability min-max normalised over the batch (0: the
    most confident image, 1: the least); NaN where every image is as confident (their 0 / 0)."""
    confidence = logits.detach().softmax(-1).max(-1).values
    low, high = confidence.min(), confidence.max()
    return 1 - (confidence - low) / (high - low)


def mixture_id_weights(ood: torch.Tensor, random_state: np.random.RandomState) -> torch.Tensor:
    """(B,) OOD scores -> (B,) float32 posteriors of the lower-mean component of a two-Gaussian mixture fitted to
    them (scikit-learn's GaussianMixture(n_components=2), its k-means start drawn from `random_state`). Fewer than
    two images, or scores that are not all finite (a batch of equally confident images), give every image weight
    1 (their code stops there: scikit-learn refuses one sample and NaN)."""
    values = ood.detach().float().cpu().numpy().reshape(-1, 1)     # float32, as theirs: scikit-learn keeps it
    if len(values) < 2 or not np.isfinite(values).all():
        return torch.ones(len(values))
    try:
        from sklearn.mixture import GaussianMixture
    except ImportError:
        raise ImportError("unient's Gaussian mixture needs scikit-learn (pip install 'shiftlab[ood]')") from None
    mixture = GaussianMixture(n_components=2, random_state=random_state).fit(values)
    proba = mixture.predict_proba(values)
    low = 0 if mixture.means_[0, 0] < mixture.means_[1, 0] else 1
    return torch.from_numpy(proba[:, low].copy())


def unient_loss(logits: torch.Tensor, id_weights: torch.Tensor, tta_weight: float, mean_entropy_weight: float,
                ood_weight: float) -> torch.Tensor:
    """(B, C) scaled logits, (B,) ID weights -> () the loss (unient.py:105-141): the ID-weighted mean entropy minus
    the weighted entropy of the mean prediction minus the OOD-weighted mean entropy (0 when `ood_weight` is 0)."""
    h = entropy(logits)
    w = id_weights.to(h)
    loss = tta_weight * (h * w).mean(0) - mean_entropy_weight * mean_prediction_entropy(logits)
    if ood_weight:
        loss = loss - ood_weight * (h * (1 - w)).mean(0)
    return loss


def _rng_state(rng: np.random.RandomState) -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = rng.get_state()
    return {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
            "gauss": float(gauss)}


def _set_rng_state(rng: np.random.RandomState, state: dict[str, Any]) -> None:
    keys = np.asarray(state["keys"].numpy() if isinstance(state["keys"], torch.Tensor) else state["keys"])
    rng.set_state(("MT19937", keys.astype(np.uint32), int(state["pos"]), int(state["has_gauss"]),
                   float(state["gauss"])))


class UniEnt(OwnOODScoreMethod):
    """UniEnt: entropy minimisation weighted by a Gaussian mixture's ID posterior of each image."""
    spec = UniEntSpec

    def reset_extra(self) -> None:
        self.rng = np.random.RandomState(self.config.mixture_seed)

    def extra_state(self) -> dict[str, Any]:
        return {"rng": _rng_state(self.rng)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        _set_rng_state(self.rng, state["rng"])

    def episodic_reset(self) -> None:
        self.reset_tower()      # their reset: the parameters and the optimiser; numpy's generator runs on

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        ood_weight = cfg.ood_weight if cfg.ood_loss else 0.0
        losses, id_weights = [], None
        for _ in range(cfg.steps):
            logits = self.logits(pixels)
            id_weights = mixture_id_weights(normalised_ood_scores(logits), self.rng)
            loss = unient_loss(logits, id_weights, cfg.tta_weight, cfg.mean_entropy_weight, ood_weight)
            losses.append(float(loss.detach()))
            self.step(loss)
        logits, scores = self.scored_logits(pixels)
        return logits, self.scored_extras(scores, losses, {"id_weight": [float(w) for w in id_weights]})
