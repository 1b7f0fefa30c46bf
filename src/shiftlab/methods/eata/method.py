"""EATA on CLIP (Niu et al., ICML 2022), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at f4221f4,
`ttavlm/methods/eata.py`, its `ETA`), for every batch of test images (view 0 of each, through the tower of
`common.norm_adaptation`):

1. logits = scale x cosine; per-image entropy H; reliable images: H < entropy_margin x ln(C);
2. non-redundant images among them: |cos(p, m)| < redundancy_margin, p an image's probabilities, m the moving
   average of earlier selected images' probabilities (no filter while m does not exist yet); m <- 0.9 m + 0.1
   mean(p) over the selected images (their mean starts it);
3. loss = mean over the selected images of H x exp(entropy_margin x ln C - H) (weights without gradient),
   minus `mean_entropy_weight` x the entropy of the batch's mean prediction, plus (with `fisher_alpha` > 0)
   EATA's Fisher penalty sum F (theta - theta0)^2; one optimiser step per `steps`;
4. the batch's logits through the adapted tower.

README.md lists what differs from the authors' code and how the Fisher is computed.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F

from ...options import say_set
from ..common.confidence import entropy
from ..common.norm_adaptation import BatchStatisticsError, NormTTAMethod, mean_prediction_entropy
from .fisher_source import FisherSource
from .spec import EATASpec


def select_samples(entropies: torch.Tensor, probs: torch.Tensor, average: torch.Tensor | None, entropy_margin: float,
                   redundancy_margin: float) -> torch.Tensor:
    """(B,) entropies, (B, C) probabilities, the moving average (C,) or None -> (B,) bool: reliable, not redundant."""
    keep = entropies < entropy_margin
    if average is not None:
        cos = F.cosine_similarity(average[None], probs, dim=1)
        keep = keep & (cos.abs() < redundancy_margin)
    return keep


def updated_average(average: torch.Tensor | None, selected_probs: torch.Tensor,
                    momentum: float) -> torch.Tensor | None:
    """EATA's moving average of the selected images' probabilities (unchanged when none was selected)."""
    if selected_probs.shape[0] == 0:
        return average
    mean = selected_probs.detach().mean(0)
    return mean if average is None else momentum * average + (1 - momentum) * mean


class EATA(NormTTAMethod):
    """EATA: entropy-weighted entropy minimisation on the reliable, non-redundant images of each batch."""
    spec = EATASpec

    def reset_extra(self) -> None:
        self.average: torch.Tensor | None = None
        self.selected_total = 0
        self.reliable_total = 0
        if not hasattr(self, "fishers"):     # the Fisher and its source images outlive every reset
            self.fishers: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
            self.source: FisherSource | None = None

    def extra_state(self) -> dict[str, Any]:
        return {"average": self.average, "selected_total": self.selected_total, "reliable_total": self.reliable_total}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.average = state["average"]
        self.selected_total, self.reliable_total = int(state["selected_total"]), int(state["reliable_total"])

    # -- EATA's Fisher anti-forgetting term ----------------------------------------------------------------
    def prepare(self) -> None:
        """With `fisher_alpha` > 0 and `fisher_source`: EATA's Fisher of the chosen source images (fisher_source.py),
        at the initial parameters, once per setup (a resumed run recomputes the same one before its state is
        restored). Refused in one line: `fisher_alpha` > 0 without a Fisher or a source, a source without
        `fisher_alpha`."""
        super().prepare()
        cfg = self.config
        if cfg.fisher_source is not None and cfg.fisher_alpha == 0:
            raise ValueError(f"eata.fisher_source is set but eata.fisher_alpha is 0: the Fisher would not be used; "
                             f"set {say_set('eata', 'fisher_alpha', 2000.0)} (EATA's) or leave out fisher_source")
        if cfg.fisher_alpha == 0 or self.fishers is not None:
            return
        if cfg.fisher_source is None:
            raise ValueError(self._no_fisher())
        self.source = FisherSource(cfg)
        initial, current = self._initial_norm, self.tower.norm_state()
        self.tower.load_norm_state(initial)
        try:
            self.compute_fisher(self.source.batches(self.model, cfg.fisher_batch_size))
        except BatchStatisticsError:
            n, size = len(self.source.ids), cfg.fisher_batch_size
            raise ValueError(f"eata: the Fisher's {n} source images in batches of {size} leave a batch of one image, "
                             f"whose BatchNorm layers in {self.model.name} have no batch statistics; choose "
                             f"{say_set('eata', 'fisher_images', n - n % size or n + 1)} or another "
                             "fisher_batch_size") from None
        finally:
            self.tower.load_norm_state(current)

    def loaded_weights(self) -> dict[str, Any]:
        """Which source images the Fisher was computed from (run.json's identity): their count and the SHA-256
        of their paths and contents."""
        if self.source is None:
            return {}
        return {"fisher_images_used": len(self.source.ids), "fisher_images_sha256": self.source.digest}

    def _no_fisher(self) -> str:
        return (f"eata.fisher_alpha > 0 needs the Fisher information of clean source images: "
                f"{say_set('eata', 'fisher_source', 'FOLDER')} (EATA: 2000 of ImageNet's validation images), or in "
                "Python call method.compute_fisher(batches) first (fisher_alpha=0 is ETA, as CLIPTTA runs it)")

    def compute_fisher(self, batches: Iterable[torch.Tensor]) -> None:
        """EATA's Fisher (main.py:142-172) from clean source images: normalised pixels (B, 3, S, S) per batch. For each
        batch the cross-entropy of the tower's logits against their own argmax; the squared gradient of every
        adapted parameter, averaged over the batches; kept with the parameters' initial values."""
        params = self.tower.adapted_parameters()
        sums = [torch.zeros_like(p) for p in params]
        n = 0
        with torch.enable_grad():
            for pixels in batches:
                logits = self.logits(pixels.to(self.model.device))
                loss = F.cross_entropy(logits, logits.argmax(1).detach())
                grads = torch.autograd.grad(loss, params)
                for s, g in zip(sums, grads):
                    s.add_(g.detach() ** 2)
                n += 1
        if n == 0:
            raise ValueError("eata: compute_fisher needs at least one batch of source images")
        self.fishers = {name: (s / n, p.detach().clone())
                        for name, s, p in zip(self.tower.parameter_names, sums, params)}

    def fisher_penalty(self) -> torch.Tensor:
        return sum((f * (p - p0) ** 2).sum() for (f, p0), p in
                   zip(self.fishers.values(), self.tower.adapted_parameters()))

    # -- a batch --------------------------------------------------------------------------------------------
    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        if cfg.fisher_alpha > 0 and self.fishers is None:
            raise ValueError(self._no_fisher())
        margin = cfg.entropy_margin * math.log(len(self.classnames))
        selected_rows = torch.zeros(pixels.shape[0], dtype=torch.bool)
        for _ in range(cfg.steps):
            logits = self.logits(pixels)
            entropies = entropy(logits)
            filter_logits = logits if cfg.redundancy_on_scaled_logits else logits / self.scale
            probs = filter_logits.detach().softmax(1)
            keep = select_samples(entropies.detach(), probs, self.average, margin, cfg.redundancy_margin)
            reliable = entropies.detach() < margin
            self.average = updated_average(self.average, probs[keep], cfg.ema_momentum)
            self.selected_total += int(keep.sum())
            self.reliable_total += int(reliable.sum())
            selected_rows |= keep.cpu()
            chosen = entropies[keep]
            loss = (chosen * torch.exp(margin - chosen.detach())).mean(0) if chosen.numel() else logits.sum() * 0
            if cfg.mean_entropy_weight:
                loss = loss - cfg.mean_entropy_weight * mean_prediction_entropy(logits)
            if cfg.fisher_alpha > 0:
                loss = loss + cfg.fisher_alpha * self.fisher_penalty()
            if chosen.numel() == 0 and cfg.skip_empty_step:
                self.optimizer.zero_grad(set_to_none=True)
                continue
            self.step(loss)
        with torch.no_grad():
            logits = self.logits(pixels)
        return logits, [{"selected": bool(s), "selected_total": self.selected_total} for s in selected_rows.tolist()]
