"""How runs are written for people: attacks, model weights, run titles.

One formatter per thing, used by summary.md (shiftlab.results.summary) and the HTML report
(shiftlab.report), so the two never describe the same run differently. An attack is labelled by
the attack itself (its `label_format` and `details_format`, read through the attack catalogue
without importing torch).
"""
from __future__ import annotations

import os

from ..attacks import catalogue as attack_catalogue
from ..attacks.base import format_255

_RANDOM = ("none", "random")


def format_eps(eps: object) -> str:
    """0.00392 -> 'eps=1/255'; budgets are quoted in 1/255 units in papers. '' when unknown."""
    text = format_255(eps)
    return f"eps={text}" if text else ""


def is_random_weights(pretrained: object) -> bool:
    return pretrained is None or str(pretrained).strip().lower() in _RANDOM


def weights_label(pretrained: object) -> str:
    """'openai' -> 'openai'; '/ckpt/RN50.pt' -> 'checkpoint RN50.pt'; None -> 'random weights'."""
    if is_random_weights(pretrained):
        return "random weights"
    text = str(pretrained)
    if "/" in text or "\\" in text or text.endswith((".pt", ".pth", ".bin", ".safetensors")):
        return f"checkpoint {os.path.basename(text.replace(chr(92), '/')) or text}"
    return text


def model_label(model: object, pretrained: object) -> str:
    """'RN50 (openai)', 'RN50 (checkpoint x.pt)', 'shiftlab-tiny (random weights)'."""
    name = str(model or "?")
    weights = weights_label(pretrained)
    return name if f"({weights})" in name else f"{name} ({weights})"


def attack_label(attack: dict | None) -> str:
    """'pgd eps=4/255' for an attack config (a summary's entry, a record's `attack`); '' when there is none."""
    return attack_catalogue.label(attack)


def attack_details(attack: dict | None) -> str:
    """What the attack adds after its label in summary.md ('steps=7'); '' when nothing."""
    return attack_catalogue.details(attack)


def run_label(model: object, pretrained: object, dataset: object, attack: dict | None = None) -> str:
    """'RN50 (openai) on imagenet-r, attack pgd eps=1/255'."""
    text = f"{model_label(model, pretrained)} on {dataset or 'unknown'}"
    attacked = attack_label(attack)
    return f"{text}, attack {attacked}" if attacked else text


def suite_heading(table: dict) -> str:
    """A suite table's title line (suite.md, the corruption table): the suite and the model, and random weights
    said as summary.md says them."""
    line = f"### {table['title'] or table['suite']} · {model_label(table.get('model'), table.get('pretrained'))}"
    if is_random_weights(table.get("pretrained")):
        line += " · RANDOM WEIGHTS: accuracies are meaningless"
    return line
