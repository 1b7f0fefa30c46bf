"""TDA (Karmanov et al., CVPR 2024, "Efficient Test-Time Adaptation of Vision-Language Models").

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from ..adaptive_modes import Adaptive
from ..catalogue.cards import settings_file
from ..catalogue.declarations import (
    FROZEN_FEATURES,
    ONLINE,
    Capabilities,
    MethodSpec,
)
from ..common.tda_cache_config import TDAConfig


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
