"""TCA (Wang et al., ICCV 2025, "Is Less More? Exploring Token Condensation as Training-free Test-time Adaptation")."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import ONLINE, OWN_TOWER, Capabilities, MethodConfig, MethodSpec


@dataclass
class TCAConfig(MethodConfig):
    """TCA as `runner.run_test_tca` runs it (Jo-wang/TCA@0f846d6) with `--token_pruning Ours-0.1` and
    configs/imagenet_r.yaml (the defaults below)."""
    # the blocks that condense tokens. clip/model.py VisionTransformer.__init__: `drop_loc = [3, 6, 9]` (ViT-B/16's
    # 12 blocks). None: the same places in any depth L, blocks L/4, L/2, 3L/4 ((3, 6, 9) on 12 blocks); a tuple
    # names them, each a block of the tower (checked when the model is known)
    condense_blocks: tuple[int, ...] | None = param(None, ge=0)
    # `--token_pruning Ours-0.1` (runner.py:25): the share of the patch tokens a condensing block removes
    drop_rate: float = param(0.1, gt=0, lt=1)
    # clip/model.py ResidualAttentionBlock_Ours.forward: `coreset_averaging(x_cluster, num_centers=4)`
    merge_centers: int = param(4, ge=1)
    # configs/imagenet_r.yaml: reservoir_size 3, scale 0.1, lambd 3.0, beta 8.0 (imagenet.yaml: beta 5.0)
    reservoir_size: int = param(3, ge=1)
    scale: float = param(0.1, gt=0)
    lambd: float = param(3.0, ge=0)
    beta: float = param(8.0, ge=0)
    # runner.py `--flag` (default True): the class-token cache steers the condensing blocks' attention
    cls_cache: bool = True
    # "zeroshot": "a photo of a {}." (the leaderboard's); "ensemble": CLIP's 80 templates (theirs for the ImageNet
    # family, datasets/imagenet_r.py:7 etc., averaged as utils.clip_classifier)
    text_head: str = param("zeroshot", choices=("zeroshot", "ensemble"))
    # None: the model's exp(logit_scale); their utils.get_clip_logits multiplies by the literal 100
    logit_scale: float | None = param(None, gt=0)
    # the first centre of each token clustering is drawn at random (their global torch RNG): shiftlab draws it
    # from a generator seeded by (seed, sample index), so a resumed stream draws the same
    seed: int = param(0, ge=0, le=2 ** 63 - 1)


class TCASpec(MethodSpec):
    # the class tokens of every block and the condensed token sequence live inside the image tower: it runs the
    # tower on view 0's pixels itself, once per image
    capabilities = Capabilities(reads=(OWN_TOWER,), state=ONLINE)
    # runner.py:24 `--backbone choices=['ViT-B/16']`: the condensation prunes and merges a ViT's tokens
    towers = ("vit",)
    towers_why = "it condenses the ViT's patch tokens inside its blocks (their runner.py offers ViT-B/16 only)"
    # the tiny ViT's 4 blocks condense at 1, 2, 3; a reservoir of 2 per class fills up (and replaces) on a short stream
    test_config = {"reservoir_size": 2}
