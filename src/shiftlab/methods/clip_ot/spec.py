"""CLIP-OT (Mishra, Silva-Rodríguez, Ben Ayed, Pedersoli & Dolz, arXiv 2024, "Words Matter: Leveraging Individual
Text Embeddings for Code Generation in CLIP Test-Time Adaptation"), as its authors' code runs it.

Sources are cited as `file:line` of
shambhavicodes/CLIPOT at 81b8a4e (`main.py`, `clipot.py`, `modeling/models.py`, `modeling/prompts.py`, `run.sh`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import ONLINE, OWN_TOWER, Capabilities, MethodSpec
from ..common.norm_config import OPTIMIZERS, NormTTAConfig
from ..head_kinds import register_head

# modeling/prompts.py:5-14 IMAGENET_TEMPLATES_SELECT, the templates main.py:96 builds the adapter with
TEMPLATES = ("itap of a {}.", "a bad photo of the {}.", "a origami {}.", "a photo of the large {}.",
             "a {} in a video game.", "art of the {}.", "a photo of the small {}.", "a photo of {}.")

register_head("clip_ot_templates", lambda cls, fields: (
    f"the mean of {len(fields.get('templates') or TEMPLATES)} templates' unnormalised text features; each "
    "template's own features for the transport targets"))


@dataclass
class ClipOTConfig(NormTTAConfig):
    """Their `main.py` arguments (run.sh's values) and `ClipOTMethod`'s optimiser; the shared fields in
    `common/norm_config.py`."""
    # one AdamW step per template, templates 0..steps-1 in order (main.py:117-127, --num_templates 8 in run.sh)
    steps: int = param(8, ge=1)
    optimizer: str = param("adamw", choices=OPTIMIZERS)    # AdamW(params, lr, weight_decay=1e-2) (clipot.py:72)
    lr: float = param(1e-4, gt=0)                          # lr=1e-4 (main.py:111)
    weight_decay: float = param(1e-2, ge=0)                # weight_decay=1e-2 (clipot.py:72)
    adam_eps: float = param(1e-8, gt=0)                    # AdamW's default eps (clipot.py:72 passes none)
    temperature: float = param(0.01, gt=0)                 # --temperature 0.01 (run.sh, main.py:38)
    epsilon: float = param(0.7, gt=0)                      # --epsilon 0.7, Sinkhorn's entropy weight (main.py:39)
    sinkhorn_iterations: int = param(3, ge=1)              # distributed_sinkhorn(num_iters=3) (clipot.py:40)
    # Sinkhorn's exp(similarity / epsilon) after subtracting each image's largest similarity: the same codes, but
    # finite where theirs overflows float32 (a cosine above ~0.62 at temperature 0.01, epsilon 0.7: NaN codes)
    stable_sinkhorn: bool = True
    text_head: str = param("clip_ot_templates", choices=("clip_ot_templates",))
    templates: tuple[str, ...] = TEMPLATES


class ClipOTSpec(MethodSpec):
    # the image tower's LayerNorms adapt on whole batches, the state carried from batch to batch (main.py never
    # calls ClipOTMethod.reset)
    capabilities = Capabilities(reads=(OWN_TOWER,), state=ONLINE, batches=True)
    # its code adapts nn.LayerNorm only (clipot.py:78-83, 100-107): a ResNet tower has none, and their AdamW stops on
    # an empty parameter list
    towers = ("vit",)
    towers_why = "it adapts the tower's LayerNorms, which a ResNet has none of (their code stops there too)"
    test_config = {"steps": 2, "lr": 0.01}
