"""TPS: test-time prototype shifting (Sui, Wang & Yeung-Levy 2024, "Just Shift It: Test-Time Prototype
Shifting for Zero-Shot Generalization with Vision-Language Models", arXiv 2403.12952), episodic.

The class prototypes are precomputed text features; per test image, a shift vector per class is added
to the normalised prototypes, which are then normalised again and scored against the frozen view
features. The shifts start at zero and take `steps` AdamW steps on the marginal entropy of the 10%
most confident views (selected anew at every step); view 0 is then scored with the shifted prototypes.
Neither tower runs per step, so TPS reads only view features (a feature store serves it).

Source: github.com/elaine-sui/TPS at 556db0fe310f029fc7b796ffa83eaa64c578b505; line numbers below are
of that commit. `shift_classification.py` (the loop), `model/learnable_shift.py` (prototypes and
forward), `model/shifter.py` (the shift), `run_utils.py` (selection, loss), `utils/save_class_embeds.py`
and `utils/save_concepts.py` (the prototypes' prompts), `scripts/shift/*.sh` (the recipes).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ...models.head_cache import cached_head
from ...models.text import encode_texts, read_class_sentences
from ...options import say_set
from ..base import MethodOutput, in_groups
from ..common.confidence import marginal_entropy_as_tpt, select_confident
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import TPSSpec

# the largest (samples x classes x dim) shift tensor tuned at once (floats); ImageNet-R RN50: 327 images
_GROUP_FLOATS = 2 ** 26


def descriptor_sentence(name: str, phrase: str) -> str:
    """The prompt their save_concepts.py:52-61,120 builds from a class name and one descriptor phrase.
    The tests are on the phrase's first characters, not its first word (as theirs): 'antlers' reads as
    if it began with the article 'a'."""
    if phrase.startswith("a"):
        return f"{name}, which is {phrase}"
    if phrase.startswith(("has", "often", "typically", "may", "can")):
        return f"{name}, which {phrase}"
    if phrase.startswith("used"):
        return f"{name}, which is {phrase}"
    return f"{name}, which has {phrase}"


def load_descriptors(path: str, classnames: Sequence[str], field: str = "tps.descriptors_file") -> list[list[str]]:
    """Per class, its descriptor phrases from a JSON file {class: [phrase, ...]} (their format). A class is
    found by name ('_' read as ' ', any case); when some are not, the file's entries pair with the classes
    by position, as their save_concepts.py:108 zips them: entry i is class i when the file lists as many
    classes as the run, or ImageNet class i when it lists ImageNet's 1000 (their ImageNet file names some
    classes otherwise: 'eft' for newt). A file that fits none of these is refused in one line."""
    try:
        data = read_class_sentences(path, field, "descriptor phrases")
    except ValueError as err:
        if os.path.isdir(os.path.expanduser(path)):   # their descriptors come one file per dataset
            raise ValueError(f"{field}: {path!r} is a directory; pass the dataset's file (their "
                             "gpt4_descriptors/<set>-gpt4.json)") from None
        raise err from None
    rows = list(data.values())
    by_name = {k.replace("_", " ").lower(): v for k, v in data.items()}
    keys = [c.replace("_", " ").lower() for c in classnames]
    if all(k in by_name for k in keys):
        chosen = [by_name[k] for k in keys]
    elif len(rows) == len(classnames):
        chosen = rows
    else:
        from ...datasets import classnames as dataset_classnames
        imagenet = [c.replace("_", " ").lower() for c in dataset_classnames("imagenet")]
        missing = [c for c, k in zip(classnames, keys) if k not in by_name]
        if len(rows) != len(imagenet) or any(k not in imagenet for k in keys):
            shown = ", ".join(repr(n) for n in missing[:5]) + (", ..." if len(missing) > 5 else "")
            raise ValueError(f"{field}: {path!r} has no entry for {len(missing)} of {len(classnames)} classes "
                             f"({shown}) and does not list them in order")
        chosen = [rows[imagenet.index(k)] for k in keys]
    empty = [c for c, phrases in zip(classnames, chosen) if not any(p.strip() for p in phrases)]
    if empty:
        raise ValueError(f"{field}: {path!r} has no descriptor for {len(empty)} classes: {empty[0]!r}"
                         + (", ..." if len(empty) > 1 else ""))
    return [list(p) for p in chosen]


def _mean_features(model, sentences: Sequence[Sequence[str]], tag: str) -> torch.Tensor:
    """Per class, the mean of its sentences' normalised text features, NOT renormalised (C, D): their
    prototypes average these means before normalising (learnable_shift.py:77, 206). Kept in the head
    cache under `tag` (the normalised heads of the same prompts are other entries)."""
    flat = [s for group in sentences for s in group]

    def build() -> torch.Tensor:
        feats = encode_texts(model, flat)
        return torch.stack([f.mean(0) for f in feats.split([len(g) for g in sentences])])

    return cached_head(model.clip, model.device, [f"\x00tps-unnormalised-mean:{tag}", *flat], build)


class TPS(EpisodicMethod):
    """TPS: per-class shift vectors on the (frozen) class prototypes, tuned per image on the marginal
    entropy of its confident views; predicts view 0 with the shifted prototypes."""
    spec = TPSSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        if cfg.text_head in ("descriptors", "ensemble_descriptors"):   # the spec's config_problem: a file is given
            self._descriptors = load_descriptors(cfg.descriptors_file, self.classnames)
        elif cfg.descriptors_file:
            raise ValueError(f"tps.descriptors_file is set but tps.text_head is {cfg.text_head!r}: the file would not "
                             f"be read; set {say_set('tps', 'text_head', 'ensemble_descriptors')} (their README's "
                             "recipe) or leave out descriptors_file")
        self.last_shifts: torch.Tensor | None = None    # (B, C or 1, D) of the last group tuned

    def prepare(self) -> None:
        _ = self.prototypes()

    def prototypes(self) -> torch.Tensor:
        """The normalised (C, D) class prototypes the shifts are added to (learnable_shift.py:203-206)."""
        cfg = self.config
        key = ("tps_prototypes", cfg.text_head, cfg.descriptors_file)
        shared = self.heads.shared
        if key not in shared:
            names = [c.replace("_", " ") for c in self.classnames]
            if cfg.text_head == "zeroshot":
                raw = self.heads.zeroshot
            elif cfg.text_head == "ensemble":
                raw = self.heads.ensemble
            else:
                sentences = [[descriptor_sentence(n, p) for p in phrases]
                             for n, phrases in zip(names, self._descriptors)]
                raw = _mean_features(self.model, sentences, "descriptors")
                if cfg.text_head == "ensemble_descriptors":
                    from ...datasets.classes import load_templates
                    templates = load_templates()
                    templated = _mean_features(self.model, [[t.format(n) for t in templates] for n in names],
                                               "templates")
                    raw = (raw + templated) / 2
            shared[key] = F.normalize(raw.float(), dim=-1)
        return shared[key]

    # -- the algorithm -------------------------------------------------------------------------
    def logits(self, prototypes: torch.Tensor, shift: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Shifted, renormalised prototypes (learnable_shift.py:231-233) against features: (C, D), (B, C|1, D),
        (B, N, D) -> (B, N, C), under the method's precision (their product runs under autocast with the
        scale applied to the text side first, learnable_shift.py:239)."""
        with self.precision.autocast():
            text = F.normalize(prototypes + shift, dim=-1)
            return torch.einsum("bcd,bnd->bnc", self.model.logit_scale * text, features)

    def objective(self, prototypes: torch.Tensor, shift: torch.Tensor,
                  features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample losses (B,) at `shift` and the views they keep (B, k): the marginal entropy of the
        confident views, selected anew at every step (shift_classification.py:41-49, run_utils.py:16-27)."""
        logits = self.logits(prototypes, shift, features).float()
        kept = select_confident(logits.detach(), self.config.selection_ratio)
        chosen = torch.gather(logits, 1, kept.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        return marginal_entropy_as_tpt(chosen), kept

    def tune(self, features: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(B, N, D) frozen view features -> tuned shifts (B, C or 1, D) and per-sample extras."""
        cfg = self.config
        protos = self.prototypes()
        rows = protos.shape[0] if cfg.shift == "per_class" else 1
        # zeros, reset before every image (shifter.py:37,54-56; shift_classification.py:243-248)
        shift = torch.nn.Parameter(protos.new_zeros(features.shape[0], rows, protos.shape[1]))
        optimizer = torch.optim.AdamW([shift], lr=cfg.lr, weight_decay=cfg.weight_decay)
        scaled = self.precision.loss_scaling
        extras: dict[str, torch.Tensor] = {}
        for _ in range(cfg.steps):
            with torch.enable_grad():
                losses, kept = self.objective(protos, shift, features)
                (grad,) = torch.autograd.grad(losses.sum() * (cfg.loss_scale if scaled else 1.0), shift)
            if "loss" not in extras:
                extras["loss"], extras["selected"] = losses.detach(), kept
            if scaled:
                grad = grad / cfg.loss_scale
            finite = torch.isfinite(grad).flatten(1).all(-1)
            before = shift.detach().clone()
            shift.grad = grad
            optimizer.step()
            if scaled and not bool(finite.all()):
                # GradScaler skips the step on overflow (per image here); its state is reset per image
                with torch.no_grad():
                    shift[~finite] = before[~finite]
        return shift.detach(), extras

    def predict_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        """Samples are tuned together: each has its own shift rows and AdamW state (elementwise), and the
        loss is a sum of per-sample terms, so the result is the one-at-a-time result."""
        protos = self.prototypes()
        rows = protos.shape[0] if self.config.shift == "per_class" else 1
        return in_groups(ctxs, max(1, _GROUP_FLOATS // (rows * protos.shape[1])), self._predict_group)

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return self._predict_group([ctx])[0]

    def _predict_group(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        n = self.config.views.n_views
        feats = torch.stack([c.image_features[:n] for c in ctxs]).float()        # (B, N, D)
        shift, extras = self.tune(feats)
        self.last_shifts = shift
        with torch.no_grad():
            logits = self.logits(self.prototypes(), shift, feats[:, :1])[:, 0].float()   # view 0 (their line 255)
        outputs = []
        for i in range(len(ctxs)):
            ex: dict[str, Any] = {}
            if extras:
                ex = {"loss": float(extras["loss"][i]), "selected": extras["selected"][i].tolist()}
            outputs.append(MethodOutput(logits[i], extras=ex))
        return outputs
