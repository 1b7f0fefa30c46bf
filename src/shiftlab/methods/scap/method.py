"""SCAP: supportive cliques of a batch's images tune the prompts, retained per class, then each image's prompts
are tuned on its views.

As its authors' main.py computes it with scripts/R.sh's flags (zhoujiahuan1991/CVPR2025-SCAP@5057c96: main.py
`test_time_adapt_eval` and `test_time_tuning`, batch_utils.py `BatchLearner`, utils/ema.py), per batch:

1. a pass over the batch's original views with the current prompts: each image's class and feature;
2. cliques: per predicted class, all its images, plus, per image, the images whose feature cosine with it exceeds
   `clique_threshold` (when that is neither only itself nor the whole class); each clique in turn: the text prompt
   back to its start (and the image prompt to the class's retention prompt), one AdamW step on the clique's mean
   entropy + `mse_weight` x 100 x the features' spread; its image prompt retained for its class (a running mean
   weighted by exp(-entropy / retention_rate)); its text step, with those of the cliques where the class was a
   negative, added to the class's text EMA (x `w_prompt`);
3. each image: the text prompt = w x EMA + (1 - w) x start, AdamW afresh, `steps` steps on the entropy of the mean
   of its most confident views (TPT's loss); the image prompt mixed with the predicted class's image EMA; the
   prediction on its original view; both EMAs of the predicted class move toward the prompts by exp(-max logit/h).

The image prompt, the text prompt, both EMAs, the retention prompts and AdamW's moments carry from batch to batch.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..base import MethodOutput
from ..common.confidence import marginal_entropy_as_tpt as marginal_entropy
from ..common.confidence import select_confident
from ..context import SampleContext, batch_pixels
from ..kinds import BatchMethod
from .prompts import TemplateText, check_tower, prompted_image_features
from .spec import SCAPSpec


def confident(logits: torch.Tensor, share: float) -> torch.Tensor:
    """The rows of (N, C) logits with the lowest entropy: int(N x share) as main.py:84-87 (at least one)."""
    return logits[select_confident(logits, share)]


def mean_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean of the rows' entropies, computed as batch_utils.py:145-148 does (log of the softmax)."""
    score = logits.softmax(1)
    return -(score * torch.log(score)).sum() / score.shape[0]


def cliques(features: torch.Tensor, preds: list[int], threshold: float) -> tuple[list[list[int]], list[int]]:
    """batch_utils.py get_subgroups: per class in order of first prediction, its images, then for each of them
    the class's images whose cosine with it exceeds `threshold`, when they are more than itself and not all."""
    members: dict[int, list[int]] = {}
    for i, c in enumerate(preds):
        members.setdefault(c, []).append(i)
    groups, classes = [], []
    for c, idx in members.items():
        groups.append(idx)
        classes.append(c)
        if len(idx) > 1:
            close = (features[idx] @ features[idx].T) > threshold
            for row in close:
                if 1 < int(row.sum()) <= len(idx) - 1:
                    groups.append([idx[j] for j in range(len(idx)) if row[j]])
                    classes.append(c)
    return groups, classes


def negative_weight(logits: torch.Tensor, c: int) -> torch.Tensor:
    """batch_utils.py:334-336 on a clique's mean logits (1, C), logarithms of the logits themselves (NaN where
    one is negative: the clique then adds nothing)."""
    grads = (logits * torch.log(logits)).sum() - logits.sum() * torch.log(logits)
    return grads[0, c]


