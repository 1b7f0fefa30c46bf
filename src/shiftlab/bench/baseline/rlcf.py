"""RLCF's prompt-tuning loop written out (mzhaoshuai/RLCF at 0996a5d, TPT/tpt_cls_rl.py, TPT/clip_reward.py),
for `shiftlab bench`.

The student is TPT's baseline (`TPTBaseline`: the learnable context in the full 77-token prompts, the text
tower over all 77 positions, a fresh AdamW); the reward model is a second CLIP. Per image, as their
`test_time_adapt_eval` and `test_time_tuning` (tpt_cls_rl.py:47-80, 232-260) run it:

1. the context back to "a photo of a", the optimizer state back to empty;
2. step 1: `model(inputs)`, every view through the student's image tower (no gradient) and the text tower
   (with gradient); the most confident views selected; `reward_model.set_image_features`: the selected views
   through the reward model's image tower; later steps: `model(inputs[selected_idx])`, the selected views
   through the student's image tower again;
3. each step: the student's top-K classes of every selected view, CLIPScore 2.5 x max(cos, 0) of each
   (view, class) pair with the reward model's features of the prompts, the baseline subtracted
   (`rewards_post_process`), loss mean(reward x cross-entropy); zero_grad, backward, AdamW step;
4. `model(image)` without gradient: view 0 and the text tower with the tuned context.

The reward model's class features are its text tower over the student's tokenised prompts, once
(tpt_cls_rl.py:182-183). Its input is the student's normalised views, resized bicubically
(align_corners=True) when its input size differs (clip_reward.py:133-134), re-normalised first when its
mean/std differ (their two CLIPs share OpenAI's; any two of shiftlab's may not).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...models import load_shared_model
from .core import TPTBaseline, l2_normalize, select_confident_samples

__all__ = ["RLCFBaseline"]


class RLCFBaseline(TPTBaseline):
    """RLCF with a prompt-tuning student, one image at a time (see the module docstring)."""
    name = "rlcf"
    parts = TPTBaseline.parts + ("reward_encode",)

    def setup(self) -> None:
        super().setup()
        cfg = self.config
        pretrained = cfg.reward_pretrained
        if pretrained is not None and pretrained.strip().lower() in ("none", "random"):
            pretrained = None
        self.reward = load_shared_model(cfg.reward_model, pretrained, device=self.device, seed=cfg.reward_seed)
        with torch.no_grad(), self.autocast(cfg.precision):
            text = self.reward.clip.encode_text(self.prompt_learner.tokenized).float()
        self.reward_text = l2_normalize(text)

    def reward_image_features(self, x: torch.Tensor) -> torch.Tensor:
        """`extract_image_features` of the student's normalised views (clip_reward.py:130-137)."""
        with self.timed("reward_encode"), torch.no_grad(), self.autocast(self.config.precision):
            mine, theirs = self.model.preprocess, self.reward.preprocess
            if (mine.mean, mine.std) != (theirs.mean, theirs.std):
                mean, std = (torch.tensor(v, device=x.device).view(3, 1, 1) for v in (theirs.mean, theirs.std))
                x = (x * self.std + self.mean - mean) / std
            size = self.reward.image_size
            if size != x.shape[-1]:
                x = F.interpolate(x, size=size, mode="bicubic", align_corners=True)
            return l2_normalize(self.reward.clip.encode_image(x).float())

    def rewards(self, clip_score: torch.Tensor) -> torch.Tensor:
        """`rewards_post_process` (clip_reward.py:153-165) of the (bs, K) scores, or of all bs x K ("batch")."""
        cfg = self.config
        if cfg.reward_baseline == "none":
            return clip_score.flatten()
        if cfg.reward_baseline == "batch":
            clip_score = clip_score.flatten()
        if clip_score.shape[-1] > 1:
            mean = torch.mean(clip_score, dim=-1, keepdim=True)
            std = torch.std(clip_score, dim=-1, keepdim=True) + 1e-5 if cfg.reward_std else 1.0
            clip_score = (clip_score - mean) / std
        return clip_score.flatten()

    def predict(self, views_u8: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        x = self.to_input(views_u8)
        k = cfg.sample_k
        with self.timed("method"):
            ctx = torch.nn.Parameter(self.prompt_learner.ctx_init_state.clone())   # model.reset()
            optimizer = torch.optim.AdamW([ctx], lr=cfg.lr, weight_decay=cfg.weight_decay)
            scaler = (torch.amp.GradScaler("cuda", init_scale=cfg.loss_scale)
                      if self.policy(cfg.precision).loss_scaling else None)
        selected_idx = reward_image = None
        for _ in range(cfg.steps):
            if selected_idx is not None:
                output, _, _ = self.model_forward(x[selected_idx], ctx)
                output = output.float()
            else:
                output, _, _ = self.model_forward(x, ctx)
                with self.timed("method"):
                    output, selected_idx = select_confident_samples(output.float(), cfg.selection_ratio)
                reward_image = self.reward_image_features(x[selected_idx])
            with self.timed("method"):
                bs = output.shape[0]
                index = torch.topk(output, k, dim=-1).indices.flatten()
                with torch.no_grad():                 # CLIPScore (clip_reward.py:113-127)
                    text_features = self.reward_text[index]
                    image_features = torch.repeat_interleave(reward_image, k, dim=0)
                    similarity = cfg.clipscore_weight * torch.sum(text_features * image_features, dim=-1)
                    scores = torch.maximum(similarity, torch.zeros_like(similarity))
                    rewards = self.rewards(scores.reshape(bs, -1))
                rep_output = torch.repeat_interleave(output, k, dim=0)
                loss = torch.mean(rewards * F.cross_entropy(rep_output, index, reduction="none"))
                optimizer.zero_grad()
            self.optimizer_step(loss, optimizer, scaler)
        out = self.readout(x, ctx.detach())
        with self.timed("method"):
            return out.float()
