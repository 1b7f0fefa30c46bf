"""TDA (Karmanov et al., CVPR 2024, "Efficient Test-Time Adaptation of Vision-Language Models").

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..facts import settings_file
from ..specs import (
    FROZEN_FEATURES,
    ONLINE,
    Capabilities,
    MethodSpec,
    ViewMethodConfig,
)


@dataclass
class TDAConfig(ViewMethodConfig):
    """TDA's ImageNet-R hyperparameters, from the authors' `configs/imagenet_r.yaml` in
    github.com/kdiAAA/TDA (values read from verbatim copies of that file: positive
    shot_capacity 3, alpha 1.0, beta 8.0; negative shot_capacity 2, alpha 0.117, beta 1.0,
    entropy_threshold 0.2-0.5, mask_threshold 0.03-1.0). The view selection (10% lowest
    entropy, mean of their features and logits) and the entropy normalisation are those of
    `get_clip_logits` / `get_entropy` in the repository's `utils.py`; the classifier is
    `clip_classifier` over the 80 CLIP ImageNet templates (`datasets/imagenet_r.py`).
    Their model is the half-precision CLIP of `clip.load` on CUDA: `precision="fp16-pure"` (the
    `paper` protocol's) encodes the views and the text head with that model; the arithmetic after
    the encoders (logits, entropies, cache affinities) stays float32 here, fp16 in theirs.
    """
    pos_capacity: int = param(3, ge=0)             # positive cache: entries per class (0: no cache)
    pos_alpha: float = param(1.0, ge=0)
    pos_beta: float = param(8.0, ge=0)
    neg_capacity: int = param(2, ge=0)             # negative cache: entries per class (0: no cache)
    neg_alpha: float = param(0.117, ge=0)
    neg_beta: float = param(1.0, ge=0)
    neg_entropy_lower: float = param(0.2, ge=0)    # a sample enters the negative cache iff lower < H_norm < upper
    neg_entropy_upper: float = param(0.5, ge=0)
    neg_mask_lower: float = param(0.03, ge=0, le=1)   # negative pseudo-labels: classes with lower < p < upper
    neg_mask_upper: float = param(1.0, ge=0, le=1)
    view_ratio: float = param(0.1, gt=0, le=1)     # share of views (lowest entropy) averaged; at least one
    # "ensemble": 80 templates (the authors'); "zeroshot": one template
    text_head: str = param("ensemble", choices=("ensemble", "zeroshot"))
    # the "ensemble" head's templates; None: CLIP's 80 (`--protocol paper` sets the dataset's, datasets/*.py)
    templates: tuple[str, ...] | None = None
    # H_norm = H (nats) / log2(C) as the authors' code; "ln": / ln(C)
    entropy_norm: str = param("log2", choices=("log2", "ln"))
    # None: the model's exp(logit_scale); the authors' code multiplies by the literal 100.0
    # (`get_clip_logits`), which differs from a checkpoint's exp(logit_scale) in the last digits
    logit_scale: float | None = param(None, gt=0)


class TDASpec(MethodSpec):
    name = "tda"
    # its paper, as `shiftlab methods --bibtex` prints it (the authors' own BibTeX where their README has one)
    bibtex = r"""@inproceedings{karmanov2024tda,
  title = {Efficient Test-Time Adaptation of Vision-Language Models},
  author = {Karmanov, Adilbek and Guan, Dayan and Lu, Shijian and El Saddik, Abdulmotaleb and Xing, Eric},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year = {2024}
}"""
    impl = "shiftlab.methods.tda.method:TDA"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    adaptive = Adaptive(("state", "bpda", "eot"),
                        "attacked against the state it holds when the sample arrives (state); the sample's own"
                        " cache write on a copy of the caches, the written feature differentiated; bpda: the"
                        " confident-view selection and which entry a write keeps; random crops drawn afresh (eot)",
                        impl="shiftlab.methods.tda.adaptive:tda_logits")
    config_class = TDAConfig
    supports_pure_fp16 = True   # --set tda.precision=fp16-pure: the authors' half model (on CUDA)
    summary = "TDA: online positive/negative feature caches over confident views (training-free)"
    label = "TDA"
    # kdiAAA/TDA: 63 AugMix views + the original, 80 templates (configs/imagenet_r.yaml). The authors run the
    # model itself in fp16 (`clip.load` on CUDA, no autocast: "fp16-pure", float32 on the CPU as every
    # precision) with the logit scale fixed at 100.
    protocols = {"paper": {"precision": "fp16-pure", "views": {"n_views": 64, "augmix": True}, "text_head": "ensemble",
                           "logit_scale": 100.0}}
    dataset_values = settings_file("tda")     # configs/<set>.yaml and datasets/<set>.py's templates
    published = (
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=62.58,
             source="github.com/kdiAAA/TDA README.md@e697fb0, 'Results' table 'OOD Benchmark' (CLIP ResNet-50)"),
    )
    fidelity = "golden (24-sample stream, caches after every sample; `logit_scale=100`)"
    # both caches fill on a short stream
    test_config = {"pos_capacity": 2, "neg_entropy_lower": 0.0, "neg_entropy_upper": 1.0}