class SCAP(BatchMethod):
    """SCAP over batches: clique tuning with per-class retention, then per-image prompt tuning (module docstring)."""
    spec = SCAPSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        visual = self.model.clip.visual
        self.layers = list(self.config.prompt_layers)
        problem = check_tower(visual, self.layers)
        if problem:
            raise ValueError(f"scap: {self.model.name}: {problem}")
        templates = self.config.templates
        if not templates or any(not isinstance(t, str) or "CLS" not in t for t in templates):
            raise ValueError(f"scap.templates: every template must hold the class name's place, CLS (as "
                             f"'a drawing of a CLS'), and there must be one at least; got {list(templates)[:3]!r}")
        self.width = visual.transformer.width
        self.text: TemplateText | None = None
        self.reset()

    # -- state ------------------------------------------------------------------------------------------------
    def _text(self) -> TemplateText:
        if self.text is None:
            self.text = TemplateText(self.model.clip, self.classnames, self.config.templates, self.model.device)
        return self.text

    def prepare(self) -> None:
        self._text()

    def reset(self) -> None:
        device = self.model.device
        gen = torch.Generator().manual_seed(self.config.prompt_seed)
        init = torch.empty(len(self.layers), 2, self.width).uniform_(-1, 1, generator=gen).to(device)
        self.image_prompt = torch.nn.Parameter(init)
        self.text_prompt: torch.nn.Parameter | None = None   # built with the text side (prepare or first batch)
        self.image_shadow = init.unsqueeze(0).repeat(len(self.classnames), 1, 1, 1)
        self.text_shadow: torch.Tensor | None = None
        self.retention: dict[int, torch.Tensor] = {}
        self.retention_t: dict[int, int] = {}
        self.optimizer_state: dict[str, Any] | None = None
        self.last_text: torch.Tensor | None = None     # the class features of the current text prompt, if known
        self.seen = 0

    def _start(self) -> None:
        if self.text_prompt is None:
            init = self._text().init
            self.text_prompt = torch.nn.Parameter(init.clone())
            self.text_shadow = init.clone()

    def _optimizer(self, fresh: bool) -> torch.optim.Optimizer:
        # main.py:382: AdamW over [text prompt, image prompt]; each image starts it afresh (main.py:482), the
        # cliques continue from where the batch's last image left it (batch_utils.py:249-254)
        opt = torch.optim.AdamW([self.text_prompt, self.image_prompt], lr=self.config.lr)
        if not fresh and self.optimizer_state is not None:
            opt.load_state_dict(self.optimizer_state)
        return opt

    # -- the passes -------------------------------------------------------------------------------------------
    def class_features(self) -> torch.Tensor:
        """(C, D) normalised class features of the current text prompt."""
        with self.precision.autocast():
            return self._text().features(self.text_prompt, self.config.ensemble_rate).float()

    def forward(self, pixels: torch.Tensor, text: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (B, 3, S, S) -> (logits (B, C), normalised features (B, D)) with the current prompts (`text`: the
        current prompt's class features when already computed, else computed here)."""
        with self.precision.autocast():
            feats = prompted_image_features(self.model.clip.visual, pixels.to(self.model.input_dtype),
                                            self.image_prompt, self.layers)
        text = self.class_features() if text is None else text
        feats = F.normalize(feats.float(), dim=-1)
        return self.model.logit_scale * feats @ text.T, feats

    def _step(self, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        opt.zero_grad()
        loss.backward()
        opt.step()

    def tune_cliques(self, base: torch.Tensor, groups: list[list[int]], classes: list[int]) -> None:
        """batch_utils.py subgroups_prompt_tuning + update_dart_text_ema on the batch's original views."""
        cfg, init = self.config, self._text().init
        self.last_text = None                  # the text prompt changes below
        opt = self._optimizer(fresh=False)
        steps, means, negatives = [], [], {}
        for i, group in enumerate(groups):
            pixels = base[group[:cfg.clique_max]]
            with torch.no_grad():
                self.text_prompt.copy_(init)
                if cfg.reset_to_retention and classes[i] in self.retention:
                    self.image_prompt.copy_(self.retention[classes[i]])
            for _ in range(cfg.steps):
                logits, feats = self.forward(pixels)
                mean = logits.mean(dim=0, keepdim=True)
                prob = mean.softmax(dim=1)
                negs = (prob[0] <= prob.max() * cfg.negative_ratio).nonzero().flatten().tolist()
                loss = mean_entropy(logits)
                entropy = float(loss.detach())
                centre = feats.mean(0, keepdim=True)
                loss = loss + ((feats - centre) ** 2).mean() * 100 * cfg.mse_weight
                self._step(opt, loss)
            with torch.no_grad():
                steps.append(self.text_prompt.detach() - init)
                means.append(mean.detach())
                for k in negs:
                    negatives.setdefault(k, []).append(i)
                classes[i] = int(logits.detach().sum(dim=0).argmax())
                self._retain(classes[i], self.image_prompt.detach().clone(), entropy)
        with torch.no_grad():
            for i, c in enumerate(classes):
                if c not in negatives:
                    continue
                push = 0
                for n in negatives[c]:
                    w0 = negative_weight(means[n], c)
                    if w0 > 1:
                        push = push + steps[n][c] * torch.pow(1 / w0, cfg.w_pow)
                push = push / len(negatives[c]) * cfg.w_step
                self.text_shadow[c] = self.text_shadow[c] + cfg.w_prompt * (push + steps[i][c])
        self.optimizer_state = opt.state_dict()

    def _retain(self, c: int, prompt: torch.Tensor, entropy: float) -> None:
        """batch_utils.py update_retention: the class's retention prompt, a running mean weighted by entropy."""
        if c in self.retention:
            t = self.retention_t[c]
            self.retention_t[c] = t + 1
            w = (1 / (1 + t)) * torch.exp(torch.tensor(-entropy) / self.config.retention_rate).to(prompt.device)
            self.retention[c] = self.retention[c] * (1 - w) + prompt * w
        else:
            self.retention[c], self.retention_t[c] = prompt, 1

    def tune_image(self, views: torch.Tensor) -> torch.Tensor:
        """main.py:471-520 and test_time_tuning for one image's views (N, 3, S, S) -> its logits (C,)."""
        cfg, init = self.config, self._text().init
        with torch.no_grad():
            self.text_prompt.copy_(cfg.text_ema_w * self.text_shadow + (1 - cfg.text_ema_w) * init)
        opt = self._optimizer(fresh=True)
        for _ in range(cfg.steps):
            logits, _ = self.forward(views)
            self._step(opt, marginal_entropy(confident(logits, cfg.selection_p)))
            with torch.no_grad():
                text = self.class_features()     # the tuned text prompt's, also the prediction's below
                tuned = confident(self.forward(views, text)[0], cfg.selection_p).mean(dim=0)
        self.optimizer_state = opt.state_dict()
        with torch.no_grad():
            pred = int(tuned.argmax())
            mixed = cfg.image_ema_w * self.image_shadow[pred] + (1 - cfg.image_ema_w) * self.image_prompt
            self.image_prompt.copy_(mixed)
            logits = self.forward(views[:1], text)[0][0]
            self.last_text = text
            pred, weight = int(logits.argmax()), float(logits.max())
            decay = math.exp(-weight / cfg.text_ema_h)
            self.text_shadow[pred] = decay * self.text_shadow[pred] + (1 - decay) * self.text_prompt[pred]
            decay = math.exp(-weight / cfg.image_ema_h)
            self.image_shadow[pred] = decay * self.image_shadow[pred] + (1 - decay) * self.image_prompt
        return logits

    # -- the engine -------------------------------------------------------------------------------------------
    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        if not ctxs:
            return []
        device = self.model.device
        base = batch_pixels(ctxs, device, "scap tunes prompts inside the image tower and needs the images' pixels, "
                            "not stored features")
        self._start()
        outputs = []
        with torch.enable_grad():       # a caller's no_grad block must not stop the adaptation
            if self.config.cliques:
                with torch.no_grad():   # the text prompt is the last image's: its class features are known
                    logits, feats = self.forward(base, self.last_text)
                groups, classes = cliques(feats, logits.argmax(dim=1).tolist(), self.config.clique_threshold)
                self.tune_cliques(base, groups, classes)
            for ctx in ctxs:
                outputs.append(MethodOutput(self.tune_image(ctx.views.to(device)).detach().float()))
        self.seen += len(ctxs)
        return outputs

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        """One image alone: a batch of one."""
        return self.adapt_batch([ctx])[0]

    def save_state(self) -> dict[str, Any]:
        def cpu(t: torch.Tensor) -> torch.Tensor:
            return t.detach().cpu().clone()

        self._start()
        opt = self.optimizer_state
        return {"seen": self.seen,
                "image_prompt": cpu(self.image_prompt), "text_prompt": cpu(self.text_prompt),
                "image_shadow": cpu(self.image_shadow), "text_shadow": cpu(self.text_shadow),
                "retention_classes": sorted(self.retention),
                "retention": torch.stack([cpu(self.retention[c]) for c in sorted(self.retention)])
                if self.retention else torch.zeros(0),
                "retention_t": [self.retention_t[c] for c in sorted(self.retention)],
                "optimizer": None if opt is None else {
                    "state": {k: {n: cpu(v) for n, v in s.items()} for k, s in opt["state"].items()},
                    "param_groups": opt["param_groups"]}}

    def load_state(self, state: dict[str, Any]) -> None:
        self.reset()
        self._start()
        device = self.model.device
        with torch.no_grad():
            self.image_prompt.copy_(state["image_prompt"].to(device))
            self.text_prompt.copy_(state["text_prompt"].to(device))
        self.image_shadow = state["image_shadow"].to(device).clone()
        self.text_shadow = state["text_shadow"].to(device).clone()
        for c, prompt, t in zip(state["retention_classes"], state["retention"], state["retention_t"]):
            self.retention[int(c)], self.retention_t[int(c)] = prompt.to(device).clone(), int(t)
        opt = state["optimizer"]
        self.optimizer_state = None if opt is None else {
            "state": {int(k): {n: v.to(device).clone() if n != "step" else v.clone() for n, v in s.items()}
                      for k, s in opt["state"].items()},
            "param_groups": opt["param_groups"]}
        self.seen = int(state["seen"])
