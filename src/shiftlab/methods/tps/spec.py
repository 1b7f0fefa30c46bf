"""TPS: test-time prototype shifting (Sui, Wang & Yeung-Levy 2024, "Just Shift It: Test-Time Prototype"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...options import say_set
from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodSpec, ViewMethodConfig
from ..head_kinds import register_head

# "zeroshot": 'a photo of a {}.' (save_class_embeds.py:86); "ensemble": CLIP's 80 templates
# (save_class_embeds.py:84, --x_templates, every dataset); "descriptors": the class's descriptor
# sentences (save_concepts.py:120); "ensemble_descriptors": the two means averaged (learnable_shift.py:77,
# --with_concepts --with_templates: the README's recipe)
TEXT_HEADS = ("zeroshot", "ensemble", "descriptors", "ensemble_descriptors")


# TPS's own heads: it builds their prototypes itself (`TPS.prototypes`), the kinds only say what they are
register_head("descriptors", lambda cls, fields: "descriptor sentences (descriptors_file)")


register_head("ensemble_descriptors",
              lambda cls, fields: "CLIP's 80 templates + descriptor sentences (descriptors_file)")


SHIFTS = ("per_class", "shared")


@dataclass
class TPSConfig(ViewMethodConfig):
    """TPS's ImageNet-R settings (shift_classification.py, args.py, scripts/shift/*.sh at 556db0f)."""
    steps: int = param(1, ge=0)                     # every scripts/shift/*.sh:12 --tta_steps 1 (0: no tuning)
    lr: float = param(5e-3, ge=0)                   # args.py:13 default; README.md:48 passes 5e-3
    weight_decay: float = param(0.01, ge=0)         # AdamW's default: shift_classification.py:181 passes lr only
    selection_ratio: float = param(0.1, gt=0, le=1)   # args.py:20 --selection_p 0.1 (int(64 x 0.1) = 6 views)
    loss_scale: float = param(1000.0, gt=0)         # shift_classification.py:185 GradScaler(init_scale=1e3)
    # "per_class": scripts/shift/*per_class*.sh --per_label, one shift per class (shifter.py:36-37);
    # "shared": scripts/shift/shift_text_shared*.sh, one shift for all classes (shifter.py:40)
    shift: str = param("per_class", choices=SHIFTS)
    text_head: str = param("ensemble", choices=TEXT_HEADS)
    # their GPT-4 descriptors (gpt4_descriptors/<set>-gpt4.json: class -> phrases); not shipped
    descriptors_file: str | None = None


class TPSSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    published: tuple = ()    # their repository (README.md, scripts/) holds no result table or log

    @classmethod
    def config_problem(cls, config: Any, attacked: bool = False) -> str | None:
        if config.text_head in ("descriptors", "ensemble_descriptors") and not config.descriptors_file:
            return (f"tps.descriptors_file: text_head {config.text_head!r} needs the class descriptors (their "
                    f"gpt4_descriptors/<set>-gpt4.json, not shipped): pass {say_set('tps', 'descriptors_file', 'PATH')}"
                    f" (or {say_set('tps', 'text_head', 'ensemble')})")
        return super().config_problem(config, attacked)
