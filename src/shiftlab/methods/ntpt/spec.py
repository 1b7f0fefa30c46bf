"""N-TPT, as TTABC runs it (walawalagoose/TTABC `ttabc/model_selection/ntpt.py`, the only code found): TPT plus a
penalty pulling the class text features' pairwise cosines to the regular simplex's 1 / (1 - K).

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec


@dataclass
class NTPTConfig(PromptTuningConfig):
    # TTABC ttabc/configs/algorithms.py@abb828a "ntpt": lambda_term 10.0 (lr 5e-3, 1 step, selection 0.1, 4 context
    # tokens from "a photo of a", 64 views: the TPT defaults)
    lambda_simplex: float = param(10.0, ge=0)


class NTPTSpec(PromptTuningSpec):
    name = "ntpt"
    # no paper is named by the code; the collection that ships it, as its README names it (the year: its README's
    # own citation, arXiv 2506.02671, 2025)
    bibtex = r"""@misc{ttabc,
  title = {TTABC: Test-Time Adaptation Benchmark of CLIP},
  author = {Huang, Jiazhen and Chen, Xiao and Jiang, Xu},
  howpublished = {\url{https://github.com/walawalagoose/TTABC}},
  note = {ttabc/model_selection/ntpt.py},
  year = {2025}
}"""
    impl = "shiftlab.methods.ntpt.method:NTPT"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "bpda", "eot"),
                        "the image tower, every AdamW step of the prompt (create_graph through the text"
                        " tower) and the readout with the simplex penalty in the loss; bpda: the"
                        " confident-view selection (its indices constant on the backward pass); random crops"
                        " drawn afresh (eot)",
                        impl="shiftlab.methods.common.prompt_tuning_adaptive:prompt_tuning_logits")
    config_class = NTPTConfig
    summary = ("N-TPT: TPT loss + lambda x mean squared gap of the class features' pairwise cosines to the "
               "simplex's 1/(1-K)")
    label = "N-TPT"
    # TTABC's ntpt.py: torch.amp.autocast('cuda') + GradScaler(init_scale=1000) (base_method.py)
    protocols = {"paper": {"precision": "fp16"}}
    published = ()      # TTABC's README points to an external spreadsheet; its repository holds no numbers
    fidelity = "golden (TTABC's ntpt.py as the code index stores it at abb828a; λ 10, 2 steps)"
