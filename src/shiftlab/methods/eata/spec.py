"""EATA (Niu, Wu, Zhang, Chen, Zheng, Zhao & Tan, ICML 2022, "Efficient Test-Time Model Adaptation without
Forgetting"), on CLIP as CLIPTTA's toolkit runs it (its `ETA`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, NormTTAConfig


@dataclass
class EATAConfig(NormTTAConfig):
    """CLIPTTA's ETA (`ttavlm/methods/eata.py`, built by `methods/__init__.py:163-168` from `configuration.py`'s
    defaults; it has no script of its own); the shared fields in `common/norm_config.py`."""
    # reliable samples: entropy < entropy_margin x ln(C) (--alpha_entropy 0.4, configuration.py:218, eata.py:36;
    # EATA's --e_margin ln(1000) x 0.40, main.py:86)
    entropy_margin: float = param(0.4, gt=0)
    # non-redundant samples: |cos(probs, moving average)| < redundancy_margin (--d_margin 0.05, configuration.py:219)
    redundancy_margin: float = param(0.05, gt=0)
    ema_momentum: float = param(0.9, ge=0, lt=1)        # 0.9 x average + 0.1 x batch mean (eata.py:106)
    # the probabilities of the redundancy filter and its moving average: False, softmax of the unscaled cosines
    # (CLIPTTA, eata.py:57, 60); True, of the scaled logits, as EATA's softmax of the classifier's outputs (eata.py:97)
    redundancy_on_scaled_logits: bool = False
    mean_entropy_weight: float = param(0.1, ge=0)      # --beta_reg 0.1 (configuration.py:186), subtracted
    # no reliable, non-redundant image: CLIPTTA steps anyway (on the mean-entropy term; eata.py:78-79); EATA skips
    # the step (eata.py:128-130)
    skip_empty_step: bool = False
    # Fisher anti-forgetting weight (EATA's --fisher_alpha 2000, main.py:85); 0: ETA, as CLIPTTA runs it. The Fisher
    # needs clean source images (EATA: 2000 of ImageNet's validation set, main.py:142-172): `fisher_source` below,
    # or in the library `EATA.compute_fisher(batches)`
    fisher_alpha: float = param(0.0, ge=0)
    # the folder of clean source images the Fisher is computed from when the method is set up (fisher_source.py),
    # read as dataset `fisher_dataset`: "imagefolder", any folder of class folders (ImageNet's validation set
    # among them); a dataset's name reads the folder as `--dataset NAME` would (e.g. "imagenet", any of its layouts)
    fisher_source: str | None = None
    fisher_dataset: str = "imagefolder"
    fisher_images: int = param(2000, ge=1)       # --fisher_size 2000 (main.py:84): a seeded random subset
    fisher_batch_size: int = param(64, ge=1)     # its loader's --batch_size 64 (main.py:70, 145)
    fisher_seed: int = param(2020, ge=0)         # --seed 2020 (main.py:66), random.seed before the subset (main.py:105)


class EATASpec(MethodSpec):
    capabilities = NORM_TTA
    test_config = {"steps": 1}
