"""RLCF (Zhao et al., ICLR 2024): test-time prompt tuning with a CLIP reward.

The student is TPT's (methods/common/prompt_tuning.py): 4 context tokens from "a photo of a", frozen towers, the
10% most confident views selected once at the first step. Instead of an entropy, each step samples the
student's top-K classes of every selected view, scores each (view, class) pair with a larger, frozen
CLIP (the reward model: 2.5 x max(cosine, 0), CLIPScore), subtracts a baseline (the mean of the view's K
scores) and takes a REINFORCE step on mean(reward x cross-entropy(view logits, class)). After `steps`
AdamW steps, view 0 is classified with the tuned prompt; the prompt is reset for the next image.

Source: github.com/mzhaoshuai/RLCF at 0996a5d5bdeea9108c36bd0c5a71bba652945cd4, the classification code in
TPT/ ("file:line" below is relative to it). Their repository has two students for classification:
prompt tuning (tpt_cls_rl.py, scripts/rlcf-prompt.sh), implemented here, and tuning the whole image
encoder (tune_cls_rl.py, scripts/rlcf-tune.sh: ViT-B/16, lr 1e-5), not implemented (it needs a trainable
copy of the image tower). Their reward ensemble (`--multiple_reward_models`, clip_reward.py:180) and the
entropy regulariser (`--min_entropy_reg`, "experimental", params.py:62) are off in their scripts and not
implemented either.

The reward model is any CLIP shiftlab's loader reads (`reward_model` an open_clip architecture,
`reward_pretrained` by the rule of --pretrained: a tag, a file, hf-hub:ORG/REPO, or "none" for random
weights of `reward_seed`), loaded once per process (`models.load_shared_model`); the run identity records
its checkpoint's SHA-256 (`loaded_weights`). It encodes each sample's selected views, the engine's views:
their code hands the student's normalised views to the reward model as they are (both are OpenAI CLIPs,
one normalisation) and resizes them bicubically with align_corners=True when its input size differs
(clip_reward.py:133-134); here the views are also re-normalised when the reward model's mean/std differ.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ...models import ClipModel, load_shared_model
from ...models.text import class_head
from ...options import say_set
from ..base import ExtraModel, MethodOutput
from ..common.prompt_tuning import PromptTuning
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import RLCFConfig, RLCFSpec


def reward_weights(config: RLCFConfig) -> str | None:
    """`reward_pretrained` as `load_model` takes it: None (random weights) for None, "none" or "random"."""
    value = config.reward_pretrained
    return None if value is None or value.strip().lower() in ("none", "random") else value


def reward_baseline(scores: torch.Tensor, mode: str, divide_by_std: bool) -> torch.Tensor:
    """Rewards from CLIP scores (..., V, K) as their `rewards_post_process` makes them: minus the mean of each
    view's K scores ("view") or of all V x K ("batch"), optionally divided by their std + 1e-5; a group of
    one score is left as it is (their `clip_score.shape[-1] > 1`)."""
    if mode == "none":
        return scores
    groups = scores if mode == "view" else scores.flatten(-2)
    if groups.shape[-1] > 1:
        centred = groups - groups.mean(-1, keepdim=True)
        groups = centred / (groups.std(-1, keepdim=True) + 1e-5) if divide_by_std else centred
    return groups.reshape(scores.shape)


class RLCF(PromptTuning, EpisodicMethod):
    """RLCF: TPT's prompt tuned by REINFORCE on a larger CLIP's reward for the student's top-K classes."""
    spec = RLCFSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        if cfg.sample_k > len(self.classnames):
            raise ValueError(f"rlcf.sample_k: {cfg.sample_k} classes sampled per view, but there are only "
                             f"{len(self.classnames)} classes")
        self.reward: ClipModel = load_shared_model(cfg.reward_model, reward_weights(cfg), device=self.model.device,
                                                   seed=cfg.reward_seed)
        # their reward prompts are the student's tokenised prompts, "<ctx_init> <name>." (custom_clip.py:128,
        # "X X X X" without ctx_init: :110-112), whatever context a CoOp checkpoint loads (tpt_cls_rl.py:183)
        words = cfg.ctx_init.replace("_", " ") if cfg.ctx_init else " ".join(["X"] * self.prompt.n_ctx)
        self.reward_prompt = f"{words} {{}}."
        self._group: Sequence[SampleContext] = ()
        self._reward_image: torch.Tensor | None = None
        self._reward_text: torch.Tensor | None = None

    @classmethod
    def extra_models(cls, config: RLCFConfig) -> list[ExtraModel]:
        return [ExtraModel(config.reward_model, reward_weights(config), config.reward_seed,
                           say_set("rlcf", "reward_model", "ARCH") + " and "
                           + say_set("rlcf", "reward_pretrained", "TAG|FILE|hf-hub:ORG/REPO|none"))]

    def loaded_weights(self) -> dict[str, Any]:
        r = self.reward
        return {"reward_checkpoint_sha256": r.checkpoint_sha256, "reward_weights_source": r.weights_source,
                "reward_weights_sha256": None if r.checkpoint_sha256 else r.weights_sha256}

    def prepare(self) -> None:
        super().prepare()
        _ = self.reward_text

    @property
    def reward_text(self) -> torch.Tensor:
        """(C, D') the reward model's class features of the student's prompts (under autocast, as theirs:
        tpt_cls_rl.py:182-183)."""
        if self._reward_text is None:
            with self.precision.autocast():
                self._reward_text = class_head(self.reward, self.classnames, [self.reward_prompt]).float()
        return self._reward_text

    def reward_inputs(self, views: torch.Tensor) -> torch.Tensor:
        """The student's normalised views (n, 3, S, S) -> the reward model's input: re-normalised when the two
        normalisations differ, resized bicubically (align_corners=True, clip_reward.py:133-134) when the sizes do."""
        mine, theirs = self.model.preprocess, self.reward.preprocess
        x = views
        if (mine.mean, mine.std) != (theirs.mean, theirs.std):
            x = self.reward.normalize(x * self.model.std.to(x.dtype) + self.model.mean.to(x.dtype))
        if theirs.image_size != x.shape[-1]:
            x = F.interpolate(x, size=theirs.image_size, mode="bicubic", align_corners=True)
        return x

    def _predict_group(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        if any(c.views is None for c in ctxs):
            raise ValueError("rlcf needs the views' pixels for its reward model; these came from a feature store")
        self._group = ctxs
        try:
            return super()._predict_group(ctxs)
        finally:
            self._group, self._reward_image = (), None

    def on_selection(self, selected: torch.Tensor) -> None:
        # the selected views only, once per image (tpt_cls_rl.py:58-59)
        views = torch.cat([c.views[idx.to(c.views.device)] for c, idx in zip(self._group, selected)])
        feats = self.reward.encode_views(self.reward_inputs(views), self.precision)
        self._reward_image = feats.view(*selected.shape, -1)                       # (B, k, D')

    @torch.no_grad()
    def rewards(self, selected_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, k, C) logits of the selected views -> their sampled top-K classes (B, k, K), the reward model's
        CLIP scores of the (view, class) pairs and the rewards after the baseline (tpt_cls_rl.py:63-67)."""
        cfg = self.config
        sampled = selected_logits.topk(cfg.sample_k, dim=-1).indices
        pairs = self.reward_text[sampled] * self._reward_image.unsqueeze(-2)          # (B, k, K, D')
        scores = (cfg.clipscore_weight * pairs.sum(-1)).clamp_min(0)                  # clip_reward.py:122-126
        return sampled, scores, reward_baseline(scores, cfg.reward_baseline, cfg.reward_std)

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """REINFORCE, tpt_cls_rl.py:69-71: per sample, mean over views and sampled classes of reward x
        cross-entropy of the view's logits with the class -> (B,)."""
        sampled, scores, rewards = self.rewards(selected_logits.detach())
        logits = selected_logits.unsqueeze(-2).expand(*sampled.shape, selected_logits.shape[-1])
        ce = F.cross_entropy(logits.flatten(0, -2), sampled.flatten(), reduction="none").view(sampled.shape)
        return (rewards * ce).flatten(1).mean(-1), {"reward": scores.flatten(1).mean(-1)}
