"""AWT (Zhu et al., NeurIPS 2024), zero-shot: augmented views and LLM class descriptions, weighted by their
prediction entropy and aligned by optimal transport; training-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...options import say_set
from ...params import param
from ...views.recipe import ViewRecipe
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodSpec, ViewMethodConfig
from ..head_kinds import register_head

# github.com/MCG-NJU/AWT at b2b49a8, AWT_zero_shot/: evaluate.py, pre_extract.py, data/datautils.py,
# data/cls_to_names.py, scripts/{evaluate,pre_extract}.sh

register_head("awt_descriptions", lambda cls, fields: (
    f"'{fields.get('template', 'a photo of a {}')}.' + {fields.get('n_descriptions', 0)} LLM descriptions per "
    "class (description_file), one feature each"))

# data/cls_to_names.py:69-90 CUSTOM_TEMPLATES (evaluate.py appends "." or ". " + a description)
TEMPLATES = {"imagenet": "a photo of a {}", "imagenet-v2": "a photo of a {}", "imagenet-a": "a photo of a {}",
             "imagenet-r": "a rendition photo of a {}", "imagenet-sketch": "a sketch photo of a {}",
             "oxford-pets": "a photo of a {} from OxfordPets", "flowers102": "a photo of a {}, a type of flower",
             "fgvc-aircraft": "a photo of a {} from Fine-Grained Visual Classification of Aircraft",
             "dtd": "a photo of a {}, which is a type of texture, or a type of pattern",
             "eurosat": "satellite photo of the {}", "stanford-cars": "a photo of a {}",
             "food101": "a photo of a {} from Food101", "sun397": "a photo of a {}", "caltech101": "a photo of a {}",
             "ucf101": "a photo of a person doing {}"}


@dataclass
class AWTConfig(ViewMethodConfig):
    # pre_extract.sh BS=50 augmented views + the original (datautils.py Augmenter: [image] + 50 views of
    # RandomResizedCrop(224) + RandomHorizontalFlip, get_preaugment)
    views: ViewRecipe = ViewRecipe(n_views=51)
    # their description files (AWT_zero_shot/descriptions/image_datasets/<set>.json: class name -> sentences;
    # imagenet.json for ImageNet, -A and -V2); not shipped: --set awt.description_file=PATH
    description_file: str | None = None
    # scripts/evaluate.sh N_DESC=50, under --protocol paper (with description_file); 0: the class prompt alone, the
    # default because their files are not shipped (as DMN's CuPL head and TPS's descriptors)
    n_descriptions: int = param(0, ge=0)
    # data/cls_to_names.py CUSTOM_TEMPLATES (ImageNet's; each dataset's own: dataset_values)
    template: str = "a photo of a {}"
    image_temperature: float = param(0.5, gt=0)   # evaluate.py AWT_evaluation image_temperature
    text_temperature: float = param(0.5, gt=0)    # evaluate.py AWT_evaluation text_temperature
    ot_eps: float = param(0.1, gt=0)              # evaluate.py optimal_transport eps
    sinkhorn_iterations: int = param(100, ge=1)   # evaluate.py Sinkhorn: range(100)
    sinkhorn_tol: float = param(1e-2, ge=0)       # evaluate.py Sinkhorn: thresh (mean |r - r_prev|)


class AWTSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    text_head = "awt_descriptions"
    test_config = {"n_descriptions": 0}

    @classmethod
    def config_problem(cls, config: Any, attacked: bool = False) -> str | None:
        if config.n_descriptions and not config.description_file:
            return (f"{cls.name}.description_file: not set; AWT reads its authors' description files (MCG-NJU/AWT "
                    f"AWT_zero_shot/descriptions/image_datasets/<set>.json): "
                    f"{say_set(cls.name, 'description_file', 'PATH')}, or {say_set(cls.name, 'n_descriptions', 0)}")
        return super().config_problem(config, attacked)
