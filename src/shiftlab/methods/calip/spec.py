"""CALIP (Guo et al., AAAI 2023, "CALIP: Zero-Shot Enhancement of CLIP with Parameter-free Attention")."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, MethodConfig, MethodSpec

# class_template.py:167-175@83e21b6: their ImageNet templates (Tip-Adapter's 7), in their order
CALIP_TEMPLATES = ("itap of a {}.", "a bad photo of the {}.", "a origami {}.", "a photo of the large {}.",
                   "a {} in a video game.", "art of the {}.", "a photo of the small {}.")


@dataclass
class CALIPConfig(MethodConfig):
    """CALIP's computation as `run_imagenet.py`'s `get_logits` (lines 74-92@83e21b6) does it. The two weights are
    searched on the test labels by their code (lines 95-121: 200 x 200 points in [0.001, 2.0] x [0.001, 0.1],
    configs/imagenet.yaml:16-17); shiftlab takes the fixed values of the CALIP in CLIPTTA's benchmark
    (MarcLafon/cliptta ttavlm/configuration.py:293, `--beta_calip 2.0 0.1`: the ends of that search range),
    since a search on labels is not test-time adaptation."""
    # beta2: weight of the class features attended by the image's tokens, read against the global feature (l1)
    beta_text: float = param(2.0, ge=0)
    # beta3: weight of the tokens attended by the class features (mean + max over positions), read against them (l2)
    beta_visual: float = param(0.1, ge=0)
    # the attention's logits are token . class x 2 (run_imagenet.py:78), softmaxed over positions and over classes
    attention_scale: float = param(2.0, gt=0)
    # "zeroshot": "a photo of a {}." (the leaderboard's); "ensemble": `head_templates` averaged (theirs, utils.py:4-16)
    text_head: str = param("zeroshot", choices=("zeroshot", "ensemble"))
    head_templates: tuple[str, ...] = CALIP_TEMPLATES
    # None: the model's exp(logit_scale); their code multiplies all three logits by the literal 100 (lines 68, 86-87)
    logit_scale: float | None = param(None, gt=0)


class CALIPSpec(MethodSpec):
    # the image tower's spatial tokens are not in the frozen (pooled) features: it runs the tower on view 0's pixels
    # itself, once, and reads the global feature from the same pass
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC)
    test_config = {}
