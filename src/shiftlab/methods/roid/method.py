"""ROID on CLIP, as mariodoebler/test-time-adaptation runs it (`classification/methods/roid.py`, 8b2ed63), for every
batch of test images (view 0 of each, through the tower of `common.norm_adaptation`: every normalisation layer's
affine parameters adapt, BatchNorm with the batch's statistics), `steps` times: the weighted soft likelihood ratio
plus the consistency loss on an augmentation of the kept images, one SGD step, then the adapted parameters
ensembled with the source's (p <- 0.99 p + 0.01 p_source); the outputs prior-corrected
(`common/roid_training.py`). README.md lists what differs from the authors' code.
"""
from __future__ import annotations

from ..common.roid_training import RoidTTAMethod, ema_merge
from .spec import ROIDSpec


class ROID(RoidTTAMethod):
    """ROID: weight ensembling with the source, diversity and certainty weighting, prior correction."""
    spec = ROIDSpec

    def after_step(self) -> None:
        # the source weights are the tower's initial norm parameters (roid.py:45-47, 93-98)
        source = [self._initial_norm[n].to(p.device) for n, p in zip(self.tower.parameter_names,
                                                                       self.tower.adapted_parameters())]
        ema_merge(self.tower.adapted_parameters(), source, self.config.momentum_src)
