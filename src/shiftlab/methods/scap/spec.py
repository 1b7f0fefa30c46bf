"""SCAP (Zhang, Xu, Liu, Peng & Zhou, CVPR 2025, "SCAP: Transductive Test-Time Adaptation via Supportive
Clique-based Attribute Prompting").

Sources are cited as `file:line` of
github.com/zhoujiahuan1991/CVPR2025-SCAP at 5057c96 (the run behind their ImageNet-R number: scripts/R.sh)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ...views.recipe import ViewRecipe
from ..catalogue.declarations import ONLINE, OWN_TOWER, Capabilities, MethodSpec, ViewMethodConfig
from ..head_kinds import register_head

# scripts/R.sh `--ctx_init`: 78 templates, "_" read as " " (my_clip_CSTP.py:260); "CLS" is the class name. The
# first is the learnable one (its words before CLS are the class's own context tokens, my_clip_CSTP.py:277-283),
# the others are averaged, unnormalised, into the fixed ensemble feature (my_clip_CSTP.py:284-293)
R_TEMPLATES = (
    'a drawing of a CLS', 'a photo of many CLS', 'a photo of the hard to see CLS',
    'a low resolution photo of the CLS', 'a rendering of a CLS', 'graffiti of a CLS', 'a bad photo of the CLS',
    'a cropped photo of the CLS', 'the embroidered CLS', 'a photo of a hard to see CLS', 'a bright photo of a CLS',
    'a photo of a clean CLS', 'a photo of a dirty CLS', 'a dark photo of the CLS', 'a drawing of a CLS',
    'a photo of my CLS', 'the plastic CLS', 'a photo of the cool CLS', 'a close-up photo of a CLS',
    'a black and white photo of the CLS', 'a painting of the CLS', 'a painting of a CLS',
    'a pixelated photo of the CLS', 'a sculpture of the CLS', 'a bright photo of the CLS',
    'a cropped photo of a CLS', 'a plastic CLS', 'a photo of the dirty CLS', 'a jpeg corrupted photo of a CLS',
    'a blurry photo of the CLS', 'a photo of the CLS', 'a good photo of the CLS', 'a rendering of the CLS',
    'a CLS in a video game', 'a photo of one CLS', 'a doodle of a CLS', 'a close-up photo of the CLS',
    'a photo of a CLS', 'the origami CLS', 'the CLS in a video game', 'a sketch of a CLS', 'a doodle of the CLS',
    'a origami CLS', 'a low resolution photo of a CLS', 'the toy CLS', 'a rendition of the CLS',
    'a photo of the clean CLS', 'a photo of a large CLS', 'a rendition of a CLS', 'a photo of a nice CLS',
    'a photo of a weird CLS', 'a blurry photo of a CLS', 'a cartoon CLS', 'art of a CLS', 'a sketch of the CLS',
    'a embroidered CLS', 'a pixelated photo of a CLS', 'itap of the CLS', 'a jpeg corrupted photo of the CLS',
    'a good photo of a CLS', 'a plushie CLS', 'a photo of the nice CLS', 'a photo of the small CLS',
    'a photo of the weird CLS', 'the cartoon CLS', 'art of the CLS', 'a drawing of the CLS',
    'a photo of the large CLS', 'a black and white photo of a CLS', 'the plushie CLS', 'a dark photo of a CLS',
    'itap of a CLS', 'graffiti of the CLS', 'a toy CLS', 'itap of my CLS', 'a photo of a cool CLS',
    'a photo of a small CLS', 'a tattoo of the CLS',
)


def _describe_head(cls: type, fields: dict) -> str:
    templates = fields.get("templates", R_TEMPLATES)
    rate = fields.get("ensemble_rate", 0.65)
    first = templates[0].replace("CLS", "{}")
    if len(templates) == 1:
        return f"'{first}', its context words learnt per class"
    return (f"'{first}', its context words learnt per class, {1 - rate:g} / {rate:g} with the mean of its "
            f"{len(templates) - 1} other templates")


# SCAP's own head: its prompt learner builds it (prompts.TemplateText); the kind only says what it is
register_head("scap_templates", _describe_head)


@dataclass
class SCAPConfig(ViewMethodConfig):
    """SCAP as scripts/R.sh runs main.py (the defaults below; main.py's argparse where R.sh says nothing)."""
    # R.sh `-b` default 64 (main.py:608): the original + 63 views of each image (data/datautils.py AugMixAugmenter)
    views: ViewRecipe = ViewRecipe(n_views=64)
    lr: float = param(5e-3, gt=0)                          # main.py:609 (AdamW, weight decay 0.01: torch's default)
    steps: int = param(1, ge=1)                            # main.py:617 --tta_steps 1
    selection_p: float = param(0.1, gt=0, le=1)            # main.py:616: the confident share of an image's views
    # R.sh --ctx_init; the first template's context words are learnt per class, the others form the ensemble
    templates: tuple[str, ...] = R_TEMPLATES
    # R.sh --use_ensemble 1 --ensemble_rate 0.65: text = (1 - r) learnt + r ensemble, both unnormalised
    ensemble_rate: float = param(0.65, ge=0, le=1)
    # R.sh --text_prompt_ema_w 0.1: each image starts from w * text EMA + (1 - w) * initial text prompt (main.py:480)
    text_ema_w: float = param(0.1, ge=0, le=1)
    # R.sh --text_prompt_ema_one_weight_h 5000: the predicted class's text EMA decays by exp(-max logit / h)
    text_ema_h: float = param(5000.0, gt=0)
    # R.sh --image_prompt_ema_w 0.1 / --image_prompt_ema_h 5000 (--image_prompt_ema 4: one EMA per class)
    image_ema_w: float = param(0.1, ge=0, le=1)
    image_ema_h: float = param(5000.0, gt=0)
    # main.py:643 --image_prompt_layer [1]: the blocks whose attention reads the image prompt (one key and one
    # value token each, prefix tuning: my_clip_CSTP.py:556-589)
    prompt_layers: tuple[int, ...] = param((1,), ge=0)
    # the image prompt starts uniform in (-1, 1) (my_clip_CSTP.py:62-69, the CUDA RNG); here seeded
    prompt_seed: int = param(0, ge=0, le=2 ** 63 - 1)
    # R.sh --use_group 1: the batch's supportive cliques (batch_utils.py:150-183), each tuned before the images
    cliques: bool = True
    # R.sh --image_feature_threshold 0.9: images of one zero-shot class whose features' cosine exceeds it
    clique_threshold: float = param(0.9, ge=-1, le=1)
    clique_max: int = param(100, ge=1)                     # batch_utils.py:199: a clique's first 100 images
    # batch_utils.py:227: a class is a clique's negative when its mean probability <= 0.7 x the top one
    negative_ratio: float = param(0.7, ge=0, le=1)
    mse_weight: float = param(0.01, ge=0)                  # main.py:705 --mse_loss_weight (times 100, batch_utils:246)
    retention_rate: float = param(100.0, gt=0)             # main.py:669 --retention_rate
    reset_to_retention: bool = True                        # R.sh --reset_to_retention 1
    w_step: float = param(1.0, ge=0)                       # R.sh --w_step 1.0
    w_prompt: float = param(0.1, ge=0)                     # R.sh --w_prompt 0.1
    w_pow: float = param(1.0, ge=0)                        # main.py:697 --w_pow


class SCAPSpec(MethodSpec):
    # image prompts inside the ViT's attention and per-class text prompts, tuned on each batch's cliques and on
    # each image's views; the prompts, their EMAs, the cliques' retention prompts and AdamW's moments carry on
    capabilities = Capabilities(reads=(OWN_TOWER,), state=ONLINE, batches=True)
    text_head = "scap_templates"
    # my_clip_CSTP.py:516-594: the prompt is a key/value prefix of a ViT block's attention
    towers = ("vit",)
    towers_why = "its image prompt is a key/value prefix inside the ViT's attention (their my_clip_CSTP.py offers ViTs)"
    # four views (one confident), one template of each kind: every part runs on a short stream
    test_config = {"views": ViewRecipe(n_views=4), "selection_p": 0.25,
                   "templates": ("a photo of a CLS", "a drawing of a CLS")}
