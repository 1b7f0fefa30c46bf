"""GTTA (Marsden, Döbler & Yang, "Gradual Test-Time Adaptation by Self-Training and Style Transfer", arXiv
2208.07736), as mariodoebler/test-time-adaptation runs it (`classification/methods/gtta.py` at 8b2ed63): registered
so that `shiftlab methods` lists it and a run naming it is refused in one line with the reason (README.md).

Its spec, without torch; there is no method.py."""
from __future__ import annotations

from ..catalogue.declarations import MethodSpec


class GTTASpec(MethodSpec):
    name = "gtta"
    # gtta.py:20-31 and 96-117: every step a labelled source batch from get_source_loader (ImageNet's training set
    # for ImageNet-R/-C with CLIP, data_loading.py:262-263) and, with USE_STYLE_TRANSFER, an AdaIN decoder
    # pretrained on those images (gtta.py:44-50)
    refused = ("it trains on labelled source images at every step (their get_source_loader: ImageNet's training "
               "set for CLIP on ImageNet variants, and an AdaIN decoder pretrained on it), which a test-time run on "
               "CLIP does not have: CLIP's source is its web pretraining data")
